"""The trainer side of `rl360 demo`: the reference trainer on the engines' own model, one file per push.

Owns the demo's policy: its initial weights (the engines' seed weights after two supervised warm
starts that never see a correct letter or a reward, `rl360_ext.reference.trainer.warm_start`: first a
base-model stage, `fit_labels`, that trains the whole network to name, at the quiz agent's
answer position, which question it read, as one arbitrary label token per question
(`question_labels`: from a hash of the question's text, never a letter or a special token), so the
answer position's features tell the questions apart as a pretrained model's would; then the
answer-format stage, `fit_head`: only the LM head is fitted, on the frozen model's states at
that position, toward the four letters A-D with equal weight, so the first policy answers with a
letter at chance instead of writing byte-level text), one
`Trainer.train_step` per rollout step on the kept samples and the reward post-process hook's
advantages, the `.npz` written for every push (`weights/v<version>.npz`, what the engines'
`update_weights_from_disk` loads) and the `train` record appended to `metrics.jsonl` after each
step. It does not push weights or drive rollouts (`rl360_ext.local.demo.driver`).

The warm start's prompts are the quiz agent's own conversation up to its answer turn
(`rl360_ext.local.fixtures.quiz_agent.look_messages`, a look turn of random tokens, the probe's tool
message with the task's options), rendered with the session's chat template, so the head is
fitted where the agent reads its answer.

The warm start is deterministic, so its result is cached (`cache_dir`, the demo passes
`rl360_ext.util.cache.cache_root()`): the key is a digest of everything it reads (the prompts and
labels as token ids, the model config, the seed, the step count, numpy's version and the source of
every module that computes it), so an entry is only hit by a run with the same inputs and code.
A cached start says so (`WarmStart.cached`) and keeps the seconds it took to compute.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from rl360_ext.diagnostics.report_data import TRAIN_KIND
from rl360_ext.local.fixtures.quiz_agent import (
    LETTERS,
    LOOK_TURN_TOKENS,
    PROBE_CALL_ID,
    extract_answer,
    look_messages,
    probe_message,
    probe_output,
)
from rl360_ext.reference.engine.model import ModelConfig, init_weights
from rl360_ext.reference.trainer.backward import TrainModel
from rl360_ext.reference.trainer.trainer import Trainer, TrainerConfig
from rl360_ext.reference.trainer.warm_start import fit_head, fit_labels, head_features, separation
from rl360_ext.rollout.metrics import append_records
from rl360_ext.templates.markup import TURN_END
from rl360_ext.templates.render import ChatRenderer
from rl360_ext.templates.tokenizer import load_hf_tokenizer
from rl360_ext.util.cache import write_atomically

CHANCE_LEVEL = 1.0 / len(LETTERS)  # a uniform guess among A-D
WARM_START_LOOKS = 2  # random look turns per question in the warm start's prompts


WARM_START_LABEL_LOOKS = 4  # random look turns per question in the base-model stage's prompts
WARM_START_LABEL_STEPS = 30  # AdamW steps of the base stage (12 prompts each)
WARM_START_CACHE = "warm-start"  # the cache folder's name under the cache root
# The modules whose code computes the warm start: their source is part of the cache key.
WARM_START_MODULES = (
    "rl360_ext.local.demo.trainer",
    "rl360_ext.reference.trainer.warm_start",
    "rl360_ext.reference.trainer.backward",
    "rl360_ext.reference.engine.model",
)
_META = "__warm_start__"  # the cache entry's key holding the WarmStart fields (JSON)


@dataclass(frozen=True)
class WarmStart:
    """What the warm starts did: prompts fitted, the base stage's steps and label probability, the
    mean cosine between the answer-position states of different questions before and after it, the
    letters' mean probability after the format stage, time."""

    prompts: int
    letter_mass: float
    seconds: float
    label_steps: int = 0
    label_prob: float = 0.0
    cosine_before: float = 1.0
    cosine_after: float = 1.0
    look_end_prob: float = 0.0  # the probability that the look turn ends at once (end-of-turn token)
    cached: bool = False  # read from the cache (`seconds` is what computing it took)


def question_labels(tokenizer: Any, questions: Sequence[tuple[str, str]]) -> list[int]:
    """One distinct label token per question for the base-model stage: chosen by a hash of the
    question's text among the tokens that are not special and whose text holds no answer letter
    (`extract_answer` finds none: a label written in the answer turn is never read as an answer),
    so a label says which question it is and nothing about its answer."""
    special = set(tokenizer.all_special_ids)
    allowed = [
        token
        for token in range(len(tokenizer))
        if token not in special and extract_answer(tokenizer.decode([token])) is None
    ]
    if len(allowed) < len(questions):
        raise ValueError(f"{len(questions)} questions but only {len(allowed)} label tokens")
    labels: list[int] = []
    for instruction, _ in questions:
        position = int.from_bytes(hashlib.sha256(instruction.encode()).digest()[:8], "big") % len(allowed)
        while allowed[position] in labels:
            position = (position + 1) % len(allowed)
        labels.append(allowed[position])
    return labels


def answer_prompts(
    renderer: ChatRenderer,
    questions: Sequence[tuple[str, str]],
    vocab_size: int,
    seed: int,
    looks: int = WARM_START_LOOKS,
) -> list[list[int]]:
    """Token ids of the quiz agent's conversation up to its answer turn, `looks` per question,
    question by question: the first with the look turn the warm-started policy takes (it ends the
    turn at once), the others with a random look turn.

    `questions` are (instruction, what the probe prints) pairs."""
    rng = np.random.default_rng(seed)
    end = renderer.tokenizer.convert_tokens_to_ids(TURN_END)
    prompts = []
    for instruction, printed in questions:
        probe = probe_message(PROBE_CALL_ID, probe_output(0, printed, ""))
        messages = look_messages(instruction)
        first = renderer.prompt_ids(messages)
        for index in range(looks):
            look = [] if index == 0 else rng.integers(0, vocab_size, LOOK_TURN_TOKENS).tolist()
            reply = {
                "role": "assistant",
                "content": renderer.tokenizer.decode(look, skip_special_tokens=True),
            }
            prompts.append([*first, *look, end, *renderer.suffix_ids([*messages, reply], [probe])])
    return prompts


@dataclass(frozen=True)
class WarmStartInputs:
    """Everything the warm starts read besides the model config, as token ids."""

    prompts: list[list[int]]  # the format stage's prompts (the agent's answer position)
    label_prompts: list[list[int]]  # the base stage's prompts, the look-turn prompts last
    labels: list[int]  # the base stage's target per label prompt (the end token for look prompts)
    look_prompts: list[list[int]]  # the look turn's prompts (its end-of-turn probability is reported)
    letters: list[int]  # the answer letters' token ids
    end: int  # the end-of-turn token id
    questions: int
    seed: int

    def key(self, model_config: ModelConfig) -> str:
        """A digest of these inputs, the model config, the constants, numpy's version and the source
        of every module that computes the warm start."""
        digest = hashlib.sha256()
        fields = {**dataclasses.asdict(self), "model": repr(model_config), "numpy": np.__version__}
        fields["constants"] = [WARM_START_LOOKS, WARM_START_LABEL_LOOKS, WARM_START_LABEL_STEPS]
        digest.update(json.dumps(fields, sort_keys=True).encode())
        for name in WARM_START_MODULES:
            digest.update(Path(str(sys.modules[name].__file__)).read_bytes())
        return digest.hexdigest()[:32]


def read_warm_start(path: Path) -> tuple[dict[str, np.ndarray], WarmStart] | None:
    """A cached warm start, or None when there is none (or it cannot be read: it is computed again)."""
    try:
        with np.load(path) as data:
            arrays = {name: data[name] for name in data.files}
        meta = json.loads(str(arrays.pop(_META)))
        return arrays, dataclasses.replace(WarmStart(**meta), cached=True)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_warm_start(path: Path, weights: dict[str, np.ndarray], warm: WarmStart) -> None:
    meta = np.array(json.dumps(dataclasses.asdict(warm)))

    def write(handle: IO[bytes]) -> None:
        np.savez(handle, **weights, **{_META: meta})

    write_atomically(path, write)


class DemoTrainer:
    """The demo's policy weights, trained by the reference trainer once per rollout step."""

    def __init__(
        self,
        directory: Path,
        tokenizer_dir: Path,
        questions: Sequence[tuple[str, str]],
        seed: int,
        config: TrainerConfig,
        cache_dir: Path | None = None,
    ) -> None:
        tokenizer = load_hf_tokenizer(str(tokenizer_dir))
        self.directory = directory
        self.model_config = ModelConfig(vocab_size=len(tokenizer))
        renderer = ChatRenderer(tokenizer)
        vocab = self.model_config.vocab_size
        prompts = answer_prompts(renderer, questions, vocab, seed)
        label_prompts = answer_prompts(renderer, questions, vocab, seed + 1, WARM_START_LABEL_LOOKS)
        labels = [
            label for label in question_labels(tokenizer, questions) for _ in range(WARM_START_LABEL_LOOKS)
        ]
        # The look turn must end by itself (an end-of-turn token): a turn cut by max_tokens is the
        # last one Miles' merge keeps, so the answer turn would never reach the trainer.
        end = tokenizer.convert_tokens_to_ids(TURN_END)
        look_prompts = [renderer.prompt_ids(look_messages(instruction)) for instruction, _ in questions]
        letters = [tokenizer.convert_tokens_to_ids(letter) for letter in LETTERS]
        inputs = WarmStartInputs(
            prompts, label_prompts + look_prompts, labels + [end] * len(look_prompts), look_prompts,
            letters, end, len(questions), seed,
        )  # fmt: skip
        entry = (
            None
            if cache_dir is None
            else cache_dir / WARM_START_CACHE / f"{inputs.key(self.model_config)}.npz"
        )
        cached = read_warm_start(entry) if entry is not None else None
        if cached is not None:
            weights, self.warm_start = cached
        else:
            weights, self.warm_start = self._warm_start(inputs)
            if entry is not None:
                write_warm_start(entry, weights, self.warm_start)
        self.trainer = Trainer(self.model_config, weights, config)

    def _warm_start(self, inputs: WarmStartInputs) -> tuple[dict[str, np.ndarray], WarmStart]:
        """Both warm starts from the seed weights: the base-model stage, then the format head."""
        started = time.perf_counter()
        groups = [q for q in range(inputs.questions) for _ in range(WARM_START_LOOKS)]
        weights = init_weights(self.model_config, inputs.seed)
        before = separation(head_features(self.model_config, weights, inputs.prompts), groups)
        weights, label_prob, label_steps = fit_labels(
            self.model_config, weights, inputs.label_prompts, inputs.labels,
            steps=WARM_START_LABEL_STEPS, seed=inputs.seed,
        )  # fmt: skip
        after = separation(head_features(self.model_config, weights, inputs.prompts), groups)
        weights, mass = fit_head(self.model_config, weights, inputs.prompts, inputs.letters)
        look_end = float(
            np.mean([np.exp(self._log_prob(weights, p, inputs.end)) for p in inputs.look_prompts])
        )
        warm = WarmStart(
            len(inputs.prompts) + len(inputs.label_prompts),
            mass,
            time.perf_counter() - started,
            label_steps,
            label_prob,
            before,
            after,
            look_end,
        )
        return weights, warm

    def _log_prob(self, weights: dict[str, np.ndarray], prompt: Sequence[int], token: int) -> float:
        log_prob, _ = TrainModel(self.model_config, weights).forward(
            np.asarray([*prompt, token]), len(prompt)
        )
        return float(log_prob[0])

    def save(self, version: str) -> Path:
        return self.trainer.save(self.directory / f"v{version}.npz")

    def update(
        self,
        step: int,
        version: str,
        samples: Sequence[Any],
        advantages: Sequence[float],
        raw_rewards: Sequence[float],
        metrics_path: Path,
        before_update: Callable[[Mapping[str, float]], bool] | None = None,
    ) -> tuple[Path, dict[str, float]]:
        """Train on one step's kept samples, save the weights as `version`, append the train record.
        `before_update`: the step gate (`Trainer.train_step`); a dropped update saves them unchanged."""
        # the weights this step starts from were pushed as pushed_version(step - 1) == str(step)
        # called with no samples too: the trainer holds every version it starts a step from
        metrics = self.trainer.train_step(
            samples, advantages, raw_rewards, policy_version=step, before_update=before_update
        )
        path = self.save(version)
        record = {"kind": TRAIN_KIND, "rollout_id": step, "metrics": metrics, "chance_level": CHANCE_LEVEL}
        append_records(metrics_path, [record])
        return path, metrics
