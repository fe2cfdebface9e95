"""The binary wire format of a merged sample: a fixed header, then contiguous little-endian arrays.

Owns `encode(sample) -> bytes` and `decode(buffer) -> MergedSample`; decoding is zero-copy (the
arrays are read-only numpy views on the buffer). Layout, version 2 (version 1 documented in
docs/session.md; every integer little-endian):

    offset  size  field
    0       4     magic b"RL3S"
    4       2     u16 format version (2; `encode(..., version=1)` writes version 1)
    6       2     u16 flags (bit 0: routing present, bit 1: version arrays present)
    8       8     u64 n_tokens
    16      8     u64 n_rows (routing rows; n_tokens - 1, or 0 without routing)
    24      2     u16 layers
    26      2     u16 top_k
    28      1     u8  routing dtype: 0 none, 1 uint8, 2 uint16
    29      3     reserved (zero)
    32      8     u64 metadata length in bytes (UTF-8 JSON)
    40      24    reserved (zero)
    64      ...   sections, each starting at a multiple of 64:
                  tokens int32[n_tokens], rollout_log_probs float32[n_tokens],
                  loss_mask uint8[n_tokens], routed_experts [n_rows, layers, top_k],
                  routing_sources uint8[n_rows], then (version 2)
                  token_version int32[n_tokens], kv_version int32[n_tokens],
                  routing_version int32[n_rows], routing_source uint8[n_rows] (these two
                  with routing only), metadata JSON (version 2 adds "turn_first_version",
                  "turn_output_start", "turn_cached_tokens": int lists, one per kept turn)

Version 1 is version 2 without the version sections (the layout up to the metadata is the same).
This codec reads both: a version-1 sample decodes with the version arrays None (its
`MergedSample.version_arrays()` is UNVERSIONED-filled). A version-1 codec refuses a version-2
buffer ("merged-sample format version 2 is not supported (this codec reads 1)"); this one
refuses any other version naming it and the versions it reads. A sample's missing version
arrays are written UNVERSIONED-filled. It does not own the merge (`merge.py`) or transport (the
FastAPI adapter, the Ray pool).
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import orjson

from rl360_ext.session.merge import MergedSample
from rl360_ext.sglang.versions import TURN_CACHED_TOKENS, TURN_OUTPUT_START

MAGIC = b"RL3S"
VERSION = 2
READS = (1, 2)
FLAG_ROUTING, FLAG_VERSIONS = 1, 2
ALIGN = 64
_HEADER = struct.Struct("<4sHHQQHHB3xQ24x")
HEADER_SIZE = _HEADER.size
_ROUTING_DTYPES: dict[int, np.dtype] = {1: np.dtype(np.uint8), 2: np.dtype("<u2")}
_ROUTING_CODES = {dtype: code for code, dtype in _ROUTING_DTYPES.items()}
_ZEROS = bytes(ALIGN)


class WireFormatError(ValueError):
    """The buffer is not a merged sample this version of the codec can read."""


_PER_TURN = ("turn_first_version", TURN_OUTPUT_START, TURN_CACHED_TOKENS)  # version-2 metadata lists


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


def encode(sample: MergedSample, version: int = VERSION) -> bytes:
    """The sample as one bytes object (one copy of each array, no per-element work).

    `version=1` writes the previous format (no version arrays) for a reader that only knows it."""
    if version not in READS:
        raise WireFormatError(f"cannot write merged-sample format version {version} (writes {READS})")
    n = len(sample.tokens)
    routed = sample.routed_experts
    if routed is not None:
        code = _ROUTING_CODES.get(routed.dtype.newbyteorder("<"))
        if code is None:
            raise WireFormatError(f"routed_experts dtype {routed.dtype} is not uint8 or uint16")
        if routed.ndim != 3 or len(routed) != max(n - 1, 0):
            raise WireFormatError(
                f"routed_experts has shape {routed.shape}; expected [{max(n - 1, 0)}, layers, top_k]"
            )
        rows, layers, top_k = routed.shape
        sources = sample.routing_sources if sample.routing_sources is not None else np.zeros(rows, np.uint8)
    else:
        code, rows, layers, top_k, sources = 0, 0, 0, 0, None
    for name in ("loss_mask", "rollout_log_probs"):
        if len(getattr(sample, name)) != n:
            raise WireFormatError(f"{name} has {len(getattr(sample, name))} entries for {n} tokens")
    arrays: list[np.ndarray] = [
        np.ascontiguousarray(sample.tokens, dtype="<i4"),
        np.ascontiguousarray(sample.rollout_log_probs, dtype="<f4"),
        np.ascontiguousarray(sample.loss_mask, dtype=np.uint8),
    ]
    if routed is not None and sources is not None:
        arrays.append(np.ascontiguousarray(routed, dtype=_ROUTING_DTYPES[code]))
        arrays.append(np.ascontiguousarray(sources, dtype=np.uint8))
    per_turn: dict[str, list[int]] | None = None
    flags = FLAG_ROUTING if code else 0
    if version >= 2:
        versions = sample.version_arrays()
        for name, length in (("token_version", n), ("kv_version", n), ("routing_version", rows)):
            array = getattr(versions, name)
            if array is not None and len(array) != length:
                raise WireFormatError(f"{name} has {len(array)} entries, expected {length}")
        arrays.append(np.ascontiguousarray(versions.token_version, dtype="<i4"))
        arrays.append(np.ascontiguousarray(versions.kv_version, dtype="<i4"))
        if code:
            assert versions.routing_version is not None and versions.routing_source is not None
            if len(versions.routing_source) != rows:
                raise WireFormatError(
                    f"routing_source has {len(versions.routing_source)} entries for {rows} rows"
                )
            arrays.append(np.ascontiguousarray(versions.routing_version, dtype="<i4"))
            arrays.append(np.ascontiguousarray(versions.routing_source, dtype=np.uint8))
        per_turn = {
            name: array.tolist() for name in _PER_TURN if (array := getattr(versions, name)) is not None
        }
        flags |= FLAG_VERSIONS
    meta = _meta_json(sample, per_turn)
    header = _HEADER.pack(MAGIC, version, flags, n, rows, layers, top_k, code, len(meta))
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


def decode(buffer: bytes | bytearray | memoryview) -> MergedSample:
    """Read a buffer written by `encode`; arrays are zero-copy views (read-only for bytes)."""
    view = memoryview(buffer).cast("B")
    if len(view) < HEADER_SIZE:
        raise WireFormatError(f"buffer has {len(view)} bytes, shorter than the {HEADER_SIZE}-byte header")
    magic, version, _flags, n, rows, layers, top_k, code, meta_len = _HEADER.unpack_from(view, 0)
    if magic != MAGIC:
        raise WireFormatError(f"buffer starts with {bytes(magic)!r}, not the merged-sample magic {MAGIC!r}")
    if version not in READS:
        raise WireFormatError(
            f"merged-sample format version {version} is not supported (this codec reads "
            f"{' and '.join(map(str, READS))})"
        )
    if code and code not in _ROUTING_DTYPES:
        raise WireFormatError(f"unknown routing dtype code {code}")
    offset = HEADER_SIZE
    sections: list[np.ndarray] = []
    layout: list[tuple[np.dtype, tuple[int, ...]]] = [
        (np.dtype("<i4"), (n,)),
        (np.dtype("<f4"), (n,)),
        (np.dtype(np.uint8), (n,)),
    ]
    if code:
        layout += [(_ROUTING_DTYPES[code], (rows, layers, top_k)), (np.dtype(np.uint8), (rows,))]
    versioned = version >= 2
    if versioned:
        layout += [(np.dtype("<i4"), (n,)), (np.dtype("<i4"), (n,))]
        if code:
            layout += [(np.dtype("<i4"), (rows,)), (np.dtype(np.uint8), (rows,))]
    for dtype, shape in layout:
        offset = _aligned(offset)
        count = int(np.prod(shape))
        end = offset + count * dtype.itemsize
        if end > len(view):
            raise WireFormatError(f"buffer of {len(view)} bytes ends inside an array section (needs {end})")
        sections.append(np.frombuffer(view, dtype=dtype, count=count, offset=offset).reshape(shape))
        offset = end
    offset = _aligned(offset)
    if offset + meta_len != len(view):
        raise WireFormatError(f"buffer has {len(view)} bytes; header promises {offset + meta_len}")
    meta = orjson.loads(view[offset : offset + meta_len])
    at = 5 if code else 3  # the first version section
    per_turn = {
        name: np.asarray(meta[name], np.int32) if versioned and meta.get(name) is not None else None
        for name in _PER_TURN
    }
    return MergedSample(
        session_id=meta["session_id"],
        status=meta["status"],
        tokens=sections[0],
        rollout_log_probs=sections[1],
        loss_mask=sections[2],
        routed_experts=sections[3] if code else None,
        routing_sources=sections[4] if code else None,
        prompt_length=meta["prompt_length"],
        weight_versions=meta["weight_versions"],
        turns=meta["turns"],
        metadata=meta["metadata"],
        token_version=sections[at] if versioned else None,
        kv_version=sections[at + 1] if versioned else None,
        routing_version=sections[at + 2] if versioned and code else None,
        routing_source=sections[at + 3] if versioned and code else None,
        turn_first_version=per_turn["turn_first_version"],
        turn_output_start=per_turn[TURN_OUTPUT_START],
        turn_cached_tokens=per_turn[TURN_CACHED_TOKENS],
    )
