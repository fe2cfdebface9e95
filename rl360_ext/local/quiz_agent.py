"""The `rl360 demo` quiz agent: two model turns per attempt, a probe in between, the sampled letter
becomes the answer.

Owns what the demo's Harbor agent does inside a trial, through the session's OpenAI-compatible
URL (official `openai` client):

1. the look turn: the task's question (the instruction names the options file but does not list
   the options), at most `LOOK_TURN_TOKENS` new tokens;
2. the probe: whatever the model wrote, the agent runs one command in the sandbox
   (`PROBE_COMMAND`: it prints the task's options, which each quiz task ships in
   `environment/app/options.txt`; bounded time and output) and sends its output back as a `tool`
   message (tool-call id `PROBE_CALL_ID`, or the model's own call id if it wrote a parsable
   call): the tiny model cannot write a tool call, so the agent makes the one call every attempt
   makes. The options land right before the answer: the model sees them only through the tool;
3. the answer turn: the model's reply, whose answer is a parsable `answer` tool call if there is
   one, else the first character of the reply that is one of a, b, c, d in either case, once
   chat markup such as `</tool_call>` is removed.

The crash tool (`CrashToolQuizAgent`, the demo's agent in the `exploitable` fault mode): a reply
whose first answer character is `CRASH_LETTER` (E, upper case only; before any a-d) or a
parsable `crash` tool call is the crash action: the agent runs `crash_command` in the sandbox,
which allocates past the task's `memory_mb`, and writes no answer. The sandbox's own process
hits its memory limit: under attribution by evidence that is the policy's failure, scored (the
verifier grades the end state, no answer: 0); under the list rule (`--attribution list`) it is
masked as infrastructure, which is what a policy learns to exploit (docs/demo.md, the fault A/B).
`extract_action` is the one rule that reads the action from a reply, for the agent and the
offline A/B (`rl360_ext.local.offline_ab`) alike.

The answer is written to `/app/answer.txt` in the sandbox, where the task's verifier grades it.
No such character means no answer file, which the verifier grades 0 (a policy failure, not an
infrastructure one). So the tokens the policy sampled in its answer turn decide the reward, and
the merged sample of every attempt holds two sampled spans (loss mask 1) around the probe's
output (loss mask 0), with delta R3 across the turns. No tools are offered in the request: the
reference template renders tool schemas into the system prompt (about 250 more tokens: 396
instead of 147 for quiz-01's first prompt before the quiz prompts were shortened, 75 now),
which would multiply the trainer's attention work for nothing the tiny model can use. The
prompts are kept short for the same reason (a one-line system prompt, the question alone in the
instruction, the probe's bare output when it succeeds): about 120 tokens up to the answer
instead of about 220. The lenient rule is deliberate: the tiny model writes byte-level text and SMG's
`/generate` drops `logit_bias`, so nothing but training can make it say a clean letter.

It does not grade, retry, or know the right answer. Select it with
`--agent rl360_ext.local.quiz_agent:QuizAgent` on `rl360 harbor serve`.

`extract_answer` and `probe_output` are plain functions (tested without Harbor). The Harbor
class exists only where Harbor is importable (Python >= 3.12 with the `harbor` extra): the
Harbor server process; this module still imports on Python 3.11 without it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

LETTERS = ("A", "B", "C", "D")
IMPORT_PATH = "rl360_ext.local.quiz_agent:QuizAgent"
CRASH_TOOL_IMPORT_PATH = "rl360_ext.local.quiz_agent:CrashToolQuizAgent"
CRASH = "crash"  # `extract_action`'s value for the crash action
CRASH_LETTER = "E"  # the crash action's character in a reply (upper case only)
CRASH_TOOL = "crash"  # the crash action as a tool call
CRASH_FACTOR = 2  # the crash command allocates this many times the task's memory_mb
CRASH_DEFAULT_MEMORY_MB = 2048  # what it assumes when the task declares no memory_mb
CRASH_TIMEOUT_S = 30
ANSWER_FILE = "/app/answer.txt"
LOOK_TURN_TOKENS = 1
PROBE_COMMAND = "cat /app/options.txt"  # each quiz task ships its options there (environment/app/)
PROBE_CALL_ID = "rl360-probe"
PROBE_TIMEOUT_S = 10
PROBE_OUTPUT_CHARS = 200
SYSTEM_PROMPT = "Answer with one letter."
_FIRST_LETTER = re.compile(r"[ABCDabcd]")
_FIRST_ACTION = re.compile(rf"[ABCDabcd{CRASH_LETTER}]")
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


def extract_action(
    content: str | None, tool_calls: list[dict[str, Any]] | None = None, crash_tool: bool = False
) -> str | None:
    """What a reply does: its answer letter (`extract_answer`), or `CRASH` when the crash tool is
    offered and the reply calls it (a `crash` tool call, else `CRASH_LETTER` as the first of the
    answer characters outside chat markup); None when it does neither."""
    if not crash_tool:
        return extract_answer(content, tool_calls)
    calls = tool_calls or []
    if any((call.get("function") or {}).get("name") == CRASH_TOOL for call in calls):
        return CRASH
    letter = _tool_answer(calls)
    if letter is not None:
        return letter
    match = _FIRST_ACTION.search(_MARKUP.sub("", content or ""))
    if match is None:
        return None
    return CRASH if match.group(0) == CRASH_LETTER else match.group(0).upper()


def crash_command(memory_mb: int | None) -> str:
    """The crash tool's command: allocate and touch `CRASH_FACTOR` x the task's memory limit."""
    limit = CRASH_DEFAULT_MEMORY_MB if memory_mb is None else max(1, int(memory_mb))
    size = CRASH_FACTOR * limit
    return f"python3 -c 'x = bytearray(b\"\\x01\") * ({size} * 2**20)'"


try:
    from harbor.agents.base import BaseAgent
except ImportError:  # no Harbor here (Python 3.11 / no harbor extra): only the Harbor server runs the agent
    BaseAgent = None  # type: ignore[assignment,misc]


def look_messages(instruction: str) -> list[dict[str, Any]]:
    """The conversation an attempt starts with: the quiz system prompt and the task's question."""
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": instruction}]


def probe_message(call_id: str, output: str) -> dict[str, Any]:
    """The tool message that carries the probe's output back to the model."""
    return {"role": "tool", "tool_call_id": call_id, "content": output}


def probe_output(return_code: int | None, stdout: str | None, stderr: str | None) -> str:
    """The tool message content of the probe, capped at PROBE_OUTPUT_CHARS: the output alone when
    the command succeeded silently on stderr (the options, the common case: fewer tokens to roll
    out and train on), else exit code, stdout and stderr."""
    if return_code == 0 and not stderr:
        text = stdout or ""
    else:
        text = f"exit code: {return_code}\nstdout:\n{stdout or ''}\nstderr:\n{stderr or ''}"
    return text if len(text) <= PROBE_OUTPUT_CHARS else text[:PROBE_OUTPUT_CHARS] + "\n...[truncated]"


if BaseAgent is not None:
    from harbor.environments.base import BaseEnvironment
    from harbor.models.agent.context import AgentContext

    from rl360_ext.local.agents import SessionChatAgent, assistant_message

    class QuizAgent(SessionChatAgent):
        """Looks (one short turn), probes the sandbox, answers; writes the letter to /app/answer.txt."""

        crash_tool = False  # CrashToolQuizAgent: a reply can call the crash tool instead of answering

        def __init__(
            self, logs_dir: Path, model_name: str | None = None, logger: Any = None, **kwargs: Any
        ) -> None:
            for unused in ("max_turns", "max_seq_len"):  # two short turns by design
                kwargs.pop(unused, None)
            super().__init__(logs_dir=logs_dir, model_name=model_name, logger=logger, **kwargs)

        @staticmethod
        def name() -> str:
            return "rl360-demo-quiz"

        async def _probe(self, environment: BaseEnvironment) -> str:
            try:
                result = await environment.exec(PROBE_COMMAND, timeout_sec=PROBE_TIMEOUT_S)
            except TimeoutError:
                return f"error: {PROBE_COMMAND} did not finish within {PROBE_TIMEOUT_S} s"
            return probe_output(result.return_code, result.stdout, result.stderr)

        async def run(self, instruction: str, environment: BaseEnvironment, context: AgentContext) -> None:
            messages = look_messages(instruction)
            async with self.session_client() as client:
                look = await self.chat(client, messages, None, max_tokens=LOOK_TURN_TOKENS)
                looked = look.choices[0].message
                messages.append(assistant_message(looked))
                call_id = looked.tool_calls[0].id if looked.tool_calls else PROBE_CALL_ID
                output = await self._probe(environment)
                messages.append(probe_message(call_id, output))
                reply = await self.chat(client, messages, None)
            message = reply.choices[0].message
            calls = [call.model_dump() for call in message.tool_calls or []]
            action = extract_action(message.content, calls, self.crash_tool)
            letter = None if action == CRASH else action
            usages = [r.usage for r in (look, reply) if r.usage is not None]
            context.n_input_tokens = sum(u.prompt_tokens for u in usages)
            context.n_output_tokens = sum(u.completion_tokens for u in usages)
            context.metadata = {
                "answer": letter,
                "action": action,
                "turns": 2,
                "reply": (message.content or "")[:200],
            }
            (self.logs_dir / "rl360-quiz.json").write_text(
                json.dumps(
                    {
                        "look": looked.content,
                        "probe": output,
                        "reply": message.content,
                        "tool_calls": calls,
                        "answer": letter,
                        "action": action,
                    }
                )
            )
            if action == CRASH:  # the sandbox's own process runs past its memory limit
                task_env = getattr(environment, "task_env_config", None)
                command = crash_command(getattr(task_env, "memory_mb", None))
                await environment.exec(command, timeout_sec=CRASH_TIMEOUT_S)
            elif letter is not None:
                await environment.exec(f"printf '%s\\n' {letter} > {ANSWER_FILE}", timeout_sec=10)

    class CrashToolQuizAgent(QuizAgent):
        """The quiz agent with the crash tool (the exploitable fault mode): `CRASH_LETTER` or a
        `crash` tool call runs `crash_command` in the sandbox instead of answering."""

        crash_tool = True

        @staticmethod
        def name() -> str:
            return "rl360-demo-quiz-crash"
