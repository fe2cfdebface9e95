"""One request as the tiny engine runs it (`Run`: its mutable state) and the SGLang `/generate`
response body it becomes (`response_body`: the text with its stop trimmed, meta_info with
finish_reason, cached tokens, weight-version spans, logprobs and routed experts)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rl360_ext.errors import Rl360Error
from rl360_ext.reference.engine.model import KVState
from rl360_ext.reference.engine.protocol import GenerateRequest, encode_routed_experts

Decode = Callable[..., str]  # the engine's `decode(ids, skip_special_tokens=...)`


class Aborted(Rl360Error):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass
class Run:
    """One in-flight request's mutable state."""

    rid: str
    request: GenerateRequest
    tokens: list[int]
    kv: KVState | None = None
    routing: list[np.ndarray] = field(default_factory=list)
    cache_epoch: int = -1
    cached_tokens: int = 0
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    output_top: list[list[list[Any]]] = field(default_factory=list)
    output_versions: list[str] = field(default_factory=list)
    input_logprobs: list[list[Any]] | None = None
    input_top: list[Any] | None = None
    abort_message: str | None = None
    waiting: bool = False
    retractions: int = 0  # times a retract pause dropped this request's KV (SGLang's num_retractions)
    stop: Any = None  # the stop the last sampled token matched (None: not stopped)


def logprob_text(decode: Decode, token: int, with_text: bool) -> str | None:
    return decode([token]) if with_text else None


def top_entries(decode: Decode, logprobs: np.ndarray, count: int, with_text: bool) -> list[list[Any]]:
    """The `count` most likely tokens as [[logprob, token_id, text|None], ...], best first."""
    best = np.argsort(-logprobs, kind="stable")[:count]
    return [[float(logprobs[t]), int(t), logprob_text(decode, int(t), with_text)] for t in best]


def response_body(
    run: Run, finish: dict[str, Any], elapsed: float, decode: Decode, weight_version: str
) -> dict[str, Any]:
    """SGLang's `/generate` response body for a finished run (`weight_version`: the engine's now)."""
    request = run.request
    params = request.sampling
    text_ids = run.output_ids
    matched = finish.get("matched")
    if finish["type"] == "stop" and isinstance(matched, int) and not params.no_stop_trim:
        text_ids = run.output_ids[:-1]
    text = decode(text_ids, skip_special_tokens=params.skip_special_tokens)
    if finish["type"] == "stop" and isinstance(matched, str) and not params.no_stop_trim:
        cut = text.rfind(matched)
        if cut >= 0:
            text = text[:cut]
    prompt_tokens, completion_tokens = len(request.input_ids), len(run.output_ids)
    spans = _version_spans(run.output_versions, weight_version)
    meta: dict[str, Any] = {
        "id": run.rid,
        "finish_reason": finish,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "cached_tokens": run.cached_tokens,
        "weight_version": spans[-1]["version"],  # SGLang: the last visible span's version
        "weight_versions": spans,
        "num_retractions": run.retractions,
        "e2e_latency": elapsed,
    }
    if request.return_logprob:
        meta["output_token_logprobs"] = [
            [lp, token, logprob_text(decode, token, request.return_text_in_logprobs)]
            for lp, token in zip(run.output_logprobs, run.output_ids, strict=True)
        ]
        if run.input_logprobs is not None:
            meta["input_token_logprobs"] = run.input_logprobs
        if request.top_logprobs_num:
            meta["output_top_logprobs"] = run.output_top
            if run.input_top is not None:
                meta["input_top_logprobs"] = run.input_top
    if request.return_routed_experts:
        rows = prompt_tokens + completion_tokens - 1
        routing = np.concatenate(run.routing, axis=0)[:rows] if run.routing else np.zeros((0,), np.int32)
        meta["routed_experts"] = encode_routed_experts(routing[request.routed_experts_start_len :])
    body: dict[str, Any] = {"text": text, "output_ids": list(run.output_ids), "meta_info": meta}
    if request.return_prompt_token_ids:
        body["prompt_token_ids"] = list(request.input_ids)
    return body


def _version_spans(versions: list[str], current: str) -> list[dict[str, Any]]:
    """Runs of equal weight versions over output token indices: [{version, start, end}] (end exclusive)."""
    if not versions:
        return [{"version": current, "start": 0, "end": 0}]
    spans: list[dict[str, Any]] = []
    for index, version in enumerate(versions):
        if spans and spans[-1]["version"] == version:
            spans[-1]["end"] = index + 1
        else:
            spans.append({"version": version, "start": index, "end": index + 1})
    return spans
