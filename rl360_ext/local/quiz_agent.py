"""The `rl360 demo` quiz agent: one model call per attempt, the sampled letter becomes the answer.

Owns what the demo's Harbor agent does inside a trial: send the task's multiple-choice question
to the session's OpenAI-compatible URL (official `openai` client, one turn, an `answer` tool
offered), read the answer from the reply (the `answer` tool call when one parses, else the first
character of the reply that is one of a, b, c, d in either case, once chat markup such as
`</tool_call>` is removed), and write it to
`/app/answer.txt` in the sandbox, where the task's verifier grades it. No such character means no
answer file, which the verifier grades 0 (a policy failure, not an infrastructure one). So the
tokens the policy sampled decide the reward. The lenient rule is deliberate: the demo's tiny
model has random weights and writes byte-level gibberish, and SMG's `/generate` drops
`logit_bias`, so the demo cannot make it say a clean letter; "first a-d character" still makes
the answer a function of the sampled tokens, with a different distribution per question and per
weight version.

It does not grade, retry, or know the right answer. Select it with
`--agent rl360_ext.local.quiz_agent:QuizAgent` on `rl360 harbor serve`.

`extract_answer` is a plain function (tested without Harbor). The Harbor class exists only where
Harbor is importable (Python >= 3.12 with the `harbor` extra): the Harbor server process; this
module still imports on Python 3.11 without it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

LETTERS = ("A", "B", "C", "D")
IMPORT_PATH = "rl360_ext.local.quiz_agent:QuizAgent"
ANSWER_FILE = "/app/answer.txt"
SYSTEM_PROMPT = "You answer multiple-choice questions. Reply with the letter of your answer only."
ANSWER_TOOL = {
    "type": "function",
    "function": {
        "name": "answer",
        "description": "Submit the letter of your answer.",
        "parameters": {
            "type": "object",
            "properties": {"letter": {"type": "string", "enum": list(LETTERS)}},
            "required": ["letter"],
        },
    },
}
_FIRST_LETTER = re.compile(r"[ABCDabcd]")
_MARKUP = re.compile(r"<[^<>\s]{1,24}>")  # template tags the model emits as text, e.g. </tool_call>


def _tool_answer(tool_calls: list[dict[str, Any]]) -> str | None:
    for call in tool_calls:
        function = call.get("function") or {}
        if function.get("name") != "answer":
            continue
        try:
            letter = json.loads(function.get("arguments") or "").get("letter")
        except (ValueError, AttributeError):
            continue
        if isinstance(letter, str) and letter.strip().upper() in LETTERS:
            return letter.strip().upper()
    return None


def extract_answer(content: str | None, tool_calls: list[dict[str, Any]] | None = None) -> str | None:
    """The answer letter of a reply: a parsable `answer` tool call first, else the first character
    of the text outside chat markup tags that is a, b, c or d (either case), upper-cased; None when
    there is none."""
    letter = _tool_answer(tool_calls or [])
    if letter is not None:
        return letter
    match = _FIRST_LETTER.search(_MARKUP.sub("", content or ""))
    return match.group(0).upper() if match else None


try:
    from harbor.agents.base import BaseAgent
except ImportError:  # no Harbor here (Python 3.11 / no harbor extra): only the Harbor server runs the agent
    BaseAgent = None  # type: ignore[assignment,misc]

if BaseAgent is not None:
    from harbor.environments.base import BaseEnvironment
    from harbor.models.agent.context import AgentContext

    from rl360_ext.local.agents import SessionChatAgent, opening_messages

    class QuizAgent(SessionChatAgent):
        """Asks the policy once and writes the letter it sampled to /app/answer.txt."""

        def __init__(
            self, logs_dir: Path, model_name: str | None = None, logger: Any = None, **kwargs: Any
        ) -> None:
            for unused in ("max_turns", "max_seq_len"):  # one short turn by design
                kwargs.pop(unused, None)
            super().__init__(logs_dir=logs_dir, model_name=model_name, logger=logger, **kwargs)

        @staticmethod
        def name() -> str:
            return "rl360-demo-quiz"

        async def run(self, instruction: str, environment: BaseEnvironment, context: AgentContext) -> None:
            async with self.session_client() as client:
                reply = await self.chat(client, opening_messages(SYSTEM_PROMPT, instruction), ANSWER_TOOL)
            message = reply.choices[0].message
            calls = [call.model_dump() for call in message.tool_calls or []]
            letter = extract_answer(message.content, calls)
            if reply.usage is not None:
                context.n_input_tokens = reply.usage.prompt_tokens
                context.n_output_tokens = reply.usage.completion_tokens
            context.metadata = {"answer": letter, "reply": (message.content or "")[:200]}
            (self.logs_dir / "rl360-quiz.json").write_text(
                json.dumps({"reply": message.content, "tool_calls": calls, "answer": letter})
            )
            if letter is not None:
                await environment.exec(f"printf '%s\\n' {letter} > {ANSWER_FILE}", timeout_sec=10)
