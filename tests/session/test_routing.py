"""Compact routing storage and row sources."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rl360_ext.session.samples.routing import (
    RoutingShape,
    compact_rows,
    row_sources,
    shape_from_model_config,
)
from rl360_ext.sglang.versions import RoutingSource


def test_expert_ids_are_stored_in_a_byte_up_to_256_experts() -> None:
    assert RoutingShape(61, 8, 256).dtype == np.uint8
    assert RoutingShape(61, 8, 257).dtype == np.dtype("<u2")
    assert RoutingShape(61, 8, 256).row_bytes == 488
    rows = np.array([[[0, 255]]], np.int32)
    assert compact_rows(rows, RoutingShape(1, 2, 256)).tolist() == [[[0, 255]]]


def test_ids_outside_the_expert_range_are_refused() -> None:
    with pytest.raises(ValueError, match="expert id 8, outside"):
        compact_rows(np.array([[[8, 1]]], np.int32), RoutingShape(1, 2, 8))
    with pytest.raises(ValueError, match="expected"):
        compact_rows(np.zeros((2, 3, 2), np.int32), RoutingShape(1, 2, 8))
    with pytest.raises(ValueError, match="top_k"):
        RoutingShape(1, 9, 8)


def test_row_sources() -> None:
    # Rows 9..14 of a call whose prompt is 12 tokens; the previous turn sampled positions 6..10.
    sources = row_sources(9, 6, 12, range(6, 10))
    assert sources.dtype == np.uint8
    assert sources.tolist() == [
        RoutingSource.REPREFILL,
        RoutingSource.PREFILL,
        RoutingSource.PREFILL,
        RoutingSource.DECODE,
        RoutingSource.DECODE,
        RoutingSource.DECODE,
    ]


def test_shape_from_a_hugging_face_config(tmp_path) -> None:
    assert shape_from_model_config(tmp_path) is None
    (tmp_path / "config.json").write_text(
        json.dumps({"num_hidden_layers": 61, "num_experts_per_tok": 8, "n_routed_experts": 384})
    )
    assert shape_from_model_config(tmp_path) == RoutingShape(61, 8, 384)
