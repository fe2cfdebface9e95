"""Pydantic models of every request body the tiny engine accepts (what /openapi.json documents).

Owns the JSON shape of each route's body: field names, JSON types, and the bounds that do not
depend on the running engine (non-negative counts, probabilities in [0, 1], a 64-bit seed). Types
are strict (no "yes" for a boolean, no "5" for an integer) except that an integral float (`2.0`)
is an integer, as before; NaN and infinities are refused. Unknown keys are refused inside
`sampling_params` and on the control routes, and ignored at the top level of `/generate`, as
SGLang does. Every string, at any depth, must be UTF-8 text (`rl360_ext.util.text.TextModel`: a
lone surrogate is a 400 naming the field). What depends on the engine (vocabulary, context
length) and the cross-field rules stay in `protocol.parse_generate_request`, which every
`/generate` body still goes through. It does not speak HTTP (`server.py`).
"""

from __future__ import annotations

import types
import typing
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

from rl360_ext.reference.engine.faults import MAX_LATENCY_S, MAX_SEED, FaultKey
from rl360_ext.reference.engine.protocol import SEED_MAX, SEED_MIN
from rl360_ext.util.text import TextModel, has_control, shown


def _integral(value: Any) -> Any:
    """2.0 -> 2 (an integral float is an integer); everything else is left to strict validation."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _path(value: str) -> str:
    """A path holds no control character (NUL, CR, LF, ...)."""
    if has_control(value):
        raise ValueError(f"holds a control character, not a path: {shown(value)!r}")
    return value


Integer = Annotated[int, BeforeValidator(_integral)]
Count = Annotated[int, BeforeValidator(_integral), Field(ge=0)]
TokenId = Annotated[int, Field(ge=0)]
Probability = Annotated[float, Field(ge=0.0, le=1.0)]

_STRICT = {"strict": True, "allow_inf_nan": False}


class SamplingParamsBody(TextModel):
    """SGLang's `sampling_params`; unknown keys are refused (naming the key)."""

    model_config = ConfigDict(extra="forbid", **_STRICT)

    max_new_tokens: Count | None = None
    min_new_tokens: Count | None = None
    temperature: Annotated[float, Field(ge=0.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    top_k: Integer | None = None
    min_p: Probability | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: Annotated[float, Field(gt=0.0)] | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[TokenId] | None = None
    stop_regex: str | list[str] | None = None
    ignore_eos: bool | None = None
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool | None = None
    no_stop_trim: bool | None = None
    n: Integer | None = None
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None
    structural_tag: str | None = None
    custom_params: dict[str, Any] | None = None
    stream_interval: Integer | None = None
    logit_bias: dict[str, float] | None = None
    sampling_seed: Annotated[int, BeforeValidator(_integral), Field(ge=SEED_MIN, le=SEED_MAX)] | None = None


class GenerateBody(TextModel):
    """SGLang's native `/generate` body (one request: text or input_ids, not a batch)."""

    model_config = ConfigDict(extra="ignore", **_STRICT)

    text: str | None = None
    input_ids: list[TokenId] | None = None
    sampling_params: SamplingParamsBody | None = None
    rid: str | None = None
    return_logprob: bool | None = None
    logprob_start_len: Annotated[int, BeforeValidator(_integral), Field(ge=-1)] | None = None
    top_logprobs_num: Count | None = None
    return_text_in_logprobs: bool | None = None
    return_routed_experts: bool | None = None
    routed_experts_start_len: Count | None = None
    return_prompt_token_ids: bool | None = None
    stream: bool | None = None
    input_embeds: Any = None
    image_data: Any = None
    audio_data: Any = None
    video_data: Any = None
    lora_path: str | None = None
    return_hidden_states: bool | None = None
    custom_logit_processor: str | None = None
    return_sampling_mask: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        """The fields the client set, as the dict `parse_generate_request` validates."""
        return self.model_dump(exclude_unset=True)


class UpdateWeightsFromDiskBody(TextModel):
    """`/update_weights_from_disk`: a `.npz` (or a directory holding weights.npz) from `save-weights`."""

    model_config = ConfigDict(extra="forbid", **_STRICT)

    model_path: Annotated[str, Field(min_length=1), AfterValidator(_path)]
    load_format: str | None = None
    weight_version: Annotated[str, Field(min_length=1)] | None = None
    flush_cache: bool | None = None
    abort_all_requests: bool | None = None
    is_async: bool | None = None
    torch_empty_cache: bool | None = None
    keep_pause: bool | None = None
    recapture_cuda_graph: bool | None = None
    token_step: Integer | None = None


class UpdateWeightVersionBody(TextModel):
    """`/update_weight_version`: `new_version` (or its alias `weight_version`) is required."""

    model_config = ConfigDict(extra="forbid", **_STRICT)

    new_version: Annotated[str, Field(min_length=1)] | None = None
    weight_version: Annotated[str, Field(min_length=1)] | None = None
    abort_all_requests: bool | None = None
    rid: str | None = None


class PauseGenerationBody(TextModel):
    """`/pause_generation` (the body is required, as in SGLang; `mode` defaults to abort)."""

    model_config = ConfigDict(extra="forbid", **_STRICT)

    mode: Literal["abort", "retract", "in_place"] | None = None
    rid: str | None = None


class ContinueGenerationBody(TextModel):
    """`/continue_generation` (the body is required, as in SGLang)."""

    model_config = ConfigDict(extra="forbid", **_STRICT)

    torch_empty_cache: bool | None = None
    rid: str | None = None


class AbortRequestBody(TextModel):
    """`/abort_request`: a rid, or abort_all=true."""

    model_config = ConfigDict(extra="forbid", **_STRICT)

    rid: Annotated[str, Field(min_length=1)] | None = None
    abort_all: bool | None = None
    finished_reason: dict[str, Any] | None = None
    aborted_message: Annotated[str, Field(min_length=1)] | None = None


class FaultsBody(TextModel):
    """`/rl360/faults`: the whole fault-injection setting (omitted fields go back to 0)."""

    model_config = ConfigDict(extra="forbid", **_STRICT)

    error_rate: Probability = 0.0
    latency_s: Annotated[float, Field(ge=0.0, le=MAX_LATENCY_S)] = 0.0
    abort_rate: Probability = 0.0
    seed: Annotated[int, BeforeValidator(_integral), Field(ge=0, le=MAX_SEED)] = 0
    draw_by: Annotated[FaultKey, Field(strict=False)] = FaultKey.REQUEST


def _nested_model(annotation: Any) -> type[BaseModel] | None:
    """The BaseModel inside `X | None` / `Annotated[X, ...]`, if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType, Annotated):
        for arg in typing.get_args(annotation):
            found = _nested_model(arg)
            if found is not None:
                return found
    return None


def field_path(model: type[BaseModel] | None, loc: Sequence[str | int]) -> str:
    """The dotted field a validation error's `loc` points at: model fields only, no list indices
    or dict keys (`sampling_params.logit_bias`, not `sampling_params.logit_bias.17`); `body` when
    the body itself is wrong."""
    parts = [part for part in loc if isinstance(part, str)]
    if parts and parts[0] == "body":
        parts = parts[1:]
    path: list[str] = []
    for part in parts:
        path.append(part)
        fields = model.model_fields if model is not None else {}
        if part not in fields:
            break
        model = _nested_model(fields[part].annotation)
        if model is None:
            break
    return ".".join(path) or "body"
