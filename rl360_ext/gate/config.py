"""The step gate's configuration: `StepGate`, the one home of every bound the gate applies.

Owns the dataclass (one field per bound, its help in `metadata["help"]`, its default measured:
docs/gate.md, "Where each default comes from"), its validation (a ValueError naming the field), and
its two channels: `--rl360-gate-<field>` flags (`add_arguments`, for a generate function's
`add_arguments`) and `RL360_GATE_<FIELD>` in the environment (Miles' conversion hook cannot add
flags). It does not decide anything (`rl360_ext.gate.rules` does).
"""

from __future__ import annotations

import math
import os
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

FLAG_PREFIX = "rl360_gate"
ENV_PREFIX = "RL360_GATE_"


def _help(text: str) -> dict[str, str]:
    return {"help": text}


@dataclass(frozen=True)
class StepGate:
    """Bounds of the step gate. A rule whose metric the run does not produce never fires."""

    max_fresh_kv_logprob_diff: float = field(
        default=1e-3,
        metadata=_help(
            "Parity: skip when |trainer - engine| log-prob at the sampling version, max over tokens "
            "that read fresh KV (train/logprob_abs_diff_fresh_kv_max), exceeds this. Clean demo "
            "steps: <= 3.4e-7 (float64 engines); set it from your engines' clean distribution."
        ),
    )
    max_topk_kl: float = field(
        default=1e-3,
        metadata=_help(
            "Parity: skip when the symmetric KL over the engine's top-k (train/topk_kl) exceeds this; "
            "judged only on steps with no stale-KV token (train/stale_kv_tokens == 0). Clean demo: "
            "<= 7.3e-16."
        ),
    )
    min_routing_agreement: float = field(
        default=0.99,
        metadata=_help(
            "Parity: skip when the share of routing rows whose trainer top-k equals the recorded one "
            "(train/routing_agreement) is below this; judged only with no stale-KV token. Clean demo: 1."
        ),
    )
    max_infra_rate: float = field(
        default=0.75,
        metadata=_help(
            "Provenance: skip when the share of the step's attempts that failed for infrastructure "
            "(infra/failure_rate, before the filter) exceeds this. Offline A/B, uniform faults at 0.3 "
            "(32 attempts a step): per-step rates up to 0.56; its burst step: 0.84-0.91."
        ),
    )
    infra_burst_margin: float = field(
        default=0.2,
        metadata=_help(
            "Provenance: skip when infra/failure_rate exceeds the run's baseline (median of the last "
            "baseline_window trained steps) by more than this, or by burst_z binomial standard "
            "deviations at the step's attempt count if that is more (a burst: the public run's step 70)."
        ),
    )
    policy_rise_margin: float = field(
        default=0.2,
        metadata=_help(
            "Provenance: skip when the share of attempts whose failure belongs to the policy "
            "(attribution/policy_rate) exceeds its baseline by more than this (or by burst_z standard "
            "deviations, as for infra_burst_margin)."
        ),
    )
    burst_z: float = field(
        default=4.0,
        metadata=_help(
            "Provenance: a rate above its baseline counts as a burst only past this many binomial "
            "standard deviations sqrt(b (1 - b) / count/attempts) too, so small steps' sampling noise "
            "does not skip (32 attempts at b = 0.31: 0.33)."
        ),
    )
    min_valid_per_kept_group: float = field(
        default=2.0,
        metadata=_help(
            "Provenance: skip when the kept groups hold fewer valid samples on average than this "
            "((count/trained - count/masked) / count/kept_groups): a group baseline needs two."
        ),
    )
    hard_infra_rate: float = field(
        default=1.0,
        metadata=_help(
            "Provenance, hard: stop when infra/failure_rate reaches this (1.0: every attempt failed "
            "for infrastructure; nothing a next step does can be trusted until someone looks)."
        ),
    )
    baseline_window: int = field(
        default=8,
        metadata=_help("Trained steps whose rates make the run's baseline (their median)."),
    )
    baseline_min_steps: int = field(
        default=3,
        metadata=_help(
            "Trained steps needed before the burst and rise rules judge (before: listed unavailable)."
        ),
    )
    max_unhealthy_task_share: float = field(
        default=0.25,
        metadata=_help(
            "Task health: skip when more than this share of the trained samples comes from tasks "
            "quarantined or drifting at this step (tasks/unhealthy_trained_frac)."
        ),
    )
    max_template_drift_frac: float = field(
        default=0.0,
        metadata=_help(
            "Templates: skip when the share of compared trajectories whose tokens drift from the "
            "canonical render (tito/render_mismatch_frac) exceeds this. Clean runs: 0."
        ),
    )
    max_stale_served_tokens: float = field(
        default=0.0,
        metadata=_help(
            "Weights: skip when more tokens than this were served by an engine that missed the last "
            "push (weights/stale_served_tokens). Clean demo pushes: 0."
        ),
    )
    max_token_age: float = field(
        default=1.0,
        metadata=_help(
            "Staleness: skip when a trained token is older than this many versions "
            "(staleness/token_age_max). The demo's one-step-off and in-flight schedules: at most 1."
        ),
    )
    max_consecutive_skips: int = field(
        default=3,
        metadata=_help("Stop instead of skipping when this many steps in a row would be skipped."),
    )

    def __post_init__(self) -> None:
        for spec in fields(self):
            value = getattr(self, spec.name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise ValueError(f"StepGate.{spec.name} must be a finite number, got {value!r}")
            if value < 0:
                raise ValueError(f"StepGate.{spec.name} must be >= 0, got {value!r}")
        shares = ("min_routing_agreement", "max_infra_rate", "hard_infra_rate", "max_unhealthy_task_share")
        for name in shares:
            if getattr(self, name) > 1:
                raise ValueError(f"StepGate.{name} is a share: at most 1, got {getattr(self, name)!r}")
        for name in ("baseline_window", "baseline_min_steps", "max_consecutive_skips"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"StepGate.{name} must be an integer >= 1, got {getattr(self, name)!r}")
        if self.baseline_min_steps > self.baseline_window:
            raise ValueError(
                f"StepGate.baseline_min_steps ({self.baseline_min_steps}) exceeds baseline_window "
                f"({self.baseline_window})"
            )

    @classmethod
    def from_args(cls, args: Any, environ: Mapping[str, str] | None = None) -> StepGate:
        """Each field from `--rl360-gate-<field>` in Miles' args, else `RL360_GATE_<FIELD>`, else its
        default; a ValueError names the flag or variable that is wrong."""
        env = os.environ if environ is None else environ
        hints = typing.get_type_hints(cls)
        values: dict[str, Any] = {}
        for spec in fields(cls):
            value = getattr(args, f"{FLAG_PREFIX}_{spec.name}", None)
            variable = f"{ENV_PREFIX}{spec.name.upper()}"
            if value is None and env.get(variable):
                kind = hints[spec.name]
                try:
                    value = kind(env[variable])
                except ValueError:
                    text = env[variable]
                    raise ValueError(f"${variable} must be a {kind.__name__}, got {text!r}") from None
            if value is not None:
                values[spec.name] = value
        return cls(**values)


def add_arguments(parser: Any) -> None:
    """One `--rl360-gate-<field>` per `StepGate` field, default None (unset: the field's default)."""
    hints = typing.get_type_hints(StepGate)
    for spec in fields(StepGate):
        parser.add_argument(
            f"--{FLAG_PREFIX.replace('_', '-')}-{spec.name.replace('_', '-')}",
            dest=f"{FLAG_PREFIX}_{spec.name}",
            type=hints[spec.name],
            default=None,
            help=f"{spec.metadata['help']} Default: {spec.default}.",
        )
