"""The tiny MoE model: determinism per seed, incremental == full forward, weight files."""

from __future__ import annotations

import numpy as np
import pytest

from rl360_ext.reference.engine.model import (
    KVState,
    ModelConfig,
    TinyMoEModel,
    init_weights,
    load_weights,
    log_softmax,
    perturb_weights,
    save_weights,
)

CONFIG = ModelConfig(vocab_size=97, layers=2, experts=4, top_k=2)


def _tokens(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, CONFIG.vocab_size, n)


def test_same_seed_same_weights_and_outputs() -> None:
    a, b = TinyMoEModel.from_seed(CONFIG, 3), TinyMoEModel.from_seed(CONFIG, 3)
    assert all(np.array_equal(a.weights[k], b.weights[k]) for k in a.weights)
    tokens = _tokens(20)
    assert np.array_equal(a.sequence_logprobs(tokens), b.sequence_logprobs(tokens))
    assert np.array_equal(a.sequence_routing(tokens), b.sequence_routing(tokens))


def test_different_seed_different_model() -> None:
    tokens = _tokens(20)
    a, b = TinyMoEModel.from_seed(CONFIG, 3), TinyMoEModel.from_seed(CONFIG, 4)
    assert not np.allclose(a.sequence_logprobs(tokens), b.sequence_logprobs(tokens))


@pytest.mark.parametrize("chunks", [[30], [1] * 30, [7, 1, 1, 13, 8], [29, 1]])
def test_incremental_forward_matches_full_forward(chunks: list[int]) -> None:
    model = TinyMoEModel.from_seed(CONFIG, 1)
    tokens = _tokens(sum(chunks), seed=5)
    kv = KVState.empty(CONFIG, 4)  # forces the buffer to grow
    logprobs, routing, pos = [], [], 0
    for size in chunks:
        out = model.forward(tokens[pos : pos + size], kv, logits_for="all")
        logprobs.append(log_softmax(out.logits))
        routing.append(out.routing)
        pos += size
    stepwise = np.concatenate(logprobs)[np.arange(len(tokens) - 1), tokens[1:]]
    assert np.max(np.abs(stepwise - model.sequence_logprobs(tokens))) < 1e-9
    assert np.array_equal(np.concatenate(routing), model.sequence_routing(tokens))


def test_routing_is_top_k_distinct_experts() -> None:
    routing = TinyMoEModel.from_seed(CONFIG, 0).sequence_routing(_tokens(40))
    assert routing.shape == (40, CONFIG.layers, CONFIG.top_k) and routing.dtype == np.int32
    assert routing.min() >= 0 and routing.max() < CONFIG.experts
    assert all(len(set(row)) == CONFIG.top_k for row in routing.reshape(-1, CONFIG.top_k).tolist())
    assert len(np.unique(routing)) > 1  # the router actually spreads tokens


def test_save_load_round_trip_and_perturbation(tmp_path) -> None:
    weights = init_weights(CONFIG, 0)
    path = save_weights(tmp_path / "w", CONFIG, perturb_weights(weights, 0.05, seed=1))
    assert path == tmp_path / "w" / "weights.npz"
    loaded = load_weights(path, CONFIG)
    assert not np.array_equal(loaded["embed"], weights["embed"])
    assert np.allclose(loaded["embed"], weights["embed"], atol=0.5)
    assert set(loaded) == set(weights)


def test_load_rejects_other_config(tmp_path) -> None:
    path = save_weights(tmp_path / "w.npz", CONFIG, init_weights(CONFIG, 0))
    other = ModelConfig(vocab_size=97, layers=3, experts=4, top_k=2)
    with pytest.raises(ValueError, match="layers"):
        load_weights(path, other)
    with pytest.raises(FileNotFoundError):
        load_weights(tmp_path / "missing.npz", CONFIG)


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="top_k"):
        ModelConfig(vocab_size=10, experts=2, top_k=3)
    with pytest.raises(ValueError, match="layers"):
        ModelConfig(vocab_size=10, layers=0)
