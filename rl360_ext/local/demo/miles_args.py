"""The Miles args the demo passes its hooks: the generate hook's own flags parsed by its
`add_arguments`, the hook paths a Miles launch would pass, and the recipe's loss flags.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from rl360_ext.local.demo.arms import RL360_REWARD_POST_PROCESS, arm_rules
from rl360_ext.local.demo.plan import DemoConfig
from rl360_ext.local.stack import LocalStack
from rl360_ext.util.procs import LOOPBACK

METRICS_FILE = "metrics.jsonl"
GENERATE_PATH = "rl360_ext.rollout.generate.generate"


FILTER_PATH = "rl360_ext.rollout.filters.check_valid_reward_nonzero_std"


REWARD_POST_PROCESS_PATH = RL360_REWARD_POST_PROCESS


ROLLOUT_LOG_PATH = "rl360_ext.rollout.metrics.log_rollout_metrics"


EVAL_LOG_PATH = "rl360_ext.rollout.eval_metrics.log_eval_metrics"


# The recipe's loss flags (recipes/lib/rl360-common.sh: --eps-clip 0.2 --eps-clip-high 0.28, no
# --eps-clip-c; --use-dynamic-global-batch-size, which the demo uses when it takes one step a rollout).
RECIPE_LOSS = {"eps_clip": 0.2, "eps_clip_high": 0.28}


def build_args(
    config: DemoConfig,
    stack: LocalStack,
    *,
    deadline_s: float | None = None,
    client_margin_s: float | None = None,
) -> argparse.Namespace:
    """Miles-style args: the generate hook's own flags parsed by its `add_arguments`, plus the Miles
    settings the hooks read (hook paths, group size, advantage estimator)."""
    from rl360_ext.rollout import generate

    parser = argparse.ArgumentParser(prog="rl360-demo", add_help=False)
    generate.add_arguments(parser)
    flags = [
        "--rl360-harbor-url", stack.harbor_urls,
        "--rl360-session-backend", stack.gateway_url,
        "--rl360-session-host", LOOPBACK,
        "--rl360-session-servers", str(config.session_servers),
        "--rl360-tokenizer", str(stack.tokenizer_dir),
        "--rl360-r3",
        "--rl360-deadline-s", str(config.deadline_s if deadline_s is None else deadline_s),
        "--rl360-task-key", "task",
        "--rl360-metrics-path", str(config.out / METRICS_FILE),
        "--rl360-top-logprobs-num", str(config.top_logprobs_num),
    ]  # fmt: skip
    if client_margin_s is not None:
        flags += ["--rl360-client-margin-s", str(client_margin_s)]
    if config.quarantine_file is not None:  # the agent masks its tasks; the log hook tracks task health
        flags += ["--rl360-quarantine-file", str(config.quarantine_file)]
    args = parser.parse_args(flags)
    args.custom_generate_function_path = GENERATE_PATH
    args.dynamic_sampling_filter_path = FILTER_PATH
    args.custom_reward_post_process_path = arm_rules(config.rules).reward_post_process_path
    args.custom_rollout_log_function_path = ROLLOUT_LOG_PATH
    args.custom_eval_rollout_log_function_path = EVAL_LOG_PATH
    args.eval_reward_key = None
    args.n_samples_per_prompt = config.attempts
    args.rollout_batch_size = config.tasks
    args.sglang_router_policy = "manual"
    args.advantage_estimator = "grpo"
    args.rewards_normalization = True
    args.grpo_std_normalization = True
    args.reward_key = None
    return args


@dataclass(frozen=True)
class DemoState:
    """Stands in for Miles' GenerateState: the generate hook reads only `state.args`."""

    args: argparse.Namespace
