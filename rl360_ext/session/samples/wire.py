"""The binary wire format of a merged sample: a fixed header, then contiguous little-endian arrays.

Owns `encode(sample) -> bytes` and `decode(buffer) -> MergedSample`; decoding is zero-copy (the
arrays are read-only numpy views on the buffer; the one exception below). Layout, version 4
(every integer little-endian; docs/session.md has the same table and versions 1 to 3):

    offset  size  field
    0       4     magic b"RL3S"
    4       2     u16 format version (4; `encode(..., version=1, 2 or 3)` writes those)
    6       2     u16 flags (bit 0: routing present, bit 1: version arrays present, bit 2: top-k
                  log-probs present)
    8       8     u64 n_tokens
    16      8     u64 n_rows (routing rows; n_tokens - 1, or 0 without routing)
    24      2     u16 layers
    26      2     u16 top_k
    28      1     u8  routing dtype: 0 none, 1 uint8, 2 uint16
    29      1     reserved (zero)
    30      2     u16 k of the top-k log-probs (0 without them; reserved zero before version 4)
    32      8     u64 metadata length in bytes (UTF-8 JSON)
    40      8     u64 top-k rows: the generated tokens (loss_mask 1; 0 without top-k; reserved
                  zero before version 4)
    48      16    reserved (zero)
    64      ...   sections, each starting at a multiple of 64:
                  tokens int32[n_tokens], rollout_log_probs float32[n_tokens],
                  loss_mask uint8[n_tokens], then with routing routed_experts
                  [n_rows, layers, top_k] and routing_source uint8[n_rows] (`RoutingSource`),
                  then token_version int32[n_tokens], kv_version int32[n_tokens],
                  routing_version int32[n_rows] (with routing only), then with top-k log-probs
                  top_logprob_ids int32[top rows, k] and top_logprobs float32[top rows, k], one
                  row per generated token in order (SGLang's `output_top_logprobs`, opt-in:
                  `--top-logprobs-num`; -1 ids where the engine gave fewer), metadata JSON (with
                  "turn_first_version", "turn_output_start", "turn_cached_tokens": int lists,
                  one per kept turn)

Version 3 is version 4 without the top-k sections (and writes no sample that has them: a
WireFormatError, never a silent drop). Version 2 has, where version 3 has routing_source, the
row sources in the session's former codes (0 prompt prefill, 1 decode, 2 later prefill;
`_LEGACY_CODE`), and routing_source after routing_version. Version 1 is version 2 without the
version sections and per-turn lists. This codec reads all four: a version-2 sample's
routing_source is its own section (the legacy one is skipped), a version-1 sample's is converted
from the legacy codes (a copy, not a view) and its version arrays are None (its
`MergedSample.version_arrays()` is UNVERSIONED-filled). It refuses any other version naming it
and the versions it reads (a version-2 codec refuses this one's buffers: "merged-sample format
version 3 is not supported (this codec reads 1 and 2)", and a version-3 codec this one's: "...
version 4 is not supported (this codec reads 1, 2 and 3)"). A sample's missing version arrays
are written UNVERSIONED-filled, missing row sources PREFILL. It does not own the merge
(`merge.py`) or transport (the FastAPI adapter, the Ray pool).
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import orjson

from rl360_ext.session.errors import SessionServerError
from rl360_ext.session.samples.merge import MergedSample
from rl360_ext.sglang.versions import TURN_CACHED_TOKENS, TURN_OUTPUT_START, RoutingSource

MAGIC = b"RL3S"
VERSION = 4
READS = (1, 2, 3, 4)
FLAG_ROUTING, FLAG_VERSIONS, FLAG_TOP_LOGPROBS = 1, 2, 4
ALIGN = 64
_HEADER = struct.Struct("<4sHHQQHHBxHQQ16x")
HEADER_SIZE = _HEADER.size
_ROUTING_DTYPES: dict[int, np.dtype] = {1: np.dtype(np.uint8), 2: np.dtype("<u2")}
_ROUTING_CODES = {dtype: code for code, dtype in _ROUTING_DTYPES.items()}
_ZEROS = bytes(ALIGN)


class WireFormatError(SessionServerError, ValueError):
    """The sample cannot be written in the asked version, or the buffer is not a merged sample this
    version of the codec can read. Raised while the server answers an export, it is a 500."""

    default_code = "wire_format"


_PER_TURN = ("turn_first_version", TURN_OUTPUT_START, TURN_CACHED_TOKENS)  # version-2+ metadata lists
# The row-source code versions 1 and 2 wrote for each RoutingSource, and the tables between them.
_LEGACY_CODE = {RoutingSource.PREFILL: 0, RoutingSource.DECODE: 1, RoutingSource.REPREFILL: 2}
_TO_LEGACY = np.asarray([_LEGACY_CODE[source] for source in sorted(RoutingSource)], np.uint8)
_FROM_LEGACY = np.asarray(sorted(_LEGACY_CODE, key=_LEGACY_CODE.__getitem__), np.uint8)


def _aligned(offset: int) -> int:
    return -(-offset // ALIGN) * ALIGN


def _meta_json(sample: MergedSample, per_turn: dict[str, list[int]] | None) -> bytes:
    meta: dict[str, Any] = {
        "session_id": sample.session_id,
        "status": sample.status,
        "prompt_length": sample.prompt_length,
        "weight_versions": sample.weight_versions,
        "turns": sample.turns,
        "metadata": sample.metadata,
    }
    meta.update(per_turn or {})
    return orjson.dumps(meta, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS)


def _checked_codes(codes: np.ndarray, limit: int, what: str) -> np.ndarray:
    if len(codes) and int(codes.max()) >= limit:
        raise WireFormatError(f"{what} holds code {int(codes.max())}, outside [0, {limit})")
    return codes


def encode(sample: MergedSample, version: int = VERSION) -> bytes:
    """The sample as one bytes object (one copy of each array, no per-element work but the check
    of the row-source codes, and their legacy codes for version 1 or 2).

    `version=1` or `2` writes that format for a reader that only knows it."""
    if version not in READS:
        raise WireFormatError(f"cannot write merged-sample format version {version} (writes {READS})")
    n = len(sample.tokens)
    routed = sample.routed_experts
    versions = sample.version_arrays()
    if routed is not None:
        code = _ROUTING_CODES.get(routed.dtype.newbyteorder("<"))
        if code is None:
            raise WireFormatError(f"routed_experts dtype {routed.dtype} is not uint8 or uint16")
        if routed.ndim != 3 or len(routed) != max(n - 1, 0):
            raise WireFormatError(
                f"routed_experts has shape {routed.shape}; expected [{max(n - 1, 0)}, layers, top_k]"
            )
        rows, layers, top_k = routed.shape
        assert versions.routing_source is not None
        source = np.ascontiguousarray(versions.routing_source, dtype=np.uint8)
        if len(source) != rows:
            raise WireFormatError(f"routing_source has {len(source)} entries for {rows} rows")
        _checked_codes(source, len(RoutingSource), "routing_source")
    else:
        code, rows, layers, top_k, source = 0, 0, 0, 0, None
    top_ids, top_values = sample.top_logprob_ids, sample.top_logprobs
    k = 0
    if (top_ids is None) != (top_values is None):
        raise WireFormatError("top_logprob_ids and top_logprobs come together")
    if top_ids is not None and top_values is not None:
        if version < 4:
            raise WireFormatError(f"top-k log-probs need merged-sample format version 4, not {version}")
        k = int(top_ids.shape[1]) if top_ids.ndim == 2 else -1
        generated = int(np.count_nonzero(sample.loss_mask))
        if top_ids.shape != (generated, k) or top_values.shape != (generated, k) or not 0 < k < 2**16:
            raise WireFormatError(
                f"top_logprob_ids {top_ids.shape} and top_logprobs {top_values.shape} must both be "
                f"[{generated} generated tokens, k]"
            )
    for name in ("loss_mask", "rollout_log_probs"):
        if len(getattr(sample, name)) != n:
            raise WireFormatError(f"{name} has {len(getattr(sample, name))} entries for {n} tokens")
    arrays: list[np.ndarray] = [
        np.ascontiguousarray(sample.tokens, dtype="<i4"),
        np.ascontiguousarray(sample.rollout_log_probs, dtype="<f4"),
        np.ascontiguousarray(sample.loss_mask, dtype=np.uint8),
    ]
    if routed is not None and source is not None:
        arrays.append(np.ascontiguousarray(routed, dtype=_ROUTING_DTYPES[code]))
        arrays.append(source if version >= 3 else _TO_LEGACY[source])
    per_turn: dict[str, list[int]] | None = None
    flags = FLAG_ROUTING if code else 0
    if version >= 2:
        for name, length in (("token_version", n), ("kv_version", n), ("routing_version", rows)):
            array = getattr(versions, name)
            if array is not None and len(array) != length:
                raise WireFormatError(f"{name} has {len(array)} entries, expected {length}")
        arrays.append(np.ascontiguousarray(versions.token_version, dtype="<i4"))
        arrays.append(np.ascontiguousarray(versions.kv_version, dtype="<i4"))
        if code:
            assert versions.routing_version is not None and source is not None
            arrays.append(np.ascontiguousarray(versions.routing_version, dtype="<i4"))
            if version == 2:
                arrays.append(source)
        per_turn = {
            name: array.tolist() for name in _PER_TURN if (array := getattr(versions, name)) is not None
        }
        flags |= FLAG_VERSIONS
    if k:
        assert top_ids is not None and top_values is not None
        arrays.append(np.ascontiguousarray(top_ids, dtype="<i4"))
        arrays.append(np.ascontiguousarray(top_values, dtype="<f4"))
        flags |= FLAG_TOP_LOGPROBS
    meta = _meta_json(sample, per_turn)
    top_rows = 0 if top_ids is None else len(top_ids)
    header = _HEADER.pack(MAGIC, version, flags, n, rows, layers, top_k, code, k, len(meta), top_rows)
    parts: list[Any] = [header]
    offset = HEADER_SIZE
    for array in arrays:
        parts.append(_ZEROS[: _aligned(offset) - offset])
        offset = _aligned(offset)
        parts.append(memoryview(array.reshape(-1).view(np.uint8)))
        offset += array.nbytes
    parts.append(_ZEROS[: _aligned(offset) - offset])
    parts.append(meta)
    return b"".join(parts)


def _layout(
    version: int, n: int, rows: int, layers: int, top_k: int, code: int, k: int = 0, top_rows: int = 0
) -> list[tuple[str, np.dtype, tuple[int, ...]]]:
    """(name, dtype, shape) of each array section of a buffer, in order."""
    i4, u1 = np.dtype("<i4"), np.dtype(np.uint8)
    layout = [("tokens", i4, (n,)), ("rollout_log_probs", np.dtype("<f4"), (n,)), ("loss_mask", u1, (n,))]
    if code:
        sources = "routing_source" if version >= 3 else "legacy_routing_source"
        layout += [("routed_experts", _ROUTING_DTYPES[code], (rows, layers, top_k)), (sources, u1, (rows,))]
    if version >= 2:
        layout += [("token_version", i4, (n,)), ("kv_version", i4, (n,))]
        if code:
            layout.append(("routing_version", i4, (rows,)))
            if version == 2:
                layout.append(("routing_source", u1, (rows,)))
    if version >= 4 and k:
        layout += [("top_logprob_ids", i4, (top_rows, k)), ("top_logprobs", np.dtype("<f4"), (top_rows, k))]
    return layout


def decode(buffer: bytes | bytearray | memoryview) -> MergedSample:
    """Read a buffer written by `encode`; arrays are zero-copy views (read-only for bytes)."""
    view = memoryview(buffer).cast("B")
    if len(view) < HEADER_SIZE:
        raise WireFormatError(f"buffer has {len(view)} bytes, shorter than the {HEADER_SIZE}-byte header")
    magic, version, flags, n, rows, layers, top_k, code, k, meta_len, top_rows = _HEADER.unpack_from(view, 0)
    if magic != MAGIC:
        raise WireFormatError(f"buffer starts with {bytes(magic)!r}, not the merged-sample magic {MAGIC!r}")
    if version not in READS:
        raise WireFormatError(
            f"merged-sample format version {version} is not supported (this codec reads "
            f"{', '.join(map(str, READS[:-1]))} and {READS[-1]})"
        )
    if code and code not in _ROUTING_DTYPES:
        raise WireFormatError(f"unknown routing dtype code {code}")
    if version < 4:
        k = top_rows = 0  # bytes 30-31 and 40-47 were reserved
    elif bool(flags & FLAG_TOP_LOGPROBS) != bool(k):
        raise WireFormatError(
            f"flags say top-k log-probs {'present' if k == 0 else 'absent'}, header k is {k}"
        )
    offset = HEADER_SIZE
    sections: dict[str, np.ndarray] = {}
    for name, dtype, shape in _layout(version, n, rows, layers, top_k, code, k, top_rows):
        offset = _aligned(offset)
        count = int(np.prod(shape))
        end = offset + count * dtype.itemsize
        if end > len(view):
            raise WireFormatError(f"buffer of {len(view)} bytes ends inside an array section (needs {end})")
        sections[name] = np.frombuffer(view, dtype=dtype, count=count, offset=offset).reshape(shape)
        offset = end
    offset = _aligned(offset)
    if offset + meta_len != len(view):
        raise WireFormatError(f"buffer has {len(view)} bytes; header promises {offset + meta_len}")
    meta = orjson.loads(view[offset : offset + meta_len])
    source = sections.get("routing_source")
    if source is not None:
        _checked_codes(source, len(RoutingSource), "routing_source")
    elif (legacy := sections.get("legacy_routing_source")) is not None:
        source = _FROM_LEGACY[_checked_codes(legacy, len(_FROM_LEGACY), f"version-{version} routing_sources")]
    versioned = version >= 2
    per_turn = {
        name: np.asarray(meta[name], np.int32) if versioned and meta.get(name) is not None else None
        for name in _PER_TURN
    }
    return MergedSample(
        session_id=meta["session_id"],
        status=meta["status"],
        tokens=sections["tokens"],
        rollout_log_probs=sections["rollout_log_probs"],
        loss_mask=sections["loss_mask"],
        routed_experts=sections.get("routed_experts"),
        routing_source=source,
        prompt_length=meta["prompt_length"],
        weight_versions=meta["weight_versions"],
        turns=meta["turns"],
        metadata=meta["metadata"],
        token_version=sections.get("token_version"),
        kv_version=sections.get("kv_version"),
        routing_version=sections.get("routing_version"),
        turn_first_version=per_turn["turn_first_version"],
        turn_output_start=per_turn[TURN_OUTPUT_START],
        turn_cached_tokens=per_turn[TURN_CACHED_TOKENS],
        top_logprob_ids=sections.get("top_logprob_ids"),
        top_logprobs=sections.get("top_logprobs"),
    )
