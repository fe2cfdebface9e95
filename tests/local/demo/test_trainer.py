"""The demo's trainer side without the stack: the warm start, one train step, the train record."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from rl360_ext.diagnostics.report_data import TRAIN_KIND
from rl360_ext.local.demo.console import learning_line, train_line
from rl360_ext.local.demo.summary import StepSummary
from rl360_ext.local.demo.trainer import (
    CHANCE_LEVEL,
    WARM_START_CACHE,
    DemoTrainer,
    WarmStartInputs,
    answer_prompts,
    question_labels,
    read_warm_start,
)
from rl360_ext.local.fixtures import quiz_task_names, tasks_root
from rl360_ext.local.fixtures.quiz_agent import LETTERS, extract_answer, probe_output
from rl360_ext.reference.engine.model import KVState, ModelConfig, TinyMoEModel, log_softmax
from rl360_ext.reference.engine.tokenizer import default_tokenizer_dir
from rl360_ext.reference.trainer.trainer import TrainerConfig
from rl360_ext.rollout.metrics import read_records
from rl360_ext.rollout.sample import Sample
from rl360_ext.templates.render import ChatRenderer
from rl360_ext.templates.tokenizer import load_hf_tokenizer


def _questions(count: int = 3) -> list[tuple[str, str]]:
    root = tasks_root()
    names = quiz_task_names(root)[:count]
    return [
        ((root / n / "instruction.md").read_text(), (root / n / "environment/app/options.txt").read_text())
        for n in names
    ]


@pytest.fixture(scope="module")
def warm_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory, warm_cache: Path) -> DemoTrainer:
    return DemoTrainer(
        tmp_path_factory.mktemp("weights"), default_tokenizer_dir(), _questions(), 0, TrainerConfig(lr=1e-3),
        cache_dir=warm_cache,
    )  # fmt: skip


def test_a_second_warm_start_is_read_from_the_cache_and_equal(
    policy: DemoTrainer, warm_cache: Path, tmp_path: Path
) -> None:
    (entry,) = (warm_cache / WARM_START_CACHE).iterdir()
    assert not policy.warm_start.cached
    again = DemoTrainer(
        tmp_path, default_tokenizer_dir(), _questions(), 0, TrainerConfig(), cache_dir=warm_cache
    )
    assert again.warm_start == dataclasses.replace(policy.warm_start, cached=True)
    cached = read_warm_start(entry)
    assert cached is not None
    weights = cached[0]
    assert weights.keys() == again.trainer.weights.keys()
    for name, value in weights.items():
        np.testing.assert_array_equal(value, again.trainer.weights[name])
    assert read_warm_start(tmp_path / "missing.npz") is None
    (tmp_path / "bad.npz").write_bytes(b"not an npz")  # an unreadable entry is computed again
    assert read_warm_start(tmp_path / "bad.npz") is None


def test_the_warm_start_key_changes_with_every_input() -> None:
    config = ModelConfig(vocab_size=580)
    base = WarmStartInputs([[1, 2]], [[3]], [4], [[5]], [6, 7], 8, 1, 0)
    keys = {
        base.key(config),
        dataclasses.replace(base, seed=1).key(config),
        dataclasses.replace(base, prompts=[[1, 3]]).key(config),
        dataclasses.replace(base, labels=[5]).key(config),
        dataclasses.replace(base, letters=[7, 6]).key(config),
        base.key(ModelConfig(vocab_size=581)),
    }
    assert len(keys) == 6 and base.key(config) == base.key(ModelConfig(vocab_size=580))


def test_every_quiz_ships_its_options_for_the_probe_alone() -> None:
    root = tasks_root()
    answers = []
    for name in quiz_task_names(root):
        options = (root / name / "environment/app/options.txt").read_text().splitlines()
        instruction = (root / name / "instruction.md").read_text()
        assert [line[:2] for line in options] == ["A)", "B)", "C)", "D)"]
        assert "/app/options.txt" in instruction and not any(line in instruction for line in options)
        answers.append((root / name / "tests/expected.txt").read_text().strip())
    assert sorted(set(answers)) == list(LETTERS) and max(map(answers.count, LETTERS)) <= 3


def test_question_labels_are_distinct_and_never_an_answer_letter() -> None:
    tokenizer = load_hf_tokenizer(str(default_tokenizer_dir()))
    questions = _questions(12)
    labels = question_labels(tokenizer, questions)
    assert len(set(labels)) == len(questions) == 12
    forbidden = {tokenizer.convert_tokens_to_ids(c) for letter in LETTERS for c in (letter, letter.lower())}
    assert not forbidden & set(labels) and not set(tokenizer.all_special_ids) & set(labels)
    assert all(extract_answer(tokenizer.decode([label])) is None for label in labels)
    assert question_labels(tokenizer, questions) == labels  # a function of the question texts


def test_answer_prompts_end_where_the_agent_reads_its_answer() -> None:
    renderer = ChatRenderer(load_hf_tokenizer(str(default_tokenizer_dir())))
    prompts = answer_prompts(renderer, _questions(2), 580, seed=1)
    assert len(prompts) == 4
    text = renderer.tokenizer.decode(prompts[0])
    assert text.endswith("<|im_start|>assistant\n")
    assert probe_output(0, _questions(1)[0][1], "") in text
    assert "<|im_start|>assistant\n<|im_end|><|im_start|>tool" in text  # a look turn that ended at once
    assert "<|im_start|>assistant\n<|im_end|>" not in renderer.tokenizer.decode(prompts[1])  # a random look


def test_warm_start_separates_the_questions_and_gives_the_letters_equal_probability(
    policy: DemoTrainer,
) -> None:
    warm = policy.warm_start
    assert warm.letter_mass >= 0.9 and warm.label_prob >= 0.9 and warm.label_steps == 30
    assert warm.cosine_before > 0.9 and warm.cosine_after < 0.5
    assert warm.look_end_prob >= 0.9  # the look turn ends by itself, so the merge keeps the answer turn
    tokenizer = load_hf_tokenizer(str(default_tokenizer_dir()))
    renderer = ChatRenderer(tokenizer)
    prompt = answer_prompts(renderer, _questions(1), policy.model_config.vocab_size, seed=9)[0]
    model = TinyMoEModel(policy.model_config, policy.trainer.weights)
    probs = np.exp(log_softmax(_last_logits(model, prompt)))
    letters = probs[[tokenizer.convert_tokens_to_ids(letter) for letter in LETTERS]]
    np.testing.assert_allclose(letters, letters[0], rtol=1e-9)
    assert CHANCE_LEVEL == 0.25


def _last_logits(model: TinyMoEModel, prompt: list[int]) -> np.ndarray:
    kv = KVState.empty(model.config, len(prompt) + 1)
    return model.forward(np.asarray(prompt), kv).logits[-1]


def test_update_trains_saves_and_appends_a_train_record(policy: DemoTrainer, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    samples = []
    for index in range(4):
        tokens = rng.integers(0, policy.model_config.vocab_size, 30).tolist()
        samples.append(
            Sample(group_index=0, index=index, tokens=tokens, response_length=6, loss_mask=[1, 1, 0, 0, 1, 1],
                   rollout_log_probs=[-3.0, -3.0, 0.0, 0.0, -3.0, -3.0], reward=float(index % 2))
        )  # fmt: skip
    before = policy.trainer.weights["lm_head"].copy()
    metrics_path = tmp_path / "metrics.jsonl"
    path, metrics = policy.update(3, "4", samples, [1.0, -1.0, 1.0, -1.0], [1.0, 0.0, 1.0, 0.0], metrics_path)
    assert path.name == "v4.npz" and path.is_file()
    assert metrics["train/valid_samples"] == 4 and not np.array_equal(
        before, policy.trainer.weights["lm_head"]
    )
    (record,) = read_records(metrics_path, TRAIN_KIND)
    assert record["rollout_id"] == 3 and record["chance_level"] == CHANCE_LEVEL
    assert record["metrics"]["train/loss_scale"] == pytest.approx(1.0)
    assert "valid + 0 masked" in train_line(3, metrics, "4")
    _, empty = policy.update(4, "5", [], [], [], metrics_path)
    assert empty["train/valid_samples"] == 0 and "unchanged" in train_line(4, empty, "5")


def _summary(step: int, mean: float | None, rollout: float, train: float) -> StepSummary:
    return StepSummary(
        step=step, attempts=8, valid=8, infra_by_cause={}, groups=2, kept_groups=1, unfiltered_mean=mean,
        kept_mean=mean, expected_version="0", versions_seen=["0"], rollout_time_s=rollout, train_time_s=train,
    )  # fmt: skip


def test_learning_line_reports_the_goal_and_the_time_split() -> None:
    line = learning_line([_summary(0, 0.25, 5.0, 2.0), _summary(1, 0.85, 4.0, 3.0)], wall_s=30.0)
    assert "0.250 (step 0) -> 0.850 (step 1)" in line and "first at >= 0.8 in step 1" in line
    assert "rollouts 9 s, training 5 s" in line
    assert "never >= 0.8" in learning_line([_summary(0, 0.3, 1.0, 1.0)], wall_s=5.0)
    assert "no step had a valid attempt" in learning_line([_summary(0, None, 1.0, 1.0)], wall_s=5.0)


def test_demo_config_checks_the_trainer_settings() -> None:
    from rl360_ext.local.demo.plan import DemoConfig

    assert DemoConfig().steps == 20 and DemoConfig().lr == 1e-3 and DemoConfig().head_lr == 2e-2
    with pytest.raises(ValueError, match="--dtype"):
        DemoConfig(engine_dtype="float16")
    with pytest.raises(ValueError, match="lr"):
        DemoConfig(lr=0.0)
    with pytest.raises(ValueError, match="head_lr"):
        DemoConfig(head_lr=0.0)
    with pytest.raises(ValueError, match="--lr-warmup-steps"):
        DemoConfig(lr_warmup_steps=-1)


def test_demo_cli_refuses_a_bad_dtype_before_starting_anything() -> None:
    from typer.testing import CliRunner

    from rl360_ext.cli import app

    result = CliRunner().invoke(app, ["demo", "--dtype", "bfloat16"])
    assert result.exit_code != 0 and "float64 or float32" in result.output
