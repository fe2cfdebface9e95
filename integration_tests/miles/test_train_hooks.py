"""The train-side hooks inside Miles' real loss: `miles.backends.training_utils.loss.loss_function`.

Miles' own dispatcher computes log-probs from logits, the PPO loss, calls the custom TIS function
and the custom pg-loss reducer with torch tensors exactly as in training, then divides by the
step's sample count (masked samples included). Runs on the CPU with random logits in Miles'
single-process ParallelState. The property under test: infra samples (all-zero loss mask) do not
change the loss or the TIS metrics; the same batch with Miles' defaults shows the scale they do.
"""

from __future__ import annotations

from argparse import Namespace
from typing import Any

import pytest

REDUCER = "rl360_ext.train.reducers.valid_sample_mean"
TIS = "rl360_ext.train.tis.valid_token_tis"
VOCAB = 32


def _args(**overrides: Any) -> Namespace:
    fields: dict[str, Any] = {
        "qkv_format": "thd",
        "rollout_temperature": 1.0,
        "allgather_cp": False,
        "log_probs_chunk_size": -1,
        "true_on_policy_mode": True,  # plain log_softmax; the fused CE needs Megatron (as in Miles CPU tests)
        "advantage_estimator": "grpo",
        "use_rollout_logprobs": False,
        "skip_actor_forward_only": False,
        "loss_type": "policy_loss",
        "eps_clip": 0.2,
        "eps_clip_high": 0.28,
        "eps_clip_c": None,
        "entropy_coef": 0.0,
        "observe_training_entropy": False,
        "use_kl_loss": False,
        "kl_loss_coef": 0.0,
        "use_unbiased_kl": False,
        "use_tis": False,
        "get_mismatch_metrics": False,
        "tis_clip": 2.0,
        "tis_clip_low": 0.0,
        "custom_tis_function_path": None,
        "custom_pg_loss_reducer_function_path": None,
        "use_opsm": False,
        "calculate_per_token_loss": False,
        "global_batch_size": 1,
        "use_dynamic_global_batch_size": False,
        "recompute_loss_function": False,
        "custom_loss_function_path": None,
        "multi_lora": False,
    }
    fields.update(overrides)
    return Namespace(**fields)


def _batch(seed: int, response_lengths: list[int], masked: list[bool]) -> dict[str, Any]:
    """A micro-batch as Miles' data iterator yields it, plus the packed logits for it."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    prompt_lengths = [3] * len(response_lengths)
    total_lengths = [p + r for p, r in zip(prompt_lengths, response_lengths, strict=True)]

    def randn(n: int) -> torch.Tensor:
        return torch.randn(n, generator=generator)

    return {
        "unconcat_tokens": [torch.randint(0, VOCAB, (t,), generator=generator) for t in total_lengths],
        "response_lengths": response_lengths,
        "total_lengths": total_lengths,
        "loss_masks": [
            torch.zeros(r) if m else torch.ones(r) for r, m in zip(response_lengths, masked, strict=True)
        ],
        "log_probs": [randn(r) * 0.3 - 2 for r in response_lengths],
        "rollout_log_probs": [randn(r) * 0.3 - 2 for r in response_lengths],
        "advantages": [torch.full((r,), float(randn(1))) for r in response_lengths],
        "logits": torch.randn(1, sum(total_lengths), VOCAB, generator=generator),
    }


def _select(batch: dict[str, Any], keep: list[int]) -> dict[str, Any]:
    import torch

    picked = {key: [value[i] for i in keep] for key, value in batch.items() if key != "logits"}
    starts = [0]
    for length in batch["total_lengths"]:
        starts.append(starts[-1] + length)
    picked["logits"] = torch.cat([batch["logits"][:, starts[i] : starts[i + 1]] for i in keep], dim=1)
    return picked


def _loss(args: Namespace, batch: dict[str, Any]) -> tuple[float, dict[str, float]]:
    """Miles' loss for one micro-batch = the whole step, divided by Miles' normalizer as Megatron
    does (1 per sample; the clamped token count in per-token mode); metrics per Miles' count."""
    from miles.backends.training_utils.loss import loss_function

    args.global_batch_size = len(batch["response_lengths"])
    inputs = {key: value for key, value in batch.items() if key != "logits"}
    loss, normalizer, log = loss_function(args, inputs, 1, batch["logits"], apply_megatron_loss_scaling=False)
    count, *values = log["values"].tolist()
    return float(loss / normalizer), {
        key: value / count for key, value in zip(log["keys"], values, strict=True)
    }


LENGTHS = [5, 7, 4, 6, 3, 8]
MASKED = [False, True, False, False, True, True]
VALID = [i for i, m in enumerate(MASKED) if not m]


def test_reducer_loss_ignores_infra_samples(parallel_state: Any) -> None:
    batch = _batch(0, LENGTHS, MASKED)
    loss_all, _ = _loss(_args(custom_pg_loss_reducer_function_path=REDUCER), batch)
    loss_valid, _ = _loss(_args(custom_pg_loss_reducer_function_path=REDUCER), _select(batch, VALID))
    assert loss_all == pytest.approx(loss_valid, rel=1e-5)

    upstream_all, _ = _loss(_args(), batch)
    upstream_valid, _ = _loss(_args(), _select(batch, VALID))
    assert upstream_valid == pytest.approx(loss_valid, rel=1e-5)  # same loss when nothing is masked
    assert upstream_all == pytest.approx(
        upstream_valid * len(VALID) / len(LENGTHS), rel=1e-5
    )  # x0.5 upstream


def test_reducer_in_per_token_mode_ignores_infra_samples(parallel_state: Any) -> None:
    batch = _batch(1, LENGTHS, MASKED)
    args = {"custom_pg_loss_reducer_function_path": REDUCER, "calculate_per_token_loss": True}
    loss_all, _ = _loss(_args(**args), batch)
    loss_valid, _ = _loss(_args(**args), _select(batch, VALID))
    assert loss_all == pytest.approx(loss_valid, rel=1e-5)


def test_tis_keeps_miles_vanilla_tis_and_reports_valid_token_means(parallel_state: Any) -> None:
    batch = _batch(2, LENGTHS, MASKED)
    ours = {"use_tis": True, "custom_tis_function_path": TIS, "custom_pg_loss_reducer_function_path": REDUCER}
    vanilla = {"use_tis": True, "custom_pg_loss_reducer_function_path": REDUCER}

    loss_ours, metrics_ours = _loss(_args(**ours), batch)
    loss_vanilla, metrics_vanilla = _loss(_args(**vanilla), batch)
    assert loss_ours == pytest.approx(loss_vanilla, rel=1e-5)  # the same TIS weights in the loss

    _, metrics_valid_only = _loss(_args(**vanilla), _select(batch, VALID))
    for key in ("tis", "tis_abs", "tis_clipfrac"):
        assert metrics_ours[key] == pytest.approx(metrics_valid_only[key], rel=1e-5, abs=1e-7), key
    assert metrics_vanilla["tis"] == pytest.approx(
        metrics_valid_only["tis"] * len(VALID) / len(LENGTHS), rel=1e-5
    )
    assert metrics_ours["logprob_abs_diff"] == pytest.approx(
        metrics_valid_only["train_rollout_logprob_abs_diff"], rel=1e-5
    )
