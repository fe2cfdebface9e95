"""A test-only Harbor agent that plays a policy: it runs the shell script its `agent_kwargs` give,
in the sandbox, as the agent phase. Registered only by tests (`--agent policy=...:ScriptPolicy`),
so they can leave any end state a policy could (a hanging module, a fork bomb, a full disk) on a
task whose oracle leaves the known-good one."""

from __future__ import annotations

from typing import Any

from harbor.agents.base import BaseAgent
from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext

IMPORT_PATH = "integration_tests.harbor.policy_agent:ScriptPolicy"


class ScriptPolicy(BaseAgent):
    MODEL_FREE = True

    def __init__(self, *args: Any, script: str = "true", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.script = script

    @staticmethod
    def name() -> str:
        return "script-policy"

    def version(self) -> str:
        return "1"

    async def setup(self, environment: BaseEnvironment) -> None:
        return None

    async def run(self, instruction: str, environment: BaseEnvironment, context: AgentContext) -> None:
        await environment.exec(self.script)
