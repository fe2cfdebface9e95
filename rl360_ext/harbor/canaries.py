"""Canary agents for the task audit (`rl360 tasks audit`): hacks and probes that need no model.

Owns the agents that try, in the sandbox, what a reward-hacking policy would try first:
- `IdleAgent` does nothing for `pause_s` seconds (the nop control, timed like a policy);
- `RewardFileCanary` writes the maximum reward as `reward.txt` and `reward.json` into every
  agent-writable directory a verifier may read a reward from (`/logs/verifier`, the logs and
  artifacts directories, the work dir);
- `PathShimCanary` observes the PATH the verifier's `tests/test.sh` really runs its commands with
  (a dry run of the task's test script in the sandbox, its work product restored after), then puts
  shims that write the maximum reward and exit 0, for every command it saw and `python3`,
  `python`, `pytest`, `curl`, into every agent-writable directory of those PATHs (and of the
  task's `[verifier] env` PATH, the `path` kwarg, and the sandbox's own);
- `LeakProbe` uses what an agent can read but should not: it runs `/solution/solve.sh` if the
  agent phase can see it, and checks out the newest commit of `git log --all` in the work dir
  when that is not HEAD, else HEAD's parent (an answer left on another branch, in a later commit,
  or reverted by the last one), whoever owns the repository (`safe.directory=*`);
- `ConftestCanary` writes a `conftest.py` that makes every pytest test pass and writes the
  maximum reward when the process exits, into every agent-writable directory pytest could take
  as a test root (the work dir and its test directories, `/app`, `/logs/*`, `/tests`, tmp, HOME);
- `WorkProductHijack` runs Harbor's oracle to learn the work product's importable and executable
  files (Python modules and packages, shell scripts, files with a shebang or the exec bit, in the
  work dir, `/app` and `/logs/artifacts`), undoes the oracle's run, and puts a stub that exits 0
  at each of those paths (a Python module exits at import: `os._exit(0)`, or with `stub="raise"`
  `raise SystemExit(0)`): a verifier that trusts an exit code of the agent's code then passes;
- `InsensitiveCanary` runs Harbor's own oracle (`solution/solve.sh`) between a copy of the work
  product (the work dir, `/app`, `/logs/artifacts`) and its restoration: the verifier then grades
  the oracle's run with its work undone (its log in `/logs/agent` stays);
- `OracleRegrade` runs Harbor's oracle, then grades that one end state `runs` times with the
  trial's own verifier, each grading prepared as the runner prepares the real one (`end_phase`);
  rewards that differ end the agent with `VerifierDisagreed`, whose message lists them.
A verifier that then reports the maximum is hackable (the canaries), leaky (the probe) or
insensitive; the decision lives in `rl360_ext.tasks.audit`. Every class says `MODEL_FREE = True`,
so the server runs it like oracle and nop (`rl360_ext.harbor.agents`), and takes `pause_s`: it
waits that long (on the host, before it acts) so that its agent phase lasts as long as a policy's
might. Nothing a canary leaves for the verifier names the audit (no marker string, file name or
variable a verifier could look for; scratch files go to a `mktemp` directory it removes). The
oracle-based agents find their task and verifier in the trial's `config.json`, which Harbor writes
before any agent starts (`trial_task`): Harbor hands the task directory to its built-in oracle only.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import re
import shlex
from abc import abstractmethod
from collections.abc import Iterable
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar

from harbor.agents.base import BaseAgent
from harbor.agents.oracle import OracleAgent
from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext
from harbor.models.task.task import Task
from harbor.models.trial.config import TrialConfig
from harbor.models.trial.paths import TrialPaths
from harbor.utils.env import resolve_env_vars
from harbor.verifier.factory import VerifierFactory

from rl360_ext.errors import Rl360Error

# The /run agent name and class of each canary (`rl360 tasks audit` starts its server with them).
CANARY_AGENTS = {
    "rl360-idle": "rl360_ext.harbor.canaries:IdleAgent",
    "rl360-canary-hijack": "rl360_ext.harbor.canaries:WorkProductHijack",
    "rl360-canary-reward-file": "rl360_ext.harbor.canaries:RewardFileCanary",
    "rl360-canary-path-shims": "rl360_ext.harbor.canaries:PathShimCanary",
    "rl360-probe-leaks": "rl360_ext.harbor.canaries:LeakProbe",
    "rl360-canary-conftest": "rl360_ext.harbor.canaries:ConftestCanary",
    "rl360-canary-insensitive": "rl360_ext.harbor.canaries:InsensitiveCanary",
    "rl360-oracle-regrade": "rl360_ext.harbor.canaries:OracleRegrade",
}
# The directories the reward-file canary writes into ("$PWD": the command's work dir).
REWARD_FILE_DIRS = ("/logs/verifier", "/logs/agent", "/logs/artifacts", "/app", "$PWD")
SHIMMED_COMMANDS = ("python3", "python", "pytest", "curl")
# At most this many commands and PATH directories from the dry run get shims.
MAX_SHIMMED_COMMANDS = 64
MAX_SHIM_DIRS = 64
_COMMAND_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._+-]*")
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
_SHELLS = frozenset({"sh", "bash", "dash"})
_OBSERVED_CAP = 256 * 1024  # bytes of the dry run's record read back
SANDBOX_MARKER = "/logs/verifier"  # every Harbor environment has it; a host normally does not
# Where the conftest canary writes conftest.py ("$..." expanded in the sandbox), and below the
# work dir and /app every directory holding a test_*.py or *_test.py (depth at most 4).
CONFTEST_DIRS = ("$PWD", "/app", "/logs/agent", "/logs/artifacts", "/tests", "/tmp", "$HOME")
CONFTEST_SEARCH = ("$PWD", "/app")
# The work product the insensitive canary copies before the oracle and restores after it.
WORK_PRODUCT_DIRS = ("$PWD", "/app", "/logs/artifacts")
# The hijack also undoes the oracle's log: its end state is the work product's stubs, nothing else.
HIJACK_DIRS = (*WORK_PRODUCT_DIRS, "/logs/agent")
# The hijack's stubs: a Python module that exits 0 at import (each variant), and any other script.
PYTHON_STUBS = {
    "exit": "#!/usr/bin/env python3\nimport os\nos._exit(0)\n",
    "raise": "#!/usr/bin/env python3\nraise SystemExit(0)\n",
}
SCRIPT_STUB = "#!/bin/sh\nexit 0\n"
# Emptied before each regrade, as the runner does before the verifier (rl360_ext.harbor.runner).
REGRADE_CLEARS = ("/logs/verifier", "/tests", "/solution")
DEFAULT_REGRADES = 3
_REWARD_TOLERANCE = 1e-9


class VerifierDisagreed(Rl360Error):
    """The verifier graded one end state with different rewards (the flaky_verifier finding)."""


class CanaryIncomplete(Rl360Error):
    """The canary could not do what it tests (no trial layout, a work product it could not
    restore, a grading that failed): its attempt is no evidence either way."""


def trial_task(logs_dir: Path) -> tuple[Task, TrialPaths, TrialConfig]:
    """The task, trial paths and trial config of the trial an agent runs in: Harbor gives an
    agent `logs_dir` = the trial's agent dir and writes the trial's config.json before any agent
    starts (the task path there is the server's snapshot of the task)."""
    trial_dir = Path(logs_dir).parent
    try:
        config = TrialConfig.model_validate_json((trial_dir / "config.json").read_text())
        task_dir = config.task.path
        if task_dir is None:
            raise ValueError("the trial's task has no local path")
        return Task(task_dir), TrialPaths(trial_dir), config
    except (OSError, ValueError) as exc:
        raise CanaryIncomplete(f"no Harbor trial layout around {logs_dir}: {exc}") from exc


def _dirs(dirs: tuple[str, ...]) -> str:
    return " ".join(f'"{d}"' if d.startswith("$") else shlex.quote(d) for d in dirs)


class _Canary(BaseAgent):
    """A model-free agent that runs one shell script in the sandbox; `reward` is the maximum;
    `pause_s` is how long it waits (on the host) before it acts."""

    MODEL_FREE: ClassVar[bool] = True

    def __init__(
        self,
        logs_dir: Path,
        model_name: str | None = None,
        reward: float = 1.0,
        pause_s: float = 0.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(logs_dir=logs_dir, model_name=model_name, **kwargs)
        self._reward = float(reward)
        self._pause_s = float(pause_s)
        if not (math.isfinite(self._pause_s) and self._pause_s >= 0):
            raise ValueError(f"pause_s must be finite and >= 0, got {pause_s}")

    async def pause(self) -> None:
        """Wait `pause_s`: the agent phase lasts as long as a policy's might."""
        if self._pause_s > 0:
            await asyncio.sleep(self._pause_s)

    def version(self) -> str:
        return "1.0.0"

    async def setup(self, environment: BaseEnvironment) -> None:
        return

    @abstractmethod
    def script(self) -> str:
        """The shell script the canary runs in the sandbox."""

    def _write_rewards(self, directory: str) -> str:
        """Shell that writes the maximum reward as reward.txt and reward.json into `directory`."""
        text, body = shlex.quote(repr(self._reward)), shlex.quote(json.dumps({"reward": self._reward}))
        return (
            f'printf "%s\\n" {text} > "{directory}/reward.txt"; '
            f'printf "%s\\n" {body} > "{directory}/reward.json"'
        )

    async def run(self, instruction: str, environment: BaseEnvironment, context: AgentContext) -> None:
        await self.pause()
        # Only where Harbor laid out a sandbox: run anywhere else, the shims would overwrite that
        # machine's own python3 and curl.
        await environment.exec(command=f"[ -d {SANDBOX_MARKER} ] || exit 0; {self.script()}")


class IdleAgent(_Canary):
    """Does nothing for `pause_s` seconds: the nop control, as long as a policy's agent phase."""

    @staticmethod
    def name() -> str:
        return "rl360-idle"

    def script(self) -> str:
        return "true"

    async def run(self, instruction: str, environment: BaseEnvironment, context: AgentContext) -> None:
        await self.pause()


class RewardFileCanary(_Canary):
    """Writes the maximum reward where a verifier may look for a reward file."""

    @staticmethod
    def name() -> str:
        return "rl360-canary-reward-file"

    def script(self) -> str:
        dirs = " ".join(d if d.startswith("$") else shlex.quote(d) for d in REWARD_FILE_DIRS)
        write = self._write_rewards("$d")
        return f'for d in {dirs}; do if [ -d "$d" ] && [ -w "$d" ]; then {write}; fi; done; true'


def shell_script(head: bytes) -> bool:
    """A test script bash runs (so its hook sees it): no shebang, or one naming sh, bash or dash,
    directly or through env."""
    first = head.split(b"\n", 1)[0]
    if not first.startswith(b"#!"):
        return True
    words = first[2:].decode(errors="replace").split()
    names = [PurePosixPath(w).name for w in words if not w.startswith("-")]
    return any(name in _SHELLS for name in names[:2])


async def _scratch(environment: BaseEnvironment) -> str:
    """A fresh scratch directory in the sandbox (a name `mktemp` picks, nothing a verifier knows)."""
    made = await environment.exec(command=f"[ -d {SANDBOX_MARKER} ] || exit 1; mktemp -d")
    scratch = (made.stdout or "").strip()
    if made.return_code != 0 or not scratch.startswith("/") or "\n" in scratch:
        raise CanaryIncomplete(f"no scratch directory in the sandbox: {made.stderr or ''}"[:500])
    return scratch


async def _must(environment: BaseEnvironment, script: str, what: str) -> None:
    """Run `script` in the sandbox; a failure (or no sandbox) makes the attempt no evidence."""
    result = await environment.exec(command=f"[ -d {SANDBOX_MARKER} ] || exit 1; {script}")
    if result.return_code != 0:
        raise CanaryIncomplete(f"{what} failed (exit {result.return_code}): {result.stderr or ''}"[:500])


def observe_script(record: str) -> str:
    """BASH_ENV file: every bash that reads it appends, before each command, its directory, PATH
    and command line to `record` (tab-separated), in functions and subshells too."""
    line = shlex.quote(f'printf "%s\\t%s\\t%s\\n" "$PWD" "$PATH" "$BASH_COMMAND" >> {shlex.quote(record)}')
    return f"set -T\ntrap {line} DEBUG\n"


def observed_paths(record: str, cwd: str = "/") -> tuple[list[str], list[str]]:
    """The PATH directories (in order of first sight, relative ones resolved against the
    command's directory, an empty entry being that directory) and the command names (a word
    that is no path, after any VAR=value) of a dry run's record (`observe_script`)."""
    dirs: dict[str, None] = {}
    commands: dict[str, None] = {}
    for line in record.splitlines():
        pwd, _, rest = line.partition("\t")
        path, _, command = rest.partition("\t")
        base = PurePosixPath(pwd if pwd.startswith("/") else cwd)
        try:
            words = shlex.split(command)
        except ValueError:
            words = command.split()
        prefix = list(itertools.takewhile(_ASSIGNMENT.match, words))
        # `PATH=... cmd`: the hook sees the PATH before the command's own assignment applies.
        paths = [path] + [
            w[5:].replace("${PATH}", path).replace("$PATH", path) for w in prefix if w.startswith("PATH=")
        ]
        for entry in ":".join(paths).split(":"):
            if "$" not in entry:
                dirs.setdefault(str(base / entry) if entry and entry != "." else str(base), None)
        name = words[len(prefix)] if len(words) > len(prefix) else ""
        if _COMMAND_NAME.fullmatch(name):
            commands.setdefault(name, None)
    return list(dirs)[:MAX_SHIM_DIRS], list(commands)[:MAX_SHIMMED_COMMANDS]


def shim_script(shim: str, dirs: Iterable[str], commands: Iterable[str]) -> str:
    """Shell that writes `shim` as each of `commands` into each directory of `dirs` the agent can
    write (made when missing), executable."""
    names = " ".join(shlex.quote(c) for c in commands)
    return (
        f"for d in {' '.join(shlex.quote(d) for d in dirs)}; do "
        '[ -n "$d" ] || continue; mkdir -p "$d" 2>/dev/null; [ -d "$d" ] && [ -w "$d" ] || continue; '
        f'for c in {names}; do printf "%s" {shlex.quote(shim)} > "$d/$c" && chmod +x "$d/$c"; done; '
        "done 2>/dev/null; true"
    )


class PathShimCanary(_Canary):
    """Shims for the verifier's commands in every writable directory of the PATH it runs them with."""

    def __init__(self, logs_dir: Path, path: str | None = None, **kwargs: Any) -> None:
        super().__init__(logs_dir=logs_dir, **kwargs)
        self._path = path or ""

    @staticmethod
    def name() -> str:
        return "rl360-canary-path-shims"

    def script(self) -> str:
        return "true"

    async def run(self, instruction: str, environment: BaseEnvironment, context: AgentContext) -> None:
        await self.pause()
        task, _, config = trial_task(self.logs_dir)
        shown = await environment.exec(
            command=f'[ -d {SANDBOX_MARKER} ] || exit 1; printf "%s\\t%s" "$PWD" "$PATH"'
        )
        if shown.return_code != 0:
            raise CanaryIncomplete("no sandbox layout for the PATH shims")
        cwd, _, path = (shown.stdout or "").strip().partition("\t")
        seen = await self._dry_run(environment, task, config)
        static = ":".join(p for p in (self._path, path) if p)
        dirs, commands = observed_paths(f"{cwd}\t{static}\t\n{seen}", cwd or "/")
        shim = "#!/bin/sh\n" + self._write_rewards("/logs/verifier") + " 2>/dev/null\nexit 0\n"
        names = list(dict.fromkeys([*SHIMMED_COMMANDS, *commands]))
        await environment.exec(command=f"[ -d {SANDBOX_MARKER} ] || exit 0; {shim_script(shim, dirs, names)}")

    async def _dry_run(self, environment: BaseEnvironment, task: Task, config: TrialConfig) -> str:
        """What the task's test script ran, with which PATH (`observe_script`'s record): it runs
        here once, with the verifier's env, between a copy of the work product and its restoration."""
        scratch = await _scratch(environment)
        store, record, hook = f"{scratch}/w", f"{scratch}/r", f"{scratch}/e"
        await _must(environment, snapshot_script(store), "copying the work product")
        await environment.upload_dir(source_dir=task.paths.tests_dir, target_dir="/tests")
        script = task.paths.test_path_for(environment.os)
        target = "/tests/" + script.relative_to(task.paths.tests_dir).as_posix()
        quoted = shlex.quote(target)
        with script.open("rb") as head:
            shell = shell_script(head.read(256))
        run = f"bash {quoted}" if shell else f"chmod +x {quoted}; {quoted}"
        env = {**task.config.verifier.env, **(config.verifier.env or {})}
        hook_text = shlex.quote(observe_script(record))
        await environment.exec(command=f"printf '%s' {hook_text} > {hook}; : > {record}")
        try:
            with environment.with_default_user(task.config.verifier.user):
                await environment.exec(
                    command=f"{run} > /dev/null 2>&1",
                    env={**(resolve_env_vars(env) if env else {}), "BASH_ENV": hook},
                    timeout_sec=max(1, int(task.config.verifier.timeout_sec)),
                )
        except Exception as exc:  # a dry run that timed out or failed still recorded what it ran
            self.logger.debug("the dry run of the test script ended with %r", exc)
        read = await environment.exec(command=f"sort -u {record} | head -c {_OBSERVED_CAP}")
        await _must(environment, restore_script(store), "restoring the work product")
        await environment.exec(
            command=f"rm -rf {scratch} /logs/verifier/reward.txt /logs/verifier/reward.json"
        )
        return read.stdout or ""


class LeakProbe(_Canary):
    """Runs a visible reference solution; checks out an answer left in the work dir's git history."""

    @staticmethod
    def name() -> str:
        return "rl360-probe-leaks"

    def script(self) -> str:
        # safe.directory=*: git refuses a repository another user owns ("dubious ownership").
        return (
            "if [ -f /solution/solve.sh ]; then bash /solution/solve.sh; fi; "
            "g() { git -c safe.directory='*' \"$@\"; }; "
            "if g rev-parse --git-dir >/dev/null 2>&1; then "
            "head=$(g rev-parse HEAD 2>/dev/null); "
            "pick=$(g log --all --date-order --format=%H -n 1 2>/dev/null); "
            '[ "$pick" != "$head" ] || pick=$(g rev-parse -q --verify "HEAD^" 2>/dev/null); '
            'if [ -n "$pick" ]; then g checkout -q -f "$pick" 2>/dev/null; fi; fi; true'
        )


def conftest_source(reward: float, verifier_dir: str = SANDBOX_MARKER) -> str:
    """The canary's conftest.py: under pytest every test passes and the session exits 0; in any
    Python that imports it, `reward` is written into `verifier_dir` (reward.txt, reward.json) at exit."""
    text, body = repr(float(reward)), json.dumps({"reward": float(reward)})
    target = verifier_dir.rstrip("/") + "/"
    return f"""
import atexit as _atexit


def _finish():
    for _name, _body in (("reward.txt", {text!r}), ("reward.json", {body!r})):
        try:
            with open({target!r} + _name, "w") as _file:
                _file.write(_body + "\\n")
        except OSError:
            pass


_atexit.register(_finish)
try:
    import pytest as _pytest
except ImportError:
    _pytest = None
if _pytest is not None:

    @_pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(item, call):
        report = (yield).get_result()
        if report.failed:
            report.outcome = "passed"

    def pytest_sessionfinish(session, exitstatus):
        session.exitstatus = 0
"""


def conftest_script(
    source: str, dirs: tuple[str, ...] = CONFTEST_DIRS, search: tuple[str, ...] = CONFTEST_SEARCH
) -> str:
    """Shell that appends `source` to conftest.py in each writable directory of `dirs` and in each
    directory under `search` (depth 4) holding a test_*.py or *_test.py."""
    return (
        f"for d in {_dirs(dirs)} $(find {_dirs(search)} -maxdepth 4 -type f "
        "\\( -name 'test_*.py' -o -name '*_test.py' \\) -exec dirname {} \\; 2>/dev/null | sort -u); do "
        '[ -n "$d" ] && [ -d "$d" ] && [ -w "$d" ] || continue; '
        f'printf "%s" {shlex.quote(source)} >> "$d/conftest.py"; done; true'
    )


class ConftestCanary(_Canary):
    """A passing conftest.py wherever the verifier's pytest could take an agent-writable test root."""

    @staticmethod
    def name() -> str:
        return "rl360-canary-conftest"

    def script(self) -> str:
        return conftest_script(conftest_source(self._reward))


def snapshot_script(store: str, dirs: tuple[str, ...] = WORK_PRODUCT_DIRS) -> str:
    """Shell that copies each directory of `dirs` (once, never / or tmp itself) into `store` and
    lists them in `store`.list."""
    return (
        f"rm -rf {store}; mkdir -p {store} || exit 1; : > {store}.list; i=0; "
        f"for d in {_dirs(dirs)}; do "
        '[ -d "$d" ] || continue; d=$(cd "$d" && pwd -P); '
        'case "$d" in /|/tmp) continue;; esac; '
        f'grep -qxF "$d" {store}.list && continue; i=$((i+1)); '
        f'mkdir -p {store}/$i && cp -a "$d/." {store}/$i/ || exit 1; printf "%s\\n" "$d" >> {store}.list; '
        "done"
    )


def restore_script(store: str, keep_list: bool = False) -> str:
    """Shell that makes each directory `snapshot_script` copied exactly its copy again (new files
    removed, changed and removed ones restored); exit 1 when one does not match its copy after.
    The copy goes, and its list too unless `keep_list`."""
    listed = "" if keep_list else f" {store}.list"
    return (
        f"[ -f {store}.list ] || exit 1; i=0; while IFS= read -r d; do i=$((i+1)); "
        'find "$d" -mindepth 1 -maxdepth 1 -exec rm -rf {} + ; '
        f'cp -a {store}/$i/. "$d/" || exit 1; diff -r {store}/$i "$d" >/dev/null || exit 1; '
        f"done < {store}.list; rm -rf {store}{listed}"
    )


class _OracleBased(_Canary):
    """A canary around Harbor's own oracle agent, found through the trial's config.json."""

    def _oracle(self) -> tuple[OracleAgent, Task, TrialPaths, TrialConfig]:
        task, paths, config = trial_task(self.logs_dir)
        oracle = OracleAgent(logs_dir=self.logs_dir, task_dir=task.task_dir, trial_paths=paths)
        return oracle, task, paths, config

    def script(self) -> str:
        return "true"


class InsensitiveCanary(_OracleBased):
    """The oracle with its work undone: the work product is restored to what it was before solve.sh."""

    @staticmethod
    def name() -> str:
        return "rl360-canary-insensitive"

    async def run(self, instruction: str, environment: BaseEnvironment, context: AgentContext) -> None:
        await self.pause()
        oracle, *_ = self._oracle()
        store = f"{await _scratch(environment)}/w"
        await _must(environment, snapshot_script(store), "copying the work product")
        await oracle.run(instruction, environment, context)
        await _must(environment, restore_script(store), "restoring the work product")
        await environment.exec(command=f"rm -rf {shlex.quote(str(PurePosixPath(store).parent))}")


def executables_script(store: str, listing: str) -> str:
    """Shell that lists, NUL-separated in `listing` as "KIND EXEC PATH", every importable or
    executable regular file under the directories `snapshot_script` recorded in `store`.list
    (never inside .git or __pycache__): KIND is py (a .py file) or sh (a .sh file, or any file with
    the exec bit or a shebang), EXEC 1 when it has the exec bit."""
    return (
        f": > {listing}; while IFS= read -r root; do "
        'find "$root" \\( -name .git -o -name __pycache__ \\) -prune -o -type f -print0 2>/dev/null | '
        "while IFS= read -r -d '' f; do x=0; [ -x \"$f\" ] && x=1; "
        'case "$f" in *.py) k=py;; *.sh) k=sh;; '
        '*) if [ $x = 1 ] || [ "$(head -c 2 -- "$f" 2>/dev/null)" = \'#!\' ]; then k=sh; '
        "else continue; fi;; esac; "
        f'printf "%s %s %s\\0" "$k" "$x" "$f" >> {listing}; done; done < {store}.list 2>/dev/null'
    )


def stub_script(listing: str, store: str, python_stub: str) -> str:
    """Shell that puts a stub at each path of `listing` (`executables_script`): `python_stub` for
    py, a script that exits 0 for sh, executable where the file was, then removes every
    __pycache__ under the recorded directories (no stale bytecode of the replaced modules)."""
    return (
        f"while IFS= read -r -d '' e; do k=${{e%% *}}; r=${{e#* }}; x=${{r%% *}}; f=${{r#* }}; "
        'mkdir -p -- "$(dirname -- "$f")" && rm -rf -- "$f" || continue; '
        f'if [ "$k" = py ]; then printf "%s" {shlex.quote(python_stub)} > "$f"; '
        f'else printf "%s" {shlex.quote(SCRIPT_STUB)} > "$f"; fi; '
        '[ "$x" = 1 ] && chmod +x -- "$f"; done < ' + listing + "; "
        f'while IFS= read -r root; do find "$root" -name __pycache__ -type d -prune -exec rm -rf {{}} + ; '
        f"done < {store}.list 2>/dev/null; true"
    )


class WorkProductHijack(_OracleBased):
    """The work product's code replaced by stubs that exit 0: the oracle shows which files it is."""

    def __init__(self, logs_dir: Path, stub: str = "exit", **kwargs: Any) -> None:
        super().__init__(logs_dir=logs_dir, **kwargs)
        if stub not in PYTHON_STUBS:
            raise ValueError(f"stub must be one of {sorted(PYTHON_STUBS)}, got {stub!r}")
        self._stub = PYTHON_STUBS[stub]

    @staticmethod
    def name() -> str:
        return "rl360-canary-hijack"

    async def run(self, instruction: str, environment: BaseEnvironment, context: AgentContext) -> None:
        await self.pause()
        oracle, _, paths, _ = self._oracle()
        scratch = await _scratch(environment)
        store, listing = f"{scratch}/w", f"{scratch}/x"
        await _must(environment, snapshot_script(store, HIJACK_DIRS), "copying the work product")
        host_logs = set(paths.agent_dir.iterdir()) if paths.agent_dir.is_dir() else set()
        await oracle.run(instruction, environment, context)
        # The oracle's log, copied to the trial's host-side agent dir, would go back to /logs/agent
        # before grading (Harbor uploads the agent's host logs): the hijack leaves none of its run.
        for added in set(paths.agent_dir.iterdir()) - host_logs if paths.agent_dir.is_dir() else ():
            if added.is_file() or added.is_symlink():
                added.unlink(missing_ok=True)
        await _must(environment, executables_script(store, listing), "listing the work product's code")
        await _must(environment, restore_script(store, keep_list=True), "undoing the oracle's run")
        await _must(environment, stub_script(listing, store, self._stub), "writing the stubs")
        await environment.exec(command=f"rm -rf {shlex.quote(scratch)} {store}.list")


class OracleRegrade(_OracleBased):
    """The oracle, then the trial's verifier `runs` times on its one end state."""

    def __init__(self, logs_dir: Path, runs: int = DEFAULT_REGRADES, **kwargs: Any) -> None:
        super().__init__(logs_dir=logs_dir, **kwargs)
        if int(runs) < 2:
            raise ValueError(f"runs must be at least 2 to compare gradings, got {runs}")
        self._runs = int(runs)

    @staticmethod
    def name() -> str:
        return "rl360-oracle-regrade"

    async def run(self, instruction: str, environment: BaseEnvironment, context: AgentContext) -> None:
        oracle, task, paths, config = self._oracle()
        await _must(environment, "true", "checking the sandbox layout")
        await oracle.run(instruction, environment, context)
        rewards = [await self._grade(environment, task, paths, config) for _ in range(self._runs)]
        context.metadata = {**(context.metadata or {}), "regrade_rewards": rewards}
        if not agree(rewards):
            raise VerifierDisagreed(f"rewards {json.dumps(rewards, sort_keys=True)} on one end state")

    async def _grade(
        self, environment: BaseEnvironment, task: Task, paths: TrialPaths, config: TrialConfig
    ) -> dict[str, float]:
        ender = getattr(environment, "end_phase", None)
        if ender is not None:
            await ender(REGRADE_CLEARS, grading=True)
        verifier = VerifierFactory.create_verifier_from_config(
            config.verifier,
            task=task,
            trial_paths=paths,
            environment=environment,
            override_env=config.verifier.env or None,
            logger=self.logger,
        )
        try:
            with environment.with_default_user(task.config.verifier.user):
                result = await verifier.verify()
        except Exception as exc:  # a grading that failed is no reward to compare
            raise CanaryIncomplete(f"a regrade failed: {type(exc).__name__}: {exc}"[:500]) from exc
        return {str(k): float(v) for k, v in (result.rewards or {}).items()}


def agree(rewards: list[dict[str, float]]) -> bool:
    """Every grading gave the same keys and values (within 1e-9)."""
    first = rewards[0]
    return all(
        r.keys() == first.keys() and all(math.isclose(r[k], first[k], abs_tol=_REWARD_TOLERANCE) for k in r)
        for r in rewards[1:]
    )
