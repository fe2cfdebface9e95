"""The step gate inside `rl360 demo`, and the injected faults that go through the demo's processes.

Owns `DemoGate`: per step it takes the evidence the Miles hook reads (the log hook's step record,
read back right after the hook wrote it: `rl360_ext.gate.evidence`), adds what the reference
trainer has before its update (its parity and staleness metrics, through `Trainer.train_step`'s
`before_update`) and the last weight push's `weights/*`, calls `rl360_ext.gate.rules.decide`,
appends the verdict's `"kind": "gate"` line (`GateVerdict.record`, the Miles hook's format) to
metrics.jsonl and says it on the console. `skip` drops the update (no optimizer step; the rollout's
metrics are logged already, the unchanged weights are pushed as the next version), `stop` ends
the run after the step (`stopped_at`). It owns no bound (`StepGate`) and no rule (`rules`).

`Injector` carries two `--inject` faults (`rl360_ext.local.demo.faults`) through the real paths:
`bad-push:STEP`: after the push rollout STEP generates on (`bad_push_target`), one engine loads
perturbed weights through its own `/update_weights_from_disk`, labelled with the pushed version,
so nothing but parity can tell; `template-drift:STEP`: rollout STEP's attempts go through the
generate hook with args naming a session template that drifts (`drift_template`), so the hook
starts a session pool rendering with it. (`burst:STEP` is planned: `demo.plan.plan_step`.)
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from rl360_ext.gate.config import StepGate
from rl360_ext.gate.evidence import last_step_record, step_evidence
from rl360_ext.gate.rules import Action, GateState, GateVerdict, decide
from rl360_ext.local.demo.faults import BAD_PUSH, TEMPLATE_DRIFT, injected
from rl360_ext.local.demo.plan import DemoConfig
from rl360_ext.local.demo.versions import PUSH, START, schedule_events
from rl360_ext.reference.engine.model import ModelConfig, load_weights, save_weights
from rl360_ext.rollout.metrics import append_records, attempt_summary

INJECT_KIND = "inject"  # a metrics.jsonl line per fault carried out (what, where, when)
PERTURBATION = 0.1  # bad-push: each tensor plus Gaussian noise at this share of its own std
BAD_PUSH_ENGINE = 0  # the engine (in the stack's order) that loads the perturbed weights
PUSH_TIMEOUT_S = 60.0
# template-drift: before the assistant content line of the reference template, a clause that renders
# an empty assistant turn (the quiz agent's look turn ends at once) with a space. The session's
# append-only check at start-up passes it (its generated conversations have no such turn).
DRIFT_ANCHOR = "{{ text(message.content) }}\n{%- if message.tool_calls"
DRIFT_CLAUSE = "{%- if not message.content and not message.tool_calls -%}{{ ' ' }}{%- endif -%}\n"
DRIFT_TEMPLATE_FILE = "inject/template-drift.jinja"


# ---- the gate ------------------------------------------------------------------------------------


@dataclass
class DemoGate:
    """The gate across the demo's steps: its state, every verdict, and what judging each step cost."""

    metrics_path: Path
    enabled: bool = True
    config: StepGate = field(default_factory=StepGate)
    state: GateState = field(default_factory=GateState)
    verdicts: dict[int, GateVerdict] = field(default_factory=dict)
    seconds: dict[int, float] = field(default_factory=dict)  # evidence + decide per step (no file append)
    stopped_at: int | None = None
    _rollout: dict[int, dict[str, Any]] = field(default_factory=dict)

    def after_rollout(self, step: int, samples: Sequence[Any]) -> None:
        """Read back the step record the log hook just wrote (its last one) as the step's evidence."""
        if not self.enabled:
            return
        started = time.perf_counter()
        record = last_step_record(self.metrics_path)
        if record is None or record.get("rollout_id") != step:
            record = {}  # every rollout rule is then listed unavailable, never guessed
        tasks = [attempt_summary(sample).get("task") for sample in samples]
        self._rollout[step] = step_evidence(record, tasks)
        self.seconds[step] = time.perf_counter() - started

    def before_update(
        self, step: int, push_metrics: Mapping[str, Any] | None
    ) -> Callable[[Mapping[str, float]], bool] | None:
        """The trainer's `before_update` for `step` (None with the gate off): decide on the rollout's
        evidence, the last push's and the trainer's metrics; True trains."""
        if not self.enabled:
            return None

        def judge(train_metrics: Mapping[str, float]) -> bool:
            started = time.perf_counter()
            evidence = {**self._rollout.pop(step, {}), **(push_metrics or {}), **train_metrics}
            verdict = decide(evidence, self.state, self.config)
            self.seconds[step] = self.seconds.get(step, 0.0) + time.perf_counter() - started
            self.state = verdict.state
            self.verdicts[step] = verdict
            append_records(self.metrics_path, [{**verdict.record(step), "gate_s": self.seconds[step]}])
            if verdict.action is Action.STOP:
                self.stopped_at = step
            return verdict.action is Action.TRAIN

        return judge

    def cell(self, step: int) -> str | None:
        """The verdict in a word or two, for the summary table (None: the step was not judged)."""
        verdict = self.verdicts.get(step)
        if verdict is None:
            return None
        rules = ",".join(reason.rule for reason in verdict.reasons)
        return verdict.action.value if not rules else f"{verdict.action.value}: {rules}"

    def line(self, step: int) -> str | None:
        """The console line of the step's verdict (None: the gate is off)."""
        verdict = self.verdicts.get(step)
        if verdict is None:
            return None if not self.enabled else f"gate step {step}: not judged (no train step)"
        reasons = "; ".join(str(reason) for reason in verdict.reasons)
        if verdict.action is Action.TRAIN:
            return (
                f"gate step {step}: train ({len(set(verdict.checked))} rules judged, "
                f"{len(verdict.unavailable)} evidence items unavailable)"
            )
        if verdict.action is Action.SKIP:
            return (
                f"[bold yellow]gate step {step}: SKIP[/] {reasons}: the update is dropped (the weights "
                "are pushed unchanged), the rollout's metrics stay logged"
            )
        return f"[bold red]gate step {step}: STOP[/] {reasons}: the demo ends after this step"

    def summary_line(self) -> str | None:
        """One line over the run: verdicts by action and every step that did not train."""
        if not self.enabled:
            return "step gate: off (--no-gate)"
        if not self.verdicts:
            return None
        counts = {action: sum(v.action is action for v in self.verdicts.values()) for action in Action}
        gated = [f"step {s} {self.cell(s)}" for s, v in sorted(self.verdicts.items()) if v.reasons]
        per_step = sorted(self.seconds.values())
        text = (
            f"step gate: {len(self.verdicts)} steps judged: {counts[Action.TRAIN]} train, "
            f"{counts[Action.SKIP]} skip, {counts[Action.STOP]} stop"
        )
        if gated:
            text += " (" + "; ".join(gated) + ")"
        if per_step:
            text += f"; evidence + decide {per_step[len(per_step) // 2] * 1e3:.2f} ms a step (median)"
        return text


# ---- injected faults -----------------------------------------------------------------------------


def bad_push_target(schedule: str, steps: int, rollout: int) -> int | None:
    """The push (its step: None is the initial push) that rollout `rollout` starts generating on:
    the last push before it starts in `schedule`. Under one-step-off rollouts 0 and 1 share the
    initial push, so a bad push aimed at either hits both."""
    last: int | None = None
    for event in schedule_events(schedule, steps):
        if event.action == PUSH:
            last = event.step
        elif event.action == START and event.step == rollout:
            return last
    raise ValueError(f"--inject {BAD_PUSH}:{rollout}: the run has no rollout {rollout}")


def perturbed_weights(weights: Mapping[str, np.ndarray], seed: int) -> dict[str, np.ndarray]:
    """Every tensor plus Gaussian noise at `PERTURBATION` of its own standard deviation (seeded)."""
    rng = np.random.default_rng(seed)
    return {
        name: value + rng.normal(0.0, PERTURBATION * float(value.std()), value.shape)
        for name, value in weights.items()
    }


def drift_template(template: str) -> str:
    """`template` with `DRIFT_CLAUSE` before its assistant content line; a ValueError when the
    template has no such line (the reference template changed: nothing to drift)."""
    if template.count(DRIFT_ANCHOR) != 1:
        raise ValueError(
            f"--inject {TEMPLATE_DRIFT}: the chat template has no single assistant content line "
            f"({DRIFT_ANCHOR!r}) to drift"
        )
    return template.replace(DRIFT_ANCHOR, DRIFT_CLAUSE + DRIFT_ANCHOR)


class Injector:
    """Carries out `--inject` bad-push and template-drift faults in a running demo (module docstring)."""

    def __init__(
        self,
        config: DemoConfig,
        args: argparse.Namespace,
        engine_urls: Callable[[], list[str]],
        tokenizer_dir: Path,
        model_config: ModelConfig,
        metrics_path: Path,
    ) -> None:
        self.config = config
        self.args = args
        self.engine_urls = engine_urls
        self.model_config = model_config
        self.metrics_path = metrics_path
        aimed = [i.step for i in config.inject if i.kind == BAD_PUSH]
        self.bad_pushes = {bad_push_target(config.schedule, config.steps, step) for step in aimed}
        self.drift_args: argparse.Namespace | None = None
        if any(i.kind == TEMPLATE_DRIFT for i in config.inject):
            base = json.loads((Path(tokenizer_dir) / "tokenizer_config.json").read_text())["chat_template"]
            path = config.out / DRIFT_TEMPLATE_FILE
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(drift_template(base))
            self.drift_args = copy.copy(args)
            self.drift_args.rl360_chat_template = str(path)

    def generate_state(self, step: int, state: Any) -> Any:
        """The generate hook's state for an attempt of rollout `step`: `state`, or on a
        template-drift step the same with the drifting template (a second session pool)."""
        if self.drift_args is None or not injected(self.config.inject, TEMPLATE_DRIFT, step):
            return state
        if state.args is not self.args:  # a client-deadline fault's own args: it fails before any turn
            return state
        return type(state)(self.drift_args)

    def after_push(self, step: int | None, weights_path: Path, version: str) -> None:
        """After the push of `step` (None: the initial one): on a bad-push target, engine
        `BAD_PUSH_ENGINE` loads perturbed weights labelled `version` (its own weight-load endpoint)."""
        if step not in self.bad_pushes:
            return
        url = self.engine_urls()[BAD_PUSH_ENGINE]
        seed = self.config.seed * 1_000_003 + (-1 if step is None else step)
        target = weights_path.with_name(f"{weights_path.stem}-bad-push.npz")
        weights = load_weights(weights_path, self.model_config)
        save_weights(target, self.model_config, perturbed_weights(weights, seed))
        body = {"model_path": str(target), "weight_version": version, "flush_cache": True}
        response = httpx.post(f"{url}/update_weights_from_disk", json=body, timeout=PUSH_TIMEOUT_S)
        if response.status_code != 200:
            refused = response.text[:200]
            raise RuntimeError(f"--inject {BAD_PUSH}: {url} refused the perturbed weights: {refused}")
        record = {"kind": INJECT_KIND, "fault": BAD_PUSH, "after_push": step, "engine": url}
        record["weight_version"] = version
        append_records(self.metrics_path, [record])
