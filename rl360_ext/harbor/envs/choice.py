"""The environments `--env` names directly (bwrap, docker) and what a server does with each when it
starts: check its options, then remove what a killed server left (`clean_stale`).

Any other `--env` is a Harbor environment type (daytona, ...) or `module.path:Class`, run as
Harbor's own: no options check and no stale cleanup here. Harbor's unmodified docker environment
stays reachable as `--env harbor.environments.docker.docker:DockerEnvironment`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rl360_ext.harbor.envs import bwrap
from rl360_ext.harbor.envs import docker as rl_docker

IMPORT_PATHS = {"bwrap": bwrap.IMPORT_PATH, "docker": rl_docker.IMPORT_PATH}


def check_server_options(name: str, kwargs: dict[str, Any]) -> None:
    """Refuse options no trial could run with (a ValueError naming the option or what is missing)."""
    if name == "bwrap":
        bwrap.BwrapEnvironment.check_server_options(kwargs)
    elif name == "docker":
        rl_docker.RlDockerEnvironment.check_server_options(kwargs)


def clean_stale(name: str, kwargs: dict[str, Any]) -> list[str]:
    """What a killed server (SIGKILL: no teardown) left of its sandboxes, cgroups or containers."""
    if name == "bwrap":
        root = kwargs.get("sandbox_root")
        return bwrap.clean_stale(Path(root) if root else None)
    if name == "docker":
        return rl_docker.RlDockerEnvironment.clean_stale(kwargs)
    return []
