"""A merged session sample in Miles' samples wire (v1), what `POST /sessions/{id}/samples` answers.

Owns the translation from rl360's `MergedSample` to the reply Miles' stock
`agentic_tool_call.generate` decodes with `decode_samples_and_merge_input_sample`: one safetensors
payload with per-sample tensors `tokens.{i}` int64, `loss_mask.{i}` uint8, `rollout_log_probs.{i}`
float64 and, with R3, `rollout_routed_experts.{i}` int32, plus a `_samples_meta` uint8 tensor
holding compact JSON `{samples: [...], session_metadata, empty_reason}`. It applies Miles' session
semantics: `response`/`response_length`/`loss_mask`/`rollout_log_probs` cover everything after
the first prompt; `max_seq_len` cuts at the turn that overflows (its output is cut and the status
becomes truncated; a turn left with no output is dropped; no turn left means
`empty_reason="all_truncated"`); a session without turns answers no samples with
`empty_reason="no_records"`. Under Miles' `--use-session-server v2` (`encode_v2`) the reply is
the same wire plus `reward` on each sample, one sample per history branch, with Miles' tree tables
in `session_metadata`. It does not own the HTTP route (`app.py`), merging turns
(`merge.py`) or rl360's own wire (`wire.py`). It imports neither Miles nor torch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
import safetensors.numpy

from rl360_ext.session.chat_api import RequestError
from rl360_ext.session.core import LEAF_KEY, SESSION_KEY
from rl360_ext.session.merge import MERGE_KEY, MergedSample

SAMPLES_META_KEY = "_samples_meta"
MEDIA_TYPE = "application/octet-stream"
V2_SERVER_KEYS = ("accumulated_token_ids", "tito_session_mismatch", LEAF_KEY, MERGE_KEY, SESSION_KEY)
REWARD_KEY = "reward"  # the agent metadata key Miles' v2 assigns to every sample as Sample.reward
NO_RECORDS = "no_records"
ALL_TRUNCATED = "all_truncated"
TENSOR_DTYPES: dict[str, np.dtype] = {
    "tokens": np.dtype(np.int64),
    "loss_mask": np.dtype(np.uint8),
    "rollout_log_probs": np.dtype(np.float64),
    "rollout_routed_experts": np.dtype(np.int32),
    "rollout_indexer_topk": np.dtype(np.int32),
}

_STATUS_OF_FINISH = {  # Miles' Sample.Status values
    "stop": "completed",
    "tool_calls": "completed",
    "length": "truncated",
    "abort": "aborted",
}
Decode = Callable[[Sequence[int]], str]


@dataclass
class MilesSample:
    """The fields of one Miles `Sample` the v1 samples wire carries (status as Miles' value string)."""

    tokens: np.ndarray  # int64 [n]
    response: str
    response_length: int
    loss_mask: np.ndarray  # uint8 [response_length]
    rollout_log_probs: np.ndarray  # float64 [response_length]
    rollout_routed_experts: np.ndarray | None  # int32 [n - 1, layers, top_k], None without R3
    status: str
    weight_versions: list[str]
    prefix_cache_info: dict[str, int]  # Miles' Sample.PrefixCacheInfo.to_dict()
    metadata: dict[str, Any]
    rollout_indexer_topk: np.ndarray | None = None  # always None: rl360 records no indexer replay


def parse_samples_request(body: Any) -> tuple[int | None, dict[str, Any] | None]:
    """`(max_seq_len, metadata)` from a `/samples` body; a bad field raises `RequestError` 400."""
    if not isinstance(body, dict):
        raise RequestError(400, "body: must be a JSON object", param="body")
    unknown = sorted(set(body) - {"max_seq_len", "metadata"})
    if unknown:
        raise RequestError(400, f"{unknown[0]}: unknown field", param=unknown[0])
    max_seq_len = body.get("max_seq_len")
    if max_seq_len is not None and (
        isinstance(max_seq_len, bool) or not isinstance(max_seq_len, int) or max_seq_len < 1
    ):
        raise RequestError(
            400, f"max_seq_len: must be a positive integer, got {max_seq_len!r}", param="max_seq_len"
        )
    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise RequestError(400, "metadata: must be a JSON object", param="metadata")
    return max_seq_len, metadata


def _cut(sample: MergedSample, max_seq_len: int | None) -> tuple[list[dict[str, Any]], int, bool]:
    """The turns kept under `max_seq_len`, the token count kept, and whether a turn's output was cut.

    Miles' rule: the first turn whose end passes `max_seq_len` ends the sample; it keeps the output
    that fits, or is dropped when none does.
    """
    turns = sample.turns
    if max_seq_len is None:
        return list(turns), len(sample.tokens), False
    kept: list[dict[str, Any]] = []
    for turn in turns:
        end = turn["input_start"] + turn["input_tokens"] + turn["output_tokens"]
        if end <= max_seq_len:
            kept.append(turn)
            continue
        if turn["output_tokens"] - (end - max_seq_len) > 0:
            kept.append(turn)
            return kept, max_seq_len, True
        break
    n = 0 if not kept else kept[-1]["input_start"] + kept[-1]["input_tokens"] + kept[-1]["output_tokens"]
    return kept, n, False


def _response_text(tokens: np.ndarray, turns: list[dict[str, Any]], n: int, decode: Decode) -> str:
    """Miles' `response`: each turn's output and each later turn's input, decoded piece by piece."""
    pieces: list[str] = []
    for i, turn in enumerate(turns):
        start = turn["input_start"]
        output_start = start + turn["input_tokens"]
        if i > 0 and output_start > start:
            pieces.append(decode(tokens[start:output_start].tolist()))
        end = min(output_start + turn["output_tokens"], n)
        if end > output_start:
            pieces.append(decode(tokens[output_start:end].tolist()))
    return "".join(pieces)


def to_miles_sample(
    sample: MergedSample,
    decode: Decode,
    max_seq_len: int | None = None,
    metadata: dict[str, Any] | None = None,
) -> MilesSample | None:
    """`sample` as Miles' session server would assemble it, or None when no turn survives.

    `decode` turns token ids into text (the tokenizer's decode, special tokens kept); `metadata`
    is merged over the sample's metadata (the `/samples` body's `metadata`).
    """
    turns, n, cut = _cut(sample, max_seq_len)
    if not turns:
        return None
    prompt = sample.prompt_length
    last_finish = turns[-1]["finish_reason"]
    status = "truncated" if cut else _STATUS_OF_FINISH.get(last_finish, sample.status.lower())
    routed = sample.routed_experts
    merge_facts = {
        **sample.metadata.get(MERGE_KEY, {}),
        "turns": turns,
        "max_seq_len": max_seq_len,
        "turns_dropped_by_max_seq_len": len(sample.turns) - len(turns),
        "tokens_cut_by_max_seq_len": len(sample.tokens) - n,
        "rl360_status": sample.status,
    }
    own = {k: v for k, v in sample.metadata.items() if k not in (SESSION_KEY, MERGE_KEY)}
    return MilesSample(
        tokens=sample.tokens[:n].astype(np.int64),
        response=_response_text(sample.tokens, turns, n, decode),
        response_length=n - prompt,
        loss_mask=sample.loss_mask[prompt:n].astype(np.uint8),
        rollout_log_probs=sample.rollout_log_probs[prompt:n].astype(np.float64),
        rollout_routed_experts=None if routed is None else routed[: n - 1].astype(np.int32),
        status=status,
        weight_versions=[t["weight_version"] for t in turns if t["weight_version"] is not None],
        prefix_cache_info={
            "cached_tokens": int(sum(t["cached_tokens"] for t in turns)),
            "total_prompt_tokens": int(sum(t["prompt_tokens"] for t in turns)),
        },
        metadata={**own, **(metadata or {}), MERGE_KEY: merge_facts},
    )


def encode(
    sample: MergedSample,
    decode: Decode,
    max_seq_len: int | None = None,
    metadata: dict[str, Any] | None = None,
) -> bytes:
    """The `/samples` reply for one session: Miles' v1 samples wire (safetensors), see the docstring.

    `session_metadata` is `{"session": <the session's facts>}`; Miles' generate merges it into
    the returned sample's metadata next to the sample's own `merge` facts.
    """
    session_metadata = {SESSION_KEY: sample.metadata.get(SESSION_KEY, {})}
    miles = to_miles_sample(sample, decode, max_seq_len, metadata) if len(sample.tokens) else None
    tensors: dict[str, np.ndarray] = {}
    if miles is None:
        metas: list[dict[str, Any]] = []
        empty_reason: str | None = ALL_TRUNCATED if len(sample.tokens) else NO_RECORDS
    else:
        metas, empty_reason = [_add_sample(tensors, 0, miles)], None
    meta = {"samples": metas, "session_metadata": session_metadata, "empty_reason": empty_reason}
    meta_bytes = orjson.dumps(meta, option=orjson.OPT_SERIALIZE_NUMPY)
    tensors[SAMPLES_META_KEY] = np.frombuffer(meta_bytes, dtype=np.uint8)
    return safetensors.numpy.save(tensors)


def _add_sample(tensors: dict[str, np.ndarray], index: int, sample: MilesSample) -> dict[str, Any]:
    """Put the sample's tensors into `tensors` (absent ones become nulls); its JSON part."""
    nulls: list[str] = []
    for name, dtype in TENSOR_DTYPES.items():
        value = getattr(sample, name)
        if value is None:
            nulls.append(name)
        else:
            tensors[f"{name}.{index}"] = np.ascontiguousarray(value, dtype=dtype)
    return {
        "response": sample.response,
        "response_length": sample.response_length,
        "status": sample.status,
        "weight_versions": sample.weight_versions,
        "prefix_cache_info": sample.prefix_cache_info,
        "metadata": sample.metadata,
        "nulls": nulls,
    }


def encode_v2(
    branches: Sequence[MergedSample],
    session_metadata: dict[str, Any],
    decode: Decode,
    max_seq_len: int | None = None,
    agent_metadata: dict[str, Any] | None = None,
) -> bytes:
    """The `/samples` reply under Miles' `--use-session-server v2`: one sample per branch.

    Miles' v2 wire is the v1 wire with `reward` on every sample and any number of samples. Each
    branch (`SessionCore.merge_branches`, in commit order) is cut by `max_seq_len` on its own; a
    branch left with no turn is dropped. As Miles' default v2 post-process does, the agent's
    metadata (the body's `metadata`) goes into every sample's metadata except the keys the server
    owns, and its `reward`, when given, becomes every sample's `reward` (else null: Miles keeps
    the driver's). `session_metadata` (`{"session": facts, "tree": {nodes, leaves}}`) gets
    `"agent"`: the agent's metadata, as Miles' v2 server adds it.
    """
    agent = {k: v for k, v in (agent_metadata or {}).items() if k not in V2_SERVER_KEYS}
    reward = (agent_metadata or {}).get(REWARD_KEY)
    session_metadata = dict(session_metadata)
    if agent_metadata is not None:
        session_metadata["agent"] = agent_metadata
    tensors: dict[str, np.ndarray] = {}
    metas: list[dict[str, Any]] = []
    for branch in branches:
        miles = to_miles_sample(branch, decode, max_seq_len, agent) if len(branch.tokens) else None
        if miles is not None:
            metas.append({**_add_sample(tensors, len(metas), miles), REWARD_KEY: reward})
    empty_reason = None if metas else (NO_RECORDS if not session_metadata["tree"]["nodes"] else ALL_TRUNCATED)
    meta = {"samples": metas, "session_metadata": session_metadata, "empty_reason": empty_reason}
    meta_bytes = orjson.dumps(meta, option=orjson.OPT_SERIALIZE_NUMPY)
    tensors[SAMPLES_META_KEY] = np.frombuffer(meta_bytes, dtype=np.uint8)
    return safetensors.numpy.save(tensors)
