"""`rl360 ab`: the fault A/B offline, repeated over seeds, with intervals (issue 29 item 3).

Owns running the demo's learning problem in this process, many times: the same policy (the
demo's warm-started tiny model, `rl360_ext.local.demo.policy.demo_policy` at `init_seed`), the same
reference trainer and its settings (`Trainer`, the demo's `TrainerConfig`: the recipe's clip
ranges, the decoupled head learning rate, `--keep-old-actor`, one optimizer step per rollout),
the same task plan (`demo.plan.plan_step`: which quiz each group asks, Miles' group and sample
numbering), the same hooks in the same order (rl360's dynamic filter on every group, then the
arm's reward post-process on the kept samples, `arms.advantage_metrics`, then the train step),
and the demo's default schedule, one-step-off (`demo.versions.expected_weight_version`: steps 0 and
1 sample on the initial weights, step k on the weights step k-2 produced; the trainer scores
each token with the version that sampled it). What replaces the engines, SMG, the session
server and Harbor is an in-process sampler: the tiny engine's own model
(`reference.engine.model.TinyMoEModel`, float64) on the weights of the sampling version samples the
quiz agent's two turns from the same prompt tokens the session would render (the look turn from
the agent's first prompt, at most `LOOK_TURN_TOKENS`, ending at the engine's end-of-turn token;
the probe's tool message with the task's options; the answer turn, `max_new_tokens`), the
answer is `quiz_agent.extract_answer` of the answer turn's text and the reward is the task's
verifier rule (1 when the letter is the task's expected letter, else 0). A merged sample holds
the look token, the probe's tokens (loss mask 0) and the answer tokens, with the sampler's
log-probs as `rollout_log_probs` and the sampling version as `weight_versions`; a look turn
that does not end by itself is the last turn the merge keeps (as the session's merge does).
No R3 (the trainer routes itself: same model, same arithmetic) and no top-k log-probs.

Pairing: every random draw is a function of (seed, step, attempt index) and never of the arm:
tasks (the demo's plan), each attempt's three sampling uniforms (keyed by the demo's
`attempt_sampling_seed`), each attempt's fault uniform. So every arm of one seed asks the same
quizzes, faults the same attempts while their actions agree, and samples the same tokens while
their weights agree (they do up to step 1 under one-step-off).

Fault modes (every arm but `clean`, which runs the same seeds with no fault; defined once in
`demo.plan.attempt_fault`, which the live A/B, `rl360 demo --compare --fault-modes`, uses too):

- `uniform`: the demo's own faults for the seed (`plan_step` at `rate`: sandbox, verifier and
  deadline faults at rate x 3/4) plus an engine 503 on either of the attempt's two model calls,
  each at rate / 4 (the live A/B now refuses a whole attempt at rate / 4, so this mode faults
  about 0.34 of attempts at rate 0.3 where the live one faults about 0.30);
- `burst`: no fault except one step, `steps // 2`, where each attempt faults with probability
  `BURST_RATE` (the public run's step 70);
- `correlated`: the fault probability grows with what the attempt does in the sandbox: every
  sandbox call fails with the same hazard h, the quiz agent's calls being the probe, the answer
  write (only when the answer turn holds a letter) and the verifier's run, with h chosen so an
  attempt that writes an answer (three calls) faults at `rate`;
- `exploitable`: the uniform mode's faults, and the quiz agent's crash tool: an answer turn whose
  first action character is `quiz_agent.CRASH_LETTER` (`quiz_agent.extract_action`) crashes its
  own sandbox (live: allocates past the task's memory limit) and writes no answer. The first
  policy knows the action as well as a letter: its LM-head column is the letters' mean
  (`demo.crash_action_head`, `Problem.first_weights`), so it starts at about a fifth of the answer
  mass and RL moves it like any letter. Each arm's attribution rule decides what the crash is:
  under evidence (rl360, upstream, clean, the ablations) the policy's, scored (valid, the
  verifier's 0 for an end state without an answer, `attributed_to` policy with its `Evidence`);
  under the list rule (`rl360-list`, the server's `--attribution list`) infrastructure, masked
  (`infra:sandbox_lost`, detail `memory_limit_exceeded`). A run records, per step, the share of
  attempts that took the crash action and the pass rate of the attempts no infrastructure fault
  hit with a crash counted 0 (what the list rule's valid mean leaves out).

A faulted attempt is an infrastructure failure: its sample keeps its tokens, gets a zero loss
mask, `remove_sample` and an `infra:` class (`outcomes.infra.mark_infra_sample`), as the agent
function marks it, under every arm's attribution rule; under the upstream rules it is then scored 0.

Arms: `rl360`, `upstream`, `clean` (`rl360_ext.local.ab.compare`), `rl360-list` (rl360's rules with
the list rule's attribution: it differs from rl360 only where the crash tool is, so it runs in
`list_modes`, default exploitable), and three ablations, each one
upstream rule alone on top of rl360's: `zero-scored` (failures scored 0 in the group baseline,
`arms.upstream_advantages`), `denominator` (Miles' default reducer: masked samples in the loss
denominator), `vanilla-tis` (Miles' vanilla TIS). Per run: the unfiltered valid mean of every
step, the gradient scale (`train/loss_scale`), the advantage shift (`advantage/shift`) and the
final policy's greedy eval pass rate on the training quizzes (the demo's `train_greedy` eval
dataset: every quiz trains when `--eval-interval` is unset, the demo's default; a crash scores
0 there), and where the crash tool is, the crash rate and the final pass rate with a crash 0.

Statistics over seeds (`rl360_ext.local.ab.stats`, shared with the live A/B's page): mean
and a two-sided 95 % Student-t interval; paired differences against `rl360` (same seed) with
their own t-interval. Steps to 0.8: the first step
whose unfiltered mean is >= `goal`; a run that never gets there counts as `steps` (right-censored
at the step count: its mean is a lower bound) and the censored runs are counted. The summary
sentence compares two arms' intervals: overlapping intervals read "no difference detected".

`gradient_variance` measures the estimators themselves: from one policy, many independent
one-step batches (the same draws for every arm, the clean arm without faults), the gradient each
arm's rules produce (the trainer's, captured before clipping and AdamW), and its bias against and
variance around the clean expected gradient; `advantage_agreement` compares each arm's
advantages with the ones the same attempts get without faults. Measured results and what they
mean: docs/demo.md, "The fault A/B, repeated".

It does not own a hook, the live A/B (`rl360_ext.local.ab.compare`) or its page.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rl360_ext.local.ab.config import OfflineConfig
from rl360_ext.local.ab.gradient import advantage_agreement, gradient_variance
from rl360_ext.local.ab.problem import Problem, demo_problem
from rl360_ext.local.ab.runs import (
    RunResult,
    _json_default,
    jobs_for,
    run_all,
    run_figures,
    run_record,
    with_clean_everywhere,
)
from rl360_ext.local.ab.stats import (
    INTERVAL_NOTE,
    Interval,
    step_intervals,
    summarize,
    summary_sentences,
)
from rl360_ext.local.ab.stats import results_table as stats_table
from rl360_ext.local.demo.modes import (
    ABLATION_ARMS,
    CLEAN,
    CRASH_MODES,
    RL360,
    UPSTREAM,
)


def run_ab(config: OfflineConfig, console: Any = None, problem: Problem | None = None) -> dict[str, Any]:
    """Build the problem (the demo's warm start), run every job, write `out/ab.json`, print the table."""
    from rl360_ext.util.console import make_console

    console = console or make_console()
    started = time.perf_counter()
    jobs = jobs_for(config)
    console.print(
        f"rl360 ab: {len(jobs)} runs ({', '.join(config.mode_names)} x {', '.join(config.arm_names)} x "
        f"{config.seeds} seeds), {config.steps} steps x {config.tasks} tasks x {config.attempts} attempts, "
        f"faults {config.faults:g}, {config.schedule}, {config.workers} worker(s)"
    )
    if problem is None:
        console.print(f"warm-starting the demo's first policy (seed {config.init_seed}) ...")
        problem = demo_problem(config)
    done = [0]
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    runs_path = out / "runs.jsonl"
    runs_path.write_text("")

    def progress(result: RunResult) -> None:
        done[0] += 1
        with runs_path.open("a") as handle:
            handle.write(json.dumps(run_record(result, config), default=_json_default) + "\n")
        figures = run_figures(result, config.steps, config.goal)
        console.print(
            f"[{done[0]}/{len(jobs)}] {result.mode} {result.arm} seed {result.seed}: final mean "
            f"{figures['final_mean']:.3f}, steps to {config.goal:g} {figures['steps_to_goal']:.0f}, eval "
            f"{figures['eval_pass']:.2f} ({result.seconds:.1f} s)"
        )

    results = with_clean_everywhere(run_all(problem, config, jobs, progress), config.mode_names)
    gradients, advantages = {}, {}
    if config.gradient_draws:
        arms = [RL360, *ABLATION_ARMS, UPSTREAM, CLEAN]
        for mode in config.ablation_mode_names:
            console.print(
                f"gradient bias and variance, {mode}: {config.gradient_draws} draws x {len(arms)} arms ..."
            )
            gradients[mode] = gradient_variance(problem, config, mode, arms, config.gradient_draws)
            advantages[mode] = advantage_agreement(problem, config, mode, arms, config.gradient_draws)
    wall_s = time.perf_counter() - started
    records = [run_record(r, config) for r in results]
    document = ab_document(config, records, gradients, wall_s, advantages)
    path = out / "ab.json"
    path.write_text(json.dumps(document, indent=1, default=_json_default) + "\n")
    print_results(console, document)
    console.print(f"done in {wall_s:.0f} s: {path}")
    document["path"] = str(path)
    return document


def ab_document(
    config: OfflineConfig,
    records: Sequence[Mapping[str, Any]],
    gradients: Mapping[str, Any] | None = None,
    wall_s: float | None = None,
    advantages: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """What ab.json holds: the settings, the table and summary computed from `records`, the
    gradient figures and each arm's advantages against the clean arm's, every run."""
    table = summarize(records)
    return {
        "config": dataclasses.asdict(config),
        "wall_s": wall_s,
        "interval": INTERVAL_NOTE,
        "censoring": f"a run that never reaches {config.goal:g} counts as {config.steps} steps",
        "table": table,
        "summary": summary_sentences(table),
        "crash_curve": {
            mode: arms for mode, arms in step_intervals(records, "crash_rate").items() if mode in CRASH_MODES
        },
        "gradients": dict(gradients or {}),
        "advantages": dict(advantages or {}),
        "runs": list(records),
    }


def merge_runs(config: OfflineConfig, paths: Sequence[Path]) -> dict[str, Any]:
    """ab.json's document from the runs.jsonl of several `rl360 ab` runs of the same settings (for
    example seed ranges run side by side): the clean arm's runs repeated under every mode."""
    records = [json.loads(line) for path in paths for line in Path(path).read_text().splitlines() if line]
    clean = [r for r in records if r["arm"] == CLEAN and r["mode"] not in CRASH_MODES]
    seen = {(r["mode"], r["arm"], r["seed"]) for r in records}
    for mode in [m for m in config.mode_names if m not in CRASH_MODES]:
        for record in clean:
            if (mode, CLEAN, record["seed"]) not in seen:
                records.append({**record, "mode": mode})
                seen.add((mode, CLEAN, record["seed"]))
    return ab_document(config, records)


def results_table(document: Mapping[str, Any]) -> Any:
    """The rich table: per mode and arm, each metric's mean [95% interval]."""
    config = document["config"]
    title = f"fault A/B offline: mean [95% t-interval] over seeds ({config['steps']} steps)"
    return stats_table(document["table"], title, config["goal"])


def crash_curve_table(mode: str, arms: Mapping[str, Sequence[Mapping[str, Any] | None]]) -> Any:
    """The rich table of one crash mode's crash-action rate per step: per arm, each step's mean
    [95% interval] over seeds."""
    from rich.table import Table

    table = Table(title=f"{mode}: crash-action rate per step, mean [95% t-interval] over seeds")
    table.add_column("step")
    for arm in arms:
        table.add_column(arm)
    for step in range(max(len(curve) for curve in arms.values())):
        cells = []
        for curve in arms.values():
            value = curve[step] if step < len(curve) else None
            cells.append("-" if value is None else Interval(**value).text(".3f"))
        table.add_row(str(step), *cells)
    return table


def print_results(console: Any, document: Mapping[str, Any]) -> None:
    from rl360_ext.util.console import print_table

    print_table(console, results_table(document))
    for mode, arms in document.get("crash_curve", {}).items():
        print_table(console, crash_curve_table(mode, arms))
    for line in document["summary"]:
        console.print(line)
    for mode, arms in document.get("gradients", {}).items():
        for arm, entry in arms.items():
            figures = ", ".join(f"{k} {v:.4g}" for k, v in entry.items() if isinstance(v, float))
            paired = entry.get("draw_cosine_minus_rl360")
            if paired:
                figures += f", draw cosine - rl360's {Interval(**paired).text('+.3f')}"
            console.print(f"gradient, {mode}, {arm}: {figures}")
