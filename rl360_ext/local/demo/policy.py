"""The demo's first policy: the tiny model after its two warm starts (`demo_policy`), with the
crash tool's action head for the exploitable fault mode.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rl360_ext.local.demo.arms import arm_rules
from rl360_ext.local.demo.miles_args import RECIPE_LOSS
from rl360_ext.local.demo.plan import DemoConfig
from rl360_ext.local.demo.trainer import DemoTrainer
from rl360_ext.local.demo.versions import max_token_age
from rl360_ext.local.fixtures import quiz_task_names
from rl360_ext.local.fixtures import tasks_root as demo_tasks_root
from rl360_ext.local.fixtures.quiz_agent import CRASH_LETTER, LETTERS, QUIZ_OPTIONS
from rl360_ext.reference.trainer.trainer import TrainerConfig
from rl360_ext.templates.tokenizer import load_hf_tokenizer


def demo_policy(config: DemoConfig) -> DemoTrainer:
    """The trainer side, warm-started on the quiz questions. It runs in the main thread after the
    stack is up: run in a thread beside the stack's start-up, the process hung (every thread
    waiting on a lock) before Ray started."""
    from rl360_ext.reference.engine.tokenizer import default_tokenizer_dir
    from rl360_ext.util.cache import cache_root

    root = demo_tasks_root()
    questions = [
        ((root / name / "instruction.md").read_text(), (root / name / QUIZ_OPTIONS).read_text())
        for name in quiz_task_names(root)
    ]
    policy = DemoTrainer(
        config.out / "weights",
        default_tokenizer_dir(),
        questions,
        config.seed,
        TrainerConfig(
            lr=config.lr,
            decoupled_lr=config.head_lr,
            lr_warmup_steps=config.lr_warmup_steps,
            steps_per_rollout=config.steps_per_rollout,
            use_dynamic_global_batch_size=config.steps_per_rollout == 1,
            **RECIPE_LOSS,
            keep_old_actor=config.keep_old_actor,
            max_token_age=max_token_age(config.schedule, config.steps),
            **arm_rules(config.rules).trainer,
        ),
        cache_dir=cache_root(),
    )
    if config.crash_tool:
        tokenizer = load_hf_tokenizer(str(default_tokenizer_dir()))
        letters = [tokenizer.convert_tokens_to_ids(letter) for letter in LETTERS]
        crash_action_head(policy.trainer.weights, letters, tokenizer.convert_tokens_to_ids(CRASH_LETTER))
    return policy


def crash_action_head(weights: dict[str, np.ndarray], letters: Sequence[int], crash: int) -> None:
    """Give the first policy the crash action as one more answer (the exploitable fault mode): the
    crash token's LM-head column becomes the mean of the letters' columns, as the format warm start
    (`warm_start.fit_head`) starts each letter's, so after any prompt its logit is the letters' mean
    logit (at most their mean probability: about a fifth of the answer mass on the warm start) and
    RL moves it like any letter's. In place."""
    head = weights["lm_head"]
    head[:, crash] = head[:, list(letters)].mean(axis=1)
