"""The container stack's state directory: where each file lives and the record of what runs.

Owns the layout under one state directory (default /var/tmp/rl360-containers, or
$RL360_CONTAINERS_DIR): the engine's data root, exec root, socket, pidfile and logs, the
registry's storage and config, the base image cache, and `stack.json`, the record of the
processes `rl360 containers up` started (pid and start time, so a reused pid is never taken for
ours) and the registry's port. `running_engine_host` tells another component (the docker
environment) the `unix://` address of the stack's engine while it runs.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rl360_ext.util.proc_stat import START_TIME, STATE, stat_fields

DEFAULT_STATE_DIR = Path("/var/tmp/rl360-containers")
STATE_ENV = "RL360_CONTAINERS_DIR"


@dataclass(frozen=True)
class Process:
    """A process the stack started: its pid and start time (clock ticks since boot)."""

    pid: int
    start_time: str

    @classmethod
    def of(cls, pid: int) -> Process | None:
        fields = stat_fields(pid)
        return None if fields is None else cls(pid, fields[START_TIME])

    def alive(self) -> bool:
        fields = stat_fields(self.pid)
        return fields is not None and fields[STATE] != "Z" and fields[START_TIME] == self.start_time


@dataclass
class StackRecord:
    """What `stack.json` holds: the processes started and the registry's loopback port."""

    registry_port: int
    dockerd: Process | None = None
    registry: Process | None = None
    images: dict[str, str] = field(default_factory=dict)  # library name -> image digest

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> StackRecord:
        data = json.loads(text)
        port = data.get("registry_port")
        if not isinstance(port, int) or not 0 < port < 65536:
            raise ValueError(f"stack.json: registry_port must be a port number, got {port!r}")

        def process(key: str) -> Process | None:
            value = data.get(key)
            if value is None:
                return None
            if not isinstance(value, dict) or not isinstance(value.get("pid"), int):
                raise ValueError(f"stack.json: {key} must be {{pid, start_time}}, got {value!r}")
            return Process(value["pid"], str(value.get("start_time", "")))

        images = data.get("images") or {}
        if not isinstance(images, dict):
            raise ValueError(f"stack.json: images must be an object, got {images!r}")
        return cls(port, process("dockerd"), process("registry"), {str(k): str(v) for k, v in images.items()})


@dataclass(frozen=True)
class StackPaths:
    """Every path of the stack under `root`."""

    root: Path

    @classmethod
    def default(cls) -> StackPaths:
        return cls(Path(os.environ.get(STATE_ENV) or DEFAULT_STATE_DIR))

    @property
    def record(self) -> Path:
        return self.root / "stack.json"

    @property
    def socket(self) -> Path:
        return self.root / "docker.sock"

    @property
    def docker_host(self) -> str:
        return f"unix://{self.socket}"

    @property
    def data_root(self) -> Path:
        return self.root / "engine"

    @property
    def exec_root(self) -> Path:
        return self.root / "exec"

    @property
    def pidfile(self) -> Path:
        return self.root / "docker.pid"

    @property
    def daemon_config(self) -> Path:
        return self.root / "daemon.json"

    @property
    def dockerd_log(self) -> Path:
        return self.root / "dockerd.log"

    @property
    def registry_root(self) -> Path:
        return self.root / "registry"

    @property
    def registry_config(self) -> Path:
        return self.root / "registry.yml"

    @property
    def registry_log(self) -> Path:
        return self.root / "registry.log"

    @property
    def image_cache(self) -> Path:
        return self.root / "base-images"

    @property
    def docker_config(self) -> Path:
        """DOCKER_CONFIG for the CLI: its config.json names the compose plugin's directory."""
        return self.root / "docker-config"

    @property
    def plugins(self) -> Path:
        return self.root / "cli-plugins"

    def read(self) -> StackRecord | None:
        """The record, or None when there is none (a malformed one raises ValueError)."""
        try:
            text = self.record.read_text()
        except FileNotFoundError:
            return None
        return StackRecord.from_json(text)

    def write(self, record: StackRecord) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.record.with_suffix(".tmp")
        tmp.write_text(record.to_json())
        tmp.replace(self.record)


def running_engine_host(paths: StackPaths | None = None) -> str | None:
    """`unix://...` of the stack's engine when `rl360 containers up` started it and it still runs."""
    paths = paths or StackPaths.default()
    try:
        record = paths.read()
    except (OSError, ValueError):
        return None
    if record is None or record.dockerd is None or not record.dockerd.alive():
        return None
    return paths.docker_host if paths.socket.exists() else None
