"""The pure parts of `rl360 demo` before it runs: its settings (`DemoConfig`), the task and fault
plan, and the eval plan (the weight schedules are `rl360_ext.local.demo.versions`, the per-step
summary `rl360_ext.local.demo.summary`).

Owns deciding, before anything runs, which quiz task each group of a step asks and which attempts
get an injected infrastructure fault (seeded, so a run can be repeated); which held-out tasks the
evals ask. It runs no process and no I/O (the driver is
`rl360_ext.local.demo.driver`). Validity comes only from `rl360_ext.outcomes.provenance`.

Faults (`--faults RATE`): each attempt independently gets a fault with probability
RATE * 3/4, one of three kinds chosen uniformly: a sandbox that fails to start, a verifier that
crashes before writing a reward, or a client whose deadline has already run out. The fourth kind,
engine 503s, cannot be aimed at one attempt from here: every engine answers each `/generate` with
a 503 at rate RATE / 4 (the engine's `POST /rl360/faults`). So about RATE of all attempts fail for
infrastructure reasons. With `seeded_sampling` (every `--compare` arm) the 503s are keyed by the
attempt's sampling seed (`attempt_sampling_seed`, a function of the run's seed and the attempt's
Miles index, which the step's plan maps to its task), not drawn in request order: the same
attempts get them in every arm (`rl360_ext.reference.engine.faults.FaultKey.SAMPLING_SEED`), as the
planned sandbox, verifier and deadline faults are the same in every arm.

That is the `uniform` fault mode (`fault_mode`). The fault modes are shared with the offline
A/B (`rl360_ext.local.ab.offline`), defined here once (`attempt_fault`, `fault_uniforms`: draws
keyed by the seed, the mode and the attempt's Miles index): `burst` plans a sandbox-start fault
for each attempt of the middle step with probability `BURST_RATE` and nothing else (no 503s);
`correlated` plans nothing and marks a valid attempt a lost sandbox once it ran, with a
probability that grows with its sandbox calls (`correlated_fault`); `exploitable` plans the
uniform mode's faults and offers the quiz agent a crash tool (`quiz_agent.CRASH_LETTER`: a reply
that picks it runs a command that allocates past the sandbox's memory limit), so the policy can
fail in a way the list rule (`attribution`: `--attribution list` on the Harbor server) masks as
infrastructure.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rl360_ext.local.demo.arms import RL360_RULES, arm_rules
from rl360_ext.local.demo.faults import BURST as BURST_INJECT
from rl360_ext.local.demo.faults import Injection, check_injections, injected
from rl360_ext.local.demo.modes import (
    BURST,
    BURST_RATE,
    CORRELATED,
    CRASH_MODES,
    FAULT_MODES,
    ONE_STEP_OFF,
    PLANNED_FAULT_MODES,
    SCHEDULES,
    UNIFORM,
)
from rl360_ext.local.fixtures.quiz_agent import extract_answer
from rl360_ext.outcomes.attribution import AttributionRule
from rl360_ext.outcomes.causes import Cause
from rl360_ext.templates.markup import TURN_START
from rl360_ext.weights.churn import ChurnEvent, parse_churn

# Fault kinds; the two that are causes are named by the cause they produce.
SANDBOX_START = "sandbox_start"


VERIFIER_CRASH = Cause.VERIFIER_CRASH.value


CLIENT_DEADLINE = Cause.CLIENT_DEADLINE.value


ENGINE_503 = "engine_503"


FAULT_KINDS = (SANDBOX_START, VERIFIER_CRASH, CLIENT_DEADLINE, ENGINE_503)


ATTEMPT_FAULT_KINDS = (SANDBOX_START, VERIFIER_CRASH, CLIENT_DEADLINE)  # aimed at single attempts


FAULT_TASKS = {SANDBOX_START: "fault-sandbox-start", VERIFIER_CRASH: "fault-verifier-crash"}


SANDBOX_LOST = Cause.SANDBOX_LOST.value  # the correlated mode's fault: a sandbox call that failed


CORRELATED_TYPICAL_CALLS = 3  # probe, answer write, verifier: an attempt that writes an answer


ATTRIBUTION_RULES = tuple(rule.value for rule in AttributionRule)


SAMPLING_SEED_LIMIT = 2**63  # an OpenAI `seed` is a non-negative integer; SGLang's sampling_seed is int64


PAUSE_MODES = ("in_place", "retract")


@dataclass(frozen=True)
class DemoConfig:
    """What `rl360 demo` runs; the constructor rejects values it cannot run, naming the option."""

    steps: int = 20
    """Rollout steps (one train step and weight push each)."""
    tasks: int = 8
    """Task groups per step."""
    attempts: int = 4
    """Attempts per task group (the group the baseline is taken over)."""
    faults: float = 0.0
    """Rate of injected infrastructure faults (0 to 1; spread by fault_mode)."""
    engines: int = 2
    """Tiny engines behind the SMG gateway."""
    out: Path = Path("runs/demo")
    """Output folder for metrics.jsonl and report.html (and the run's logs and trials)."""
    seed: int = 0
    """Seed of the policy, the task draw and the fault draw."""
    lr: float = 1e-3
    """The reference trainer's AdamW learning rate (attention, norms, router, experts)."""
    head_lr: float = 2e-2
    """Embedding and LM head (Megatron's --decoupled-lr): RL moves the answer there."""
    lr_warmup_steps: int = 0
    """Linear warmup of both learning rates."""
    steps_per_rollout: int = 1
    """Optimizer steps per rollout (Miles' --num-steps-per-rollout)"""
    engine_dtype: str = "float64"
    """The tiny engines' arithmetic (`rl360 engine serve --dtype`)"""
    temperature: float = 1.0
    """Sampling temperature of the agent's turns."""
    max_new_tokens: int = 2
    """The answer turn's budget (the look turn takes quiz_agent.LOOK_TURN_TOKENS)"""
    deadline_s: float = 120.0
    """Seconds an attempt may take end to end before it is cut off."""
    session_servers: int = 1
    """The generate hook's session servers (Ray actors)"""
    harbor_replicas: int = 1
    """Harbor /run servers; the agent function routes over them by image group."""
    schedule: str = ONE_STEP_OFF
    """When weights are pushed (SCHEDULES)"""
    pause_mode: str = "in_place"
    """How engines pause for a push (PAUSE_MODES)"""
    rules: str = RL360_RULES
    """The A/B arm's reward and loss rules (`rl360_ext.local.demo.arms.ARM_RULES`)"""
    seeded_sampling: bool = False
    """Every attempt's turns sample with `attempt_sampling_seed` (the A/B)"""
    keep_old_actor: bool = True
    """Miles' --keep-old-actor: PPO's old policy is each token's sampler."""
    top_logprobs_num: int = 5
    """The engines' top-k log-probs kept per generated token (0: off)"""
    eval_interval: int | None = None
    """Miles' --eval-interval: eval after every N train steps (None: no eval)"""
    eval_held_out: int = 2
    """Quiz tasks held out of training and evaluated, when eval_interval is set."""
    engine_churn: str = ""
    """--engine-churn SPEC: kill:STEP / hang:STEP events (`rl360_ext.weights.churn`)"""
    confirm_timeout_s: float = 10.0
    """A push fences an engine that does not confirm a call within this."""
    fault_mode: str = UNIFORM
    """How --faults are spread (FAULT_MODES; the module docstring)"""
    quarantine_file: Path | None = None
    """--rl360-quarantine-file for the hooks (--audit-tasks sets it)"""
    attribution: str | None = None
    """The Harbor server's --attribution (None: its default, evidence)"""
    inject: tuple[Injection, ...] = ()
    """--inject FAULT:STEP faults for the step gate (`demo.faults`)"""
    gate: bool = True
    """The step gate (`rl360_ext.local.demo.gate`, `StepGate` defaults) judges every step."""

    def __post_init__(self) -> None:
        minimums = {
            "steps": 1,
            "tasks": 1,
            "attempts": 2,
            "engines": 1,
            "session_servers": 1,
            "harbor_replicas": 1,
            "max_new_tokens": 1,
            "steps_per_rollout": 1,
            "lr_warmup_steps": 0,
            "top_logprobs_num": 0,
            "eval_held_out": 1,
        }
        for name, least in minimums.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"--{name.replace('_', '-')} must be an integer >= {least}, got {value!r}")
        interval = self.eval_interval
        if interval is not None and (
            isinstance(interval, bool) or not isinstance(interval, int) or interval < 1
        ):
            raise ValueError(f"--eval-interval must be an integer >= 1, got {interval!r}")
        if not (isinstance(self.faults, int | float) and 0.0 <= self.faults <= 1.0):
            raise ValueError(f"--faults must be a rate in [0, 1], got {self.faults!r}")
        for name in ("lr", "head_lr", "temperature", "deadline_s"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        for name in ("deadline_s", "lr", "head_lr"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if self.engine_dtype not in ("float64", "float32"):
            raise ValueError(f"--dtype must be float64 or float32, got {self.engine_dtype!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"--schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}")
        if self.pause_mode not in PAUSE_MODES:
            raise ValueError(f"--pause-mode must be one of {', '.join(PAUSE_MODES)}, got {self.pause_mode!r}")
        arm_rules(self.rules)
        if not isinstance(self.engine_churn, str):
            raise ValueError(f"--engine-churn must be a SPEC string, got {self.engine_churn!r}")
        parse_churn(self.engine_churn, self.steps)
        timeout = self.confirm_timeout_s
        if isinstance(timeout, bool) or not (isinstance(timeout, int | float) and 1 <= timeout <= 600):
            raise ValueError(f"confirm_timeout_s must be a number of seconds in [1, 600], got {timeout!r}")
        if self.fault_mode not in FAULT_MODES:
            raise ValueError(f"fault_mode must be one of {', '.join(FAULT_MODES)}, got {self.fault_mode!r}")
        if self.attribution is not None and self.attribution not in ATTRIBUTION_RULES:
            raise ValueError(
                f"attribution must be one of {', '.join(ATTRIBUTION_RULES)}, got {self.attribution!r}"
            )
        check_injections(self.inject, self.steps)
        if not isinstance(self.gate, bool):
            raise ValueError(f"gate must be true or false, got {self.gate!r}")
        if not isinstance(self.seeded_sampling, bool):
            raise ValueError(f"seeded_sampling must be true or false, got {self.seeded_sampling!r}")

    @property
    def churn_events(self) -> tuple[ChurnEvent, ...]:
        """The `--engine-churn` events, in step order."""
        return parse_churn(self.engine_churn, self.steps)

    @property
    def attempt_fault_rate(self) -> float:
        """Probability that one attempt gets a fault aimed at it (sandbox, verifier or deadline);
        uniform mode only (burst and correlated place their faults themselves)."""
        if self.fault_mode not in PLANNED_FAULT_MODES:
            return 0.0
        return self.faults * len(ATTEMPT_FAULT_KINDS) / len(FAULT_KINDS)

    @property
    def engine_error_rate(self) -> float:
        """Probability that an engine answers one `/generate` with a 503 (uniform mode only)."""
        return self.faults / len(FAULT_KINDS) if self.fault_mode in PLANNED_FAULT_MODES else 0.0

    @property
    def crash_tool(self) -> bool:
        """Whether the quiz agent offers the crash tool (the exploitable mode)."""
        return self.fault_mode in CRASH_MODES


def keyed_uniforms(key: str, n: int) -> list[float]:
    """`n` uniforms in [0, 1) that are a function of `key` alone."""
    seed = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")
    return np.random.default_rng(seed).random(n).tolist()


def fault_uniforms(seed: int, mode: str, index: int) -> list[float]:
    """An attempt's fault draws under `mode`: a function of the run's seed and the attempt's Miles
    index (so of its step, group, task and place), the same in every arm."""
    return keyed_uniforms(f"rl360-ab-fault:{seed}:{mode}:{index}", 2)


def burst_step(steps: int) -> int:
    """The step the burst mode faults (the public run's step 70): the middle one."""
    return steps // 2


def correlated_hazard(rate: float) -> float:
    """The per-call hazard at which an attempt with the typical three sandbox calls faults at `rate`."""
    return 1.0 - (1.0 - rate) ** (1.0 / CORRELATED_TYPICAL_CALLS)


def attempt_fault(
    mode: str, rate: float, step: int, steps: int, planned: str | None, uniforms: Sequence[float], calls: int
) -> str | None:
    """The fault of one attempt under `mode` (None: it runs clean). `planned` is the demo plan's
    attempt fault (uniform mode), `uniforms` the attempt's two fault draws, `calls` its sandbox calls.

    uniform (and exploitable, whose infrastructure faults are the uniform ones): the planned fault,
    else an engine 503 on either of the two model calls, each at rate / 4 (the offline A/B's;
    live, the engines decide the 503s themselves, keyed per attempt);
    burst: a sandbox-start fault with probability `BURST_RATE` on `burst_step` only; correlated: a
    lost sandbox with probability 1 - (1 - h)^calls, h = `correlated_hazard(rate)`."""
    if mode in PLANNED_FAULT_MODES:
        if planned is not None:
            return planned
        per_call = rate / len(FAULT_KINDS)  # the engines' 503 rate, on each of the two model calls
        return ENGINE_503 if min(uniforms) < per_call else None
    if mode == BURST:
        return SANDBOX_START if step == burst_step(steps) and uniforms[0] < BURST_RATE else None
    if mode == CORRELATED:
        probability = 1.0 - (1.0 - correlated_hazard(rate)) ** calls
        return SANDBOX_LOST if uniforms[0] < probability else None
    raise ValueError(f"fault mode must be one of {', '.join(FAULT_MODES)}, got {mode!r}")


def answer_written(response: str, reward: float | None) -> bool:
    """Whether the quiz agent wrote an answer file, from a valid merged sample's `response` text
    (Miles' `response`, special tokens kept) and reward: the answer turn (after the last generation
    prompt) holds a letter (`quiz_agent.extract_answer`), or, when the merge kept only the look turn
    (no answer turn in the sample), the verifier's reward is 1 (a reward 0 cannot tell a wrong
    letter from none there and counts as no write)."""
    marker = f"{TURN_START}assistant\n"
    if marker not in response:
        return reward == 1.0
    return extract_answer(response.rsplit(marker, 1)[1]) is not None


def correlated_fault(
    config: DemoConfig, step: int, index: int, response: str, reward: float | None
) -> str | None:
    """The live correlated mode's fault for a valid attempt, decided once it ran (None: none; always
    None outside that mode): `attempt_fault(CORRELATED, ...)` with the attempt's fault draws and its
    sandbox calls (the probe, the verifier's run, and the answer write when `answer_written`)."""
    if config.fault_mode != CORRELATED or config.faults == 0:
        return None
    calls = 2 + answer_written(response, reward)
    uniforms = fault_uniforms(config.seed, CORRELATED, index)
    return attempt_fault(CORRELATED, config.faults, step, config.steps, None, uniforms, calls)


@dataclass(frozen=True)
class AttemptPlan:
    """One attempt: its place in Miles' numbering, the quiz it belongs to, and its fault."""

    step: int
    group_index: int
    index: int
    task: str  # the group's quiz task
    fault: str | None = None

    @property
    def run_task(self) -> str:
        """The Harbor task the attempt runs: the quiz, or the fault task standing in for it."""
        return FAULT_TASKS.get(self.fault or "", self.task)


def plan_step(step: int, config: DemoConfig, task_names: Sequence[str]) -> list[list[AttemptPlan]]:
    """The step's groups: `config.tasks` quiz tasks (distinct while the pool lasts), each with
    `config.attempts` attempts, some with a fault (uniform: drawn at `attempt_fault_rate`; burst:
    `attempt_fault`'s sandbox-start faults on the burst step; correlated: none planned, see
    `correlated_fault`; `--inject burst:STEP`: a sandbox-start fault at `BURST_RATE` on STEP).
    Deterministic in (config.seed, step); the tasks do not depend on the mode."""
    if not task_names:
        raise ValueError("the demo needs at least one quiz task")
    rng = random.Random(f"rl360-demo:{config.seed}:{step}")
    pool = sorted(task_names)
    if config.tasks <= len(pool):
        chosen = rng.sample(pool, config.tasks)
    else:
        chosen = [*rng.sample(pool, len(pool)), *rng.choices(pool, k=config.tasks - len(pool))]
    groups = []
    for position, task in enumerate(chosen):
        group_index = step * config.tasks + position
        group = []
        for attempt in range(config.attempts):
            index = group_index * config.attempts + attempt
            fault = rng.choice(ATTEMPT_FAULT_KINDS) if rng.random() < config.attempt_fault_rate else None
            if config.fault_mode == BURST and config.faults > 0:
                uniforms = fault_uniforms(config.seed, BURST, index)
                fault = attempt_fault(BURST, config.faults, step, config.steps, None, uniforms, 0)
            burst = injected(config.inject, BURST_INJECT, step)  # --inject burst:STEP
            if burst and fault_uniforms(config.seed, BURST_INJECT, index)[0] < BURST_RATE:
                fault = SANDBOX_START
            group.append(AttemptPlan(step, group_index, index, task, fault))
        groups.append(group)
    return groups


TRAIN_GREEDY, TRAIN_SAMPLED = "train_greedy", "train_sampled"


HELD_OUT_GREEDY, HELD_OUT_SAMPLED = "held_out_greedy", "held_out_sampled"


HELD_OUT_NOTE = (
    "quiz tasks never trained on: each quiz's answer is an arbitrary letter, so nothing learned on "
    "the training quizzes can transfer, and the held-out pass rate is expected to stay at chance"
)


@dataclass(frozen=True)
class EvalAttempt:
    """One eval attempt: the dataset, its place in Miles' eval numbering, its task and sampling."""

    dataset: str
    index: int  # Sample.index within the dataset (Miles: sequential over prompts x samples)
    task: str
    temperature: float
    sampling_seed: int | None


def split_eval_tasks(config: DemoConfig, task_names: Sequence[str]) -> tuple[list[str], list[str]]:
    """(training tasks, held-out tasks): without eval every task trains; with it, `eval_held_out`
    tasks drawn by the seed never appear in a training step. Raises ValueError naming the option
    when no training task would be left."""
    pool = sorted(task_names)
    if config.eval_interval is None:
        return pool, []
    if config.eval_held_out >= len(pool):
        raise ValueError(
            f"--eval-held-out {config.eval_held_out} leaves no training task of the {len(pool)} quiz tasks"
        )
    held_out = sorted(random.Random(f"rl360-demo-held-out:{config.seed}").sample(pool, config.eval_held_out))
    return [t for t in pool if t not in held_out], held_out


def should_evaluate(step: int, config: DemoConfig) -> bool:
    """Miles' `should_run_periodic_action(rollout_id, eval_interval, None, num_rollout)`
    (train_async.py:113, miles/utils/misc.py): after every N-th train step and after the last."""
    if config.eval_interval is None:
        return False
    return step == config.steps - 1 or (step + 1) % config.eval_interval == 0


def plan_eval(
    rollout_id: int, config: DemoConfig, train_tasks: Sequence[str], held_out: Sequence[str]
) -> dict[str, list[EvalAttempt]]:
    """The eval datasets of one eval point: the training and the held-out tasks, each greedy (one
    attempt at temperature 0) and sampled (`attempts` attempts at the training temperature), as
    Miles' `eval_rollout_single_dataset` numbers them (prompt-major, `n_samples_per_eval_prompt`
    per prompt). With `seeded_sampling`, each sampled attempt gets a seed from (seed, rollout_id,
    task, sample) so every A/B arm evaluates with the same draws."""
    datasets: dict[str, list[EvalAttempt]] = {}
    for (greedy, sampled), tasks in (
        ((TRAIN_GREEDY, TRAIN_SAMPLED), train_tasks),
        ((HELD_OUT_GREEDY, HELD_OUT_SAMPLED), held_out),
    ):
        if not tasks:
            continue
        for name, temperature, n in ((greedy, 0.0, 1), (sampled, config.temperature, config.attempts)):
            attempts = []
            for task in sorted(tasks):
                for j in range(n):
                    seed = (
                        eval_sampling_seed(config.seed, rollout_id, task, j)
                        if config.seeded_sampling
                        else None
                    )
                    attempts.append(EvalAttempt(name, len(attempts), task, temperature, seed))
            datasets[name] = attempts
    return datasets


def eval_sampling_seed(seed: int, rollout_id: int, task: str, sample: int) -> int:
    """The sampling seed of one sampled eval attempt (the same in every arm of an A/B)."""
    digest = hashlib.sha256(f"rl360-demo-eval:{seed}:{rollout_id}:{task}:{sample}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % SAMPLING_SEED_LIMIT


def eval_notes(train_tasks: Sequence[str], held_out: Sequence[str]) -> dict[str, str]:
    """What each eval dataset holds, for the report's eval chart."""
    trained = f"the {len(train_tasks)} training quiz tasks"
    notes = {
        TRAIN_GREEDY: f"{trained}, one greedy attempt each (temperature 0)",
        TRAIN_SAMPLED: f"{trained}, sampled at the training temperature",
    }
    if held_out:
        names = ", ".join(held_out)
        notes[HELD_OUT_GREEDY] = f"{names}: {HELD_OUT_NOTE}; one greedy attempt each"
        notes[HELD_OUT_SAMPLED] = f"{names}: {HELD_OUT_NOTE}; sampled at the training temperature"
    return notes


def attempt_sampling_seed(seed: int, attempt_index: int) -> int:
    """The sampling seed of every model turn of one attempt, from the run's seed and the attempt's
    Miles index: two runs with the same seed draw the same tokens for the same attempt while their
    weights are the same, whatever order the requests reach the engines in."""
    digest = hashlib.sha256(f"rl360-demo-sampling:{seed}:{attempt_index}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % SAMPLING_SEED_LIMIT
