"""SGLang native `/generate` request parsing and validation for the tiny engine (HTTP-agnostic).

Owns turning a decoded JSON body into a validated `GenerateRequest` (or a `RequestError`, from
`errors.py`, that names the offending field: HTTP 400), the accepted sampling-parameter keys
(SGLang's set; unknown keys are rejected as SGLang does), and the routed-experts codec. It does not
run requests (`engine.py`) or speak HTTP (`server.py`).
"""

from __future__ import annotations

import base64
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rl360_ext.reference.engine.errors import RequestError

# SGLang's SamplingParams keys. Keys outside this set -> 400 naming the key.
SAMPLING_KEYS = frozenset(
    {
        "max_new_tokens",
        "min_new_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "frequency_penalty",
        "presence_penalty",
        "repetition_penalty",
        "stop",
        "stop_token_ids",
        "stop_regex",
        "ignore_eos",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "no_stop_trim",
        "n",
        "json_schema",
        "regex",
        "ebnf",
        "structural_tag",
        "custom_params",
        "stream_interval",
        "logit_bias",
        "sampling_seed",
    }
)
# Accepted but only with a null/empty value: the tiny engine has no constrained decoding.
UNSUPPORTED_SAMPLING_KEYS = ("stop_regex", "json_schema", "regex", "ebnf", "structural_tag")
# Top-level keys SGLang accepts that the tiny engine honours only at their default value.
UNSUPPORTED_TOP_LEVEL = {
    "input_embeds": None,
    "image_data": None,
    "audio_data": None,
    "video_data": None,
    "lora_path": None,
    "return_hidden_states": False,
    "custom_logit_processor": None,
    "return_sampling_mask": False,
}
DEFAULT_MAX_NEW_TOKENS = 128
# SGLang 0.5.x puts sampling_seed in an int64 tensor and reinterprets it as uint64 for its seeded
# Gumbel sampler (`seed.to(torch.uint64)`): any signed 64-bit value is a seed, -1 included.
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1


@dataclass
class SamplingParams:
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    logit_bias: dict[int, float] = field(default_factory=dict)
    sampling_seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1


@dataclass
class GenerateRequest:
    input_ids: list[int]
    sampling: SamplingParams
    rid: str | None = None
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    return_text_in_logprobs: bool = False
    return_routed_experts: bool = False
    routed_experts_start_len: int = 0
    return_prompt_token_ids: bool = False
    stream: bool = False


def _bool(body: dict[str, Any], key: str, default: bool, where: str = "") -> bool:
    value = body.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise RequestError(where + key, f"must be a boolean, got {value!r}")
    return value


def _int(
    body: dict[str, Any], key: str, default: int | None, where: str = "", minimum: int | None = None
) -> int | None:
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise RequestError(where + key, f"must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise RequestError(where + key, f"must be >= {minimum}, got {value}")
    return value


def _float(body: dict[str, Any], key: str, default: float, where: str = "") -> float:
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise RequestError(where + key, f"must be a finite number, got {value!r}")
    return float(value)


def _token_ids(value: Any, key: str, vocab_size: int) -> list[int]:
    if not isinstance(value, list):
        raise RequestError(key, f"must be a list of token ids, got {type(value).__name__}")
    for i, token in enumerate(value):
        if isinstance(token, bool) or not isinstance(token, int):
            raise RequestError(key, f"element {i} must be an integer token id, got {token!r}")
        if not 0 <= token < vocab_size:
            raise RequestError(key, f"element {i} = {token} is outside the vocabulary [0, {vocab_size})")
    return list(value)


def parse_sampling_params(raw: Any, vocab_size: int) -> SamplingParams:
    """Validate `sampling_params` (SGLang semantics); unknown keys -> RequestError naming the key."""
    where = "sampling_params."
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise RequestError("sampling_params", "must be an object")
    unknown = sorted(set(raw) - SAMPLING_KEYS)
    if unknown:
        raise RequestError(where + unknown[0], f"unknown sampling parameter {unknown[0]!r}")
    for key in UNSUPPORTED_SAMPLING_KEYS:
        if raw.get(key) not in (None, "", [], {}):
            raise RequestError(where + key, "constrained decoding is not supported by the tiny engine")
    n = _int(raw, "n", 1, where)
    if n != 1:
        raise RequestError(where + "n", f"only n=1 is supported, got {n}")
    params = SamplingParams(
        max_new_tokens=_int(raw, "max_new_tokens", DEFAULT_MAX_NEW_TOKENS, where, minimum=0),
        min_new_tokens=_int(raw, "min_new_tokens", 0, where, minimum=0),
        temperature=_float(raw, "temperature", 1.0, where),
        top_p=_float(raw, "top_p", 1.0, where),
        top_k=_int(raw, "top_k", -1, where),
        min_p=_float(raw, "min_p", 0.0, where),
        frequency_penalty=_float(raw, "frequency_penalty", 0.0, where),
        presence_penalty=_float(raw, "presence_penalty", 0.0, where),
        repetition_penalty=_float(raw, "repetition_penalty", 1.0, where),
        ignore_eos=_bool(raw, "ignore_eos", False, where),
        skip_special_tokens=_bool(raw, "skip_special_tokens", True, where),
        spaces_between_special_tokens=_bool(raw, "spaces_between_special_tokens", True, where),
        no_stop_trim=_bool(raw, "no_stop_trim", False, where),
        sampling_seed=_int(raw, "sampling_seed", None, where),
    )
    if params.sampling_seed is not None and not SEED_MIN <= params.sampling_seed <= SEED_MAX:
        raise RequestError(
            where + "sampling_seed", f"must be a 64-bit signed integer, got {params.sampling_seed}"
        )
    if params.temperature < 0:
        raise RequestError(where + "temperature", f"must be >= 0, got {params.temperature}")
    if not 0 < params.top_p <= 1:
        raise RequestError(where + "top_p", f"must be in (0, 1], got {params.top_p}")
    if params.top_k == 0 or params.top_k < -1:
        raise RequestError(where + "top_k", f"must be -1 (disabled) or >= 1, got {params.top_k}")
    if not 0 <= params.min_p <= 1:
        raise RequestError(where + "min_p", f"must be in [0, 1], got {params.min_p}")
    if params.repetition_penalty <= 0:
        raise RequestError(where + "repetition_penalty", f"must be > 0, got {params.repetition_penalty}")
    stop = raw.get("stop")
    if stop is not None:
        stops = [stop] if isinstance(stop, str) else stop
        if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
            raise RequestError(where + "stop", "must be a non-empty string or a list of non-empty strings")
        params.stop = list(stops)
    if raw.get("stop_token_ids") is not None:
        params.stop_token_ids = _token_ids(raw["stop_token_ids"], where + "stop_token_ids", vocab_size)
    bias = raw.get("logit_bias")
    if bias is not None:
        params.logit_bias = _logit_bias(bias, vocab_size)
    return params


def _logit_bias(bias: Any, vocab_size: int) -> dict[int, float]:
    key = "sampling_params.logit_bias"
    if not isinstance(bias, dict):
        raise RequestError(key, "must be an object mapping token ids to biases")
    out: dict[int, float] = {}
    for token, value in bias.items():
        try:
            token_id = int(token)
        except (TypeError, ValueError):
            raise RequestError(key, f"key {token!r} is not a token id") from None
        if not 0 <= token_id < vocab_size:
            raise RequestError(key, f"token id {token_id} is outside the vocabulary [0, {vocab_size})")
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise RequestError(key, f"bias for {token} must be a finite number")
        out[token_id] = float(value)
    return out


def parse_generate_request(
    body: Any, vocab_size: int, encode, max_text_chars: int | None = None  # encode: str -> list[int]
) -> GenerateRequest:
    """Validate a decoded `/generate` JSON body. Single requests only (no batches). A `text` longer
    than `max_text_chars` (the context length times the longest token) cannot fit the context and
    is refused before it is tokenized."""
    if not isinstance(body, dict):
        raise RequestError("body", "must be a JSON object")
    has_text, has_ids = body.get("text") is not None, body.get("input_ids") is not None
    if has_text and has_ids:
        raise RequestError("input_ids", "give either text or input_ids, not both")
    if not has_text and not has_ids:
        raise RequestError("input_ids", "one of text or input_ids is required")
    for key, default in UNSUPPORTED_TOP_LEVEL.items():
        if body.get(key, default) not in (default, None):
            raise RequestError(key, "not supported by the tiny engine")
    if has_text:
        if not isinstance(body["text"], str):
            raise RequestError("text", "must be a string (batched requests are not supported)")
        if max_text_chars is not None and len(body["text"]) > max_text_chars:
            raise RequestError(
                "text",
                f"{len(body['text'])} characters are more tokens than the context holds (at most "
                f"{max_text_chars} characters: the context length times the longest token)",
            )
        input_ids = encode(body["text"])
    else:
        if body["input_ids"] and isinstance(body["input_ids"][0], list):
            raise RequestError("input_ids", "batched requests are not supported; send one list of ids")
        input_ids = _token_ids(body["input_ids"], "input_ids", vocab_size)
    if not input_ids:
        raise RequestError("input_ids" if has_ids else "text", "the prompt must contain at least one token")
    rid = body.get("rid")
    if rid is not None and not isinstance(rid, str):
        raise RequestError("rid", "must be a string")
    request = GenerateRequest(
        input_ids=input_ids,
        sampling=parse_sampling_params(body.get("sampling_params"), vocab_size),
        rid=rid,
        return_logprob=_bool(body, "return_logprob", False),
        logprob_start_len=_int(body, "logprob_start_len", -1, minimum=-1),
        top_logprobs_num=_int(body, "top_logprobs_num", 0, minimum=0),
        return_text_in_logprobs=_bool(body, "return_text_in_logprobs", False),
        return_routed_experts=_bool(body, "return_routed_experts", False),
        routed_experts_start_len=_int(body, "routed_experts_start_len", 0, minimum=0),
        return_prompt_token_ids=_bool(body, "return_prompt_token_ids", False),
        stream=_bool(body, "stream", False),
    )
    if request.top_logprobs_num > vocab_size:
        raise RequestError("top_logprobs_num", f"must be <= the vocabulary size {vocab_size}")
    if request.logprob_start_len >= len(input_ids):
        raise RequestError("logprob_start_len", f"must be < the prompt length {len(input_ids)}")
    return request


def encode_routed_experts(routing: np.ndarray) -> str:
    """base64 of raw little-endian int32 (shape is implied: [rows, layers, top_k])."""
    return base64.b64encode(np.ascontiguousarray(routing, dtype="<i4").tobytes()).decode("ascii")


def decode_routed_experts(data: str, layers: int, top_k: int) -> np.ndarray:
    """Inverse of encode_routed_experts: an int32 array [rows, layers, top_k]."""
    flat = np.frombuffer(base64.b64decode(data), dtype="<i4")
    if flat.size % (layers * top_k):
        raise ValueError(f"{flat.size} int32 values do not divide into rows of {layers}x{top_k}")
    return flat.reshape(-1, layers, top_k).astype(np.int32)
