"""An instant SGLang stand-in: answers `/generate` at once with a fixed reply, for load benchmarks.

Owns a backend whose own cost is as close to nothing as HTTP allows, so a benchmark of the
session server in front of it measures the session server: `/generate` returns the same short
reply (its token ids, end-of-turn token last, as `finish_reason: stop`), output log-probs, and,
when asked, `routed_experts` of exactly the shape SGLang sends (`[prompt + output - 1 -
routed_experts_start_len, layers, top_k]` int32, base64) filled with a fixed pattern; plus the
info routes the session server and SMG probe. `/v1/chat/completions` with `input_ids` answers as
SGLang does for Miles' session server (the same reply as `message.content`, `choices[0].meta_info`
with `return_meta_info`, `usage`), so Miles' server can be benchmarked in front of the same
backend. It samples nothing and keeps no state per request. It is not a model
(`rl360_ext.reference.engine.engine` is) and validates only what it reads.
"""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response

from rl360_ext.reference.engine.errors import EngineError, RequestError
from rl360_ext.reference.engine.tokenizer import build_tokenizer
from rl360_ext.templates.markup import TURN_END

REPLY = "Done: the tests pass."
MODEL_NAME = "rl360-instant"


@dataclass(frozen=True)
class InstantConfig:
    """What the instant backend reports and returns."""

    layers: int = 4
    """MoE layers in `routed_experts` (and /model_info)."""
    top_k: int = 2
    """Experts per token in `routed_experts`."""
    experts: int = 8
    """Experts per layer reported in /model_info (routing ids stay below it)."""
    reply: str = REPLY
    """The text every `/generate` answers with (the end-of-turn token follows it)."""

    def __post_init__(self) -> None:
        if min(self.layers, self.top_k, self.experts) < 1 or self.top_k > self.experts:
            raise ValueError(f"need layers, top_k, experts >= 1 and top_k <= experts, got {self}")


class InstantBackend:
    """The reply's tokens and the routing pattern, computed once; `generate` only slices them."""

    def __init__(self, config: InstantConfig) -> None:
        self.config = config
        tokenizer = build_tokenizer()
        self.vocab_size = tokenizer.get_vocab_size()
        end = tokenizer.token_to_id(TURN_END)
        self.output_ids = [*tokenizer.encode(config.reply).ids, end]
        self.token_texts = {token: tokenizer.id_to_token(token) for token in self.output_ids}
        self.end_token_id = end
        self._row = (np.arange(config.layers * config.top_k, dtype=np.int32) % config.experts).reshape(
            1, config.layers, config.top_k
        )

    def routed_experts(self, rows: int) -> str:
        routing = np.broadcast_to(self._row, (max(rows, 0), self.config.layers, self.config.top_k))
        return base64.b64encode(np.ascontiguousarray(routing, dtype="<i4").tobytes()).decode("ascii")

    def generate(self, body: dict[str, Any]) -> dict[str, Any]:
        started = time.monotonic()
        input_ids = body.get("input_ids")
        if not isinstance(input_ids, list):
            raise ValueError("input_ids must be a list of token ids")
        params = body.get("sampling_params") or {}
        limit = params.get("max_new_tokens")
        output = self.output_ids if not isinstance(limit, int) else self.output_ids[: max(limit, 0)]
        finish = (
            {"type": "stop", "matched": self.end_token_id}
            if output and output[-1] == self.end_token_id
            else {"type": "length", "length": len(output)}
        )
        meta: dict[str, Any] = {
            "id": body.get("rid") or "instant",
            "finish_reason": finish,
            "prompt_tokens": len(input_ids),
            "completion_tokens": len(output),
            "cached_tokens": max(len(input_ids) - 1, 0),
            "weight_version": "default",
        }
        if body.get("return_logprob"):
            meta["output_token_logprobs"] = [[-0.5, token, None] for token in output]
        if body.get("return_routed_experts"):
            start = body.get("routed_experts_start_len") or 0
            meta["routed_experts"] = self.routed_experts(len(input_ids) + len(output) - 1 - int(start))
        meta["e2e_latency"] = time.monotonic() - started
        text = self.config.reply if finish["type"] == "stop" else ""
        return {"text": text, "output_ids": list(output), "meta_info": meta}

    def chat_completion(self, body: dict[str, Any]) -> dict[str, Any]:
        """SGLang's `chat.completion` for a pretokenized request (`input_ids`, as Miles sends it)."""
        params = {"max_new_tokens": body["max_tokens"]} if isinstance(body.get("max_tokens"), int) else {}
        generated = self.generate(
            {
                "input_ids": body.get("input_ids"),
                "rid": body.get("rid"),
                "sampling_params": params,
                "return_logprob": bool(body.get("logprobs")),
                "return_routed_experts": bool(body.get("return_routed_experts")),
                "routed_experts_start_len": body.get("routed_experts_start_len"),
            }
        )
        meta = generated["meta_info"]
        output = generated["output_ids"]
        finish = meta["finish_reason"]["type"]
        choice: dict[str, Any] = {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": generated["text"],
                "reasoning_content": None,
                "tool_calls": None,
            },
            "logprobs": (
                {
                    "content": [
                        {"token": self.token_texts[t], "logprob": -0.5, "top_logprobs": []} for t in output
                    ]
                }
                if body.get("logprobs")
                else None
            ),
            "finish_reason": finish,
            "matched_stop": meta["finish_reason"].get("matched"),
        }
        if body.get("return_meta_info"):
            choice["meta_info"] = meta
        return {
            "id": meta["id"],
            "object": "chat.completion",
            "created": int(time.time()),
            "model": MODEL_NAME,
            "choices": [choice],
            "usage": {
                "prompt_tokens": meta["prompt_tokens"],
                "completion_tokens": meta["completion_tokens"],
                "total_tokens": meta["prompt_tokens"] + meta["completion_tokens"],
            },
        }


def create_app(config: InstantConfig | None = None) -> FastAPI:
    backend = InstantBackend(config or InstantConfig())
    app = FastAPI(title="rl360 instant SGLang stand-in")

    @app.exception_handler(EngineError)
    async def refused(_: Request, err: EngineError) -> Response:
        return Response(orjson.dumps(err.to_json()), status_code=err.status, media_type="application/json")

    info = {
        "model_path": MODEL_NAME,
        "is_generation": True,
        "weight_version": "default",
        "num_layers": backend.config.layers,
        "num_experts": backend.config.experts,
        "num_experts_per_tok": backend.config.top_k,
        "vocab_size": backend.vocab_size,
        "eos_token_id": backend.end_token_id,
    }

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/model_info")
    async def model_info() -> dict[str, Any]:
        return info

    @app.get("/server_info")
    async def server_info() -> dict[str, Any]:
        return {**info, "served_model_name": MODEL_NAME, "enable_return_routed_experts": True}

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": "instant"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": MODEL_NAME, "object": "model", "owned_by": "sglang"}]}

    @app.post("/generate")
    async def generate(request: Request) -> Response:
        try:
            body = await request.json()
            if not isinstance(body, dict):
                raise ValueError("the body must be a JSON object")
            return Response(orjson.dumps(backend.generate(body)), media_type="application/json")
        except ValueError as exc:
            raise RequestError("body", str(exc)) from exc

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        try:
            body = await request.json()
            if not isinstance(body, dict):
                raise ValueError("the body must be a JSON object")
            return Response(orjson.dumps(backend.chat_completion(body)), media_type="application/json")
        except ValueError as exc:
            raise RequestError("body", str(exc)) from exc

    return app
