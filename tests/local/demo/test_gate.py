"""`rl360 demo`'s step gate and `--inject`: parsing, the fault plans, the gate's wiring to the trainer."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from rl360_ext.cli import app
from rl360_ext.gate.rules import INFRA_RATE, TOPK_KL
from rl360_ext.local.demo.faults import (
    BAD_PUSH,
    BURST,
    INJECT_KINDS,
    TEMPLATE_DRIFT,
    Injection,
    parse_injections,
)
from rl360_ext.local.demo.gate import DemoGate, bad_push_target, drift_template, perturbed_weights
from rl360_ext.local.demo.modes import BURST_RATE, IN_FLIGHT, ONE_STEP_OFF
from rl360_ext.local.demo.plan import SANDBOX_START, DemoConfig, plan_step
from rl360_ext.reference.trainer.trainer import Trainer, TrainerConfig
from rl360_ext.rollout.metrics import append_records, read_records
from tests.reference.trainer.helpers import SMALL, sample, small_weights

TASKS = [f"quiz-{i:02d}" for i in range(8)]


# ---- --inject parsing --------------------------------------------------------------------------


@given(st.lists(st.tuples(st.sampled_from(INJECT_KINDS), st.integers(0, 10_000)), unique=True, max_size=6))
def test_injections_round_trip_in_step_order(pairs: list[tuple[str, int]]) -> None:
    parsed = parse_injections([f"{kind}:{step}" for kind, step in pairs])
    assert sorted(parsed, key=lambda i: (i.step, i.kind)) == list(parsed)
    assert {(i.kind, i.step) for i in parsed} == set(pairs)
    assert parse_injections([",".join(str(i) for i in parsed)]) == parsed if parsed else True


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("burst", "expected FAULT:STEP"),
        ("meteor:3", "unknown fault 'meteor'"),
        ("burst:x", "STEP must be a rollout step"),
        ("burst:-1", "STEP must be a rollout step"),
        ("burst:1,", "an empty FAULT:STEP"),
    ],
)
def test_bad_inject_values_are_named(value: str, says: str) -> None:
    with pytest.raises(ValueError, match=says) as raised:
        parse_injections([value])
    assert repr(value) in str(raised.value) or value.rstrip(",") in str(raised.value)


def test_a_fault_twice_on_one_step_and_a_step_past_the_run_are_refused() -> None:
    with pytest.raises(ValueError, match="burst:2: given twice"):
        parse_injections(["burst:2", "burst:2"])
    with pytest.raises(ValueError, match=r"bad-push:5: step 5 is past the run's last step \(4\)"):
        DemoConfig(steps=5, inject=parse_injections(["bad-push:5"]))
    with pytest.raises(ValueError, match="expected FAULT:STEP values"):
        DemoConfig(steps=5, inject=("burst:1",))  # type: ignore[arg-type]


def test_the_cli_names_a_bad_inject_value() -> None:
    result = CliRunner().invoke(app, ["demo", "--inject", "template-drift:soon"], env={"COLUMNS": "240"})
    assert result.exit_code == 2
    assert "template-drift:soon" in result.output and "STEP must be a rollout step" in result.output


# ---- the faults' plans -------------------------------------------------------------------------


def test_a_burst_faults_most_attempts_of_its_step_only() -> None:
    config = DemoConfig(steps=4, tasks=8, attempts=4, inject=(Injection(BURST, 2),))
    clean = DemoConfig(steps=4, tasks=8, attempts=4)
    for step in range(4):
        plan = [a for group in plan_step(step, config, TASKS) for a in group]
        faulted = sum(a.fault == SANDBOX_START for a in plan)
        if step == 2:
            assert faulted / len(plan) > BURST_RATE - 0.25 and faulted < len(plan) + 1
        else:
            assert faulted == 0
        assert [a.task for a in plan] == [a.task for g in plan_step(step, clean, TASKS) for a in g]


def test_a_bad_push_hits_the_push_its_rollout_generates_on() -> None:
    # one-step-off: rollouts 0 and 1 start on the initial push, rollout k >= 2 on the push after k - 2
    assert [bad_push_target(ONE_STEP_OFF, 6, k) for k in range(6)] == [None, None, 0, 1, 2, 3]
    # in flight: rollout k starts after the push of step k - 2 too (k + 1 starts before k trains)
    assert [bad_push_target(IN_FLIGHT, 6, k) for k in range(6)] == [None, None, 0, 1, 2, 3]
    with pytest.raises(ValueError, match="no rollout 6"):
        bad_push_target(ONE_STEP_OFF, 6, 6)


def test_perturbed_weights_move_every_tensor_by_a_share_of_its_spread() -> None:
    weights = small_weights()
    one, again = perturbed_weights(weights, 7), perturbed_weights(weights, 7)
    for name, value in weights.items():
        moved = np.abs(one[name] - value)
        assert np.array_equal(one[name], again[name])
        if value.std() > 0:
            assert 0 < moved.mean() < value.std()


def test_the_drift_template_renders_an_empty_assistant_turn_apart_and_passes_the_checker() -> None:
    from rl360_ext.reference.engine.tokenizer import default_tokenizer_dir
    from rl360_ext.templates.check import check_template
    from rl360_ext.templates.render import ChatRenderer
    from rl360_ext.templates.tokenizer import load_hf_tokenizer

    directory = default_tokenizer_dir()
    base = json.loads((directory / "tokenizer_config.json").read_text())["chat_template"]
    drifting = drift_template(base)
    tokenizer = load_hf_tokenizer(str(directory))
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": ""}]
    clean = ChatRenderer(tokenizer, base).render_text(messages, None, add_generation_prompt=False)
    drifted = ChatRenderer(tokenizer, drifting).render_text(messages, None, add_generation_prompt=False)
    assert drifted == clean.replace("assistant\n<|im_end|>", "assistant\n <|im_end|>") != clean
    answered = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "B"}]
    assert ChatRenderer(tokenizer, drifting).render_text(answered, None, add_generation_prompt=False) == (
        ChatRenderer(tokenizer, base).render_text(answered, None, add_generation_prompt=False)
    )
    assert check_template(tokenizer, drifting, cases=50).ok  # what an offline check misses
    with pytest.raises(ValueError, match=TEMPLATE_DRIFT):
        drift_template("{{ messages }}")


# ---- the gate's wiring -------------------------------------------------------------------------


def _step_record(path: Path, step: int, infra_rate: float) -> None:
    metrics = {
        INFRA_RATE: infra_rate, "count/attempts": 32, "count/trained": 8, "count/masked": 0,
        "count/kept_groups": 2, "count/policy_floor": 0, "tito/render_mismatch_frac": 0.0,
    }  # fmt: skip
    append_records(path, [{"kind": "step", "rollout_id": step, "metrics": metrics, "task_health": None}])
    append_records(path, [{"kind": "attempt", "rollout_id": step}])


CLEAN_TRAIN = {TOPK_KL: 1e-15, "train/stale_kv_tokens": 0.0, "staleness/token_age_max": 1.0}
PUSH = {"weights/engines_expected": 2, "weights/engines_reached": 2, "weights/stale_served_tokens": 0}


def test_the_gate_trains_clean_steps_and_skips_a_burst_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    gate = DemoGate(path)
    for step, rate in enumerate([0.0, 0.0, 0.0, 0.9]):
        _step_record(path, step, rate)
        gate.after_rollout(step, [])
        judge = gate.before_update(step, PUSH)
        assert judge is not None
        assert judge(CLEAN_TRAIN) is (rate == 0.0)
    lines = read_records(path, "gate")
    assert [line["action"] for line in lines] == ["train", "train", "train", "skip"]
    assert {r["rule"] for r in lines[-1]["reasons"]} == {"provenance/infra_rate", "provenance/infra_burst"}
    assert lines[-1]["metrics"]["gate/skip"] == 1.0 and lines[-1]["gate_s"] >= 0
    assert gate.cell(3) == "skip: provenance/infra_rate,provenance/infra_burst"
    assert "gate step 3: SKIP" in (gate.line(3) or "") and gate.stopped_at is None
    assert "1 skip" in (gate.summary_line() or "")


def test_a_hard_rule_stops_and_a_missing_record_is_unavailable_not_guessed(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    gate = DemoGate(path)
    _step_record(path, 0, 1.0)
    gate.after_rollout(0, [])
    assert gate.before_update(0, PUSH)(CLEAN_TRAIN) is False  # type: ignore[misc]
    assert gate.stopped_at == 0 and gate.verdicts[0].action.value == "stop"
    gate.after_rollout(1, [])  # the last step record is step 0's: not this step's evidence
    assert gate.before_update(1, None)(CLEAN_TRAIN) is True  # type: ignore[misc]
    assert any(u.metric == INFRA_RATE for u in gate.verdicts[1].unavailable)


def test_the_gate_off_judges_nothing(tmp_path: Path) -> None:
    gate = DemoGate(tmp_path / "metrics.jsonl", enabled=False)
    gate.after_rollout(0, [])
    assert gate.before_update(0, PUSH) is None and gate.line(0) is None
    assert not (tmp_path / "metrics.jsonl").exists()


def test_a_skipped_update_leaves_the_weights_and_optimizer_alone() -> None:
    weights = small_weights()
    samples = [sample(weights, i, group_index=i // 4) for i in range(8)]
    rewards = [1.0, -1.0, 0.5, -0.5, 1.0, -1.0, 0.25, -0.25]
    seen: list[dict[str, float]] = []

    def refuse(metrics: object) -> bool:
        seen.append(dict(metrics))  # type: ignore[call-overload]
        return False

    trainer = Trainer(SMALL, weights, TrainerConfig())
    metrics = trainer.train_step(samples, rewards, before_update=refuse)
    assert metrics["train/update_skipped"] == 1.0 and "train/optimizer_steps" not in metrics
    assert all(np.array_equal(trainer.weights[n], w) for n, w in weights.items())
    assert seen and "train/routing_agreement" in seen[0] and "train/logprob_abs_diff_max" in seen[0]
    trainer = Trainer(SMALL, weights, TrainerConfig())
    trained = trainer.train_step(samples, rewards, before_update=lambda metrics: True)
    assert trained["train/optimizer_steps"] == 1.0 and "train/update_skipped" not in trained
    assert BAD_PUSH in INJECT_KINDS
