"""A Harbor environment on bubblewrap: one long-lived local sandbox per trial, no container engine.

Owns starting, entering, limiting and tearing down one sandbox, and moving files in and out.
It does not own task semantics or scoring. Select it with
`EnvironmentConfig(import_path="rl360_ext.harbor.envs.bwrap:BwrapEnvironment")`
(`rl360 harbor serve --env bwrap`).

Design
- `start` launches `bwrap --unshare-all` around a holder process (`sleep infinity`). The holder
  keeps the sandbox's mount, PID, IPC, UTS and network namespaces alive for the whole trial, so
  state that lives in processes survives between commands (terminus-2's tmux server).
- `exec` enters those namespaces with `nsenter`, changes root to the sandbox's root, drops every
  capability (bounding set emptied, no_new_privs) with `setpriv`, then runs `bash -c`. Each
  command runs in its own host process group, killed on timeout or cancellation; processes a
  command leaves behind (daemons, tmux) stay in the sandbox until `stop`.
- Filesystem: host /usr read-only (with the /bin, /lib, /lib64, /sbin links), a curated read-only
  /etc, a private /proc and /dev. Writable: /app, /logs (with /logs/agent, /logs/verifier,
  /logs/artifacts bind-mounted to the trial directory, so Harbor reads rewards straight from
  it), /tests, /solution, /tmp, and the task's workdir; each is a per-trial host directory.
- Network: none (a private network namespace with loopback only). A task whose
  `[environment] network_mode` is "public" gets the host network only when the server allows it
  (`allow_network=true`); otherwise it runs offline. "allowlist" is rejected (not enforceable).
- Limits: the trial's reservation (task `cpus`/`memory_mb`, or the server's overrides) is
  enforced by `rl360_ext.harbor.envs.limits` (a child cgroup, else a watchdog). A hit memory
  limit makes the next `exec` raise `MemoryLimitExceededError`, which Harbor's error policy
  treats as "do not grade, no valid reward".
- Environment definition: there is no image to build. `environment/app/` (if present) is copied
  into /app, then `environment/setup.sh` (if present) runs inside the sandbox as root with the
  task's env and network policy; a non-zero exit fails the start (`SandboxBuildFailedError`).
  `environment/Dockerfile`, `docker-compose.yaml` and `[environment] docker_image` are ignored:
  the host's /usr is the image.
- Teardown: `stop` SIGKILLs the holder (the kernel then kills every process of the PID
  namespace), waits until none is left, removes the cgroup and, with `delete`, the sandbox's
  host directories.

Threat model (honest): this is for development and CI, not for hostile code at scale. The
sandboxed code shares the host kernel (no seccomp filter, no user-namespace remapping when the
server runs as root: sandbox root is host uid 0 without capabilities), sees the host's /usr,
and can exhaust resources the limits do not cover (disk space, PIDs when no cgroup is
available). Host-side file transfers refuse to follow symlinks planted inside the sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pwd
import shutil
import signal
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar, Literal

from harbor.environments.base import BaseEnvironment, ExecResult, SandboxBuildFailedError
from harbor.environments.capabilities import EnvironmentCapabilities, EnvironmentResourceCapabilities
from harbor.environments.options import EnvironmentOptions
from harbor.models.task.config import NetworkMode
from pydantic import Field

from rl360_ext.harbor.envs.limits import SandboxLimits, make_limits, pids_in_namespace

IMPORT_PATH = "rl360_ext.harbor.envs.bwrap:BwrapEnvironment"
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_WRITABLE_DIRS = ("/app", "/logs", "/tests", "/solution", "/tmp")
_ETC_FILES = (
    "passwd",
    "group",
    "hosts",
    "resolv.conf",
    "nsswitch.conf",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "ssl",
    "ca-certificates",
    "alternatives",
    "localtime",
    "bash.bashrc",
    "profile",
    "profile.d",
    "inputrc",
    "terminfo",
    "mime.types",
    "os-release",
    "debian_version",
    "login.defs",
)
_READY_TIMEOUT_S = 30.0


class MemoryLimitExceededError(RuntimeError):
    """The sandbox hit its memory reservation. The name matches Harbor's own: its error policy is
    keyed by exception type name (retry: yes, grade: no, valid reward: no)."""


class BwrapOptions(EnvironmentOptions):
    auto_mounting: bool = Field(default=True, description="Bind the trial's log dirs into the sandbox.")
    sandbox_root: str | None = Field(default=None, description="Host dir for per-trial sandbox dirs.")
    allow_network: bool = Field(default=False, description="Give 'public' network tasks the host network.")
    node_label: str | None = Field(default=None, description="Placement label (logged; one local node).")
    limits: Literal["auto", "cgroup", "watchdog"] = Field(
        default="auto", description="How to enforce limits."
    )


def bwrap_executable() -> str | None:
    return shutil.which("bwrap")


def _inside(root: Path, candidate: Path) -> bool:
    return candidate == root or root in candidate.parents


def _safe_dir(root: Path, relative: PurePosixPath) -> Path:
    """The host directory `root/relative`, created as needed; symlinks and files in the way are
    removed (the sandbox planted them), never followed."""
    current = root
    for part in relative.parts:
        current = current / part
        if current.is_symlink() or (current.exists() and not current.is_dir()):
            current.unlink()
        current.mkdir(exist_ok=True)
    return current


def _safe_target(root: Path, relative: PurePosixPath) -> Path:
    """A host path under `root` for a file transfer into the sandbox, with no symlink on the way."""
    if not relative.parts:
        return root
    target = _safe_dir(root, relative.parent) / relative.name
    if target.is_symlink():
        target.unlink()
    return target


def _copy_tree_in(source: Path, root: Path, relative: PurePosixPath) -> None:
    for path in sorted(source.rglob("*")):
        rel = relative / path.relative_to(source).as_posix()
        if path.is_symlink() or not (path.is_dir() or path.is_file()):
            continue
        target = _safe_target(root, rel)
        if path.is_dir():
            if target.exists() and not target.is_dir():
                target.unlink()
            target.mkdir(exist_ok=True)
        else:
            if target.is_dir():
                shutil.rmtree(target)
            shutil.copy2(path, target)


def _copy_tree_out(source: Path, target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    for path in sorted(source.rglob("*")):
        if path.is_symlink() or not (path.is_dir() or path.is_file()):
            continue
        out = target / path.relative_to(source)
        if path.is_dir():
            out.mkdir(parents=True, exist_ok=True)
        else:
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, out)


class BwrapEnvironment(BaseEnvironment):
    options_model: ClassVar[type[EnvironmentOptions]] = BwrapOptions
    options: BwrapOptions

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._holder: asyncio.subprocess.Process | None = None
        self._init_pid: int | None = None
        self._pidns: int | None = None
        self._limits: SandboxLimits = SandboxLimits()
        self._stopped = False
        kwargs.setdefault("auto_mounting", True)  # the sandbox binds the trial's log dirs
        super().__init__(*args, **kwargs)
        root = Path(self.options.sandbox_root or Path(tempfile.gettempdir()) / "rl360-sandboxes")
        self.sandbox_dir = root / self.session_id
        self.workdir = self.task_env_config.workdir or "/app"

    @staticmethod
    def type() -> str:
        return "bwrap"

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        return EnvironmentCapabilities(disable_internet=True, mounted=True)

    @classmethod
    def resource_capabilities(cls) -> EnvironmentResourceCapabilities:
        return EnvironmentResourceCapabilities(cpu_limit=True, memory_limit=True, fractional_cpus=True)

    def _validate_definition(self) -> None:
        if not self.environment_dir.is_dir():
            raise FileNotFoundError(f"task environment directory not found: {self.environment_dir}")
        setup = self.environment_dir / "setup.sh"
        if setup.exists() and not setup.is_file():
            raise FileNotFoundError(f"{setup} is not a file")

    @property
    def limits_mode(self) -> str:
        return self._limits.mode

    @property
    def network_enabled(self) -> bool:
        return self.options.allow_network and self.network_policy.network_mode == NetworkMode.PUBLIC

    # -- mounts ---------------------------------------------------------------------------------

    def _writable_mounts(self) -> list[tuple[PurePosixPath, Path]]:
        """(sandbox path, host path) of every writable mount, deepest first."""
        mounts = {PurePosixPath(d): self.sandbox_dir / d.strip("/") for d in _WRITABLE_DIRS}
        workdir = PurePosixPath(self.workdir)
        if not any(workdir == m or m in workdir.parents for m in mounts):
            mounts[workdir] = self.sandbox_dir / "workdir"
        for mount in self._mounts:
            if mount["type"] == "bind":
                mounts[PurePosixPath(mount["target"])] = Path(mount["source"])
        return sorted(mounts.items(), key=lambda item: len(item[0].parts), reverse=True)

    def _host_path(self, sandbox_path: str) -> tuple[Path, PurePosixPath]:
        """The writable mount's host root and the path relative to it for a sandbox path."""
        path = PurePosixPath(sandbox_path)
        if not path.is_absolute():
            path = PurePosixPath(self.workdir) / path
        for target, source in self._writable_mounts():
            if path == target or target in path.parents:
                return source, path.relative_to(target)
        raise PermissionError(
            f"{sandbox_path} is not in a writable sandbox directory ({', '.join(_WRITABLE_DIRS)})"
        )

    def _bwrap_argv(self, info_fd: int) -> list[str]:
        argv = [
            bwrap_executable() or "bwrap",
            "--die-with-parent",
            "--new-session",
            "--unshare-all",
            "--cap-drop",
            "ALL",
            "--hostname",
            "sandbox",
            "--ro-bind",
            "/usr",
            "/usr",
        ]
        if self.network_enabled:
            argv.append("--share-net")
        for link in ("bin", "lib", "lib64", "sbin"):
            host = Path("/") / link
            if host.is_symlink():
                argv += ["--symlink", os.readlink(host), f"/{link}"]
            elif host.is_dir():
                argv += ["--ro-bind", str(host), f"/{link}"]
        for name in _ETC_FILES:
            if (Path("/etc") / name).exists():
                argv += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
        argv += ["--proc", "/proc", "--dev", "/dev"]
        for target, source in reversed(self._writable_mounts()):
            source.mkdir(parents=True, exist_ok=True)
            argv += ["--bind", str(source), str(target)]
        argv += ["--remount-ro", "/dev", "--remount-ro", "/"]  # only the binds above stay writable
        argv += [
            "--chdir",
            self.workdir,
            "--clearenv",
            "--setenv",
            "PATH",
            SANDBOX_PATH,
            "--info-fd",
            str(info_fd),
        ]
        return [*argv, "--", "/bin/sh", "-c", "echo ready; exec sleep infinity"]

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self, force_build: bool) -> None:
        if bwrap_executable() is None:
            raise SandboxBuildFailedError("bubblewrap is not installed (apt-get install bubblewrap)")
        if self.sandbox_dir.exists():
            shutil.rmtree(self.sandbox_dir, ignore_errors=True)
        self.sandbox_dir.mkdir(parents=True)
        for name in ("app", "tmp", "tests", "solution", "logs"):
            (self.sandbox_dir / name).mkdir(exist_ok=True)
            (self.sandbox_dir / name).chmod(0o1777 if name == "tmp" else 0o777)
        app_seed = self.environment_dir / "app"
        if app_seed.is_dir():
            _copy_tree_in(app_seed, self.sandbox_dir / "app", PurePosixPath())
        self._limits = make_limits(
            self.options.limits,
            f"rl360-{self.session_id}"[:200],
            self.task_env_config.cpus,
            self.task_env_config.memory_mb,
        )
        await self._launch()
        setup = self.environment_dir / "setup.sh"
        if setup.is_file():
            result = await self._run(
                ["/bin/bash", "-s"], stdin=setup.read_bytes(), cwd=self.workdir, env=self._merge_env(None)
            )
            if result.return_code != 0:
                tail = (result.stderr or result.stdout or "")[-1000:]
                raise SandboxBuildFailedError(f"environment/setup.sh exited {result.return_code}: {tail}")

    async def _launch(self) -> None:
        read_fd, write_fd = os.pipe()
        try:
            self._holder = await asyncio.create_subprocess_exec(
                *self._limits.wrap(self._bwrap_argv(write_fd)),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                pass_fds=(write_fd,),
                start_new_session=True,
            )
        finally:
            os.close(write_fd)
        info = asyncio.StreamReader()
        transport, _ = await asyncio.get_running_loop().connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(info), os.fdopen(read_fd, "rb", 0)
        )
        try:
            info_raw = await asyncio.wait_for(info.read(), timeout=_READY_TIMEOUT_S)
            stdout = self._holder.stdout
            ready = await asyncio.wait_for(stdout.readline(), timeout=_READY_TIMEOUT_S) if stdout else b""
        finally:
            transport.close()
        if ready.strip() != b"ready" or not info_raw:
            stderr = b""
            if self._holder.stderr is not None:
                with contextlib.suppress(TimeoutError):
                    stderr = await asyncio.wait_for(self._holder.stderr.read(4000), timeout=2.0)
            raise SandboxBuildFailedError(
                f"bubblewrap failed to start: {stderr.decode(errors='replace').strip()}"
            )
        started = json.loads(info_raw)
        self._init_pid = int(started["child-pid"])
        self._pidns = int(started["pid-namespace"])
        self._limits.attach(self._pidns)
        self.logger.debug(
            "sandbox %s up: pid %s, limits %s, node %s",
            self.session_id,
            self._init_pid,
            self._limits.mode,
            self.options.node_label,
        )

    async def stop(self, delete: bool) -> None:
        if self._stopped:
            return
        self._stopped = True
        if self._init_pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._init_pid, signal.SIGKILL)  # the kernel then kills the whole PID namespace
        if self._holder is not None:
            try:  # bwrap reaps its sandbox init and exits by itself
                await asyncio.wait_for(self._holder.wait(), timeout=2.0)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self._holder.pid, signal.SIGKILL)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._holder.wait(), timeout=10.0)
        await asyncio.to_thread(self._reap)
        if delete:
            await asyncio.to_thread(shutil.rmtree, self.sandbox_dir, True)

    def _reap(self) -> None:
        self._limits.kill_all()
        if self._pidns is not None:
            for _ in range(250):
                if not pids_in_namespace(self._pidns):
                    break
                time.sleep(0.02)
        self._limits.close()

    # -- commands -------------------------------------------------------------------------------

    def _user_args(self, user: str | int | None) -> list[str]:
        if user is None or user in ("root", 0, "0"):
            return []
        if isinstance(user, int) or str(user).isdigit():
            uid = gid = int(user)
        else:
            entry = pwd.getpwnam(str(user))
            uid, gid = entry.pw_uid, entry.pw_gid
        return [f"--reuid={uid}", f"--regid={gid}", "--clear-groups"]

    def _enter_argv(self, inner: Sequence[str], cwd: str, user: str | int | None) -> list[str]:
        if self._init_pid is None or self._stopped:
            raise RuntimeError(f"sandbox {self.session_id} is not running")
        namespaces = ["--mount", "--uts", "--ipc", "--net", "--pid"]
        if os.geteuid() != 0:
            namespaces += ["--user", "--preserve-credentials"]
        return self._limits.wrap(
            [
                "nsenter",
                f"--target={self._init_pid}",
                *namespaces,
                "--root",
                "--wd",
                "--",
                "/usr/bin/setpriv",
                *self._user_args(user),
                "--bounding-set=-all",
                "--inh-caps=-all",
                "--no-new-privs",
                "--",
                "/usr/bin/env",
                "-C",
                cwd,
                *inner,
            ]
        )

    def _process_env(self, env: dict[str, str] | None) -> dict[str, str]:
        return {
            "PATH": SANDBOX_PATH,
            "HOME": "/tmp",
            "LANG": "C.UTF-8",
            "TERM": "xterm-256color",
            **(env or {}),
        }

    async def _run(
        self,
        inner: Sequence[str],
        *,
        cwd: str,
        env: dict[str, str] | None,
        stdin: bytes | None = None,
        timeout_sec: float | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        """Run `inner` in the sandbox. Output goes to files, so a command that leaves a daemon
        holding its stdout returns when the command itself exits (as `docker exec` does)."""
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            process = await asyncio.create_subprocess_exec(
                *self._enter_argv(inner, cwd, user),
                stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env=self._process_env(env),
                start_new_session=True,
            )
            try:
                await asyncio.wait_for(self._feed_and_wait(process, stdin), timeout=timeout_sec)
            except BaseException:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                with contextlib.suppress(BaseException):
                    await asyncio.shield(process.wait())
                raise
            stdout, stderr = _read_back(out), _read_back(err)
        if self._limits.memory_exceeded():
            raise MemoryLimitExceededError(
                f"sandbox {self.session_id} exceeded its memory reservation "
                f"of {self.task_env_config.memory_mb} MB"
            )
        return ExecResult(
            stdout=stdout,
            stderr=stderr,
            return_code=process.returncode if process.returncode is not None else -1,
        )

    @staticmethod
    async def _feed_and_wait(process: asyncio.subprocess.Process, stdin: bytes | None) -> None:
        if stdin is not None and process.stdin is not None:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                process.stdin.write(stdin)
                await process.stdin.drain()
            process.stdin.close()
        await process.wait()

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        try:
            return await self._run(
                ["/bin/bash", "-c", command],
                cwd=cwd or self.workdir,
                env=self._merge_env(env),
                timeout_sec=timeout_sec,
                user=self._resolve_user(user),
            )
        except TimeoutError as exc:
            raise TimeoutError(f"Command timed out after {timeout_sec} seconds") from exc

    # -- files ----------------------------------------------------------------------------------

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        root, relative = self._host_path(target_path)
        target = _safe_target(root, relative)
        if target.is_dir():
            shutil.rmtree(target)
        await asyncio.to_thread(shutil.copy2, Path(source_path), target)

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        root, relative = self._host_path(target_dir)
        _safe_dir(root, relative)
        await asyncio.to_thread(_copy_tree_in, Path(source_dir), root, relative)

    def _readable(self, sandbox_path: str) -> Path:
        root, relative = self._host_path(sandbox_path)
        real_root = root.resolve()
        real = (root / relative).resolve()
        if not _inside(real_root, real):
            raise PermissionError(f"{sandbox_path} leaves its sandbox directory through a symlink")
        return real

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        source = self._readable(source_path)
        if not source.is_file():
            raise FileNotFoundError(f"{source_path} is not a file in the sandbox")
        if source == Path(target_path).resolve():
            return
        Path(target_path).parent.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(shutil.copy2, source, Path(target_path))

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        source = self._readable(source_dir)
        if not source.is_dir():
            raise FileNotFoundError(f"{source_dir} is not a directory in the sandbox")
        if source == Path(target_dir).resolve():
            return  # a bind mount of the target itself: already on the host
        await asyncio.to_thread(_copy_tree_out, source, Path(target_dir))


def _read_back(file: Any) -> str:
    file.seek(0)
    return file.read().decode(errors="replace")
