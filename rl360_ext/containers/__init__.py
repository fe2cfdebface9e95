"""A local container stack: a Docker engine and an image registry on this machine, nothing routed off it.

`rl360 containers up|down|status` (rl360_ext.cli.containers). The modules: `paths` (the state
directory's layout, the record of what runs, the engine's socket for others to find), `engine`
(running the docker CLI against the stack's engine, labels and the cleanup of what a killed
server left), `image` (the base image: debootstrap, import, cached by digest, pushed to the
registry under the library names tasks use) and `stack` (starting and stopping dockerd and the
registry by PID, the one-line errors). docs/harbor.md ("Docker and podman") says how it is used.
"""

from rl360_ext.containers.paths import StackPaths, running_engine_host

__all__ = ["StackPaths", "running_engine_host"]
