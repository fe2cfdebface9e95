"""A host-side demo agent for Harbor: an OpenAI chat loop with one `bash` tool run in the sandbox.

Owns the loop: send the conversation to the session's OpenAI-compatible URL with the official
`openai` client, run every `bash` tool call in the trial's environment (bounded time and output),
feed the results back, and stop when the model answers without a tool call or after `max_turns`.
It records turns and token usage in Harbor's AgentContext and the conversation in
`<logs>/rl360-bash.jsonl`. It does not grade; the task's verifier does.

When the session server refuses a request because the context is full, the agent raises
`ContextLengthExceededError` (named like Harbor's: a policy failure, so the verifier still grades
what the agent left). Other model errors propagate as the openai client raised them.
Use it with `--agent rl360_ext.local.agents:BashToolAgent`.

`SessionChatAgent` is what rl360's demo agents share (this one and `rl360 demo`'s quiz agent in
rl360_ext.local.quiz_agent): the session URL and model, the official client, and one chat
request built from SGLang-style sampling params.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openai
from harbor.agents.base import BaseAgent
from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext

SYSTEM_PROMPT = (
    "You are a coding agent working in a Linux sandbox. Use the bash tool to inspect files, run "
    "commands and make changes. The task's files are in /app. When the task is done, reply without "
    "calling a tool."
)
BASH_TOOL = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a bash command in the task's sandbox; returns the exit code, stdout and stderr.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string", "description": "The command line to run."}},
            "required": ["command"],
        },
    },
}
_OPENAI_PARAMS = ("temperature", "top_p", "seed", "stop")


class ContextLengthExceededError(RuntimeError):
    """The conversation no longer fits the model's context (Harbor's policy: grade, reward counts)."""


def request_params(sampling_params: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """OpenAI chat parameters and `extra_body` for the rest (e.g. top_k) from SGLang-style params."""
    params = {key: sampling_params[key] for key in _OPENAI_PARAMS if key in sampling_params}
    max_tokens = sampling_params.get("max_new_tokens", sampling_params.get("max_tokens"))
    if max_tokens is not None:
        params["max_tokens"] = int(max_tokens)
    used = {*_OPENAI_PARAMS, "max_new_tokens", "max_tokens"}
    extra = {key: value for key, value in sampling_params.items() if key not in used}
    return params, extra


def _is_context_error(exc: openai.BadRequestError) -> bool:
    text = f"{getattr(exc, 'code', '') or ''} {exc}".lower()
    return "context" in text and ("length" in text or "exceed" in text or "window" in text)


def assistant_message(message: Any) -> dict[str, Any]:
    """The assistant turn as plain chat-completions JSON (content plus function tool calls)."""
    turn: dict[str, Any] = {"role": "assistant", "content": message.content or ""}
    calls = [
        {
            "id": call.id,
            "type": "function",
            "function": {"name": call.function.name, "arguments": call.function.arguments},
        }
        for call in message.tool_calls or []
    ]
    if calls:
        turn["tool_calls"] = calls
    return turn


def opening_messages(system_prompt: str, instruction: str) -> list[dict[str, Any]]:
    """The conversation an attempt starts with: the agent's system prompt and the task's instruction."""
    return [{"role": "system", "content": system_prompt}, {"role": "user", "content": instruction}]


class SessionChatAgent(BaseAgent):
    """A Harbor agent that talks to one rl360 session's OpenAI-compatible URL (`api_base`, `api_model`)."""

    def __init__(
        self,
        logs_dir: Path,
        model_name: str | None = None,
        logger: Any = None,
        *,
        api_base: str | None = None,
        api_model: str | None = None,
        sampling_params: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(logs_dir=logs_dir, model_name=model_name, logger=logger, **kwargs)
        if not api_base or not api_model:
            raise ValueError(f"{type(self).__name__} needs api_base and api_model")
        self.api_base = api_base
        self.api_model = api_model
        self.sampling_params = dict(sampling_params or {})

    def version(self) -> str:
        return "1.0.0"

    async def setup(self, environment: BaseEnvironment) -> None:
        self.logs_dir.mkdir(parents=True, exist_ok=True)

    def session_client(self) -> openai.AsyncOpenAI:
        """The official client on the session URL; no retries (a failed call is the attempt's outcome)."""
        return openai.AsyncOpenAI(base_url=self.api_base, api_key="rl360-session", max_retries=0)

    async def chat(
        self,
        client: openai.AsyncOpenAI,
        messages: list[dict[str, Any]],
        tool: dict[str, Any] | None,
        max_tokens: int | None = None,
    ) -> Any:
        """One chat completion offering `tool` (no tools when None), sampled with this agent's
        sampling params; `max_tokens` caps the reply below their budget."""
        params, extra_body = request_params(self.sampling_params)
        if max_tokens is not None:
            params["max_tokens"] = min(int(params.get("max_tokens", max_tokens)), max_tokens)
        tools = {"tools": [tool]} if tool is not None else {}
        return await client.chat.completions.create(
            model=self.api_model, messages=messages, extra_body=extra_body, **tools, **params
        )


class BashToolAgent(SessionChatAgent):
    def __init__(
        self,
        logs_dir: Path,
        model_name: str | None = None,
        logger: Any = None,
        *,
        max_seq_len: int | None = None,
        max_turns: int = 8,
        command_timeout_s: int = 30,
        output_chars: int = 4000,
        **kwargs: Any,
    ) -> None:
        super().__init__(logs_dir=logs_dir, model_name=model_name, logger=logger, **kwargs)
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.max_seq_len = max_seq_len
        self.max_turns = max_turns
        self.command_timeout_s = command_timeout_s
        self.output_chars = output_chars

    @staticmethod
    def name() -> str:
        return "rl360-bash"

    async def _run_tool(self, environment: BaseEnvironment, arguments: str) -> str:
        try:
            command = json.loads(arguments)["command"]
            if not isinstance(command, str):
                raise TypeError("command must be a string")
        except (ValueError, KeyError, TypeError) as exc:
            return f'error: the bash tool takes {{"command": string}}; {exc}'
        try:
            result = await environment.exec(command, timeout_sec=self.command_timeout_s)
        except TimeoutError:
            return f"error: the command did not finish within {self.command_timeout_s} s and was killed"
        text = (
            f"exit code: {result.return_code}\nstdout:\n{result.stdout or ''}\nstderr:\n{result.stderr or ''}"
        )
        return text if len(text) <= self.output_chars else text[: self.output_chars] + "\n...[truncated]"

    async def run(self, instruction: str, environment: BaseEnvironment, context: AgentContext) -> None:
        messages = opening_messages(SYSTEM_PROMPT, instruction)
        context.n_input_tokens = context.n_output_tokens = 0
        context.metadata = {"turns": 0, "stop": "max_turns"}
        log = (self.logs_dir / "rl360-bash.jsonl").open("a")
        client = self.session_client()
        try:
            for turn in range(1, self.max_turns + 1):
                try:
                    reply = await self.chat(client, messages, BASH_TOOL)
                except openai.BadRequestError as exc:
                    if _is_context_error(exc):
                        raise ContextLengthExceededError(str(exc)) from exc
                    raise
                context.metadata["turns"] = turn
                if reply.usage is not None:
                    context.n_input_tokens += reply.usage.prompt_tokens
                    context.n_output_tokens += reply.usage.completion_tokens
                message = reply.choices[0].message
                messages.append(assistant_message(message))
                log.write(json.dumps({"turn": turn, "assistant": messages[-1]}) + "\n")
                if not message.tool_calls:
                    context.metadata["stop"] = "answered"
                    return
                for call in message.tool_calls:
                    output = await self._run_tool(environment, call.function.arguments)
                    messages.append({"role": "tool", "tool_call_id": call.id, "content": output})
                    log.write(json.dumps({"turn": turn, "tool": call.function.name, "output": output}) + "\n")
        finally:
            log.close()
            await client.close()
