"""The routing delta's base64 decode (pybase64): byte-exact with the stdlib, strict on bad input."""

from __future__ import annotations

import base64

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from rl360_ext.sglang.client import EngineResponseError, decode_routed_experts

ROWS = hnp.arrays(
    dtype=np.dtype("<i4"),
    shape=st.tuples(st.integers(0, 40), st.integers(1, 8), st.integers(1, 8)),
    elements=st.integers(-(2**31), 2**31 - 1),
)


@settings(max_examples=200, deadline=None)
@given(rows=ROWS)
def test_decode_is_the_inverse_of_the_engines_encoding(rows: np.ndarray) -> None:
    encoded = base64.b64encode(rows.tobytes()).decode("ascii")
    decoded = decode_routed_experts(encoded)
    assert decoded.dtype == np.dtype("<i4")
    assert np.array_equal(decoded, rows.reshape(-1))
    assert decoded.tobytes() == base64.b64decode(encoded)


@pytest.mark.parametrize("bad", ["AAAA!AAA", "AAAA\nAAAA", "AAA", "AAAAA"])
def test_text_that_is_not_base64_is_an_engine_response_error(bad: str) -> None:
    with pytest.raises(EngineResponseError, match="routed_experts"):
        decode_routed_experts(bad)
