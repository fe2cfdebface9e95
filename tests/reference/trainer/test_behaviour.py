"""The behaviour policy per token (`--keep-old-actor`) and the two parity families kept apart."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl360_ext.reference.trainer.backward import TrainModel
from rl360_ext.reference.trainer.behaviour import (
    KvContext,
    SampleVersions,
    VersionHistory,
    low_var_kl,
    sample_versions,
    select_per_token,
    topk_parity,
    turn_first_tokens,
)
from rl360_ext.reference.trainer.trainer import Trainer, TrainerConfig
from rl360_ext.sglang.top_logprobs import NO_TOKEN, TOP_LOGPROBS_KEY
from rl360_ext.sglang.versions import UNVERSIONED, VERSIONS_KEY
from tests.reference.trainer.helpers import SMALL, sample, small_weights

REWARDS = [1.0, -1.0, 0.5, -0.5]


@settings(max_examples=200, deadline=None)
@given(
    versions=st.lists(st.sampled_from([UNVERSIONED, 0, 1, 2, 3, 7]), min_size=0, max_size=40),
    held=st.sets(st.sampled_from([0, 1, 2, 3, 5])),
)
def test_select_per_token_takes_each_tokens_own_version(versions: list[int], held: set[int]) -> None:
    """On any mix of versions, each position takes its own version's value, the fallback otherwise."""
    array = np.asarray(versions, np.int64)
    by_version = {v: np.full(len(array), 100.0 + v) + np.arange(len(array)) for v in held}
    fallback = -np.arange(len(array), dtype=np.float64)
    values, known = select_per_token(by_version, array, fallback)
    for j, v in enumerate(versions):
        assert known[j] == (v in held)
        assert values[j] == (100.0 + v + j if v in held else -j)


def test_version_history_keeps_the_last_k_as_copies() -> None:
    history = VersionHistory(2)
    weights = {"w": np.zeros(3)}
    for version in range(4):
        weights["w"][:] = version
        history.remember(version, weights)
    assert history.versions == [2, 3]
    held = history.get(2)
    assert held is not None and held["w"].tolist() == [2.0, 2.0, 2.0]
    assert history.get(1) is None
    with pytest.raises(ValueError, match="at least 1"):
        VersionHistory(0)


def test_turn_first_tokens_from_turn_starts_or_mask_runs() -> None:
    mask = np.array([1, 1, 0, 0, 1, 1, 1, 0, 1], np.float64)
    runs = turn_first_tokens(mask, 5, None)
    assert np.flatnonzero(runs).tolist() == [0, 4, 8]
    starts = turn_first_tokens(mask, 5, np.array([5, 10, 14]))  # response indices 0, 5, 9 (out of range)
    assert np.flatnonzero(starts).tolist() == [0, 5]


def test_low_var_kl_is_miles_k3() -> None:
    behaviour = np.log(np.array([0.5, 0.2, 0.9]))
    current = np.log(np.array([0.5, 0.4, 0.3]))
    ratio = np.exp(current - behaviour)
    np.testing.assert_allclose(low_var_kl(behaviour, current), ratio - 1 - np.log(ratio))
    assert low_var_kl(behaviour, behaviour).tolist() == [0.0, 0.0, 0.0]


def test_sample_versions_reads_token_versions_then_weight_versions() -> None:
    item = sample(small_weights(), 0)
    n = len(item.tokens)
    plain = sample_versions(item, n)
    prompt = n - item.response_length
    assert plain.token[:prompt].tolist() == [UNVERSIONED] * prompt
    assert plain.token[prompt:].tolist() == [0] * item.response_length
    item.weight_versions = ["0", "1"]  # two labels: no single version for the response
    assert (sample_versions(item, n).token == UNVERSIONED).all()
    item.metadata[VERSIONS_KEY] = {
        "token_version": [UNVERSIONED] * prompt + [4] * item.response_length,
        "kv_version": [4] * n,
        "turn_first_version": [4],
        "routing_version": [3] * (n - 1),
    }
    arrays = sample_versions(item, n)
    assert arrays.token[-1] == 4 and arrays.row.tolist() == [3] * (n - 1)
    item.metadata[VERSIONS_KEY]["token_version"] = [0]
    with pytest.raises(ValueError, match="token_version"):
        sample_versions(item, n, "samples[0]")


def _two_versions(max_token_age: int = 1) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], Trainer]:
    """Weights of version 0 and 1 (one real update), and a trainer that holds both."""
    w0 = small_weights()
    trainer = Trainer(SMALL, w0, TrainerConfig(lr=3e-2, max_token_age=max_token_age))
    trainer.train_step([sample(w0, 20 + i, group_index=0) for i in range(4)], REWARDS, policy_version=0)
    return w0, {k: v.copy() for k, v in trainer.weights.items()}, trainer


def _mixed(w0: dict, w1: dict, index: int, switch: int) -> object:
    """A sample whose response tokens before `switch` were sampled at version 0, the rest at version
    1 (an in-flight push, KV recomputed): each recorded log-prob is its own version's (each engine
    forward routes with its own top-k); the routing rows were all recorded at version 0
    (`routing_version`), so version 1 replays none of them."""
    item = sample(w0, index, group_index=0)
    n, length = len(item.tokens), item.response_length
    prompt = n - length
    tokens = np.asarray(item.tokens)
    routing = np.asarray(item.rollout_routed_experts)
    lp0, _ = TrainModel(SMALL, w0).forward(tokens, prompt, routing)
    lp1, _ = TrainModel(SMALL, w1).forward(tokens, prompt)
    versions = np.where(np.arange(length) < switch, 0, 1)
    mask = np.asarray(item.loss_mask) > 0
    item.rollout_log_probs = np.where(mask, np.where(versions == 0, lp0, lp1), 0.0).tolist()
    item.metadata[VERSIONS_KEY] = {
        "token_version": [UNVERSIONED] * prompt + versions.tolist(),
        "kv_version": [0] * n,
        "turn_first_version": [0],
        "routing_version": [0] * (n - 1),
    }
    return item


def test_keep_old_actor_scores_each_token_with_its_sampling_version() -> None:
    """Mixed-version samples: the mismatch at the sampling version is ~0 while the policy lag is not,
    and under keep_old_actor the update equals one whose old log-probs are the rollout's."""
    w0, w1, _ = _two_versions()
    samples = [_mixed(w0, w1, i, switch=2 + i) for i in range(4)]
    results = {}
    for label, overrides in (
        ("keep_old", {"keep_old_actor": True}),
        ("rollout_old", {"use_rollout_logprobs": True, "use_tis": False}),
        ("current", {}),
    ):
        trainer = Trainer(SMALL, w1, TrainerConfig(clip_grad=0.0, **overrides))
        trainer.history.remember(0, w0)
        metrics = trainer.train_step(samples, REWARDS, policy_version=1)
        results[label] = (metrics, trainer.optimizer.m)
    for metrics, _ in results.values():  # the families do not depend on the mode
        assert metrics["train/logprob_abs_diff_max"] <= 1e-9
        assert metrics["train/routing_agreement"] == 1.0
        assert metrics["train/policy_lag_abs_diff_max"] > 1e-3
        assert metrics["train/policy_lag_kl"] > 0
        assert metrics["train/parity_unscored_tokens"] == 0
    keep_old, rollout_old, current = (results[k][1] for k in ("keep_old", "rollout_old", "current"))
    for name in keep_old:
        np.testing.assert_allclose(keep_old[name], rollout_old[name], rtol=1e-7, atol=1e-15)
    assert any(not np.allclose(keep_old[n], current[n], rtol=1e-3, atol=0) for n in keep_old)
    assert results["keep_old"][0]["train/tis_clipfrac"] == 0.0  # TIS sees only the numerical gap


def test_rows_recorded_by_another_versions_forward_are_not_replayed_at_the_sampling_version() -> None:
    """Delta-R3 keeps an earlier turn's rows (recorded by the version-0 forward); after a flushing push
    (`--pause-mode retract`) this turn's prefill recomputed those positions at version 1, routing
    them with its own top-k. The version-1 tokens are scored replaying only the rows recorded at
    version 1, so the mismatch is ~0 (replaying the version-0 rows read 0.029 in the demo); the
    current policy's forward, the gradient's, still replays every recorded row (R3)."""
    w0, w1, _ = _two_versions()
    split = 4  # rows before it: the earlier turn's, recorded at version 0
    samples, bites = [], False
    for i in range(4):
        item = sample(w0, 60 + i, group_index=0)
        n, length = len(item.tokens), item.response_length
        prompt = n - length
        tokens = np.asarray(item.tokens)
        lp1, tape1 = TrainModel(SMALL, w1).forward(tokens, prompt)  # the engine's version-1 forward
        routing = np.asarray(item.rollout_routed_experts).copy()
        bites |= bool((np.sort(routing[:split], -1) != np.sort(tape1.own_routing[:split], -1)).any())
        routing[split:] = tape1.own_routing[split:]
        item.rollout_routed_experts = routing
        item.rollout_log_probs = np.where(np.asarray(item.loss_mask) > 0, lp1, 0.0).tolist()
        item.metadata[VERSIONS_KEY] = {
            "token_version": [UNVERSIONED] * prompt + [1] * length,
            "kv_version": [1] * n,
            "turn_first_version": [1],
            "routing_version": [0] * split + [1] * (n - 1 - split),
        }
        samples.append(item)
    assert bites  # versions 0 and 1 route some of the earlier rows differently
    trainer = Trainer(SMALL, w1, TrainerConfig(keep_old_actor=True))
    trainer.history.remember(0, w0)
    metrics = trainer.train_step(samples, REWARDS, policy_version=1)
    trained = sum(int((np.asarray(s.loss_mask) > 0).sum()) for s in samples)
    assert metrics["train/fresh_kv_tokens"] == trained
    assert metrics["train/logprob_abs_diff_max"] <= 1e-9
    assert metrics["train/routing_agreement"] == 1.0
    assert metrics["train/policy_lag_abs_diff_max"] > 1e-6  # the gradient's forward replays the v0 rows


def test_rows_a_retracts_re_prefill_rewrote_are_not_replayed_for_the_tokens_before_it() -> None:
    """Within a turn: tokens sampled at version 0, then a retract whose re-prefill (version 1, after
    the flush) recomputed every position and returned its own rows. The version-0 tokens read the
    version-0 forward's own routing, which the record lost: scored at version 0 without replaying
    the version-1 rows, their mismatch is ~0."""
    w0, w1, _ = _two_versions()
    samples = []
    for i in range(4):
        item = sample(w0, 80 + i, group_index=0)  # recorded log-probs: version 0, its own routing
        n = len(item.tokens)
        _, tape1 = TrainModel(SMALL, w1).forward(np.asarray(item.tokens), n - item.response_length)
        item.rollout_routed_experts = tape1.own_routing.copy()  # the re-prefill's rows, version 1
        item.metadata[VERSIONS_KEY] = {
            "token_version": [UNVERSIONED] * (n - item.response_length) + [0] * item.response_length,
            "kv_version": [1] * n,
            "turn_first_version": [0],
            "routing_version": [1] * (n - 1),
        }
        samples.append(item)
    trainer = Trainer(SMALL, w1, TrainerConfig(keep_old_actor=True))
    trainer.history.remember(0, w0)
    metrics = trainer.train_step(samples, REWARDS, policy_version=1)
    assert metrics["train/logprob_abs_diff_max"] <= 1e-9


def test_policy_lag_is_zero_on_fresh_samples_and_mismatch_ignores_it() -> None:
    _, w1, trainer = _two_versions()
    metrics = trainer.train_step([sample(w1, 40 + i, version=1) for i in range(4)], REWARDS, policy_version=1)
    assert metrics["train/policy_lag_abs_diff_max"] == 0.0 and metrics["train/policy_lag_kl"] == 0.0
    assert metrics["train/logprob_abs_diff_max"] <= 1e-9
    assert metrics["train/logprob_abs_diff_first_token_mean"] <= 1e-9
    assert "train/logprob_abs_diff_later_tokens_mean" in metrics


def test_tokens_older_than_the_history_are_refused_or_left_unscored() -> None:
    w0, _, _ = _two_versions()
    old = [sample(w0, i) for i in range(4)]  # version 0, trained at version 2: age 2 > max_token_age 1
    strict = Trainer(SMALL, w0, TrainerConfig(keep_old_actor=True))
    strict.history.remember(0, w0)
    with pytest.raises(ValueError, match=r"samples\[0\] .*versions \[0\].*max_token_age"):
        strict.train_step(old, REWARDS, policy_version=2)
    lenient = Trainer(SMALL, w0, TrainerConfig())
    lenient.history.remember(0, w0)
    metrics = lenient.train_step(old, REWARDS, policy_version=2)
    assert metrics["train/parity_unscored_tokens"] == 4 * 6
    assert "train/logprob_abs_diff_mean" not in metrics and "train/policy_lag_kl" not in metrics
    unversioned = [sample(w0, i, version=None) for i in range(4)]
    with pytest.raises(ValueError, match="-1: unversioned"):
        Trainer(SMALL, w0, TrainerConfig(keep_old_actor=True)).train_step(unversioned, REWARDS)
    assumed = Trainer(SMALL, w0, TrainerConfig(keep_old_actor=True, unversioned_as=0))
    metrics = assumed.train_step(unversioned, REWARDS, policy_version=0)
    assert metrics["train/parity_unscored_tokens"] == 0 and metrics["train/logprob_abs_diff_max"] <= 1e-9


def test_a_step_with_nothing_to_train_still_holds_its_version_for_the_next() -> None:
    """One-step-off: step 1 has only masked samples and step 2 none, so version 1's weights are
    published unchanged as version 2; step 3's samples were sampled with version 2 and must be
    scored with it (the demo crashed here when only steps that trained were remembered)."""
    w0 = small_weights()
    trainer = Trainer(SMALL, w0, TrainerConfig(lr=3e-2, keep_old_actor=True))
    trainer.train_step([sample(w0, 20 + i) for i in range(4)], REWARDS, policy_version=0)
    w1 = {k: v.copy() for k, v in trainer.weights.items()}
    masked = [sample(w1, 60 + i, version=1, remove=True) for i in range(4)]
    assert trainer.train_step(masked, REWARDS, policy_version=1)["train/valid_samples"] == 0.0
    assert trainer.train_step([], [], policy_version=2)["train/valid_samples"] == 0.0
    metrics = trainer.train_step([sample(w1, 70 + i, version=2) for i in range(4)], REWARDS, policy_version=3)
    assert metrics["train/logprob_abs_diff_max"] <= 1e-9 and metrics["train/parity_unscored_tokens"] == 0


def test_max_token_age_is_validated() -> None:
    with pytest.raises(ValueError, match="max_token_age"):
        TrainerConfig(max_token_age=-1)


@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    vocab=st.integers(2, 30),
    k=st.integers(1, 8),
    noise=st.floats(0, 3),
)
def test_topk_parity_bounds_the_true_total_variation(seed: int, vocab: int, k: int, noise: float) -> None:
    """On random pairs of distributions: KL >= 0 (0 when equal), overlap in [0, 1], and the TV bound
    from the engine's top-k alone is never below the exact total variation."""
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal((3, vocab)) * 2
    engine = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    shifted = logits + noise * rng.standard_normal((3, vocab))
    trainer = np.exp(shifted) / np.exp(shifted).sum(axis=1, keepdims=True)
    k = min(k, vocab)
    ids = np.argsort(-engine, axis=1)[:, :k]
    logprobs = np.log(np.take_along_axis(engine, ids, axis=1))
    figures = topk_parity(ids, logprobs, trainer)
    exact_tv = 0.5 * np.abs(engine - trainer).sum(axis=1)
    assert (figures["tv_bound"] >= exact_tv - 1e-12).all()
    assert (figures["kl_engine_trainer"] >= -1e-12).all() and (figures["kl_trainer_engine"] >= -1e-12).all()
    assert ((figures["overlap"] >= 0) & (figures["overlap"] <= 1)).all()
    same = topk_parity(ids, logprobs, engine)
    np.testing.assert_allclose(same["kl_engine_trainer"], 0, atol=1e-12)
    np.testing.assert_allclose(same["overlap"], 1)
    outside = 1 - np.take_along_axis(engine, ids, axis=1).sum(axis=1)
    np.testing.assert_allclose(same["tv_bound"], outside, atol=1e-12)  # only what lies outside S is unknown


def _with_top_k(item, weights: dict, k: int, shift: float = 0.0):
    """`item` with the engine's top-k rows (from `weights`, the sampling version) on its trained tokens."""
    n, length = len(item.tokens), item.response_length
    _, tape = TrainModel(SMALL, weights).forward(
        np.asarray(item.tokens), n - length, np.asarray(item.rollout_routed_experts)
    )
    ids = np.argsort(-tape.softmax, axis=1)[:, :k]
    values = np.log(np.take_along_axis(tape.softmax, ids, axis=1)) + shift * np.arange(k)
    mask = np.asarray(item.loss_mask) > 0
    item.metadata[TOP_LOGPROBS_KEY] = {
        "ids": np.where(mask[:, None], ids, NO_TOKEN).tolist(),
        "logprobs": np.where(mask[:, None], values, 0.0).tolist(),
    }
    return item


def test_top_k_parity_is_measured_at_the_sampling_version() -> None:
    w0, w1, _ = _two_versions()
    samples = [_with_top_k(sample(w0, 60 + i), w0, 4) for i in range(4)]
    keep = Trainer(SMALL, w1, TrainerConfig(keep_old_actor=True))
    keep.history.remember(0, w0)
    metrics = keep.train_step(samples, REWARDS, policy_version=1)
    assert metrics["train/topk_kl"] <= 1e-9 and metrics["train/topk_overlap"] == 1.0
    assert 0 <= metrics["train/tv_bound"] <= metrics["train/tv_bound_max"] <= 1
    assert metrics["train/policy_lag_kl"] > 0  # the current weights moved; the parity did not
    skewed = [_with_top_k(sample(w0, 60 + i), w0, 4, shift=-0.3) for i in range(4)]
    other = Trainer(SMALL, w1, TrainerConfig(keep_old_actor=True))
    other.history.remember(0, w0)
    assert other.train_step(skewed, REWARDS, policy_version=1)["train/topk_kl"] > 1e-3
    broken = sample(w0, 70)
    broken.metadata[TOP_LOGPROBS_KEY] = {"ids": [[1]], "logprobs": [[-0.1]]}
    with pytest.raises(ValueError, match=r"samples\[0\]\.metadata\['rl360_top_logprobs'\] has ids \(1, 1\)"):
        other.train_step([broken], REWARDS[:1], policy_version=1)


def test_context_kv_tells_fresh_stale_and_unknown_kv_apart() -> None:
    fresh, stale, unknown = KvContext.FRESH, KvContext.STALE, KvContext.UNKNOWN
    token = np.array([UNVERSIONED, UNVERSIONED, 0, 0, 1, 1])
    versions = SampleVersions(token=token, row=np.zeros(5, np.int64), kv=np.array([0, 0, 0, 0, 1, 1]))
    assert versions.context_kv(2).tolist() == [fresh, fresh, stale, stale]
    cached = SampleVersions(token=token, row=versions.row, kv=np.array([UNVERSIONED, 1, 0, 0, 1, 1]))
    assert cached.context_kv(2).tolist() == [unknown, unknown, stale, stale]
    current = SampleVersions(token=np.array([-1, -1, 1, 1, 1, -1]), row=versions.row, kv=np.ones(6, np.int64))
    assert current.context_kv(2).tolist() == [fresh, fresh, fresh, unknown]
    assert SampleVersions(token=token, row=versions.row).context_kv(2) is None


def test_mismatch_is_split_by_the_kv_the_sampler_read() -> None:
    w0, w1, _ = _two_versions()
    samples = [_mixed(w0, w1, i, switch=2 + i) for i in range(4)]  # kv_version all 0: v1 tokens read v0 KV
    trainer = Trainer(SMALL, w1, TrainerConfig(keep_old_actor=True))
    trainer.history.remember(0, w0)
    metrics = trainer.train_step(samples, REWARDS, policy_version=1)
    trained_v1 = sum(
        int(((np.asarray(s.loss_mask) > 0) & (np.arange(s.response_length) >= 2 + i)).sum())
        for i, s in enumerate(samples)
    )
    assert metrics["train/stale_kv_tokens"] == trained_v1 > 0
    assert metrics["train/fresh_kv_tokens"] + trained_v1 == sum(
        int((np.asarray(s.loss_mask) > 0).sum()) for s in samples
    )
    assert metrics["train/logprob_abs_diff_fresh_kv_max"] <= 1e-9
    assert metrics["train/logprob_abs_diff_stale_kv_max"] <= 1e-9  # recorded as recomputed: no real staleness
