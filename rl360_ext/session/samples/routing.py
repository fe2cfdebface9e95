"""Compact storage of R3 routing rows and where each row came from.

Owns the routing shape (layers, top_k, expert count), the compact dtype (uint8 when expert ids
fit in a byte, i.e. <= 256 experts, else uint16), the conversion of the engine's int32 rows into
it (refusing ids that do not fit), and which forward recorded each row a delta-R3 response
carries (`row_sources`, in `RoutingSource` codes). It does not own when rows are requested
(`core.py`), how rows are merged into a sample (`merge.py`) or a retract's relabelling
(`policy_versions.py`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rl360_ext.sglang.versions import RoutingSource


@dataclass(frozen=True)
class RoutingShape:
    """Per-position routing: `layers` MoE layers x `top_k` expert ids out of `num_experts`."""

    layers: int
    top_k: int
    num_experts: int

    def __post_init__(self) -> None:
        for name in ("layers", "top_k", "num_experts"):
            if getattr(self, name) < 1:
                raise ValueError(f"routing {name} must be >= 1, got {getattr(self, name)}")
        if self.top_k > self.num_experts:
            raise ValueError(f"routing top_k ({self.top_k}) must be <= num_experts ({self.num_experts})")
        if self.num_experts > 65536:
            raise ValueError(f"routing num_experts {self.num_experts} does not fit uint16 ids")

    @property
    def dtype(self) -> np.dtype:
        return compact_dtype(self.num_experts)

    @property
    def row_bytes(self) -> int:
        return self.layers * self.top_k * self.dtype.itemsize


def compact_dtype(num_experts: int) -> np.dtype:
    """uint8 when every expert id fits a byte (<= 256 experts), else little-endian uint16."""
    return np.dtype(np.uint8) if num_experts <= 256 else np.dtype("<u2")


def compact_rows(rows: np.ndarray, shape: RoutingShape) -> np.ndarray:
    """int32 rows [n, layers, top_k] -> a compact copy; raises if an id is outside [0, num_experts)."""
    if rows.ndim != 3 or rows.shape[1:] != (shape.layers, shape.top_k):
        raise ValueError(f"routing rows have shape {rows.shape}, expected [n, {shape.layers}, {shape.top_k}]")
    if rows.size:
        low, high = int(rows.min()), int(rows.max())
        if low < 0 or high >= shape.num_experts:
            raise ValueError(
                f"routing holds expert id {low if low < 0 else high}, outside [0, {shape.num_experts})"
            )
    return rows.astype(shape.dtype)


def row_sources(start: int, count: int, prompt_len: int, earlier_output: range) -> np.ndarray:
    """`RoutingSource` (uint8) of the rows for positions [start, start + count) one /generate returned.

    Positions >= `prompt_len` were fed by this call's decode (DECODE). Positions below it came
    from this call's prefill: REPREFILL where an earlier turn sampled the token
    (`earlier_output`: the previous turn's output positions), else PREFILL.
    """
    positions = np.arange(start, start + count)
    sources = np.full(count, RoutingSource.PREFILL, dtype=np.uint8)
    sources[positions >= prompt_len] = RoutingSource.DECODE
    if len(earlier_output):
        earlier = (positions >= earlier_output.start) & (positions < earlier_output.stop)
        sources[earlier & (positions < prompt_len)] = RoutingSource.REPREFILL
    return sources


def shape_from_model_config(directory: str | Path) -> RoutingShape | None:
    """Routing shape from a Hugging Face `config.json` next to the tokenizer, if it describes an MoE."""
    path = Path(directory) / "config.json"
    if not path.is_file():
        return None
    config = json.loads(path.read_text())
    config = config.get("text_config", config)
    layers = config.get("num_hidden_layers")
    top_k = config.get("num_experts_per_tok") or config.get("moe_topk")
    experts = config.get("num_experts") or config.get("n_routed_experts") or config.get("num_local_experts")
    if not (layers and top_k and experts):
        return None
    return RoutingShape(int(layers), int(top_k), int(experts))
