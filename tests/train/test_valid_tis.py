"""TIS wrapper: Miles' vanilla TIS on the loss; mismatch metrics averaged over valid samples' tokens."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from rl360_ext.train.tis import valid_token_tis


def tis_args(**overrides: object) -> SimpleNamespace:
    return SimpleNamespace(**{"use_tis": True, "tis_clip": 2.0, "tis_clip_low": 0.0, **overrides})


def miles_metric_reduction(value: np.ndarray, masks: list[np.ndarray]) -> float:
    """What Miles logs: sum of per-sample masked means (sum_of_sample_mean) divided by the sample count."""
    total, start = 0.0, 0
    for mask in masks:
        piece = value[start : start + len(mask)]
        start += len(mask)
        total += float((piece * mask).sum() / max(mask.sum(), 1))
    return total / len(masks)


def setup() -> dict:
    masks = [np.array([1, 1, 0]), np.array([1, 1]), np.array([0, 0, 0])]  # the last sample is infra
    train = [np.array([-1.0, -2.0, -3.0]), np.array([-0.5, -0.5]), np.array([-1.0, -1.0, -1.0])]
    rollout = [np.array([-1.5, -2.0, 40.0]), np.array([-0.5, -2.0]), np.array([-900.0, 3.0, 0.0])]
    return {
        "pg_loss": np.array([1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]),
        "train_log_probs": train,
        "rollout_log_probs": rollout,
        "loss_masks": masks,
        "total_lengths": [5, 4, 6],
        "response_lengths": [3, 2, 3],
        "parallel_state": None,
        "max_seq_lens": None,
    }


def test_loss_gets_miles_clamped_weights_on_unmasked_tokens() -> None:
    kwargs = setup()
    pg_loss, masks, _ = valid_token_tis(tis_args(), **kwargs)
    assert masks is kwargs["loss_masks"]
    expected = np.minimum(np.exp([0.5, 0.0]), 2.0)
    assert pg_loss[:2] == pytest.approx(expected)
    assert pg_loss[3:5] == pytest.approx([1.0, 2.0])  # exp(1.5) clamped to tis_clip
    assert np.isfinite(pg_loss).all()


def test_mismatch_metrics_only_leave_the_loss_alone() -> None:
    kwargs = setup()
    pg_loss, _, metrics = valid_token_tis(tis_args(use_tis=False), **kwargs)
    assert pg_loss is kwargs["pg_loss"]
    assert set(metrics) == {"tis", "tis_clipfrac", "tis_abs", "logprob_abs_diff"}


def test_metrics_after_miles_reduction_are_valid_sample_means() -> None:
    kwargs = setup()
    _, _, metrics = valid_token_tis(tis_args(), **kwargs)
    masks = kwargs["loss_masks"]
    ratio_a, ratio_b = np.exp([0.5, 0.0]), np.exp([0.0, 1.5])
    assert miles_metric_reduction(metrics["tis"], masks) == pytest.approx(
        (ratio_a.mean() + ratio_b.mean()) / 2
    )
    assert miles_metric_reduction(metrics["logprob_abs_diff"], masks) == pytest.approx((0.25 + 0.75) / 2)
    assert miles_metric_reduction(metrics["tis_clipfrac"], masks) == pytest.approx((0.0 + 0.5) / 2)
    assert miles_metric_reduction(metrics["tis_abs"], masks) == pytest.approx(
        (np.abs(ratio_a - 1).mean() + np.abs(ratio_b - 1).mean()) / 2
    )
    for value in metrics.values():
        assert np.isfinite(value).all()  # huge differences at masked tokens never become inf * 0


def test_length_mismatch_is_an_error() -> None:
    kwargs = setup()
    kwargs["pg_loss"] = kwargs["pg_loss"][:-1]
    with pytest.raises(ValueError, match="differ in length"):
        valid_token_tis(tis_args(), **kwargs)
