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
  when that is not HEAD (an answer left on another branch or in a later commit).
A verifier that then reports the maximum is hackable (the canaries) or leaky (the probe); the
decision lives in `rl360_ext.tasks.audit`. Every class says `MODEL_FREE = True`, so the server
runs it like oracle and nop (`rl360_ext.harbor.agents`).
"""

from __future__ import annotations

import json
import shlex
from abc import abstractmethod
from pathlib import Path
from typing import Any, ClassVar

from harbor.agents.base import BaseAgent
from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext

# The /run agent name and class of each canary (`rl360 tasks audit` starts its server with them).
CANARY_AGENTS = {
    "rl360-canary-reward-file": "rl360_ext.harbor.canaries:RewardFileCanary",
    "rl360-canary-path-shims": "rl360_ext.harbor.canaries:PathShimCanary",
    "rl360-probe-leaks": "rl360_ext.harbor.canaries:LeakProbe",
}
# The directories the reward-file canary writes into ("$PWD": the command's work dir).
REWARD_FILE_DIRS = ("/logs/verifier", "/logs/agent", "/logs/artifacts", "/app", "$PWD")
SHIMMED_COMMANDS = ("python3", "python", "pytest", "curl")
SANDBOX_MARKER = "/logs/verifier"  # every Harbor environment has it; a host normally does not


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
