"""Harbor's adapter: `BwrapEnvironment`, a Harbor `BaseEnvironment` over one bwrap sandbox per trial.

Owns the trial's lifecycle (start with the task's `app/` seed and `setup.sh`, phase ends, stop),
the limits its processes hit by phase (`limit_hits`) and running commands in the sandbox as its
user (`exec`, `exec_and_end`). Select it with `--env bwrap`; the design and its promises are in
docs/harbor.md ("The bubblewrap sandbox")."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import stat
from collections.abc import Iterator, Sequence
from pathlib import PurePosixPath
from typing import Any, ClassVar

from harbor.environments.base import BaseEnvironment, ExecResult, SandboxBuildFailedError
from harbor.environments.capabilities import EnvironmentCapabilities, EnvironmentResourceCapabilities
from harbor.environments.options import EnvironmentOptions
from harbor.models.task.config import NetworkMode

from rl360_ext.errors import Rl360Error
from rl360_ext.harbor.envs import nofollow, seccomp, warm
from rl360_ext.harbor.envs.bwrap.capture import _Capture
from rl360_ext.harbor.envs.bwrap.files import SandboxFiles
from rl360_ext.harbor.envs.bwrap.layout import _GRADED_DIRS, SANDBOX_PATH, SCRATCH_DIR
from rl360_ext.harbor.envs.bwrap.network import slirp4netns_executable
from rl360_ext.harbor.envs.bwrap.options import BwrapConfig
from rl360_ext.harbor.envs.bwrap.sandbox import WarmSpare, bwrap_executable
from rl360_ext.harbor.envs.bwrap.tracer import _PYTHON, _TRACER, EXIT_TAG, reported_exit
from rl360_ext.harbor.envs.limits import remount_tmpfs, rlimit_argv
from rl360_ext.outcomes.attribution import LimitHit, Phase, Resource

_FULL_BYTES = 64 * 1024  # a tmpfs with less free than this is full (no useful write fits)
_PIDS_SLACK = 64  # RLIMIT_NPROC above a cgroup's pids.max: the cgroup refuses first, and counts it
# Inside the sandbox: read the command's environment (NUL-separated KEY=VALUE) from fd $1, close
# it, and exec the command with exactly that environment.
_ENV_LOADER = (
    'fd=$1; shift; entries=(); while IFS= read -r -d "" entry; do entries+=("$entry"); done <&"$fd"; '
    'exec {fd}<&-; exec /usr/bin/env -i -- "${entries[@]}" "$@"'
)
_SETUP_SCRIPT_CAP = 1 << 20


class MemoryLimitExceededError(Rl360Error, RuntimeError):
    """A process of the current phase hit the sandbox's memory reservation (raised by every
    command of that phase once it happened; a later phase starts clean). The name matches
    Harbor's own: its error policy is keyed by exception type name (retry: yes, grade: no,
    valid reward: no)."""


class BwrapEnvironment(SandboxFiles, BaseEnvironment):
    options_model: ClassVar[type[EnvironmentOptions]] = BwrapConfig
    options: BwrapConfig

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._stopped = False
        self._grading = False
        self._holder_due = False  # a phase ended: the next command starts a fresh holder first
        self._holder_lock = asyncio.Lock()
        self._phase = Phase.ENVIRONMENT_SETUP
        self._hits: list[LimitHit] = []
        self._oom_base = 0  # the limits' OOM kill count when this phase started
        self._pids_base = 0  # the limits' refused-fork count when this phase started
        super().__init__(*args, **kwargs)
        if self._host_mounts:
            raise ValueError("the bwrap environment binds no host directories; remove the mounts")
        self._init_sandbox(self.options, self.session_id, self.task_env_config.workdir or "/app")

    @staticmethod
    def type() -> str:
        return "bwrap"

    @classmethod
    def check_server_options(cls, kwargs: dict[str, Any]) -> None:
        """Refuse, when a server starts, options no trial could run with: a ValueError naming
        the option (a bad value, or network allowed where slirp4netns is missing)."""
        options = cls.parse_options(kwargs)
        if isinstance(options, BwrapConfig) and options.allow_network and slirp4netns_executable() is None:
            raise ValueError(
                "--env-kwarg allow_network=true needs slirp4netns (apt-get install slirp4netns): "
                "the bwrap environment never gives a sandbox the host's network namespace"
            )

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        # mounted=False: nothing of the trial directory is visible in the sandbox; Harbor copies
        # the log directories out through download_dir.
        return EnvironmentCapabilities(disable_internet=True, mounted=False)

    @classmethod
    def resource_capabilities(cls) -> EnvironmentResourceCapabilities:
        return EnvironmentResourceCapabilities(cpu_limit=True, memory_limit=True, fractional_cpus=True)

    def _validate_definition(self) -> None:
        try:
            info = os.lstat(self.environment_dir)
        except FileNotFoundError as exc:
            raise FileNotFoundError(f"task environment directory not found: {self.environment_dir}") from exc
        if not stat.S_ISDIR(info.st_mode):
            raise FileNotFoundError(f"{self.environment_dir} is not a directory")
        setup = self.environment_dir / "setup.sh"
        with contextlib.suppress(FileNotFoundError):
            if not stat.S_ISREG(os.lstat(setup).st_mode):
                raise FileNotFoundError(f"{setup} is not a regular file")

    @property
    def limits_mode(self) -> str:
        return self._limits.mode

    @property
    def pids_mode(self) -> str:
        """How the process limit applies: "cgroup+rlimit" or "rlimit" (see limits.py)."""
        return self._limits.pids_mode

    @property
    def network_enabled(self) -> bool:
        return self.options.allow_network and self.network_policy.network_mode == NetworkMode.PUBLIC

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self, force_build: bool) -> None:
        """Start the sandbox; a start that fails tears down what it made (the tmpfs, the cgroup,
        any process) before it raises."""
        try:
            await self._start()
        except BaseException:
            with contextlib.suppress(Exception):
                await asyncio.shield(self.stop(delete=True))
            raise
        self._observe()
        self._enter_phase(Phase.AGENT)

    async def _start(self) -> None:
        if bwrap_executable() is None:
            raise SandboxBuildFailedError("bubblewrap is not installed (apt-get install bubblewrap)")
        if os.geteuid() != 0:
            raise SandboxBuildFailedError(
                "the bwrap environment runs as root: it maps the sandbox to an unprivileged uid"
            )
        if self.network_enabled and slirp4netns_executable() is None:
            raise SandboxBuildFailedError(
                "this task asks for network (network_mode public) and the server allows it, but "
                "slirp4netns is not installed (apt-get install slirp4netns): the bwrap environment "
                "never gives a sandbox the host's network namespace"
            )
        if self.options.seccomp:
            try:
                seccomp.prepare()
            except seccomp.SeccompUnsupported as exc:
                raise SandboxBuildFailedError(f"{exc}; run with --env-kwarg seccomp=false") from exc
        await self._sandbox_up()
        app_seed = self.environment_dir / "app"
        if app_seed.is_dir() and not app_seed.is_symlink():
            with nofollow.opened_dir(self.files_dir, PurePosixPath("app")) as app_fd:
                await asyncio.to_thread(nofollow.copy_tree_in, app_seed, app_fd, owner=self.owner)
        setup = self.environment_dir / "setup.sh"
        try:
            script = nofollow.read_regular(setup, _SETUP_SCRIPT_CAP)
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            raise SandboxBuildFailedError(f"environment/setup.sh cannot be read: {exc}") from exc
        result = await self._run(
            ["/bin/bash", "-s"], stdin=script, cwd=self.workdir, env=self._merge_env(None)
        )
        if result.return_code != 0:
            tail = (result.stderr or result.stdout or "")[-1000:]
            raise SandboxBuildFailedError(f"environment/setup.sh exited {result.return_code}: {tail}")

    async def _sandbox_up(self) -> None:
        """Take a warm spare of this sandbox's shape if the loop's pool holds one, else start the
        sandbox here; then have the pool make a spare for the next trial of this shape. A task
        with network is never warm: its slirp4netns starts with its holder."""
        cpus, memory_mb = self.task_env_config.cpus, self.task_env_config.memory_mb
        if self.options.warm_sandboxes == 0 or self.network_enabled:
            await self._create(cpus, memory_mb)
            return
        pool = warm.pool(self.options.warm_sandboxes, self.options.warm_max_age_s)
        shape = (self.options.model_dump_json(), self.workdir, cpus, memory_mb)
        spare = pool.take(shape)
        if isinstance(spare, WarmSpare):
            spare.hand_to(self)
            self.logger.debug("sandbox %s: took warm sandbox %s", self.session_id, self.sandbox_dir.name)
        else:
            await self._create(cpus, memory_mb)
        pool.refill(shape, functools.partial(WarmSpare.started, self.options, self.workdir, cpus, memory_mb))

    async def end_phase(self, clear: Sequence[str] = (), *, grading: bool = False) -> None:
        """Kill every process the sandbox runs, empty the sandbox directories in `clear`, and have
        the next command start a fresh holder (fresh namespaces) over the same files first: what
        one phase left running (an agent's background writer) or left behind in the next phase's
        directories cannot reach it. With `grading` (the verifier is next, `Phase.VERIFIER`
        begins): the tmpfs grows by the verifier's reserve (`verifier_disk_mb`,
        `verifier_inodes`), HOME and tmp (/tmp, but for a workdir inside it) are emptied as
        well, the workdir, /tests and /logs get their owner and owner permissions back
        (`nofollow.reset_tree`), and every later command runs with PYTHONNOUSERSITE=1.
        Back-to-back phase ends start one holder, at the next command. Raises
        `nofollow.SandboxTreeError` for a tree past the walks' caps."""
        if self._stopped or (self._init_pid is None and not self._holder_due):
            return
        async with self._holder_lock:
            await self._end_processes()
            if grading and not self._grading:
                self._grading = True
                self._enter_phase(Phase.VERIFIER)
            await asyncio.to_thread(self._empty_all, tuple(clear), grading)

    async def kill_processes(self) -> None:
        """Kill every process the sandbox runs now (its PID namespace), files untouched; the next
        command starts a fresh holder (`exec_and_end` ends with it)."""
        if self._stopped:
            return
        async with self._holder_lock:
            await self._end_processes()

    async def _end_processes(self) -> None:
        """(Holding the holder lock.) Kill the holder's PID namespace, if one runs, and note what
        limits the phase hit."""
        if self._init_pid is not None:
            await self._kill_sandbox()
            self._limits.detach()
        self._holder_due = True
        self._observe()

    def limit_hits(self) -> list[LimitHit]:
        """Every limit the sandbox's own processes hit in this trial, in the order it was seen,
        once per phase and resource: `Phase.ENVIRONMENT_SETUP` (start and setup.sh),
        `Phase.AGENT` (until grading starts) or `Phase.VERIFIER` (after `end_phase(grading=True)`);
        `Resource.MEMORY` (an OOM kill, or the watchdog's), `Resource.PIDS` (a fork the cgroup's
        pids.max refused; none is seen under RLIMIT_NPROC alone), `Resource.DISK` or
        `Resource.INODES` (the tmpfs was full after a command or at a phase's end),
        `Resource.OUTPUT` (a command's output was cut to `max_output_kb`). Kept after `stop`."""
        return list(self._hits)

    def _hit(self, resource: Resource, detail: str) -> None:
        if not any(hit.phase == self._phase and hit.resource == resource for hit in self._hits):
            self._hits.append(LimitHit(self._phase, resource, detail))

    def _enter_phase(self, phase: Phase) -> None:
        self._phase = phase
        self._oom_base = self._limits.oom_kills()
        self._pids_base = self._limits.pids_refusals()

    def _memory_exceeded(self) -> bool:
        """Whether a process of this phase was killed for the memory limit."""
        return self._limits.oom_kills() > self._oom_base

    def _observe(self) -> None:
        """Note the limits the sandbox's processes hit in this phase so far (`limit_hits`)."""
        if (killed := self._limits.oom_kills() - self._oom_base) > 0:
            self._hit(Resource.MEMORY, f"{killed} killed at {self.task_env_config.memory_mb} MB")
        if (refused := self._limits.pids_refusals() - self._pids_base) > 0:
            self._hit(Resource.PIDS, f"{refused} forks refused at pids.max {self.options.max_pids}")
        try:
            disk = os.statvfs(self.files_dir)
        except OSError:
            return
        if disk.f_blocks and disk.f_bavail * disk.f_frsize < _FULL_BYTES:
            self._hit(Resource.DISK, f"{disk.f_bavail * disk.f_frsize} bytes free")
        if disk.f_files and disk.f_favail == 0:
            self._hit(Resource.INODES, f"0 of {disk.f_files} inodes free")

    async def start_due_holder(self) -> None:
        """Start the holder a phase end left due, if any (once, whichever comes first: this or a
        command); a start that fails or is cancelled leaves no process behind."""
        if not self._holder_due:
            return
        async with self._holder_lock:
            if not self._holder_due or self._stopped:
                return
            try:
                await self._launch()
            except BaseException:
                with contextlib.suppress(Exception):
                    await asyncio.shield(self._kill_sandbox())
                raise
            self._holder_due = False

    def _empty_all(self, clear: Sequence[str], grading: bool) -> None:
        """`end_phase`'s host work, in one trip off the event loop: empty each of `clear`; with
        `grading`, give the tmpfs the verifier's reserve, empty HOME and tmp but for a workdir
        inside it, give the graded directories back to the sandbox user and the memory the
        files hold back to the verifier."""
        if grading:
            remount_tmpfs(
                self.files_dir,
                (self.options.disk_mb + self.options.verifier_disk_mb) * 2**20,
                self._walk_cap(),
            )
        for sandbox_path in clear:
            self._empty(sandbox_path)
        if grading:
            self._empty(SCRATCH_DIR, self._work_in_scratch())
            self._reset_graded()
            # the files left on the tmpfs are memory charged to the sandbox's cgroup: the
            # verifier gets its reservation on top of them (and of its own disk reserve)
            disk = os.statvfs(self.files_dir)
            used = (disk.f_blocks - disk.f_bfree) * disk.f_frsize
            self._limits.grow_memory(used + self.options.verifier_disk_mb * 2**20)

    def _walk_cap(self) -> int:
        """Inodes the sandbox's tmpfs holds at most while grading: no walk of it visits more."""
        return self.options.max_inodes + self.options.verifier_inodes

    def _reset_graded(self) -> None:
        """Owner and owner permissions back on the workdir, /tests and /logs (whole trees), the
        writable mount roots and the workdir's parents, and /tmp 1777 again: a phase's chmod 000
        cannot lock the verifier (the sandbox user) out of them."""
        for _, source in self._writable_mounts():
            with nofollow.opened_dir(source) as fd:
                nofollow.reset_owner(fd, self.owner)
        with nofollow.opened_dir(self.files_dir, PurePosixPath(SCRATCH_DIR.strip("/"))) as fd:
            os.fchmod(fd, 0o1777)
        root, relative = self._host_path(self.workdir)
        for depth in range(1, len(relative.parts)):
            parent = PurePosixPath(*relative.parts[:depth])
            with nofollow.opened_dir(root, parent, create=True, owner=self.owner) as fd:
                nofollow.reset_owner(fd, self.owner)
        for sandbox_path in (self.workdir, *_GRADED_DIRS):
            root, relative = self._host_path(sandbox_path)
            with nofollow.opened_dir(root, relative, create=True, owner=self.owner) as fd:
                nofollow.reset_tree(fd, self.owner, self._walk_cap())

    def _work_in_scratch(self) -> str | None:
        """The top-level name under /tmp that holds the workdir, if the workdir is inside /tmp."""
        relative = PurePosixPath(self.workdir).relative_to("/")
        scratch = PurePosixPath(SCRATCH_DIR).relative_to("/")
        if scratch in relative.parents:
            return relative.relative_to(scratch).parts[0]
        return None

    def _empty(self, sandbox_path: str, keep: str | None = None) -> None:
        root, relative = self._host_path(sandbox_path)
        with nofollow.opened_dir(root, relative, create=True, owner=self.owner) as fd:
            for name in os.listdir(fd):
                if name != keep:
                    nofollow.remove_entry(fd, name)

    async def stop(self, delete: bool) -> None:
        if self._stopped:
            return
        self._stopped = True
        async with self._holder_lock:  # a holder being started is waited for, then killed
            await self._kill_sandbox()
        self._observe()
        await self._remove(delete)

    # -- commands -------------------------------------------------------------------------------

    def _enter_argv(
        self, inner: Sequence[str], cwd: str, env_fd: int, prefix: Sequence[str] = ()
    ) -> list[str]:
        """argv that runs `inner` in the sandbox as its user, in `cwd`, with exactly the
        environment in `env_fd` (NUL-separated KEY=VALUE entries, applied only inside); `prefix`
        runs first, on the host side (the seccomp loader)."""
        if self._init_pid is None or self._stopped:
            raise RuntimeError(f"sandbox {self.session_id} is not running")
        uid = self.options.sandbox_uid
        return self._limits.wrap(
            [
                *prefix,
                "/usr/bin/nsenter",
                f"--target={self._init_pid}",
                "--mount",
                "--uts",
                "--ipc",
                "--net",
                "--pid",
                "--root",
                "--wd",
                "--",
                "/usr/bin/setpriv",
                f"--reuid={uid}",
                f"--regid={uid}",
                "--clear-groups",
                "--",
                "/usr/bin/nsenter",
                "--target=1",
                "--user",
                "--preserve-credentials",
                "--",
                *rlimit_argv(self._nproc(), self.options.disk_mb * 2**20),
                "/usr/bin/setpriv",
                "--no-new-privs",
                "--",
                "/usr/bin/env",
                "-i",
                "-C",
                cwd,
                f"PATH={SANDBOX_PATH}",
                "/bin/bash",
                "-c",
                _ENV_LOADER,
                "rl360-env",
                str(env_fd),
                *inner,
            ]
        )

    def _nproc(self) -> int:
        """RLIMIT_NPROC of a command: `max_pids`, or above it where the cgroup's pids.max applies
        (the cgroup then refuses first, and counts the refusal for `limit_hits`)."""
        return self.options.max_pids + (_PIDS_SLACK if self._limits.pids_cgroup else 0)

    def _process_env(self, env: dict[str, str] | None) -> dict[str, str]:
        """The environment a command sees inside the sandbox (never that of the host-side
        processes that enter it: those run with PATH only, so no task env reaches root)."""
        grading = {"PYTHONNOUSERSITE": "1"} if self._grading else {}
        return {
            "PATH": SANDBOX_PATH,
            "HOME": SCRATCH_DIR,
            "LANG": "C.UTF-8",
            "TERM": "xterm-256color",
            **grading,
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
    ) -> ExecResult:
        """Run `inner` in the sandbox. stdout and stderr are pipes read while the command runs,
        at most `max_output_kb` kept of each; the command returns when it exits, even if a
        daemon it left still holds its output (as `docker exec` does)."""
        await self.start_due_holder()
        entries = b"".join(f"{key}={value}".encode() + b"\0" for key, value in self._process_env(env).items())
        cap = self.options.max_output_kb * 1024
        loader = seccomp.exec_prefix() if self.options.seccomp else None
        with _env_file(entries) as env_fd, _Capture(cap) as out, _Capture(cap) as err:
            try:
                process = await asyncio.create_subprocess_exec(
                    *self._enter_argv(inner, cwd, env_fd, loader or ()),
                    stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
                    stdout=out.write_fd,
                    stderr=err.write_fd,
                    env={"PATH": SANDBOX_PATH},  # root runs nsenter: no task-chosen PATH, LD_PRELOAD, ...
                    cwd="/",  # the server's cwd would reach the sandbox as PWD
                    pass_fds=(env_fd,),
                    start_new_session=True,
                    # the host-side process loads the filter before it execs nsenter (the loader
                    # prefix, else this hook): the command and everything it starts inherit it
                    preexec_fn=seccomp.install if self.options.seccomp and loader is None else None,
                )
            finally:
                out.started()
                err.started()
            try:
                await asyncio.wait_for(self._feed_and_wait(process, stdin), timeout=timeout_sec)
            except BaseException:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                with contextlib.suppress(BaseException):
                    await asyncio.shield(process.wait())
                self._observe()
                raise
            stdout, stderr = out.text(), err.text()
            if out.kept.dropped or err.kept.dropped:
                self._hit(Resource.OUTPUT, f"{out.kept.dropped + err.kept.dropped} bytes dropped")
        self._observe()
        if self._memory_exceeded():
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
        """Run `command` with bash in the sandbox as the sandbox user (`user` is not honoured:
        there is one unprivileged user)."""
        return await self._command(["/bin/bash", "-c", command], cwd, env, timeout_sec)

    async def _command(
        self, inner: list[str], cwd: str | None, env: dict[str, str] | None, timeout_sec: int | None
    ) -> ExecResult:
        """`_run` for Harbor's `exec` calls: the task's env merged in, Harbor's timeout message."""
        try:
            return await self._run(
                inner, cwd=cwd or self.workdir, env=self._merge_env(env), timeout_sec=timeout_sec
            )
        except TimeoutError as exc:
            raise TimeoutError(f"Command timed out after {timeout_sec} seconds") from exc

    async def exec_and_end(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        """Run `command` as `exec` does, and end every process of the sandbox as its shell exits:
        the shell runs traced, stopped as it begins to exit (before its descriptors close), and
        every process of the sandbox's user is killed then; the host then kills the sandbox's
        PID namespace (`kill_processes`), also when the command fails, times out or is
        cancelled. So nothing the command started acts after it exited, even one that watches
        it go. The verifier runs the test script this way (exec'd by the shell, so the script
        is the traced process). The return code is the command's own."""
        traced = os.path.exists(_PYTHON)
        inner = [_PYTHON, "-I", "-S", "-c", _TRACER, EXIT_TAG] if traced else []
        try:
            result = await self._command([*inner, "/bin/bash", "-c", command], cwd, env, timeout_sec)
        finally:
            await asyncio.shield(self.kill_processes())
        return reported_exit(result) if traced else result


@contextlib.contextmanager
def _env_file(entries: bytes) -> Iterator[int]:
    """A command's environment as an anonymous in-memory file (memfd: no inode on the host's
    disk to create and journal per command), at offset 0, closed on exit."""
    fd = os.memfd_create("rl360-env", os.MFD_CLOEXEC)
    try:
        view = memoryview(entries)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
        yield fd
    finally:
        os.close(fd)
