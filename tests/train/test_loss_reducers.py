"""Loss reducers: masked samples never shrink the gradient; numpy arrays stand in for Miles' torch tensors."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl360_ext.train import reducers
from rl360_ext.train.reducers import PG_LOSS_CONSTANT_ENV, configure, constant_normalizer, valid_sample_mean


@pytest.fixture(autouse=True)
def no_constant(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(PG_LOSS_CONSTANT_ENV, raising=False)
    configure(constant=None)
    yield
    configure(constant=None)


def batch(masks: list[list[int]], seed: int = 0) -> tuple[list[int], list[np.ndarray], np.ndarray]:
    rng = np.random.default_rng(seed)
    lengths = [len(m) for m in masks]
    x = rng.normal(size=sum(lengths))
    return lengths, [np.array(m, dtype=np.int32) for m in masks], x


def ref_valid_mean(masks: list[list[int]], x: np.ndarray) -> float:
    """Brute force: mean of per-sample token means over samples with an unmasked token, times n."""
    means, start = [], 0
    for mask in masks:
        piece = x[start : start + len(mask)]
        start += len(mask)
        if sum(mask):
            means.append(sum(float(p) * m for p, m in zip(piece, mask, strict=True)) / sum(mask))
    return len(masks) * (sum(means) / len(means) if means else 0.0)


def ref_token(masks: list[list[int]], x: np.ndarray) -> float:
    flat_mask = [m for mask in masks for m in mask]
    unmasked = sum(flat_mask)
    token_sum = sum(float(v) * m for v, m in zip(x, flat_mask, strict=True))
    clamped = sum(max(sum(mask), 1) for mask in masks)
    return token_sum / max(unmasked, 1) * clamped


mask_lists = st.lists(st.lists(st.integers(0, 1), min_size=0, max_size=7), min_size=1, max_size=8)


@settings(max_examples=150)
@given(masks=mask_lists, seed=st.integers(0, 1000))
def test_reducers_equal_a_reference_on_random_masks(masks: list[list[int]], seed: int) -> None:
    lengths, arrays, x = batch(masks, seed)
    assert float(valid_sample_mean(None, lengths, arrays, False)(x)) == pytest.approx(
        ref_valid_mean(masks, x)
    )
    assert float(valid_sample_mean(None, lengths, arrays, True)(x)) == pytest.approx(ref_token(masks, x))
    configure(constant=64.0)
    sums = [
        sum(float(v) * m for v, m in zip(x[sum(lengths[:i]) : sum(lengths[: i + 1])], mask, strict=True))
        for i, mask in enumerate(masks)
    ]
    valid = sum(1 for mask in masks if sum(mask))
    expected = len(masks) * sum(sums) / 64.0 / max(valid, 1)
    assert float(constant_normalizer(None, lengths, arrays, False)(x)) == pytest.approx(expected)


@settings(max_examples=100)
@given(
    masks=st.lists(st.lists(st.integers(0, 1), min_size=1, max_size=6), min_size=1, max_size=6),
    masked_lengths=st.lists(st.integers(1, 6), min_size=1, max_size=6),
    seed=st.integers(0, 1000),
)
def test_adding_masked_samples_never_changes_the_loss_scale(
    masks: list[list[int]], masked_lengths: list[int], seed: int
) -> None:
    """In one micro-batch Miles divides by the sample count (per-token: clamped token count)."""
    lengths, arrays, x = batch(masks, seed)
    more_masks = masks + [[0] * n for n in masked_lengths]
    more_lengths, more_arrays, _ = batch(more_masks)
    more_x = np.concatenate([x, np.random.default_rng(seed + 1).normal(size=sum(masked_lengths)) * 1e3])
    base = valid_sample_mean(None, lengths, arrays, False)(x) / len(masks)
    more = valid_sample_mean(None, more_lengths, more_arrays, False)(more_x) / len(more_masks)
    assert float(more) == pytest.approx(float(base))
    clamped = sum(max(sum(m), 1) for m in masks)
    more_clamped = sum(max(sum(m), 1) for m in more_masks)
    base_tok = valid_sample_mean(None, lengths, arrays, True)(x) / clamped
    more_tok = valid_sample_mean(None, more_lengths, more_arrays, True)(more_x) / more_clamped
    assert float(more_tok) == pytest.approx(float(base_tok))


def test_field_step_no_longer_scales_gradients_by_059() -> None:
    """56 samples, 23 fully masked: Miles' default reducer / 56 is 33/56 of the valid mean; ours is 1x."""
    masks = [[1, 1, 1]] * 33 + [[0, 0, 0]] * 23
    lengths, arrays, _ = batch(masks)
    x = np.ones(sum(lengths))
    default = (
        sum(float((x[i * 3 : i * 3 + 3] * m).sum() / max(m.sum(), 1)) for i, m in enumerate(arrays)) / 56
    )
    ours = float(valid_sample_mean(None, lengths, arrays, False)(x)) / 56
    assert default == pytest.approx(33 / 56) and round(default, 2) == 0.59
    assert ours == pytest.approx(1.0)


def test_constant_comes_from_configure_env_or_megatron_args(monkeypatch: pytest.MonkeyPatch) -> None:
    lengths, arrays, x = batch([[1, 1], [1, 0]])
    with pytest.raises(ValueError, match="--rl360-pg-loss-constant"):
        constant_normalizer(None, lengths, arrays, False)
    monkeypatch.setenv(PG_LOSS_CONSTANT_ENV, "4")
    assert float(constant_normalizer(None, lengths, arrays, False)(x)) == pytest.approx(
        (x[0] + x[1] + x[2]) / 4
    )
    monkeypatch.setenv(PG_LOSS_CONSTANT_ENV, "-1")
    with pytest.raises(ValueError, match="positive"):
        constant_normalizer(None, lengths, arrays, False)
    monkeypatch.delenv(PG_LOSS_CONSTANT_ENV)
    fake_global_vars = type(
        "GlobalVars", (), {"get_args": staticmethod(lambda: type("A", (), {"rl360_pg_loss_constant": 2.0}))}
    )
    monkeypatch.setitem(reducers.sys.modules, "megatron.training.global_vars", fake_global_vars)
    assert reducers.pg_loss_constant() == 2.0
    configure(constant=8)
    assert reducers.pg_loss_constant() == 8.0


def test_constant_normalizer_refuses_per_token_loss() -> None:
    lengths, arrays, _ = batch([[1]])
    with pytest.raises(ValueError, match="calculate_per_token_loss"):
        constant_normalizer(None, lengths, arrays, True)


def test_shape_errors_name_the_problem() -> None:
    lengths, arrays, x = batch([[1, 1], [1]])
    with pytest.raises(ValueError, match="context parallelism"):
        valid_sample_mean(None, lengths, arrays, False)(x[:2])
    with pytest.raises(ValueError, match=r"loss_masks\[1\]"):
        valid_sample_mean(None, [2, 2], arrays, False)


def test_module_never_imports_torch() -> None:
    import inspect

    from rl360_ext.train import tis

    for module in (reducers, tis):
        assert "import torch" not in inspect.getsource(module)
