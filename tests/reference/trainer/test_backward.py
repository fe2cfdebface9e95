"""Every parameter group's gradient against central finite differences (float64)."""

from __future__ import annotations

import numpy as np
import pytest

from rl360_ext.reference.engine.model import WEIGHT_NAMES_GLOBAL, WEIGHT_NAMES_LAYER, TinyMoEModel
from rl360_ext.reference.trainer.backward import TrainModel
from tests.reference.trainer.helpers import SMALL, small_weights

STEP = 1e-5
TOLERANCE = 1e-6
GROUPS = [
    *WEIGHT_NAMES_GLOBAL,
    *(f"layers.{layer}.{name}" for layer in range(SMALL.layers) for name in WEIGHT_NAMES_LAYER),
]


def _objective(
    weights: dict[str, np.ndarray], sequence: np.ndarray, first: int, c: np.ndarray, replay: np.ndarray | None
) -> float:
    log_probs, _ = TrainModel(SMALL, weights).forward(sequence, first, replay)
    return float((log_probs * c).sum())


def _directional_error(name: str, replay_on: bool, seed: int) -> float:
    rng = np.random.default_rng(seed)
    weights = small_weights(seed)
    sequence = rng.integers(0, SMALL.vocab_size, 24)
    first = 7
    model = TrainModel(SMALL, weights)
    own = TinyMoEModel(SMALL, weights).sequence_routing(sequence[:-1])
    replay = (
        rng.permuted(np.tile(np.arange(SMALL.experts), (len(own), SMALL.layers, 1)), axis=-1)[
            ..., : SMALL.top_k
        ]
        if replay_on
        else None
    )
    c = rng.standard_normal(len(sequence) - first)
    _, tape = model.forward(sequence, first, replay)
    grads = model.backward(tape, c)
    direction = rng.standard_normal(weights[name].shape)
    analytic = float((grads[name] * direction).sum())

    def shifted(sign: float) -> float:
        moved = {k: v.copy() for k, v in weights.items()}
        moved[name] = moved[name] + sign * STEP * direction
        if not replay_on:  # own routing must not flip inside the finite-difference step
            assert np.array_equal(TinyMoEModel(SMALL, moved).sequence_routing(sequence[:-1]), own)
        return _objective(moved, sequence, first, c, replay)

    numeric = (shifted(1.0) - shifted(-1.0)) / (2 * STEP)
    return abs(numeric - analytic) / max(abs(numeric), abs(analytic), 1e-12)


@pytest.mark.parametrize("name", GROUPS)
@pytest.mark.parametrize("replay_on", [False, True], ids=["own-routing", "r3-replay"])
def test_gradient_matches_finite_differences(name: str, replay_on: bool) -> None:
    assert _directional_error(name, replay_on, seed=11) <= TOLERANCE


def test_long_sequence_uses_attention_blocks() -> None:
    """More positions than one attention block: the blockwise backward still matches."""
    rng = np.random.default_rng(5)
    weights = small_weights(5)
    sequence = rng.integers(0, SMALL.vocab_size, 300)
    model = TrainModel(SMALL, weights)
    log_probs, tape = model.forward(sequence, 1)
    np.testing.assert_allclose(
        log_probs, TinyMoEModel(SMALL, weights).sequence_logprobs(sequence), atol=1e-12
    )
    c = rng.standard_normal(len(log_probs))
    grads = model.backward(tape, c)
    replay = tape.used_routing
    for name in ("layers.0.wq", "layers.1.wk", "embed"):
        direction = rng.standard_normal(weights[name].shape)
        values = []
        for sign in (1.0, -1.0):
            moved = {k: v.copy() for k, v in weights.items()}
            moved[name] = moved[name] + sign * STEP * direction
            values.append(_objective(moved, sequence, 1, c, replay))
        numeric = (values[0] - values[1]) / (2 * STEP)
        analytic = float((grads[name] * direction).sum())
        assert abs(numeric - analytic) <= TOLERANCE * max(abs(numeric), 1e-12)


def test_forward_equals_engine_logprobs() -> None:
    rng = np.random.default_rng(2)
    weights = small_weights(2)
    sequence = rng.integers(0, SMALL.vocab_size, 40)
    log_probs, tape = TrainModel(SMALL, weights).forward(sequence, 10)
    expected = TinyMoEModel(SMALL, weights).sequence_logprobs(sequence)[9:]
    np.testing.assert_allclose(log_probs, expected, rtol=0, atol=1e-12)
    assert np.array_equal(tape.own_routing, TinyMoEModel(SMALL, weights).sequence_routing(sequence[:-1]))


def test_bad_replay_is_refused() -> None:
    weights = small_weights()
    sequence = np.arange(10) % SMALL.vocab_size
    model = TrainModel(SMALL, weights)
    with pytest.raises(ValueError, match="shape"):
        model.forward(sequence, 3, np.zeros((4, SMALL.layers, SMALL.top_k), np.int32))
    with pytest.raises(ValueError, match="outside"):
        model.forward(sequence, 3, np.full((9, SMALL.layers, SMALL.top_k), SMALL.experts, np.int32))
    with pytest.raises(ValueError, match="repeats"):
        model.forward(sequence, 3, np.zeros((9, SMALL.layers, SMALL.top_k), np.int32))


def test_replay_rows_replay_only_those_rows() -> None:
    """`replay_rows` limits R3 to the rows it marks: all of them is a full replay, none is the model's
    own routing, and a row left out routes with the model's own top-k."""
    weights = small_weights()
    sequence = (np.arange(12) * 7) % SMALL.vocab_size
    model = TrainModel(SMALL, weights)
    own_lp, own = model.forward(sequence, 3)
    replay = np.roll(own.own_routing, 1, axis=0)  # another routing on most rows
    full_lp, _ = model.forward(sequence, 3, replay)
    rows = np.zeros(11, bool)
    np.testing.assert_array_equal(model.forward(sequence, 3, replay, ~rows)[0], full_lp)
    np.testing.assert_array_equal(model.forward(sequence, 3, replay, rows)[0], own_lp)
    rows[5:] = True
    _, tape = model.forward(sequence, 3, replay, rows)
    assert np.array_equal(tape.used_routing[5:], replay[5:])
    assert np.array_equal(tape.used_routing[:5], own.own_routing[:5])
    with pytest.raises(ValueError, match="replay_rows"):
        model.forward(sequence, 3, replay, rows[:4])
