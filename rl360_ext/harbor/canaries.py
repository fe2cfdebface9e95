"""Canary agents for the task audit (`rl360 tasks audit`): hacks that need no model.

Owns `RewardFileCanary`, a Harbor agent that solves nothing and writes the maximum reward as
`reward.txt` and `reward.json` into every agent-writable directory a verifier may read a reward
from (`/logs/verifier`, the logs and artifacts directories, the work dir). A task whose verifier
then reports the maximum trusts a file the agent wrote: `hackable`. The audit's decision lives
in `rl360_ext.tasks.audit`; this module only runs the hack in the sandbox.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from harbor.agents.base import BaseAgent
from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext

# The /run agent name and class of each canary (`rl360 tasks audit` starts its server with them).
CANARY_AGENTS = {"rl360-canary-reward-file": "rl360_ext.harbor.canaries:RewardFileCanary"}
# The directories the canary writes its reward files into ("$PWD": the command's work dir).
REWARD_FILE_DIRS = ("/logs/verifier", "/logs/agent", "/logs/artifacts", "/app", "$PWD")


class RewardFileCanary(BaseAgent):
    """Writes `reward` (default 1.0) as reward.txt and reward.json where a verifier may look."""

    MODEL_FREE = True  # the server runs it like oracle and nop (rl360_ext.harbor.agents)

    def __init__(self, logs_dir: Path, model_name: str | None = None, reward: float = 1.0, **kwargs: Any) -> None:
        super().__init__(logs_dir=logs_dir, model_name=model_name, **kwargs)
        self._reward = float(reward)

    @staticmethod
    def name() -> str:
        return "rl360-canary-reward-file"

    def version(self) -> str:
        return "1.0.0"

    async def setup(self, environment: BaseEnvironment) -> None:
        return

    async def run(self, instruction: str, environment: BaseEnvironment, context: AgentContext) -> None:
        text = shlex.quote(repr(self._reward))
        body = shlex.quote(json.dumps({"reward": self._reward}))
        dirs = " ".join(d if d.startswith("$") else shlex.quote(d) for d in REWARD_FILE_DIRS)
        command = (
            f'for d in {dirs}; do if [ -d "$d" ] && [ -w "$d" ]; then '
            f'printf "%s\\n" {text} > "$d/reward.txt"; printf "%s\\n" {body} > "$d/reward.json"; fi; done; true'
        )
        await environment.exec(command=command)
