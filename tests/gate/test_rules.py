"""The step gate's rules: each fires on its metric past its bound, names it, and never on missing evidence."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl360_ext.gate.config import StepGate, add_arguments
from rl360_ext.gate.rules import Action, GateState, decide

CLEAN = {
    "train/logprob_abs_diff_fresh_kv_max": 3.4e-7,
    "train/stale_kv_tokens": 0.0,
    "train/topk_kl": 7.3e-16,
    "train/routing_agreement": 1.0,
    "infra/failure_rate": 0.3,
    "count/attempts": 32,
    "count/policy_floor": 0,
    "count/trained": 16,
    "count/masked": 4,
    "count/kept_groups": 4,
    "tasks/unhealthy_trained_frac": 0.0,
    "tito/render_mismatch_frac": 0.0,
    "weights/engines_expected": 4,
    "weights/engines_reached": 4,
    "weights/stale_served_tokens": 0,
    "staleness/token_age_max": 1.0,
}


def _warm(evidence: dict | None = None, steps: int = 3) -> GateState:
    state = GateState()
    for _ in range(steps):
        verdict = decide(evidence or CLEAN, state)
        assert verdict.action is Action.TRAIN, verdict.reasons
        state = verdict.state
    return state


def test_a_clean_step_trains_with_every_rule_judged() -> None:
    verdict = decide(CLEAN, _warm())
    assert verdict.action is Action.TRAIN and verdict.reasons == []
    assert verdict.unavailable == []
    assert {"parity/mismatch", "parity/topk_kl", "parity/routing_agreement", "provenance/infra_burst",
            "provenance/policy_rise", "provenance/valid_per_group", "weights/partial_push",
            "weights/stale_served", "tasks/unhealthy_share", "templates/drift",
            "staleness/token_age"} <= set(verdict.checked)  # fmt: skip


@pytest.mark.parametrize(
    ("change", "rule", "value", "bound"),
    [
        ({"train/logprob_abs_diff_fresh_kv_max": 0.4}, "parity/mismatch", 0.4, 1e-3),
        ({"train/topk_kl": 0.07}, "parity/topk_kl", 0.07, 1e-3),
        ({"train/routing_agreement": 0.95}, "parity/routing_agreement", 0.95, 0.99),
        ({"infra/failure_rate": 0.8}, "provenance/infra_rate", 0.8, 0.75),
        ({"count/masked": 12}, "provenance/valid_per_group", 1.0, 2.0),
        ({"tasks/unhealthy_trained_frac": 0.5}, "tasks/unhealthy_share", 0.5, 0.25),
        ({"tito/render_mismatch_frac": 0.1}, "templates/drift", 0.1, 0.0),
        ({"weights/engines_reached": 3}, "weights/partial_push", 1.0, 0.0),
        ({"weights/stale_served_tokens": 17}, "weights/stale_served", 17.0, 0.0),
        ({"staleness/token_age_max": 3}, "staleness/token_age", 3.0, 1.0),
    ],
)
def test_each_rule_skips_and_names_its_metric_value_and_bound(change, rule, value, bound) -> None:
    verdict = decide({**CLEAN, **change}, _warm())
    assert verdict.action is Action.SKIP
    fired = {reason.rule: reason for reason in verdict.reasons}
    assert rule in fired, verdict.reasons
    assert math.isclose(fired[rule].value, value) and math.isclose(fired[rule].bound, bound)
    assert rule in str(fired[rule]) and fired[rule].metric in str(fired[rule])


def test_a_burst_against_the_baseline_skips_below_the_absolute_bound() -> None:
    state = _warm({**CLEAN, "infra/failure_rate": 0.05, "count/attempts": 256})
    verdict = decide({**CLEAN, "infra/failure_rate": 0.4, "count/attempts": 256}, state)
    assert verdict.action is Action.SKIP
    (reason,) = verdict.reasons
    assert reason.rule == "provenance/infra_burst" and math.isclose(reason.bound, 0.25)


def test_burst_bound_widens_with_sampling_noise_of_small_steps() -> None:
    state = _warm({**CLEAN, "infra/failure_rate": 0.31})  # 32 attempts: 4 sd = 0.33
    assert decide({**CLEAN, "infra/failure_rate": 0.56}, state).action is Action.TRAIN
    assert decide({**CLEAN, "infra/failure_rate": 0.66}, state).action is Action.SKIP


def test_policy_failures_rising_skip_and_absent_rate_reads_zero_only_when_attribution_ran() -> None:
    state = _warm()
    assert state.policy_rates == (0.0, 0.0, 0.0)
    verdict = decide({**CLEAN, "attribution/policy_rate": 0.5}, state)
    assert [r.rule for r in verdict.reasons] == ["provenance/policy_rise"]
    no_attribution = {k: v for k, v in CLEAN.items() if k != "count/policy_floor"}
    verdict = decide(no_attribution, state)
    assert ("provenance/policy_rise", "attribution/policy_rate", "not produced") in {
        (u.rule, u.metric, u.why) for u in verdict.unavailable
    }


def test_topk_and_routing_are_judged_only_on_fresh_kv() -> None:
    stale = {**CLEAN, "train/stale_kv_tokens": 40.0, "train/topk_kl": 0.07, "train/routing_agreement": 0.95}
    verdict = decide(stale, _warm())
    assert verdict.action is Action.TRAIN
    assert {u.rule for u in verdict.unavailable} == {"parity/topk_kl", "parity/routing_agreement"}
    no_split = {k: v for k, v in stale.items() if k != "train/stale_kv_tokens"}
    assert decide(no_split, _warm()).action is Action.TRAIN


def test_missing_or_non_finite_evidence_never_fires_and_is_listed() -> None:
    evidence = {"infra/failure_rate": float("nan"), "train/topk_kl": True, "tito/render_mismatch_frac": "x",
                "infra/failure_rate_extra": 1.0, "staleness/token_age_max": None}  # fmt: skip
    verdict = decide(evidence)
    assert verdict.action is Action.TRAIN and verdict.reasons == []
    why = {(u.metric, u.why.split(":")[0]) for u in verdict.unavailable}
    assert ("infra/failure_rate", "not a finite number") in why
    assert ("train/topk_kl", "not a finite number") in why
    assert ("tito/render_mismatch_frac", "not a finite number") in why
    assert ("staleness/token_age_max", "not produced") in why
    unavailable = decide({"infra/failure_rate": 1.5}).unavailable
    shares = [u.why for u in unavailable if u.metric == "infra/failure_rate"]
    assert shares == ["not a share in [0, 1]: 1.5"]


def test_consecutive_skips_stop_and_a_trained_step_resets_the_streak() -> None:
    state = _warm()
    bad = {**CLEAN, "tito/render_mismatch_frac": 0.2}
    actions = []
    for evidence in (bad, bad, CLEAN, bad, bad, bad):
        verdict = decide(evidence, state)
        actions.append(verdict.action)
        state = verdict.state
    assert actions == [Action.SKIP, Action.SKIP, Action.TRAIN, Action.SKIP, Action.SKIP, Action.STOP]
    assert verdict.reasons[-1].rule == "gate/consecutive_skips" and verdict.reasons[-1].hard


@pytest.mark.parametrize(
    ("change", "rule"),
    [
        ({"infra/failure_rate": 1.0}, "provenance/infra_down"),
        ({"weights/engines_reached": 0}, "weights/no_engine_reached"),
    ],
)
def test_a_hard_rule_stops_at_once(change, rule) -> None:
    verdict = decide({**CLEAN, **change}, _warm())
    assert verdict.action is Action.STOP
    assert any(r.rule == rule and r.hard for r in verdict.reasons)


def test_skipped_steps_stay_out_of_the_baseline() -> None:
    state = _warm()
    verdict = decide({**CLEAN, "infra/failure_rate": 0.9}, state)
    assert verdict.action is Action.SKIP
    assert verdict.state.infra_rates == state.infra_rates
    assert verdict.state.consecutive_skips == 1 and verdict.state.steps == 4


def test_baseline_warming_up_is_listed_not_guessed() -> None:
    verdict = decide({**CLEAN, "infra/failure_rate": 0.7})
    assert verdict.action is Action.TRAIN
    assert any(u.rule == "provenance/infra_burst" and "warming up" in u.why for u in verdict.unavailable)


def test_verdict_metrics_and_json() -> None:
    verdict = decide({**CLEAN, "staleness/token_age_max": 2}, _warm())
    metrics = verdict.metrics()
    assert metrics["gate/skip"] == 1.0 and metrics["gate/train"] == 0.0
    assert metrics["gate/fired/staleness/token_age"] == 1.0
    data = verdict.to_json()
    assert data["action"] == "skip" and data["reasons"][0]["bound"] == 1.0
    assert GateState.from_json(data["state"]) == verdict.state


rates = st.lists(st.floats(0.0, 1.0), max_size=12).map(tuple)


@settings(max_examples=200, deadline=None)
@given(
    st.integers(0, 10**6), st.integers(0, 10**6), rates, rates,
)
def test_state_round_trips_through_json(steps, skips, infra, policy) -> None:
    state = GateState(steps=steps, consecutive_skips=skips, infra_rates=infra, policy_rates=policy)
    assert GateState.from_json(state.to_json()) == state


@pytest.mark.parametrize(
    "data",
    [[], {"steps": -1}, {"steps": True}, {"infra_rates": [2.0]}, {"policy_rates": "x"}, {"other": 1}],
)
def test_a_bad_state_names_the_field(data) -> None:
    with pytest.raises(ValueError, match="gate state"):
        GateState.from_json(data)


metric_names = st.sampled_from([*sorted(CLEAN), "attribution/policy_rate"])
values = st.one_of(
    st.none(), st.booleans(), st.text(max_size=3), st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-5, 10**6),
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(metric_names, values), st.integers(0, 5))
def test_any_evidence_gives_a_verdict_whose_reasons_justify_it(evidence, skips) -> None:
    """Hostile evidence: never an exception; train exactly when no rule fired (streak below the
    bound); every reason's value really is past its bound; a missing metric is never a reason."""
    state = GateState(consecutive_skips=skips)
    verdict = decide(evidence, state)
    assert (verdict.action is Action.TRAIN) == (not verdict.reasons)
    for reason in verdict.reasons:
        assert math.isfinite(reason.value)
        assert {">": reason.value > reason.bound, "<": reason.value < reason.bound,
                ">=": reason.value >= reason.bound}[reason.op]  # fmt: skip
        if not reason.metric.startswith("gate/"):
            assert reason.metric in evidence
    if verdict.reasons and not any(r.hard for r in verdict.reasons):
        assert verdict.action is Action.SKIP
    assert verdict.state.steps == 1


def test_config_refuses_bad_values_by_field() -> None:
    with pytest.raises(ValueError, match="max_topk_kl"):
        StepGate(max_topk_kl=-1.0)
    with pytest.raises(ValueError, match="min_routing_agreement"):
        StepGate(min_routing_agreement=1.5)
    with pytest.raises(ValueError, match="max_consecutive_skips"):
        StepGate(max_consecutive_skips=0)
    with pytest.raises(ValueError, match="baseline_min_steps"):
        StepGate(baseline_window=2, baseline_min_steps=3)
    with pytest.raises(ValueError, match="max_infra_rate"):
        StepGate(max_infra_rate=float("nan"))


def test_config_from_flags_then_environment() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--rl360-gate-max-topk-kl", "0.5"])
    environ = {"RL360_GATE_MAX_TOPK_KL": "0.1", "RL360_GATE_MAX_CONSECUTIVE_SKIPS": "5"}
    config = StepGate.from_args(args, environ)
    assert config.max_topk_kl == 0.5 and config.max_consecutive_skips == 5
    assert StepGate.from_args(SimpleNamespace(), {}) == StepGate()
    with pytest.raises(ValueError, match="RL360_GATE_BASELINE_WINDOW"):
        StepGate.from_args(SimpleNamespace(), {"RL360_GATE_BASELINE_WINDOW": "many"})
