"""`rl360 ab`: the fault A/B offline, repeated over seeds, with intervals (issue 29 item 3).

Owns running the demo's learning problem in this process, many times: the same policy (the
demo's warm-started tiny model, `rl360_ext.local.demo.policy.demo_policy` at `init_seed`), the same
reference trainer and its settings (`Trainer`, the demo's `TrainerConfig`: the recipe's clip
ranges, the decoupled head learning rate, `--keep-old-actor`, one optimizer step per rollout),
the same task plan (`demo.plan.plan_step`: which quiz each group asks, Miles' group and sample
numbering), the same hooks in the same order (rl360's dynamic filter on every group, then the
arm's reward post-process on the kept samples, `arms.advantage_metrics`, then the train step),
and the demo's default schedule, one-step-off (`demo.plan.expected_weight_version`: steps 0 and
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

import copy
import dataclasses
import json
import math
import os
import tempfile
import time
from argparse import Namespace
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rl360_ext.local.ab.config import OfflineConfig
from rl360_ext.local.ab.stats import (
    INTERVAL_NOTE,
    Interval,
    curve_figures,
    paired_interval,
    step_intervals,
    summarize,
    summary_sentences,
)
from rl360_ext.local.ab.stats import results_table as stats_table
from rl360_ext.local.demo.arms import (
    ADVANTAGE_SHIFT,
    RL360_REWARD_POST_PROCESS,
    UPSTREAM_REWARD_POST_PROCESS,
    UPSTREAM_TRAINER,
    advantage_metrics,
)
from rl360_ext.local.demo.modes import (
    ABLATION_ARMS,
    ARM_NAMES,
    BURST,
    CLEAN,
    CRASH_MODES,
    DENOMINATOR,
    PLANNED_FAULT_MODES,
    RL360,
    RL360_LIST,
    UPSTREAM,
    VANILLA_TIS,
    ZERO_SCORED,
)
from rl360_ext.local.demo.plan import (
    CLIENT_DEADLINE,
    ENGINE_503,
    ONE_STEP_OFF,
    SANDBOX_LOST,
    SANDBOX_START,
    VERIFIER_CRASH,
    DemoConfig,
    attempt_fault,
    attempt_sampling_seed,
    expected_weight_version,
    fault_uniforms,
    keyed_uniforms,
    plan_step,
)
from rl360_ext.local.fixtures.quiz_agent import (
    CRASH,
    CRASH_LETTER,
    LETTERS,
    LOOK_TURN_TOKENS,
    PROBE_CALL_ID,
    extract_action,
    look_messages,
    probe_message,
    probe_output,
)
from rl360_ext.outcomes.attribution import (
    ATTRIBUTED_TO,
    EVIDENCE,
    Attribution,
    AttributionRule,
    Control,
    Evidence,
    Phase,
    Resource,
)
from rl360_ext.outcomes.causes import Cause
from rl360_ext.outcomes.infra import mark_infra_sample
from rl360_ext.outcomes.provenance import ATTEMPT_CLASS, REWARD_SOURCE, VALID, VERIFIER, is_valid
from rl360_ext.reference.engine.model import KVState, ModelConfig, TinyMoEModel
from rl360_ext.reference.engine.threads import single_blas_thread
from rl360_ext.reference.trainer.trainer import Trainer, TrainerConfig
from rl360_ext.rollout.filters import check_valid_reward_nonzero_std
from rl360_ext.rollout.metrics import REGISTRY
from rl360_ext.rollout.sample import Sample
from rl360_ext.templates.markup import TURN_END
from rl360_ext.templates.render import ChatRenderer
from rl360_ext.util.dotted import load_function

CRASH_CAUSE = Cause.SANDBOX_LOST.value  # the list rule's class for a crashed sandbox (as live)
CRASH_SIGNAL = Cause.MEMORY_LIMIT_EXCEEDED.value  # the finer cause the /run server reports
CRASH_EVIDENCE = Evidence(  # what attribution by evidence records for it: the policy's, by rule
    phase=Phase.AGENT,
    control=Control.RULE,
    resource=Resource.MEMORY,
    signal=CRASH_SIGNAL,
    detail="the crash tool allocated past the task's memory_mb",
)
FAULT_CAUSES = {  # the cause the agent function records for each injected fault
    SANDBOX_START: Cause.NO_SANDBOX.value,
    VERIFIER_CRASH: Cause.VERIFIER_CRASH.value,
    CLIENT_DEADLINE: Cause.CLIENT_DEADLINE.value,
    ENGINE_503: Cause.NO_ENGINE_AVAILABLE.value,
    SANDBOX_LOST: SANDBOX_LOST,
}


@dataclass(frozen=True)
class ArmRules:
    """One offline arm: its reward post-process hook, its trainer settings, whether it gets faults,
    and how the Harbor server would attribute a crash of the policy's own sandbox."""

    reward_post_process_path: str
    trainer: Mapping[str, Any] = field(default_factory=dict)
    faults: bool = True
    attribution: AttributionRule = AttributionRule.EVIDENCE


OFFLINE_ARMS: dict[str, ArmRules] = {
    RL360: ArmRules(RL360_REWARD_POST_PROCESS),
    RL360_LIST: ArmRules(RL360_REWARD_POST_PROCESS, attribution=AttributionRule.LIST),
    UPSTREAM: ArmRules(UPSTREAM_REWARD_POST_PROCESS, UPSTREAM_TRAINER),
    CLEAN: ArmRules(RL360_REWARD_POST_PROCESS, faults=False),
    ZERO_SCORED: ArmRules(UPSTREAM_REWARD_POST_PROCESS),
    DENOMINATOR: ArmRules(RL360_REWARD_POST_PROCESS, {"pg_loss_reducer_path": None}),
    VANILLA_TIS: ArmRules(RL360_REWARD_POST_PROCESS, {"tis_function_path": None}),
}
if tuple(OFFLINE_ARMS) != ARM_NAMES:
    raise RuntimeError(f"ab.config.ARM_NAMES {ARM_NAMES} and OFFLINE_ARMS {tuple(OFFLINE_ARMS)} disagree")


# ---- the problem: the demo's quizzes and first policy --------------------------------------------


@dataclass
class Quiz:
    """One quiz task as the quiz agent meets it: its first prompt's tokens and its answer."""

    name: str
    instruction: str
    options: str
    expected: str
    first: list[int]  # the look turn's prompt (system prompt and question, generation prompt)


@dataclass
class Problem:
    """What every run shares: tokenizer, quizzes, the model's sizes, the first policy's weights and
    the trainer settings (the demo's)."""

    renderer: ChatRenderer
    quizzes: dict[str, Quiz]
    model_config: ModelConfig
    weights: dict[str, np.ndarray]
    trainer_config: TrainerConfig
    end: int = field(init=False)
    _suffixes: dict[tuple[str, tuple[int, ...]], list[int]] = field(default_factory=dict, init=False)
    _crash_weights: dict[str, np.ndarray] | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.end = self.renderer.tokenizer.convert_tokens_to_ids(TURN_END)

    def first_weights(self, mode: str) -> dict[str, np.ndarray]:
        """The first policy of a run in `mode`: `weights`, and where the crash tool is offered
        (`CRASH_MODES`) the same weights with the crash action as one more answer
        (`demo.crash_action_head`, as the live demo's first policy in that mode)."""
        if mode not in CRASH_MODES:
            return self.weights
        if self._crash_weights is None:
            from rl360_ext.local.demo.policy import crash_action_head

            tokenizer = self.renderer.tokenizer
            weights = copy.deepcopy(self.weights)
            letters = [tokenizer.convert_tokens_to_ids(letter) for letter in LETTERS]
            crash_action_head(weights, letters, tokenizer.convert_tokens_to_ids(CRASH_LETTER))
            self._crash_weights = weights
        return self._crash_weights

    @property
    def task_names(self) -> list[str]:
        return sorted(self.quizzes)

    def answer_suffix(self, task: str, look: Sequence[int]) -> list[int]:
        """The tokens after the look turn's end-of-turn token up to the answer turn: the probe's
        tool message with the task's options (what `demo.trainer.answer_prompts` renders)."""
        key = (task, tuple(look))
        if key not in self._suffixes:
            quiz = self.quizzes[task]
            tokenizer = self.renderer.tokenizer
            reply = {"role": "assistant", "content": tokenizer.decode(list(look), skip_special_tokens=True)}
            probe = probe_message(PROBE_CALL_ID, probe_output(0, quiz.options, ""))
            self._suffixes[key] = self.renderer.suffix_ids([*look_messages(quiz.instruction), reply], [probe])
        return self._suffixes[key]

    def decode(self, tokens: Sequence[int]) -> str:
        return self.renderer.tokenizer.decode(list(tokens), skip_special_tokens=True)


def read_quizzes(renderer: ChatRenderer) -> dict[str, Quiz]:
    """The demo's quiz tasks: instruction, options (what the probe prints), expected letter."""
    from rl360_ext.local.fixtures import quiz_task_names, tasks_root
    from rl360_ext.local.fixtures.quiz_agent import QUIZ_OPTIONS

    root = tasks_root()
    quizzes = {}
    for name in quiz_task_names(root):
        instruction = (root / name / "instruction.md").read_text()
        quizzes[name] = Quiz(
            name,
            instruction,
            (root / name / QUIZ_OPTIONS).read_text(),
            (root / name / "tests" / "expected.txt").read_text().strip().upper(),
            renderer.prompt_ids(look_messages(instruction)),
        )
    return quizzes


def quiz_problem(
    model_config: ModelConfig, weights: dict[str, np.ndarray], trainer_config: TrainerConfig
) -> Problem:
    """The demo's quizzes and tokenizer around a given first policy and trainer settings."""
    from rl360_ext.reference.engine.tokenizer import default_tokenizer_dir
    from rl360_ext.templates.tokenizer import load_hf_tokenizer

    renderer = ChatRenderer(load_hf_tokenizer(str(default_tokenizer_dir())))
    return Problem(renderer, read_quizzes(renderer), model_config, weights, trainer_config)


def demo_problem(config: OfflineConfig) -> Problem:
    """The demo's first policy (`demo_policy`: both warm starts at `init_seed`) and trainer settings."""
    from rl360_ext.local.demo.policy import demo_policy

    demo = DemoConfig(
        steps=config.steps,
        tasks=config.tasks,
        attempts=config.attempts,
        seed=config.init_seed,
        lr=config.lr,
        head_lr=config.head_lr,
        out=Path(tempfile.mkdtemp(prefix="rl360-ab-")),
    )
    policy = demo_policy(demo)
    trainer_config = dataclasses.replace(
        policy.trainer.config, max_token_age=1 if config.schedule == ONE_STEP_OFF else 0
    )
    return quiz_problem(policy.model_config, copy.deepcopy(policy.trainer.weights), trainer_config)


# ---- the in-process sampler ----------------------------------------------------------------------


class Sampler:
    """The tiny engine's model on one weight version, with the prompts' KV cached."""

    def __init__(self, problem: Problem, weights: dict[str, np.ndarray], temperature: float) -> None:
        self.problem = problem
        self.model = TinyMoEModel(problem.model_config, weights)
        self.temperature = temperature
        self._kv: dict[tuple[int, ...], KVState] = {}
        self._logits: dict[tuple[int, ...], np.ndarray] = {}

    def logits(self, prefix: tuple[int, ...], extra: tuple[int, ...] = ()) -> np.ndarray:
        """The next token's logits after `prefix + extra` (`prefix`'s KV is kept for reuse)."""
        key = prefix + extra
        if key not in self._logits:
            if prefix not in self._kv:
                kv = KVState.empty(self.problem.model_config, len(prefix) + 8)
                self._logits[prefix] = self.model.forward(np.asarray(prefix), kv).logits[-1]
                self._kv[prefix] = kv
            if extra:
                base = self._kv[prefix]
                kv = KVState.from_prefix(*base.slice(0, base.length), spare=len(extra) + 1)
                self._logits[key] = self.model.forward(np.asarray(extra), kv).logits[-1]
        return self._logits[key]

    def draw(self, prefix: tuple[int, ...], extra: tuple[int, ...], u: float | None) -> tuple[int, float]:
        """(token, its log-prob under the raw logits): inverse-CDF at `u`, greedy when `u` is None."""
        logits = self.logits(prefix, extra)
        shifted = logits - logits.max()
        log_probs = shifted - np.log(np.exp(shifted).sum())
        if u is None:
            token = int(np.argmax(logits))
        else:
            scaled = shifted / self.temperature
            probs = np.exp(scaled - scaled.max())
            cdf = np.cumsum(probs / probs.sum())
            token = int(min(np.searchsorted(cdf, u, side="right"), len(cdf) - 1))
        return token, float(log_probs[token])


@dataclass
class Attempt:
    """One attempt's merged tokens and what the verifier would say."""

    tokens: list[int]
    response_length: int
    loss_mask: list[int]
    log_probs: list[float]
    letter: str | None
    reward: float
    crashed: bool = False  # the answer turn took the crash action (no answer written)

    @property
    def sandbox_calls(self) -> int:
        """The probe, the answer write (only with a letter) and the verifier's run."""
        return 2 + (self.letter is not None)


def run_attempt(
    problem: Problem,
    sampler: Sampler,
    task: str,
    uniforms: Sequence[float] | None,
    max_new_tokens: int,
    crash_tool: bool = False,
) -> Attempt:
    """The quiz agent's two turns on `sampler` (`uniforms`: the look token's, then one per answer
    token; None: greedy), merged as the session merges them. With `crash_tool`, an answer turn
    that takes the crash action (`quiz_agent.extract_action`) writes no answer: reward 0, the
    task's floor, whatever the rules then make of it (`make_sample`)."""
    if LOOK_TURN_TOKENS != 1:
        raise ValueError(
            f"the offline sampler draws a one-token look turn, LOOK_TURN_TOKENS is {LOOK_TURN_TOKENS}"
        )

    def u(i: int) -> float | None:
        return None if uniforms is None else uniforms[i]

    quiz = problem.quizzes[task]
    first = tuple(quiz.first)
    look, look_lp = sampler.draw(first, (), u(0))
    looked = [] if look == problem.end else [look]  # LOOK_TURN_TOKENS is 1: one draw
    suffix = problem.answer_suffix(task, looked)
    answer_prompt = (*first, *looked, problem.end, *suffix)
    answer: list[int] = []
    answer_lps: list[float] = []
    for position in range(max_new_tokens):
        token, lp = sampler.draw(answer_prompt, tuple(answer), u(1 + position))
        answer.append(token)
        answer_lps.append(lp)
        if token == problem.end:
            break
    action = extract_action(problem.decode(answer), None, crash_tool)
    letter = None if action == CRASH else action
    reward = 1.0 if letter == quiz.expected else 0.0
    if looked:  # a look turn cut by its token budget is the last turn the merge keeps
        response, mask, lps = [look], [1], [look_lp]
    else:
        response = [problem.end, *suffix, *answer]
        mask = [1] + [0] * len(suffix) + [1] * len(answer)
        lps = [look_lp] + [0.0] * len(suffix) + answer_lps
    return Attempt([*first, *response], len(response), mask, lps, letter, reward, action == CRASH)


def sampling_uniforms(seed: int, index: int, max_new_tokens: int) -> list[float]:
    """An attempt's sampling draws (look token, answer tokens): from the demo's sampling seed."""
    return keyed_uniforms(f"rl360-ab-sampling:{attempt_sampling_seed(seed, index)}", 1 + max_new_tokens)


def make_sample(
    attempt: Attempt,
    group_index: int,
    index: int,
    version: int,
    fault: str | None,
    attribution: AttributionRule = AttributionRule.EVIDENCE,
) -> Sample:
    """The Miles-shaped sample the generate hook would hand back for `attempt`: an infrastructure
    `fault` masks it under every rule; a crash of its own sandbox (`attempt.crashed`) is the
    policy's under attribution by evidence (valid, the verifier's 0 for the end state without an
    answer, `attributed_to` policy and the evidence) and masked as `infra:memory_limit_exceeded`
    under the list rule (`infra:sandbox_lost`, detail `memory_limit_exceeded`)."""
    sample = Sample(
        group_index=group_index,
        index=index,
        tokens=list(attempt.tokens),
        response_length=attempt.response_length,
        loss_mask=list(attempt.loss_mask),
        rollout_log_probs=list(attempt.log_probs),
        weight_versions=[str(version)] * (1 if attempt.response_length == 1 else 2),
        reward=attempt.reward,
        metadata={ATTEMPT_CLASS: VALID, REWARD_SOURCE: VERIFIER},
    )
    if fault is not None:
        sample.metadata.pop(REWARD_SOURCE)
        mark_infra_sample(sample, FAULT_CAUSES.get(fault, fault))
    elif attempt.crashed and attribution == AttributionRule.LIST:
        sample.metadata.pop(REWARD_SOURCE)
        mark_infra_sample(sample, CRASH_CAUSE, detail=CRASH_SIGNAL)
    elif attempt.crashed:
        sample.metadata[ATTRIBUTED_TO] = Attribution.POLICY.value
        sample.metadata[EVIDENCE] = CRASH_EVIDENCE.as_json()
    return sample


def miles_args(config: OfflineConfig) -> Namespace:
    """The Miles settings the hooks read (the demo's `build_args`)."""
    return Namespace(
        n_samples_per_prompt=config.attempts,
        rollout_batch_size=config.tasks,
        advantage_estimator="grpo",
        rewards_normalization=True,
        grpo_std_normalization=True,
        reward_key=None,
    )


def sampling_version(schedule: str, step: int) -> int:
    """The weight version step `step` samples on (one-step-off: the demo's; on-policy: its own)."""
    return int(expected_weight_version(step)) if schedule == ONE_STEP_OFF else step


# ---- one run -------------------------------------------------------------------------------------


@dataclass
class StepRecord:
    step: int
    attempts: int
    valid: int
    infra: int
    kept_groups: int
    unfiltered_mean: float | None
    loss_scale: float | None
    advantage_shift: float | None
    grad_norm: float | None
    crashes: int = 0  # attempts whose answer turn took the crash action
    pass_rate: float | None = None  # reward over the attempts no infrastructure fault hit, a crash 0

    @property
    def crash_rate(self) -> float:
        return self.crashes / self.attempts if self.attempts else 0.0


@dataclass
class RunResult:
    """One (mode, arm, seed) run: its steps, eval and the figures the statistics use."""

    mode: str
    arm: str
    seed: int
    steps: list[StepRecord]
    eval_pass: float
    faulted: list[list[int]]  # per step, the Miles indices of the faulted attempts (infrastructure)
    tasks: list[list[str]]  # per step, the groups' quizzes
    seconds: float
    weights: dict[str, np.ndarray] | None = None  # the final weights, when asked for (run_one)

    def figures(self, total_steps: int, goal: float) -> dict[str, float]:
        return run_figures(self, total_steps, goal)


def _mean(values: Sequence[float]) -> float | None:
    return float(np.mean(values)) if values else None


def run_figures(run: RunResult, total_steps: int, goal: float) -> dict[str, float]:
    """The run's figures (`ab.stats.curve_figures`) from its steps and its eval."""
    return curve_figures(
        [(s.step, s.unfiltered_mean) for s in run.steps],
        [s.loss_scale for s in run.steps],
        [s.advantage_shift for s in run.steps],
        run.eval_pass,
        total_steps,
        goal,
        crash_rates=[s.crash_rate for s in run.steps],
        pass_rates=[s.pass_rate for s in run.steps],
    )


def greedy_eval(
    problem: Problem, weights: dict[str, np.ndarray], max_new_tokens: int, crash_tool: bool = False
) -> float:
    """The demo's `train_greedy` eval: one greedy attempt per training quiz, the pass rate (a
    crash action scores 0)."""
    sampler = Sampler(problem, weights, 1.0)
    rewards = [
        run_attempt(problem, sampler, task, None, max_new_tokens, crash_tool).reward
        for task in problem.task_names
    ]
    return float(np.mean(rewards))


def arm_trainer(problem: Problem, arm: str, weights: dict[str, np.ndarray] | None = None) -> Trainer:
    config = dataclasses.replace(problem.trainer_config, **OFFLINE_ARMS[arm].trainer)
    return Trainer(problem.model_config, copy.deepcopy(weights or problem.weights), config)


def plan_run_step(
    config: OfflineConfig, seed: int, step: int, task_names: Sequence[str], mode: str
) -> list[Any]:
    """The demo's plan of one step for `seed` (uniform and exploitable modes: with the attempt
    faults at `faults`)."""
    rate = config.faults if mode in PLANNED_FAULT_MODES else 0.0
    demo = DemoConfig(
        steps=config.steps, tasks=config.tasks, attempts=config.attempts, faults=rate, seed=seed
    )
    return plan_step(step, demo, task_names)


def rollout_step(
    problem: Problem,
    config: OfflineConfig,
    sampler: Sampler,
    mode: str,
    arm: str,
    seed: int,
    step: int,
    version: int,
) -> tuple[list[list[Sample]], list[int], list[int], list[str]]:
    """One step's groups of samples; the indices of the attempts an infrastructure fault hit, and
    of those that took the crash action; the groups' quizzes."""
    rules = OFFLINE_ARMS[arm]
    crash_tool = mode in CRASH_MODES
    groups, faulted, crashed, tasks = [], [], [], []
    for group in plan_run_step(config, seed, step, problem.task_names, mode):
        samples = []
        for plan in group:
            attempt = run_attempt(
                problem, sampler, plan.task, sampling_uniforms(seed, plan.index, config.max_new_tokens),
                config.max_new_tokens, crash_tool,
            )  # fmt: skip
            fault = None
            if rules.faults:
                fault = attempt_fault(
                    mode, config.faults, step, config.steps, plan.fault,
                    fault_uniforms(seed, mode, plan.index), attempt.sandbox_calls,
                )  # fmt: skip
            if fault is not None:
                faulted.append(plan.index)
            if attempt.crashed:
                crashed.append(plan.index)
            sample = make_sample(attempt, plan.group_index, plan.index, version, fault, rules.attribution)
            samples.append(sample)
        groups.append(samples)
        tasks.append(group[0].task)
    return groups, faulted, crashed, tasks


def run_one(
    problem: Problem, config: OfflineConfig, mode: str, arm: str, seed: int, keep_weights: bool = False
) -> RunResult:
    """One whole run of `config.steps` steps under `mode`'s faults with `arm`'s rules (with
    `keep_weights`, the result holds the final weights)."""
    with single_blas_thread():
        return _run_one(problem, config, mode, arm, seed, keep_weights)


def _run_one(
    problem: Problem, config: OfflineConfig, mode: str, arm: str, seed: int, keep_weights: bool
) -> RunResult:
    started = time.perf_counter()
    args = miles_args(config)
    post_process = load_function(OFFLINE_ARMS[arm].reward_post_process_path)
    trainer = arm_trainer(problem, arm, problem.first_weights(mode))
    snapshots: dict[int, dict[str, np.ndarray]] = {0: copy.deepcopy(trainer.weights)}
    samplers: dict[int, Sampler] = {}
    steps, faulted, tasks = [], [], []
    for step in range(config.steps):
        version = sampling_version(config.schedule, step)
        if version not in samplers:
            samplers = {version: Sampler(problem, snapshots[version], config.temperature)}
        groups, faults, crashes, names = rollout_step(
            problem, config, samplers[version], mode, arm, seed, step, version
        )
        faulted.append(faults)
        tasks.append(names)
        kept = [group for group in groups if check_valid_reward_nonzero_std(args, group).keep]
        REGISTRY.drain()
        every = [s for group in groups for s in group]
        valid_rewards = [float(s.reward) for s in every if is_valid(s)]
        fault_indices, crash_indices = set(faults), set(crashes)
        unfaulted = [s for s in every if s.index not in fault_indices]
        passed = [0.0 if s.index in crash_indices else float(s.reward) for s in unfaulted]
        samples = [s for group in sorted(kept, key=lambda g: g[0].index) for s in group]
        shift: dict[str, float] = {}
        if samples:
            raw, advantages = post_process(args, samples)
            shift = advantage_metrics(args, samples, advantages)
        else:
            raw, advantages = [], []
        metrics = trainer.train_step(samples, advantages, raw, policy_version=step)
        snapshots[step + 1] = copy.deepcopy(trainer.weights)
        for old in [v for v in snapshots if v < step]:
            del snapshots[old]  # the next sampling version is step or later
        trained = bool(metrics.get("train/valid_samples"))
        steps.append(
            StepRecord(
                step=step,
                attempts=len(every),
                valid=len(valid_rewards),
                infra=len(every) - len(valid_rewards),
                kept_groups=len(kept),
                unfiltered_mean=_mean(valid_rewards),
                loss_scale=metrics.get("train/loss_scale") if trained else None,
                advantage_shift=shift.get(ADVANTAGE_SHIFT),
                grad_norm=metrics.get("train/grad_norm"),
                crashes=len(crashes),
                pass_rate=_mean(passed),
            )
        )
    eval_pass = greedy_eval(problem, trainer.weights, config.max_new_tokens, mode in CRASH_MODES)
    weights = copy.deepcopy(trainer.weights) if keep_weights else None
    return RunResult(
        mode, arm, seed, steps, eval_pass, faulted, tasks, time.perf_counter() - started, weights
    )


# ---- many runs -----------------------------------------------------------------------------------

_SHARED: dict[str, Any] = {}


def _run_job(job: tuple[str, str, int]) -> RunResult:
    return run_one(_SHARED["problem"], _SHARED["config"], *job)


def run_all(
    problem: Problem,
    config: OfflineConfig,
    jobs: Sequence[tuple[str, str, int]],
    progress: Callable[[RunResult], None] | None = None,
) -> list[RunResult]:
    """Every (mode, arm, seed) job, in `config.workers` forked processes (1: in this one)."""
    results: list[RunResult] = []
    if config.workers == 1:
        for job in jobs:
            results.append(run_one(problem, config, *job))
            if progress:
                progress(results[-1])
        return results
    import multiprocessing

    _SHARED.update(problem=problem, config=config)
    context = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(config.workers, mp_context=context) as pool:
        for future in as_completed([pool.submit(_run_job, job) for job in jobs]):  # run in job order
            results.append(future.result())
            if progress:
                progress(results[-1])
    order = {job: number for number, job in enumerate(jobs)}
    return sorted(results, key=lambda r: order[(r.mode, r.arm, r.seed)])


# ---- the estimators' bias and variance -----------------------------------------------------------


class _GradientRecorder:
    """Stands in for the trainer's AdamW: keeps the gradient it is handed, changes no weight."""

    def __init__(self) -> None:
        self.grads: list[np.ndarray] = []

    def step(self, grads: Mapping[str, np.ndarray], clip_grad: float | None = None) -> float:
        flat = np.concatenate([grads[name].ravel() for name in sorted(grads)])
        self.grads.append(flat)
        return float(np.linalg.norm(flat))


def gradient_variance(
    problem: Problem, config: OfflineConfig, mode: str, arms: Sequence[str], draws: int
) -> dict[str, dict[str, Any]]:
    """Per arm: bias and variance of the one-step policy gradient from `problem.weights`.

    Each draw is one step's batch (the plan of seed `first_seed + draw`, step 0, `mode`'s faults;
    the clean arm the same batch without faults), post-processed and trained on by the arm's
    rules with the optimizer replaced by a recorder. Against the clean arm's mean gradient g*:
    `bias` = |mean(g) - g*| / |g*|, `variance` = mean |g - mean(g)|^2 / |g*|^2, `mse` their
    sum (bias^2 + variance), `cosine` = cos(mean(g), g*), `draw_cosine` the mean over draws of
    cos(g, g*) (scale-free: what AdamW's direction sees), `draw_cosines` each draw's (the same
    draws in every arm: paired). A draw with no kept group is a zero gradient (no update)."""
    args = miles_args(config)
    recorded: dict[str, list[np.ndarray]] = {}
    with single_blas_thread():
        first = problem.first_weights(mode)
        sampler = Sampler(problem, first, config.temperature)
        size = sum(value.size for value in first.values())
        for arm in arms:
            post_process = load_function(OFFLINE_ARMS[arm].reward_post_process_path)
            trainer = arm_trainer(problem, arm, first)
            recorder = _GradientRecorder()
            trainer.optimizer = recorder  # type: ignore[assignment]
            grads = []
            for draw in range(draws):
                seed = config.first_seed + draw
                step = config.steps // 2 if mode == BURST else 0
                groups, _, _, _ = rollout_step(problem, config, sampler, mode, arm, seed, step, 0)
                kept = [g for g in groups if check_valid_reward_nonzero_std(args, g).keep]
                REGISTRY.drain()
                samples = [s for g in kept for s in g]
                recorder.grads.clear()
                if samples:
                    raw, advantages = post_process(args, samples)
                    trainer.train_step(samples, advantages, raw, policy_version=0)
                # a step with nothing valid to train on moves nothing: a zero gradient
                grads.append(recorder.grads[0] if recorder.grads else np.zeros(size))
            recorded[arm] = grads
    reference = np.mean(recorded[CLEAN], axis=0) if CLEAN in recorded else None
    out: dict[str, dict[str, Any]] = {}
    for arm, grads in recorded.items():
        stack = np.asarray(grads)
        mean = stack.mean(axis=0)
        spread = float(np.mean(np.sum((stack - mean) ** 2, axis=1)))
        entry: dict[str, Any] = {
            "draws": float(len(stack)),
            "norm": float(np.linalg.norm(mean)),
            "variance_abs": spread,
        }
        if reference is not None:
            scale = float(np.linalg.norm(reference)) or 1.0
            bias = float(np.linalg.norm(mean - reference)) / scale
            variance = spread / scale**2
            norms = np.linalg.norm(stack, axis=1)
            cosines = np.where(norms > 0, stack @ reference / (norms * scale + 1e-300), 0.0)
            entry.update(
                bias=bias,
                variance=variance,
                mse=bias**2 + variance,
                cosine=float(mean @ reference / (np.linalg.norm(mean) * scale + 1e-300)),
                draw_cosine=float(np.mean(cosines)),
                draw_cosine_sd=float(np.std(cosines, ddof=1)) if len(cosines) > 1 else 0.0,
                draw_cosines=cosines.tolist(),
            )
        out[arm] = entry
    if RL360 in out and "draw_cosines" in out[RL360]:
        for arm, entry in out.items():
            if arm != RL360:
                paired = paired_interval(entry["draw_cosines"], out[RL360]["draw_cosines"])
                entry["draw_cosine_minus_rl360"] = dataclasses.asdict(paired)
    return out


def advantage_agreement(
    problem: Problem, config: OfflineConfig, mode: str, arms: Sequence[str], draws: int
) -> dict[str, dict[str, float]]:
    """Per arm: how far its advantages are from the ones the same attempts get without faults.

    At `problem.weights` every arm samples the same tokens for an attempt (paired draws), so the
    clean arm's advantage of an attempt is what its group would have given it had no attempt
    failed. Over `draws` one-step batches (as `gradient_variance`), for every valid attempt in a
    group the arm trains on: `rmse` of (arm's advantage - clean's), and the mean signed error for
    right and wrong answers (`error_right`, `error_wrong`); 0 for the clean arm itself."""
    args = miles_args(config)
    sampler = Sampler(problem, problem.first_weights(mode), config.temperature)
    step = config.steps // 2 if mode == BURST else 0

    def advantages(arm: str, seed: int) -> dict[int, tuple[float, float]]:
        groups, _, _, _ = rollout_step(problem, config, sampler, mode, arm, seed, step, 0)
        kept = [g for g in groups if check_valid_reward_nonzero_std(args, g).keep]
        REGISTRY.drain()
        samples = [s for g in kept for s in g]
        if not samples:
            return {}
        _, values = load_function(OFFLINE_ARMS[arm].reward_post_process_path)(args, samples)
        return {s.index: (float(s.reward), a) for s, a in zip(samples, values, strict=True) if is_valid(s)}

    errors: dict[str, list[tuple[float, float]]] = {arm: [] for arm in arms}
    with single_blas_thread():
        for draw in range(draws):
            seed = config.first_seed + draw
            clean = advantages(CLEAN, seed)
            for arm in arms:
                for index, (reward, value) in advantages(arm, seed).items():
                    errors[arm].append((reward, value - clean.get(index, (reward, 0.0))[1]))
    out = {}
    for arm, pairs in errors.items():
        right = [e for r, e in pairs if r > 0]
        wrong = [e for r, e in pairs if r <= 0]
        out[arm] = {
            "attempts": float(len(pairs)),
            "rmse": float(np.sqrt(np.mean([e * e for _, e in pairs]))) if pairs else math.nan,
            "error_right": float(np.mean(right)) if right else math.nan,
            "error_wrong": float(np.mean(wrong)) if wrong else math.nan,
        }
    return out


# ---- the command ---------------------------------------------------------------------------------


def jobs_for(config: OfflineConfig) -> list[tuple[str, str, int]]:
    """Every (mode, arm, seed) to run, seed by seed (stopped early, every arm and mode has the
    same seeds); the ablation arms only in `ablation_modes`, rl360-list only in `list_modes`. The
    clean arm has no fault, and its tasks and sampling draws do not depend on the mode, so its
    runs are the same in every mode without the crash tool: it runs once per seed in the first of
    them (`with_clean_everywhere` copies it to the others), and once in each mode with the crash
    tool (another first policy and action space: the crash, under attribution by evidence)."""
    jobs = []
    plain = [mode for mode in config.mode_names if mode not in CRASH_MODES]
    for seed in config.seed_list:
        for mode in config.mode_names:
            for arm in config.arm_names:
                if (
                    (arm == CLEAN and mode in plain and mode != plain[0])
                    or (arm in ABLATION_ARMS and mode not in config.ablation_mode_names)
                    or (arm == RL360_LIST and mode not in config.list_mode_names)
                ):
                    continue
                jobs.append((mode, arm, seed))
    return jobs


def with_clean_everywhere(results: Sequence[RunResult], modes: Sequence[str]) -> list[RunResult]:
    """`results` with the clean arm's runs repeated under every mode without the crash tool (they
    are the same in each); a crash mode's clean runs are its own."""
    clean = [r for r in results if r.arm == CLEAN and r.mode not in CRASH_MODES]
    plain = [mode for mode in modes if mode not in CRASH_MODES]
    extra = [dataclasses.replace(r, mode=mode) for mode in plain for r in clean if r.mode != mode]
    return [*results, *extra]


def run_record(run: RunResult, config: OfflineConfig) -> dict[str, Any]:
    """One run as ab.json and runs.jsonl hold it."""
    return {
        "mode": run.mode,
        "arm": run.arm,
        "seed": run.seed,
        "eval_pass": run.eval_pass,
        "seconds": run.seconds,
        "figures": run_figures(run, config.steps, config.goal),
        "curve": [s.unfiltered_mean for s in run.steps],
        "loss_scale": [s.loss_scale for s in run.steps],
        "advantage_shift": [s.advantage_shift for s in run.steps],
        "infra": [s.infra for s in run.steps],
        "kept_groups": [s.kept_groups for s in run.steps],
        "crash_rate": [s.crash_rate for s in run.steps],
        "pass_rate": [s.pass_rate for s in run.steps],
    }


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
    gradients = {}
    if config.gradient_draws:
        arms = [RL360, *ABLATION_ARMS, UPSTREAM, CLEAN]
        for mode in config.ablation_mode_names:
            console.print(
                f"gradient bias and variance, {mode}: {config.gradient_draws} draws x {len(arms)} arms ..."
            )
            gradients[mode] = gradient_variance(problem, config, mode, arms, config.gradient_draws)
    wall_s = time.perf_counter() - started
    document = ab_document(config, [run_record(r, config) for r in results], gradients, wall_s)
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
) -> dict[str, Any]:
    """What ab.json holds: the settings, the table and summary computed from `records`, the
    gradient figures, every run."""
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


def _json_default(value: Any) -> Any:
    if isinstance(value, np.floating | np.integer):
        return value.item()
    raise TypeError(f"not JSON: {type(value).__name__}")


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


def default_workers() -> int:
    return max(1, min(2, os.cpu_count() or 1))
