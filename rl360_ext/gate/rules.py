"""The step gate's decision: one verdict per step (train, skip or stop) with the reasons behind it.

Owns `decide(evidence, state, config) -> GateVerdict`, a pure function of the step's evidence (the
flat metric names rl360's hooks already compute: rollout metrics, the trainer's parity and
staleness metrics, the weight push's `weights/*`), the gate's state across steps (`GateState`:
the run's baseline and the consecutive skips, serialisable) and its bounds (`StepGate`). Every
rule names its metric and bound in a `Reason`; a metric the run does not produce, or that is not a
finite number, never fires a rule and is listed in `GateVerdict.unavailable`, never guessed.
It does not read files or talk to Miles (`rl360_ext.gate.evidence`, `rl360_ext.gate.miles_hook`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from statistics import median
from typing import Any

from rl360_ext.gate.config import StepGate
from rl360_ext.rollout.audit import GATE_KIND

# Evidence names the rules read (the hooks' metric names).
FRESH_KV_DIFF = "train/logprob_abs_diff_fresh_kv_max"
STALE_KV_TOKENS = "train/stale_kv_tokens"
TOPK_KL = "train/topk_kl"
ROUTING_AGREEMENT = "train/routing_agreement"
INFRA_RATE = "infra/failure_rate"
POLICY_RATE = "attribution/policy_rate"
POLICY_FLOOR_COUNT = "count/policy_floor"  # present exactly when attribution was computed
ATTEMPTS = "count/attempts"
TRAINED = "count/trained"
MASKED = "count/masked"
KEPT_GROUPS = "count/kept_groups"
UNHEALTHY_TASKS = "tasks/unhealthy_trained_frac"
TEMPLATE_DRIFT = "tito/render_mismatch_frac"
ENGINES_EXPECTED = "weights/engines_expected"
ENGINES_REACHED = "weights/engines_reached"
STALE_SERVED = "weights/stale_served_tokens"
TOKEN_AGE_MAX = "staleness/token_age_max"
VALID_PER_GROUP = "gate/valid_per_kept_group"  # derived from TRAINED, MASKED, KEPT_GROUPS
ENGINES_MISSED = "gate/engines_missed"  # derived from ENGINES_EXPECTED, ENGINES_REACHED
SKIPS_IN_A_ROW = "gate/consecutive_skips"


class Action(StrEnum):
    """What Miles does with the step: train on it, drop its update (its rollouts' metrics stay
    logged), or end the run."""

    TRAIN = "train"
    SKIP = "skip"
    STOP = "stop"


@dataclass(frozen=True)
class Reason:
    """A rule that fired: its name, the metric, the value seen, the bound, and how they compare."""

    rule: str
    metric: str
    value: float
    bound: float
    op: str  # ">" : fired because value > bound; "<": value < bound; ">=": value >= bound
    hard: bool = False

    def __str__(self) -> str:
        kind = "hard, " if self.hard else ""
        return f"{self.rule} ({kind}{self.metric} = {self.value:.4g} {self.op} {self.bound:.4g})"


@dataclass(frozen=True)
class Unavailable:
    """A rule that could not judge this step: the metric it needs and why."""

    rule: str
    metric: str
    why: str


@dataclass(frozen=True)
class GateState:
    """The gate across steps: the rates of the last trained steps (the run's baseline) and how many
    steps in a row were skipped. Skipped steps never enter the baseline, so a burst does not become
    the norm. `to_json`/`from_json` round-trip it (a resumed run keeps its baseline)."""

    steps: int = 0
    consecutive_skips: int = 0
    infra_rates: tuple[float, ...] = ()
    policy_rates: tuple[float, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "consecutive_skips": self.consecutive_skips,
            "infra_rates": list(self.infra_rates),
            "policy_rates": list(self.policy_rates),
        }

    @classmethod
    def from_json(cls, data: Any) -> GateState:
        """A state from `to_json`'s dict; a ValueError names the field that is wrong."""
        if not isinstance(data, Mapping):
            raise ValueError(f"gate state must be a JSON object, got {type(data).__name__}")
        unknown = set(data) - {"steps", "consecutive_skips", "infra_rates", "policy_rates"}
        if unknown:
            raise ValueError(f"gate state: unknown field(s) {sorted(unknown)}")
        counts = {}
        for name in ("steps", "consecutive_skips"):
            value = data.get(name, 0)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"gate state: {name} must be an integer >= 0, got {value!r}")
            counts[name] = value
        rates = {}
        for name in ("infra_rates", "policy_rates"):
            values = data.get(name, [])
            if not isinstance(values, list) or not all(_share(v) for v in values):
                raise ValueError(f"gate state: {name} must be a list of numbers in [0, 1], got {values!r}")
            rates[name] = tuple(float(v) for v in values)
        return cls(**counts, **rates)


@dataclass(frozen=True)
class GateVerdict:
    """The gate's answer for one step and the state to hand the next step's `decide`."""

    action: Action
    reasons: list[Reason]
    unavailable: list[Unavailable]
    state: GateState
    checked: list[str] = field(default_factory=list)  # rules that judged this step

    def metrics(self) -> dict[str, float]:
        """`gate/*` numbers for a step record: the action one-hot, the skip streak, the rules that fired."""
        out = {f"gate/{action.value}": float(self.action is action) for action in Action}
        out["gate/consecutive_skips"] = float(self.state.consecutive_skips)
        out["gate/rules_fired"] = float(len(self.reasons))
        out["gate/rules_unavailable"] = float(len(self.unavailable))
        out.update({f"gate/fired/{reason.rule}": 1.0 for reason in self.reasons})
        return out

    def record(self, rollout_id: Any) -> dict[str, Any]:
        """The verdict's line in the rl360 metrics JSONL (`"kind": "gate"`), as the Miles hook and the
        demo write it and `rl360 report` / `rl360 audit` read it."""
        return {"kind": GATE_KIND, "rollout_id": rollout_id, **self.to_json(), "metrics": self.metrics()}

    def to_json(self) -> dict[str, Any]:
        return {
            "action": self.action.value,
            "reasons": [vars(reason) for reason in self.reasons],
            "unavailable": [vars(item) for item in self.unavailable],
            "checked": list(self.checked),
            "state": self.state.to_json(),
        }


def _share(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and 0.0 <= value <= 1.0


class _Judge:
    """One step's rule evaluations: collects reasons, unavailable metrics and the rules that judged."""

    def __init__(self, evidence: Mapping[str, Any]) -> None:
        self.evidence = evidence
        self.reasons: list[Reason] = []
        self.unavailable: list[Unavailable] = []
        self.checked: list[str] = []

    def number(self, rule: str, metric: str) -> float | None:
        """The metric as a finite float, or None (listed unavailable, with why)."""
        if metric not in self.evidence or self.evidence[metric] is None:
            self.unavailable.append(Unavailable(rule, metric, "not produced"))
            return None
        value = self.evidence[metric]
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            self.unavailable.append(Unavailable(rule, metric, f"not a finite number: {value!r}"))
            return None
        return float(value)

    def share(self, rule: str, metric: str) -> float | None:
        """The metric as a share in [0, 1], or None (listed unavailable, with why)."""
        value = self.number(rule, metric)
        if value is not None and not 0.0 <= value <= 1.0:
            self.unavailable.append(Unavailable(rule, metric, f"not a share in [0, 1]: {value!r}"))
            return None
        return value

    def check(
        self, rule: str, metric: str, value: float | None, bound: float, op: str, *, hard: bool = False
    ) -> None:
        if value is None:
            return
        self.checked.append(rule)
        fired = {">": value > bound, "<": value < bound, ">=": value >= bound}[op]
        if fired:
            self.reasons.append(Reason(rule, metric, value, bound, op, hard))


def _parity(judge: _Judge, config: StepGate) -> None:
    judge.check(
        "parity/mismatch",
        FRESH_KV_DIFF,
        judge.number("parity/mismatch", FRESH_KV_DIFF),
        config.max_fresh_kv_logprob_diff,
        ">",
    )
    for rule, metric, bound, op in (
        ("parity/topk_kl", TOPK_KL, config.max_topk_kl, ">"),
        ("parity/routing_agreement", ROUTING_AGREEMENT, config.min_routing_agreement, "<"),
    ):
        value = judge.number(rule, metric)
        stale = None if value is None else judge.number(rule, STALE_KV_TOKENS)
        if value is not None and stale != 0.0:
            if stale:  # a missing split is listed by number() already
                judge.unavailable.append(Unavailable(rule, STALE_KV_TOKENS, f"{stale:g} tokens on stale KV"))
            continue
        judge.check(rule, metric, value, bound, op)


def _above_baseline(
    judge: _Judge, rule: str, metric: str, value: float | None, history: Sequence[float], margin: float,
    config: StepGate,
) -> None:
    if value is None:
        return
    if len(history) < config.baseline_min_steps:
        judge.unavailable.append(
            Unavailable(rule, metric, f"baseline warming up ({len(history)} of {config.baseline_min_steps})")
        )
        return
    base = median(history)
    attempts = judge.evidence.get(ATTEMPTS)
    noise = 0.0
    if isinstance(attempts, int | float) and not isinstance(attempts, bool) and attempts >= 1:
        noise = config.burst_z * math.sqrt(base * (1.0 - base) / attempts)
    judge.check(rule, metric, value, base + max(margin, noise), ">")


def _policy_rate(judge: _Judge) -> float | None:
    """attribution/policy_rate, 0 when attribution ran and found no policy failure (its rate is then
    absent, but count/policy_floor is there), None when attribution did not run."""
    value = judge.evidence.get(POLICY_RATE)
    if value is None and judge.evidence.get(POLICY_FLOOR_COUNT) is not None:
        return 0.0
    return judge.share("provenance/policy_rise", POLICY_RATE)


def _provenance(judge: _Judge, config: StepGate, state: GateState) -> tuple[float | None, float | None]:
    infra = judge.share("provenance/infra_rate", INFRA_RATE)
    judge.check("provenance/infra_rate", INFRA_RATE, infra, config.max_infra_rate, ">")
    judge.check("provenance/infra_down", INFRA_RATE, infra, config.hard_infra_rate, ">=", hard=True)
    _above_baseline(
        judge, "provenance/infra_burst", INFRA_RATE, infra, state.infra_rates[-config.baseline_window :],
        config.infra_burst_margin, config,
    )
    policy = _policy_rate(judge)
    _above_baseline(
        judge, "provenance/policy_rise", POLICY_RATE, policy, state.policy_rates[-config.baseline_window :],
        config.policy_rise_margin, config,
    )
    trained = judge.number("provenance/valid_per_group", TRAINED)
    masked = judge.number("provenance/valid_per_group", MASKED)
    groups = judge.number("provenance/valid_per_group", KEPT_GROUPS)
    if None not in (trained, masked, groups):
        if groups:
            per_group = (trained - masked) / groups  # type: ignore[operator]
            bound = config.min_valid_per_kept_group
            judge.check("provenance/valid_per_group", VALID_PER_GROUP, per_group, bound, "<")
        else:
            judge.unavailable.append(Unavailable("provenance/valid_per_group", KEPT_GROUPS, "no kept group"))
    return infra, policy


def _weights(judge: _Judge, config: StepGate) -> None:
    expected = judge.number("weights/partial_push", ENGINES_EXPECTED)
    reached = judge.number("weights/partial_push", ENGINES_REACHED)
    if expected is not None and reached is not None:
        judge.check("weights/partial_push", ENGINES_MISSED, expected - reached, 0.0, ">")
        if expected > 0:
            judge.checked.append("weights/no_engine_reached")
            if reached == 0:
                rule = "weights/no_engine_reached"
                judge.reasons.append(Reason(rule, ENGINES_REACHED, 0.0, 1.0, "<", True))
    judge.check(
        "weights/stale_served", STALE_SERVED, judge.number("weights/stale_served", STALE_SERVED),
        config.max_stale_served_tokens, ">",
    )


_SIMPLE: tuple[tuple[str, str, Callable[[StepGate], float], str], ...] = (
    ("tasks/unhealthy_share", UNHEALTHY_TASKS, lambda c: c.max_unhealthy_task_share, ">"),
    ("templates/drift", TEMPLATE_DRIFT, lambda c: c.max_template_drift_frac, ">"),
    ("staleness/token_age", TOKEN_AGE_MAX, lambda c: c.max_token_age, ">"),
)


def decide(
    evidence: Mapping[str, Any], state: GateState | None = None, config: StepGate | None = None
) -> GateVerdict:
    """The verdict on one step from its evidence and the gate's state before it (None: a new run).

    Any hard rule, or a skip that would make `max_consecutive_skips` in a row, is `stop`; any other
    rule that fires is `skip`; else `train`. Only a trained step's rates enter the baseline."""
    if not isinstance(evidence, Mapping):
        raise TypeError(f"evidence must be a mapping of metric names, got {type(evidence).__name__}")
    state = GateState() if state is None else state
    config = StepGate() if config is None else config
    judge = _Judge(evidence)
    _parity(judge, config)
    infra, policy = _provenance(judge, config, state)
    _weights(judge, config)
    for rule, metric, bound, op in _SIMPLE:
        judge.check(rule, metric, judge.number(rule, metric), bound(config), op)
    reasons = list(judge.reasons)
    if not reasons:
        action = Action.TRAIN
    elif any(reason.hard for reason in reasons):
        action = Action.STOP
    elif state.consecutive_skips + 1 >= config.max_consecutive_skips:
        action = Action.STOP
        skips = state.consecutive_skips + 1
        bound = float(config.max_consecutive_skips)
        reasons.append(Reason("gate/consecutive_skips", SKIPS_IN_A_ROW, float(skips), bound, ">=", True))
    else:
        action = Action.SKIP
    keep = config.baseline_window
    if action is Action.TRAIN:
        next_state = GateState(
            steps=state.steps + 1,
            consecutive_skips=0,
            infra_rates=(state.infra_rates + (() if infra is None else (infra,)))[-keep:],
            policy_rates=(state.policy_rates + (() if policy is None else (policy,)))[-keep:],
        )
    else:
        next_state = replace(state, steps=state.steps + 1, consecutive_skips=state.consecutive_skips + 1)
    return GateVerdict(action, reasons, judge.unavailable, next_state, judge.checked)
