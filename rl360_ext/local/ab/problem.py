"""The offline A/B's learning problem, in process: the demo's quizzes and first policy
(`Problem`), the arms' rules (`OFFLINE_ARMS`), and the sampler that stands in for the engines,
SMG, the session server and Harbor: one attempt's two turns sampled from the tiny model
(`run_attempt`) and merged into a Miles sample (`make_sample`). What it models and why:
`rl360_ext.local.ab.offline`'s docstring and docs/demo.md.
"""

from __future__ import annotations

import copy
import dataclasses
import tempfile
from argparse import Namespace
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rl360_ext.local.ab.config import OfflineConfig
from rl360_ext.local.demo.arms import (
    RL360_REWARD_POST_PROCESS,
    UPSTREAM_REWARD_POST_PROCESS,
    UPSTREAM_TRAINER,
)
from rl360_ext.local.demo.modes import (
    ARM_NAMES,
    CLEAN,
    CRASH_MODES,
    DENOMINATOR,
    ONE_STEP_OFF,
    RL360,
    RL360_LIST,
    UPSTREAM,
    VANILLA_TIS,
    ZERO_SCORED,
)
from rl360_ext.local.demo.plan import (
    CLIENT_DEADLINE,
    ENGINE_503,
    SANDBOX_LOST,
    SANDBOX_START,
    VERIFIER_CRASH,
    DemoConfig,
    attempt_sampling_seed,
    keyed_uniforms,
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
from rl360_ext.outcomes.provenance import ATTEMPT_CLASS, REWARD_SOURCE, VALID, VERIFIER
from rl360_ext.reference.engine.model import KVState, ModelConfig, TinyMoEModel
from rl360_ext.reference.trainer.trainer import TrainerConfig
from rl360_ext.rollout.sample import Sample
from rl360_ext.templates.markup import TURN_END
from rl360_ext.templates.render import ChatRenderer

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
    raise RuntimeError(f"demo.modes.ARM_NAMES {ARM_NAMES} and OFFLINE_ARMS {tuple(OFFLINE_ARMS)} disagree")


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
