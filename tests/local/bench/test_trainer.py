"""`rl360 bench trainer`'s parity families: the mismatch at the sampling version apart from policy lag."""

from __future__ import annotations

from rl360_ext.local.bench.trainer import parity_families


def test_float64_mismatch_is_rounding_while_one_step_of_policy_lag_is_not() -> None:
    figures = parity_families("float64")
    assert figures["logprob_abs_diff_max"] <= 1e-9
    assert figures["routing_agreement"] == 1.0
    assert figures["policy_lag_abs_diff_max"] > 1e3 * figures["logprob_abs_diff_max"]
    assert figures["policy_lag_kl"] > 0
