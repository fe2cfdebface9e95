"""The measurements shared by the parity tests (test_megatron_parity.py) and the bench entry point
(bench.py): Megatron's log-probs and routing of a merged sample, Miles' replay fill, and one step
of Miles' loss on Megatron's logits beside the reference trainer's gradient.

Owns how a sample is put through Megatron and Miles (the same code for the test's assertions and
the bench's figures); asserts nothing about the figures. Needs torch, Megatron and Miles (the
scratch venv: ../miles/setup_venv.sh); the world (world.py) set up and the shims applied first.
"""

from __future__ import annotations

import types
from argparse import Namespace
from dataclasses import dataclass
from typing import Any

import numpy as np

from integration_tests.megatron.world import causal_mask
from rl360_ext.reference.engine.model import ModelConfig
from rl360_ext.reference.trainer.trainer import Trainer, TrainerConfig
from rl360_ext.rollout.sample import Sample


@dataclass
class MergedCase:
    sample: Sample
    engine_logprobs: np.ndarray  # float64 prefill log-prob of every token (index 0 is nan)
    config: ModelConfig
    weights: dict[str, np.ndarray]

    @property
    def prompt(self) -> int:
        return len(self.sample.tokens) - self.sample.response_length

    @property
    def sampled(self) -> np.ndarray:
        return np.asarray(self.sample.loss_mask) > 0


def forward_logits(model: Any, tokens: list[int]) -> Any:
    import torch

    n = len(tokens)
    ids = torch.tensor(tokens, dtype=torch.long)[None]
    return model(ids, torch.arange(n)[None], attention_mask=causal_mask(n))


def response_logprobs(model: Any, case: MergedCase) -> np.ndarray:
    import torch

    tokens = case.sample.tokens
    with torch.no_grad():
        out = forward_logits(model, tokens)[0, :-1]
    picked = torch.log_softmax(out, dim=-1).gather(1, torch.tensor(tokens[1:])[:, None])[:, 0]
    return picked.numpy()[case.prompt - 1 :]


def routing_of(model: Any, case: MergedCase) -> np.ndarray:
    """Megatron's chosen experts per (token, layer) as a [T, layers, experts] bool map."""
    import torch

    maps: list[Any] = []
    hooks = [
        layer.mlp.router.register_forward_hook(lambda _m, _i, out: maps.append(out[1].detach().clone()))
        for layer in model.decoder.layers
    ]
    try:
        with torch.no_grad():
            forward_logits(model, case.sample.tokens)
    finally:
        for hook in hooks:
            hook.remove()
    return np.stack([m.numpy() for m in maps], axis=1)


def agreement(routing_map: np.ndarray, recorded: np.ndarray) -> float:
    """Share of (token, layer) rows whose chosen set equals the recorded top-k (rows of tokens[:-1])."""
    rows, layers, experts = recorded.shape[0], recorded.shape[1], routing_map.shape[2]
    onehot = np.zeros((rows, layers, experts), bool)
    np.put_along_axis(onehot, recorded.astype(np.int64), True, axis=-1)
    return float((routing_map[:rows] == onehot).all(axis=-1).mean())


def fill_replay(model: Any, case: MergedCase, rows: np.ndarray) -> None:
    """Miles' own replay fill: `fill_replay_data` over a Miles `DataIterator`.

    The streams are mapped to the MoE layers by Miles' `register_replay_list_moe`.
    """
    import torch
    from miles.backends.megatron_utils.replay_utils import register_replay_list_moe
    from miles.backends.training_utils.data import DataIterator
    from miles.backends.training_utils.replay_data import fill_replay_data
    from miles.utils.replay_base import routing_replay_manager

    routing_replay_manager.clear_all()
    tokens = torch.tensor(case.sample.tokens, dtype=torch.long)
    rollout_data = {
        "rollout_routed_experts": [torch.from_numpy(np.ascontiguousarray(rows))],
        "tokens": [tokens],
        "max_seq_lens": [len(tokens)],
    }
    args = Namespace(
        qkv_format="thd", data_pad_size_multiplier=1, allgather_cp=False, sequence_parallel=False
    )
    fill_replay_data(
        args=args, models=[types.SimpleNamespace(module=model)],
        data_iterator=[DataIterator(rollout_data, micro_batch_size=1)], num_microbatches=[1],
        rollout_data=rollout_data, data_key=routing_replay_manager.data_key,
        replay_list=routing_replay_manager.replays, register_replay_list_func=register_replay_list_moe,
        if_sp_region=routing_replay_manager.if_sp_region,
    )  # fmt: skip


REWARD = 1.0


def miles_loss_args(trainer: Trainer) -> Namespace:
    """The trainer's Miles flags plus the other fields Miles' loss path reads, at Miles' defaults."""
    args = trainer.config.miles_args()
    fields = dict(
        loss_type="policy_loss", advantage_estimator="grpo", use_rollout_logprobs=False,
        skip_actor_forward_only=False, entropy_coef=0.0, observe_training_entropy=False, use_opsm=False,
        get_mismatch_metrics=False, use_kl_loss=False, use_unbiased_kl=False, true_on_policy_mode=False,
        allgather_cp=False, recompute_loss_function=False, rollout_temperature=1.0,
        log_probs_chunk_size=-1, use_dynamic_global_batch_size=False, global_batch_size=1,
        custom_loss_function_path=None, dump_details=None, data_pad_size_multiplier=1,
    )  # fmt: skip
    for name, value in fields.items():
        setattr(args, name, value)
    return args


def reference_gradient(case: MergedCase, config: TrainerConfig) -> dict[str, np.ndarray]:
    """The reference trainer's gradient of one train step on the sample (captured before AdamW)."""
    weights = {name: value.copy() for name, value in case.weights.items()}
    trainer = Trainer(case.config, weights, config)
    captured: dict[str, np.ndarray] = {}
    step = trainer.optimizer.step

    def capture(grads: dict[str, np.ndarray], clip_grad: float | None = None) -> float:
        captured.update({name: value.copy() for name, value in grads.items()})
        return step(grads, clip_grad)

    trainer.optimizer.step = capture  # type: ignore[method-assign]
    metrics = trainer.train_step([case.sample], [REWARD])
    if metrics["train/optimizer_steps"] != 1.0:
        raise RuntimeError(f"the reference trainer took {metrics['train/optimizer_steps']} steps, not 1")
    return captured


def miles_batch(case: MergedCase, old_log_probs: Any) -> dict[str, Any]:
    """One sample's micro-batch as Miles' `get_rollout_data` / `get_batch` hand it to the loss."""
    import torch

    sample = case.sample
    tokens = torch.tensor(sample.tokens, dtype=torch.long)
    response = sample.response_length
    mask = torch.tensor(sample.loss_mask, dtype=torch.int)
    return {
        "unconcat_tokens": [tokens],
        "tokens": [tokens],
        "total_lengths": [len(sample.tokens)],
        "response_lengths": [response],
        "loss_masks": [mask],
        "rollout_mask_sums": torch.tensor([float(mask.sum())], dtype=torch.float32),
        "advantages": [torch.full((response,), REWARD, dtype=torch.float64)],
        "returns": [torch.full((response,), REWARD, dtype=torch.float64)],
        "log_probs": [old_log_probs],
        "rollout_log_probs": [torch.tensor(sample.rollout_log_probs, dtype=torch.float64)],
    }


def replayed(model: Any, case: MergedCase, rows: np.ndarray, stage: str, run: Any) -> Any:
    """`run(model, case)` with Miles' replay filled from `rows` and the manager at `stage`.

    Miles' actor scores old log-probs under "replay_forward" and trains under "replay_backward".
    """
    from miles.utils.replay_base import routing_replay_manager

    fill_replay(model, case, rows)
    routing_replay_manager.stage = stage
    try:
        return run(model, case)
    finally:
        routing_replay_manager.stage = "fallthrough"
        routing_replay_manager.clear_all()


def miles_loss_backward(
    args: Namespace, batch: dict[str, Any], logits: Any, *, true_on_policy: bool
) -> float:
    """Miles' `loss_function` as its Megatron forward step binds it (one micro-batch), then backward.

    `true_on_policy`: Miles' `--true-on-policy-mode` log-prob path, which keeps the logits' dtype
    (float64 here); without it Miles asserts float32/bf16 logits and computes log-probs in float32.
    """
    from miles.backends.training_utils.loss import loss_function

    args.true_on_policy_mode = true_on_policy
    loss, _normalizer, _log = loss_function(
        args, batch, 1, logits, apply_megatron_loss_scaling=True, num_rollouts=1
    )
    loss.backward()
    return float(loss.detach())


def relative_errors(got: dict[str, np.ndarray], reference: dict[str, np.ndarray]) -> dict[str, float]:
    return {
        name: float(np.linalg.norm(got[name] - value) / max(np.linalg.norm(value), 1e-300))
        for name, value in reference.items()
    }
