"""A merged session sample in Miles' samples wire (v1), what `POST /sessions/{id}/samples` answers.

Owns the translation from rl360's `MergedSample` to the reply Miles' stock
`agentic_tool_call.generate` decodes with `decode_samples_and_merge_input_sample`: one safetensors
payload with per-sample tensors `tokens.{i}` int64, `loss_mask.{i}` uint8, `rollout_log_probs.{i}`
float64 and, with R3, `rollout_routed_experts.{i}` int32, plus a `_samples_meta` uint8 tensor
holding compact JSON `{samples: [...], session_metadata, empty_reason}`. The sample itself is
`rl360_ext.session.samples.miles_sample.to_miles_sample` (the one converter, with Miles' truncation rule,
which rl360's generate hook calls too); when it yields none the reply has no samples and
`empty_reason="all_truncated"`; a session without turns answers `empty_reason="no_records"`. Under
Miles' `--use-session-server v2` (`encode_v2`) the reply is the same wire plus `reward` on each
sample, one sample per history branch, with Miles' tree tables in `session_metadata`. It does not
own the HTTP route (`app.py`), merging turns (`merge.py`) or rl360's own wire
(`wire.py`). It imports neither Miles nor torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson
import safetensors.numpy

from rl360_ext.session.core import LEAF_KEY, SESSION_KEY
from rl360_ext.session.errors import RequestError
from rl360_ext.session.samples.merge import MERGE_KEY, MergedSample
from rl360_ext.session.samples.miles_sample import Decode, MilesSample, to_miles_sample

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


def parse_samples_request(body: Any) -> tuple[int | None, dict[str, Any] | None]:
    """`(max_seq_len, metadata)` from a `/samples` body; a bad field raises `RequestError` 400."""
    if not isinstance(body, dict):
        raise RequestError("body: must be a JSON object", param="body")
    unknown = sorted(set(body) - {"max_seq_len", "metadata"})
    if unknown:
        raise RequestError(f"{unknown[0]}: unknown field", param=unknown[0])
    max_seq_len = body.get("max_seq_len")
    if max_seq_len is not None and (
        isinstance(max_seq_len, bool) or not isinstance(max_seq_len, int) or max_seq_len < 1
    ):
        raise RequestError(
            f"max_seq_len: must be a positive integer, got {max_seq_len!r}", param="max_seq_len"
        )
    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise RequestError("metadata: must be a JSON object", param="metadata")
    return max_seq_len, metadata


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
