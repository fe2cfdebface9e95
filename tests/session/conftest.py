"""Unit-test fixtures for the session core: the tiny tokenizer and a scripted /generate backend.

The scripted backend is only for unit tests of `SessionCore` (no HTTP); integration tests use the
real tiny engine. It follows the protocol's shapes exactly: it returns the JSON body SGLang
would, parsed by the real `GenerateResult.from_json`, with routing rows for positions
[routed_experts_start_len, prompt + output - 1) whose expert ids are a function of the position.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from rl360_ext.reference.engine.tokenizer import load_tiny_tokenizer
from rl360_ext.session.core import SessionCore, SessionCoreConfig
from rl360_ext.session.samples.routing import RoutingShape
from rl360_ext.session.tito import TitoRenderer
from rl360_ext.sglang.client import EngineError, GenerateResult
from rl360_ext.templates.render import ChatRenderer

SHAPE = RoutingShape(layers=3, top_k=2, num_experts=300)


def expert_ids(positions: np.ndarray, shape: RoutingShape = SHAPE) -> np.ndarray:
    """The scripted backend's routing: a fixed function of (position, layer, slot)."""
    p = positions[:, None, None]
    layer = np.arange(shape.layers)[None, :, None]
    slot = np.arange(shape.top_k)[None, None, :]
    return ((p * 7 + layer * 13 + slot * 29) % shape.num_experts).astype(np.int32)


@dataclass
class Step:
    """One scripted engine answer: output text (tokenized) or an error."""

    text: str = "ok<|im_end|>"
    finish: dict[str, Any] = field(default_factory=lambda: {"type": "stop", "matched": 2})
    error: EngineError | None = None
    extra_rows: int = 0
    cached_tokens: int = 0
    output_ids: list[int] | None = None  # sent instead of the text's tokens (a protocol-breaking engine)


class ScriptedBackend:
    def __init__(self, renderer: ChatRenderer) -> None:
        self.renderer = renderer
        self.steps: list[Step] = []
        self.calls: list[dict[str, Any]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.delay_s = 0.0

    def push(self, *steps: Step) -> None:
        self.steps.extend(steps)

    async def generate(self, input_ids: list[int], sampling_params: dict[str, Any] | None = None, **kw: Any):
        self.calls.append({"input_ids": list(input_ids), "sampling_params": sampling_params, **kw})
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay_s)
        finally:
            self.in_flight -= 1
        step = self.steps.pop(0) if self.steps else Step()
        if step.error is not None:
            raise step.error
        output = self.renderer.encode(step.text) if step.output_ids is None else list(step.output_ids)
        logprobs = [[-0.5 - 0.01 * i, t, None] for i, t in enumerate(output)]
        meta: dict[str, Any] = {
            "id": kw.get("rid"),
            "finish_reason": step.finish,
            "prompt_tokens": len(input_ids),
            "completion_tokens": len(output),
            "cached_tokens": step.cached_tokens,
            "weight_version": "v1",
            "output_token_logprobs": logprobs,
        }
        k = kw.get("top_logprobs_num", 0)
        if k:  # the sampled token first, then the next ids down (SGLang's [logprob, token_id, text])
            meta["output_top_logprobs"] = [[[lp - j, t + j, None] for j in range(k)] for lp, t, _ in logprobs]
        start = kw.get("routed_experts_start_len", 0)
        if kw.get("return_routed_experts"):
            end = len(input_ids) + len(output) - 1 + step.extra_rows
            rows = expert_ids(np.arange(start, end))
            meta["routed_experts"] = base64.b64encode(rows.astype("<i4").tobytes()).decode()
        body = {"text": "", "output_ids": output, "meta_info": meta, "prompt_token_ids": list(input_ids)}
        return GenerateResult.from_json(
            body, routed_experts_start_len=start if kw.get("return_routed_experts") else 0, top_logprobs_num=k
        )


@pytest.fixture(scope="session")
def renderer() -> ChatRenderer:
    return ChatRenderer(load_tiny_tokenizer())


@pytest.fixture
def make_core(renderer: ChatRenderer) -> Callable[..., tuple[SessionCore, ScriptedBackend]]:
    def make(**config: Any) -> tuple[SessionCore, ScriptedBackend]:
        backend = ScriptedBackend(renderer)
        config.setdefault("r3", True)
        if config["r3"]:
            config.setdefault("routing_shape", SHAPE)
        return SessionCore(TitoRenderer(renderer), backend, SessionCoreConfig(**config)), backend

    return make
