"""Canary agents for the task audit (`rl360 tasks audit`): hacks and probes that need no model.

Owns the agents that try, in the sandbox, what a reward-hacking policy would try first:
- `RewardFileCanary` writes the maximum reward as `reward.txt` and `reward.json` into every
  agent-writable directory a verifier may read a reward from (`/logs/verifier`, the logs and
  artifacts directories, the work dir);
- `PathShimCanary` puts `python3`, `python`, `pytest` and `curl` shims that write the maximum
  reward and exit 0 into every agent-writable directory of the verifier's PATH (the task's
  `[verifier] env` PATH, which the audit passes as the `path` kwarg, and the sandbox's own);
- `LeakProbe` uses what an agent can read but should not: it runs `/solution/solve.sh` if the
  agent phase can see it, and checks out the newest commit of `git log --all` in the work dir
  when that is not HEAD (an answer left on another branch or in a later commit);
- `ConftestCanary` writes a `conftest.py` that makes every pytest test pass and writes the
  maximum reward when the process exits, into every agent-writable directory pytest could take
  as a test root (the work dir and its test directories, `/app`, `/logs/*`, `/tests`, tmp, HOME);
- `InsensitiveCanary` runs Harbor's own oracle (`solution/solve.sh`) between a copy of the work
  product (the work dir, `/app`, `/logs/artifacts`) and its restoration: the verifier then grades
  the oracle's run with its work undone (its log in `/logs/agent` stays);
- `OracleRegrade` runs Harbor's oracle, then grades that one end state `runs` times with the
  trial's own verifier, each grading prepared as the runner prepares the real one (`end_phase`);
  rewards that differ end the agent with `VerifierDisagreed`, whose message lists them.
A verifier that then reports the maximum is hackable (the canaries), leaky (the probe) or
insensitive; the decision lives in `rl360_ext.tasks.audit`. Every class says `MODEL_FREE = True`,
so the server runs it like oracle and nop (`rl360_ext.harbor.agents`). The oracle-based agents
find their task and verifier in the trial's `config.json`, which Harbor writes before any agent
starts (`trial_task`): Harbor hands the task directory to its built-in oracle only.
"""

from __future__ import annotations

import json
import math
import shlex
from abc import abstractmethod
from pathlib import Path
from typing import Any, ClassVar

from harbor.agents.base import BaseAgent
from harbor.agents.oracle import OracleAgent
from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext
from harbor.models.task.task import Task
from harbor.models.trial.config import TrialConfig
from harbor.models.trial.paths import TrialPaths
from harbor.verifier.factory import VerifierFactory

# The /run agent name and class of each canary (`rl360 tasks audit` starts its server with them).
CANARY_AGENTS = {
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
SANDBOX_MARKER = "/logs/verifier"  # every Harbor environment has it; a host normally does not
# Where the conftest canary writes conftest.py ("$..." expanded in the sandbox), and below the
# work dir and /app every directory holding a test_*.py or *_test.py (depth at most 4).
CONFTEST_DIRS = ("$PWD", "/app", "/logs/agent", "/logs/artifacts", "/tests", "/tmp", "$HOME")
CONFTEST_SEARCH = ("$PWD", "/app")
# The work product the insensitive canary copies before the oracle and restores after it.
WORK_PRODUCT_DIRS = ("$PWD", "/app", "/logs/artifacts")
# Emptied before each regrade, as the runner does before the verifier (rl360_ext.harbor.runner).
REGRADE_CLEARS = ("/logs/verifier", "/tests", "/solution")
DEFAULT_REGRADES = 3
_REWARD_TOLERANCE = 1e-9


class VerifierDisagreed(Exception):
    """The verifier graded one end state with different rewards (the flaky_verifier finding)."""


class CanaryIncomplete(Exception):
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
    """A model-free agent that runs one shell script in the sandbox; `reward` is the maximum."""

    MODEL_FREE: ClassVar[bool] = True

    def __init__(
        self, logs_dir: Path, model_name: str | None = None, reward: float = 1.0, **kwargs: Any
    ) -> None:
        super().__init__(logs_dir=logs_dir, model_name=model_name, **kwargs)
        self._reward = float(reward)

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
        # Only where Harbor laid out a sandbox: run anywhere else, the shims would overwrite that
        # machine's own python3 and curl.
        await environment.exec(command=f"[ -d {SANDBOX_MARKER} ] || exit 0; {self.script()}")


class RewardFileCanary(_Canary):
    """Writes the maximum reward where a verifier may look for a reward file."""

    @staticmethod
    def name() -> str:
        return "rl360-canary-reward-file"

    def script(self) -> str:
        dirs = " ".join(d if d.startswith("$") else shlex.quote(d) for d in REWARD_FILE_DIRS)
        write = self._write_rewards("$d")
        return f'for d in {dirs}; do if [ -d "$d" ] && [ -w "$d" ]; then {write}; fi; done; true'


class PathShimCanary(_Canary):
    """Shims for common verifier commands in every writable directory of the verifier's PATH."""

    def __init__(self, logs_dir: Path, path: str | None = None, **kwargs: Any) -> None:
        super().__init__(logs_dir=logs_dir, **kwargs)
        self._path = path or ""

    @staticmethod
    def name() -> str:
        return "rl360-canary-path-shims"

    def script(self) -> str:
        shim = "#!/bin/sh\n" + self._write_rewards("/logs/verifier") + " 2>/dev/null\nexit 0\n"
        commands = " ".join(SHIMMED_COMMANDS)
        return (
            f"dirs={shlex.quote(self._path)}:$PATH; set -f; IFS=: ; for d in $dirs; do "
            '[ -n "$d" ] || continue; mkdir -p "$d" 2>/dev/null; [ -d "$d" ] && [ -w "$d" ] || continue; '
            f'for c in {commands}; do printf "%s" {shlex.quote(shim)} > "$d/$c" && chmod +x "$d/$c"; done; '
            "done; true"
        )


class LeakProbe(_Canary):
    """Runs a visible reference solution; checks out an answer left in the work dir's git history."""

    @staticmethod
    def name() -> str:
        return "rl360-probe-leaks"

    def script(self) -> str:
        return (
            "if [ -f /solution/solve.sh ]; then bash /solution/solve.sh; fi; "
            "if git rev-parse --git-dir >/dev/null 2>&1; then "
            "newest=$(git log --all --date-order --format=%H -n 1 2>/dev/null); "
            'if [ -n "$newest" ] && [ "$newest" != "$(git rev-parse HEAD 2>/dev/null)" ]; then '
            'git checkout -q -f "$newest" 2>/dev/null; fi; fi; true'
        )


def conftest_source(reward: float, verifier_dir: str = SANDBOX_MARKER) -> str:
    """The canary's conftest.py: under pytest every test passes and the session exits 0; in any
    Python that imports it, `reward` is written into `verifier_dir` (reward.txt, reward.json) at exit."""
    text, body = repr(float(reward)), json.dumps({"reward": float(reward)})
    target = verifier_dir.rstrip("/") + "/"
    return f"""
# rl360 tasks audit: conftest.py canary (a verifier that imports this is hackable)
import atexit as _rl360_atexit


def _rl360_write_max_reward():
    for _name, _body in (("reward.txt", {text!r}), ("reward.json", {body!r})):
        try:
            with open({target!r} + _name, "w") as _file:
                _file.write(_body + "\\n")
        except OSError:
            pass


_rl360_atexit.register(_rl360_write_max_reward)
try:
    import pytest as _rl360_pytest
except ImportError:
    _rl360_pytest = None
if _rl360_pytest is not None:

    @_rl360_pytest.hookimpl(hookwrapper=True)
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


def restore_script(store: str) -> str:
    """Shell that makes each directory `snapshot_script` copied exactly its copy again (new files
    removed, changed and removed ones restored); exit 1 when one does not match its copy after."""
    return (
        f"[ -f {store}.list ] || exit 1; i=0; while IFS= read -r d; do i=$((i+1)); "
        'find "$d" -mindepth 1 -maxdepth 1 -exec rm -rf {} + ; '
        f'cp -a {store}/$i/. "$d/" || exit 1; diff -r {store}/$i "$d" >/dev/null || exit 1; '
        f"done < {store}.list; rm -rf {store} {store}.list"
    )


class _OracleBased(_Canary):
    """A canary around Harbor's own oracle agent, found through the trial's config.json."""

    def _oracle(self) -> tuple[OracleAgent, Task, TrialPaths, TrialConfig]:
        task, paths, config = trial_task(self.logs_dir)
        oracle = OracleAgent(logs_dir=self.logs_dir, task_dir=task.task_dir, trial_paths=paths)
        return oracle, task, paths, config

    def script(self) -> str:
        return "true"

    async def _exec(self, environment: BaseEnvironment, script: str, what: str) -> None:
        result = await environment.exec(command=f"[ -d {SANDBOX_MARKER} ] || exit 1; {script}")
        if result.return_code != 0:
            raise CanaryIncomplete(f"{what} failed (exit {result.return_code}): {result.stderr or ''}"[:500])


class InsensitiveCanary(_OracleBased):
    """The oracle with its work undone: the work product is restored to what it was before solve.sh."""

    STORE = "/tmp/.rl360-work-product"

    @staticmethod
    def name() -> str:
        return "rl360-canary-insensitive"

    async def run(self, instruction: str, environment: BaseEnvironment, context: AgentContext) -> None:
        oracle, *_ = self._oracle()
        await self._exec(environment, snapshot_script(self.STORE), "copying the work product")
        await oracle.run(instruction, environment, context)
        await self._exec(environment, restore_script(self.STORE), "restoring the work product")


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
        await self._exec(environment, "true", "checking the sandbox layout")
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
