"""The reference trainer's step: Miles' actor train loop for one rollout, on the tiny MoE model.

Owns `TrainerConfig` (every setting, with Miles' flag names and defaults where Miles has them)
and `Trainer`: weights and AdamW state, and `train_step(samples, rewards)`, which does what
Miles' Megatron actor does with one rollout (radixark/miles 31f1ca96,
`miles/backends/megatron_utils/actor.py` -> `model.train`):

1. build the train data (`data.train_data`, Miles' `convert_samples_to_train_data`);
2. score every sample, forward only (Miles' `compute_log_prob`, with R3 replaying
   `rollout_routed_experts` when on), with the current weights and with each older version a
   token was sampled by (`behaviour.VersionHistory`, the last `max_token_age + 1` versions):
   with `keep_old_actor` (Miles' `--keep-old-actor`, which scores on `old_actor`) each token's
   behaviour log-prob is PPO's old log-prob and TIS's `train_log_probs`, without it the current
   weights' (Miles' default); then the two parity families before any update (`behaviour`:
   mismatch at the sampling version against the rollout's log-probs and routing, policy lag of
   the current weights against the sampling version);
3. split the rollout into global batches as Miles' rollout-side schedule does (`data.global_batches`:
   whole rollouts per step; `global_batch_size`, `--use-dynamic-global-batch-size`, or
   `steps_per_rollout` steps) and each into micro-batches of `micro_batch_size`; per
   micro-batch: forward, Miles' policy loss (`loss.micro_batch_loss`: PPO-clip with dual clip,
   TIS hook, pg-loss reducer hook, `loss_function`'s division by the step's rollout count),
   backward; per global batch: clip the gradient norm and take one AdamW step. The gradient
   weight each valid sample ended up with is compared with a mean over the valid samples
   (`train/loss_scale` in sum, `train/effective_weight_min|max` per sample).

What it is not: Megatron. No tensor, pipeline, expert, data or context parallelism, no
sequence packing, no mixed precision (float64 throughout), no KL or entropy terms (`kl_coef` 0,
`entropy_coef` 0, RL360's recipe), no value model. Samples without a loss-masked-in token
(infra samples) are not forwarded: their gradient is zero, and they still count in every
normalizer exactly as in Miles.
"""

from __future__ import annotations

import math
import time
from argparse import Namespace
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rl360_ext.reference.engine.model import ModelConfig, init_weights, load_weights, save_weights
from rl360_ext.reference.engine.threads import single_blas_thread
from rl360_ext.reference.trainer.backward import Tape, TrainModel
from rl360_ext.reference.trainer.behaviour import (
    ParityTally,
    SampleVersions,
    VersionHistory,
    sample_top_logprobs,
    sample_versions,
    select_per_token,
    turn_first_tokens,
)
from rl360_ext.reference.trainer.data import TrainData, global_batches, train_data
from rl360_ext.reference.trainer.loss import micro_batch_loss, reducer_coefficients, sum_of_sample_mean
from rl360_ext.reference.trainer.optim import AdamW
from rl360_ext.sglang.versions import UNVERSIONED
from rl360_ext.train.staleness import sample_staleness_metrics
from rl360_ext.util.dotted import load_function

RL360_REDUCER = "rl360_ext.train.reducers.valid_sample_mean"
RL360_TIS = "rl360_ext.train.tis.valid_token_tis"
DECOUPLED_LR_TENSORS = ("embed", "lm_head")  # Megatron's --decoupled-lr: input embedding, output layer


@dataclass(frozen=True)
class TrainerConfig:
    """Every setting of the reference trainer; the constructor rejects values it cannot run."""

    lr: float = 3e-3
    """AdamW learning rate (Miles' `--lr`; large because the model is tiny)."""
    betas: tuple[float, float] = (0.9, 0.98)
    """AdamW (beta1, beta2) (`--adam-beta1`, `--adam-beta2`)."""
    adam_eps: float = 1e-8
    """AdamW epsilon (`--adam-eps`)."""
    weight_decay: float = 0.0
    """Decoupled weight decay (`--weight-decay`)."""
    decoupled_lr: float | None = None
    """Learning rate of the input embedding and the output layer (`embed`, `lm_head`), Megatron's
    `--decoupled-lr`; None: they use `lr`."""
    lr_warmup_steps: int = 0
    """Optimizer steps of linear learning-rate warmup (`--lr-warmup-iters`); 0: none."""
    clip_grad: float = 1.0
    """Global gradient-norm clip (`--clip-grad`, Miles' default 1.0); 0 turns it off."""
    eps_clip: float = 0.2
    """PPO lower clip range (`--eps-clip`; RL360's recipe 0.2)."""
    eps_clip_high: float | None = None
    """PPO upper clip range (`--eps-clip-high`); None is `eps_clip`, as Miles resolves it
    (`miles/utils/arguments.py`: `if args.eps_clip_high is None: args.eps_clip_high =
    args.eps_clip`). RL360's recipe and the demo set 0.28."""
    eps_clip_c: float | None = None
    """Dual-clip PPO's lower bound (`--eps-clip-c`, > 1; Miles' default None: off): where the
    advantage is negative the loss is at most `-eps_clip_c * A`."""
    use_tis: bool = True
    """Multiply the pg loss by truncated importance-sampling weights (`--use-tis`)."""
    tis_clip: float = 2.0
    """Upper TIS clamp (`--tis-clip`)."""
    tis_clip_low: float = 0.0
    """Lower TIS clamp (`--tis-clip-low`)."""
    tis_function_path: str | None = RL360_TIS
    """`--custom-tis-function-path`; None uses Miles' vanilla TIS."""
    pg_loss_reducer_path: str | None = RL360_REDUCER
    """`--custom-pg-loss-reducer-function-path`; None uses Miles' per-sample mean."""
    calculate_per_token_loss: bool = False
    """`--calculate-per-token-loss`: normalize by tokens instead of samples."""
    use_rollout_logprobs: bool = False
    """`--use-rollout-logprobs`: PPO's old log-probs are the rollout's, not the trainer's."""
    steps_per_rollout: int = 1
    """Optimizer steps per rollout (`--num-steps-per-rollout`): that many global batches."""
    micro_batch_size: int | None = None
    """Samples per micro-batch (`--micro-batch-size`); None puts each global batch in one."""
    global_batch_size: int | None = None
    """Rollouts per optimizer step (`--global-batch-size`, counted in rollout ids as Miles'
    rollout-side schedule counts them): whole steps of that many rollouts, the trailing rest
    dropped (`train/dropped_samples`); None splits each rollout into `steps_per_rollout` steps."""
    use_dynamic_global_batch_size: bool = False
    """`--use-dynamic-global-batch-size`: the global batch is the whole rollout, one optimizer step
    (Miles' `_compute_dynamic_global_batch_size` at dp_size 1); needs `steps_per_rollout` 1."""
    r3: bool = True
    """R3: MoE layers replay `rollout_routed_experts` (`--use-rollout-routing-replay`)."""
    keep_old_actor: bool = False
    """Miles' `--keep-old-actor`: PPO's old log-probs and TIS's train log-probs come from the
    weights that sampled each token (its `token_version`), so the PPO ratio is pi_theta /
    pi_behaviour; off, from the current weights (Miles' default). A trained token whose version
    the trainer does not hold is then a ValueError."""
    max_token_age: int = 1
    """The oldest token age (trainer version - token version) the schedule may train on: the
    trainer keeps the weights of the last `max_token_age + 1` versions, for `keep_old_actor` and
    for the parity metrics (mismatch at the sampling version, policy lag) in both modes."""
    unversioned_as: int | None = None
    """The version assumed for a token that carries none (an engine never pushed to reports
    SGLang's label "default", which has no number); None: such tokens are in neither parity
    family (`train/parity_unscored_tokens`) and `keep_old_actor` refuses them."""

    def __post_init__(self) -> None:
        for name in ("lr", "adam_eps", "tis_clip", "decoupled_lr"):
            value = getattr(self, name)
            if value is None and name == "decoupled_lr":
                continue
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive finite number, got {value!r}")
        for name in ("weight_decay", "clip_grad", "eps_clip", "eps_clip_high", "tis_clip_low"):
            value = getattr(self, name)
            if value is None and name == "eps_clip_high":
                continue
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if self.eps_clip >= 1:
            raise ValueError(f"eps_clip must be < 1, got {self.eps_clip}")
        if self.eps_clip_c is not None and not (math.isfinite(self.eps_clip_c) and self.eps_clip_c > 1):
            raise ValueError(f"eps_clip_c must be a finite number > 1 or None, got {self.eps_clip_c!r}")
        if self.global_batch_size is not None and self.global_batch_size < 1:
            raise ValueError(f"global_batch_size must be >= 1 or None, got {self.global_batch_size}")
        if self.use_dynamic_global_batch_size and (self.steps_per_rollout != 1 or self.global_batch_size):
            raise ValueError(
                "use_dynamic_global_batch_size makes the whole rollout one step: steps_per_rollout must be "
                "1 and global_batch_size None"
            )
        if self.global_batch_size is not None and self.steps_per_rollout != 1:
            raise ValueError("set global_batch_size or steps_per_rollout, not both")
        if self.tis_clip_low > self.tis_clip:
            raise ValueError(f"tis_clip_low ({self.tis_clip_low}) must be <= tis_clip ({self.tis_clip})")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"betas must be two numbers in [0, 1), got {self.betas!r}")
        if self.lr_warmup_steps < 0:
            raise ValueError(f"lr_warmup_steps must be >= 0, got {self.lr_warmup_steps}")
        if self.steps_per_rollout < 1:
            raise ValueError(f"steps_per_rollout must be >= 1, got {self.steps_per_rollout}")
        if (
            isinstance(self.max_token_age, bool)
            or not isinstance(self.max_token_age, int)
            or self.max_token_age < 0
        ):
            raise ValueError(f"max_token_age must be an integer >= 0, got {self.max_token_age!r}")
        if self.micro_batch_size is not None and self.micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1 or None, got {self.micro_batch_size}")

    def miles_args(self) -> Namespace:
        """The `args` Miles' hooks read (TIS bounds, clip ranges, per-token flag)."""
        return Namespace(
            eps_clip=self.eps_clip,
            eps_clip_high=self.eps_clip if self.eps_clip_high is None else self.eps_clip_high,
            eps_clip_c=self.eps_clip_c,
            use_tis=self.use_tis,
            tis_clip=self.tis_clip,
            tis_clip_low=self.tis_clip_low,
            calculate_per_token_loss=self.calculate_per_token_loss,
            custom_tis_function_path=self.tis_function_path,
            custom_pg_loss_reducer_function_path=self.pg_loss_reducer_path,
            qkv_format="thd",
        )


@dataclass
class _Scored:
    log_probs: np.ndarray
    tape: Tape


@dataclass
class _Scores:
    current: list[_Scored | None]  # the current weights' log-probs and tapes (None: invalid sample)
    behaviour: list[np.ndarray]  # per token, the log-prob under the version that sampled it
    metrics: dict[str, float]  # the mismatch and policy-lag families


def _nanmean(values: Sequence[float]) -> float | None:
    finite = [v for v in values if not math.isnan(v)]
    return sum(finite) / len(finite) if finite else None


class Trainer:
    """Weights, optimizer state and the train step of the reference trainer."""

    def __init__(
        self, model_config: ModelConfig, weights: dict[str, np.ndarray], config: TrainerConfig | None = None
    ) -> None:
        self.model_config = model_config
        self.config = config or TrainerConfig()
        self.weights = {name: np.array(value, dtype=np.float64) for name, value in weights.items()}
        self.model = TrainModel(model_config, self.weights)
        self.optimizer = AdamW(
            self.weights,
            self.config.lr,
            self.config.betas,
            self.config.adam_eps,
            self.config.weight_decay,
            self.config.lr_warmup_steps,
            None
            if self.config.decoupled_lr is None
            else {name: self.config.decoupled_lr for name in DECOUPLED_LR_TENSORS},
        )
        self.args = self.config.miles_args()
        self.tis_function = (
            load_function(self.config.tis_function_path) if self.config.tis_function_path else None
        )
        self.reducer_factory = (
            load_function(self.config.pg_loss_reducer_path) if self.config.pg_loss_reducer_path else None
        )
        self.history = VersionHistory(self.config.max_token_age + 1)
        self.steps_done = 0

    @classmethod
    def from_seed(cls, model_config: ModelConfig, seed: int, config: TrainerConfig | None = None) -> Trainer:
        """Start from the tiny engine's deterministic weights for `seed` (what `--seed` serves)."""
        return cls(model_config, init_weights(model_config, seed), config)

    @classmethod
    def from_file(
        cls, model_config: ModelConfig, path: str | Path, config: TrainerConfig | None = None
    ) -> Trainer:
        return cls(model_config, load_weights(path, model_config), config)

    def save(self, path: str | Path) -> Path:
        """Write the weights as the `.npz` the tiny engine's `update_weights_from_disk` loads."""
        return save_weights(path, self.model_config, self.weights)

    # ---- scoring ------------------------------------------------------------------------------

    def _forward(
        self, data: TrainData, i: int, model: TrainModel | None = None, rows: np.ndarray | None = None
    ) -> _Scored:
        """One sample's forward; under R3 replaying the recorded routing on `rows` (None: all)."""
        replay = None
        if self.config.r3 and data.rollout_routed_experts is not None:
            replay = data.rollout_routed_experts[i]
        first = data.total_lengths[i] - data.response_lengths[i]
        log_probs, tape = (model or self.model).forward(data.tokens[i], first, replay, rows)
        return _Scored(log_probs, tape)

    def _behaviour_forward(
        self, data: TrainData, i: int, rows: np.ndarray, model: TrainModel | None, item: _Scored | None
    ) -> _Scored:
        """The forward of the version that sampled tokens: under R3 it replays only the rows recorded
        at that version (`rows`) and routes the others with its own top-k, as that version's engine
        forward did (a row recorded by another version's forward, kept by delta-R3 from an earlier
        turn or rewritten by a later re-prefill, is not what it read: after a flush the engine
        recomputed those positions, or read them from another request's cache, at its own version).
        `item`: this model's forward replaying every row, reused when that is the same forward."""
        if item is not None:
            recorded = None
            if self.config.r3 and data.rollout_routed_experts is not None:
                recorded = data.rollout_routed_experts[i]
            if recorded is None or rows.all():
                return item
            own = item.tape.own_routing
            if (np.sort(own, axis=-1) == np.sort(np.asarray(recorded), axis=-1)).all():
                return item  # every replayed row is the model's own choice: the same forward
        return self._forward(data, i, model, rows)

    def _numbered(self, versions: np.ndarray) -> np.ndarray:
        """`versions` with UNVERSIONED read as `unversioned_as` when that is set."""
        if self.config.unversioned_as is None:
            return versions
        return np.where(versions == UNVERSIONED, self.config.unversioned_as, versions)

    def score(
        self, samples: Sequence[Any], data: TrainData, versions: Sequence[SampleVersions], version: int
    ) -> _Scores:
        """Forward-only pass over the valid samples before any update: the current weights' log-probs
        (with their tapes), each token's behaviour log-prob (the weights of the version that sampled
        it, `behaviour.VersionHistory`; the current one where that version is not held) and the two
        parity families (`behaviour.parity_metrics`)."""
        tally = ParityTally()
        current: list[_Scored | None] = []
        behaviour: list[np.ndarray] = []
        models: dict[int, TrainModel] = {version: self.model}
        for i, valid in enumerate(data.valid):
            if not valid:
                current.append(None)
                behaviour.append(np.zeros(data.response_lengths[i]))
                continue
            item = self._forward(data, i)
            current.append(item)
            prompt = data.total_lengths[i] - data.response_lengths[i]
            response_versions = self._numbered(versions[i].token[prompt:])
            row_versions = self._numbered(versions[i].row)
            trained = data.loss_masks[i] > 0
            recorded = None if data.rollout_routed_experts is None else data.rollout_routed_experts[i]
            wanted = set(np.unique(response_versions[trained]).tolist())
            if recorded is not None:
                wanted |= set(np.unique(row_versions).tolist())
            by_version = {version: self._behaviour_forward(data, i, row_versions == version, None, item)}
            for held in sorted(wanted - {version, UNVERSIONED}):
                weights = self.history.get(held)
                if weights is not None:
                    model = models.setdefault(held, TrainModel(self.model_config, weights))
                    by_version[held] = self._behaviour_forward(data, i, row_versions == held, model, None)
            log_probs, known = select_per_token(
                {held: s.log_probs for held, s in by_version.items()}, response_versions, item.log_probs
            )
            if self.config.keep_old_actor and (trained & ~known).any():
                missing = sorted(set(response_versions[trained & ~known].tolist()))
                raise ValueError(
                    f"samples[{i}] has {int((trained & ~known).sum())} trained tokens of versions "
                    f"{missing} (-1: unversioned) that the trainer does not hold (it holds "
                    f"{self.history.versions}); keep_old_actor scores each token with the weights that "
                    f"sampled it: raise max_token_age or give the sample its token versions"
                )
            behaviour.append(log_probs)
            top = sample_top_logprobs(samples[i], data.response_lengths[i], f"samples[{i}]")
            if top is not None:
                for held, s in by_version.items():
                    at = trained & known & (response_versions == held)
                    tally.add_topk(top[0][at], top[1][at], s.tape.softmax[at])
            tally.add_sample(
                current=item.log_probs,
                behaviour=log_probs,
                known=known,
                trained=trained,
                first=turn_first_tokens(data.loss_masks[i], prompt, versions[i].turn_output_start),
                rollout=None if data.rollout_log_probs is None else data.rollout_log_probs[i],
                kv_context=versions[i].context_kv(prompt),
            )
            if recorded is not None:
                for held, s in by_version.items():
                    rows = row_versions == held
                    tally.add_routing(s.tape.own_routing[rows], np.asarray(recorded)[rows])
        return _Scores(current, behaviour, tally.metrics())

    # ---- the step -----------------------------------------------------------------------------

    def train_step(
        self,
        samples: Sequence[Any],
        rewards: Sequence[float],
        raw_rewards: Sequence[float] | None = None,
        policy_version: int | None = None,
        before_update: Callable[[Mapping[str, float]], bool] | None = None,
    ) -> dict[str, float]:
        """Train on one rollout's samples with the reward post-process hook's rewards; the metrics.

        `policy_version` is the version of the weights this step starts from (token ages are
        measured against it, `rl360_ext.train.staleness`); None counts the steps this trainer took.
        `before_update` (a step gate) is called once per step with the metrics known before any
        update (counts, staleness, the parity families); False drops the update (no optimizer step,
        `train/update_skipped` 1), the metrics are still returned.
        OpenBLAS runs single-threaded for the step (small matrices: a multi-threaded BLAS only
        spins on a shared machine) and gets its thread count back after it.
        """
        with single_blas_thread():
            return self._train_step(samples, rewards, raw_rewards, policy_version, before_update)

    def _train_step(
        self,
        samples: Sequence[Any],
        rewards: Sequence[float],
        raw_rewards: Sequence[float] | None,
        policy_version: int | None,
        before_update: Callable[[Mapping[str, float]], bool] | None = None,
    ) -> dict[str, float]:
        started = time.perf_counter()
        version = self.steps_done if policy_version is None else policy_version
        # every version the step starts from is held, trained on or not: the next step's samples
        # were sampled with it (a step with nothing to train still publishes it)
        self.history.remember(version, self.weights)
        if not samples:
            metrics = {"train/valid_samples": 0.0, "train/masked_samples": 0.0, "train/loss_scale": 0.0}
            if before_update is not None:
                before_update(metrics)
            metrics["train/time_s"] = time.perf_counter() - started
            return metrics
        data = train_data(samples, rewards, raw_rewards)
        valid = data.valid
        metrics: dict[str, float] = {
            "train/valid_samples": float(sum(valid)),
            "train/masked_samples": float(len(data) - sum(valid)),
        }
        metrics.update(sample_staleness_metrics(samples, version))
        if not any(valid):
            metrics["train/loss_scale"] = 0.0
            if before_update is not None:
                before_update(metrics)
            metrics["train/time_s"] = time.perf_counter() - started
            return metrics
        token_versions = [
            sample_versions(sample, len(tokens), f"samples[{i}]")
            for i, (sample, tokens) in enumerate(zip(samples, data.tokens, strict=True))
        ]
        scores = self.score(samples, data, token_versions, version)
        metrics.update(scores.metrics)
        if before_update is not None and not before_update(metrics):
            metrics["train/update_skipped"] = 1.0
            metrics["train/time_s"] = time.perf_counter() - started
            return metrics
        scored = scores.current
        # Miles' compute_log_prob runs on `old_actor` under --keep-old-actor, on `actor` without it:
        # those log-probs are both PPO's old log-probs and TIS's train_log_probs.
        trainer_scored = (
            scores.behaviour
            if self.config.keep_old_actor
            else [
                s.log_probs if s is not None else np.zeros(n)
                for s, n in zip(scored, data.response_lengths, strict=True)
            ]
        )
        old = data.rollout_log_probs if self.config.use_rollout_logprobs else trainer_scored
        if old is None:
            raise ValueError("use_rollout_logprobs needs rollout_log_probs on every sample")
        advantages = data.advantages()
        losses, norms, scales, pg_clip, tis_clip = [], [], [], [], []
        relative_weights: list[float] = []
        tis_hook: dict[str, list[float]] = {}
        steps, dropped = global_batches(
            data.rollout_ids,
            self.config.steps_per_rollout,
            self.config.global_batch_size,
            self.config.use_dynamic_global_batch_size,
        )
        metrics["train/dropped_samples"] = float(len(dropped))
        for batch_index, step in enumerate(steps):
            batch = step.positions
            grads = {name: np.zeros_like(value) for name, value in self.weights.items()}
            per_token = self.config.calculate_per_token_loss
            # Miles' loss_function: / num_rollouts of the step (per-token loss: / its token count)
            normalizer = (
                float(sum(max(data.loss_masks[i].sum(), 1.0) for i in batch))
                if per_token
                else float(step.num_rollouts)
            )
            size = self.config.micro_batch_size or len(batch)
            weight_of: dict[int, float] = {}
            batch_loss = batch_scale = 0.0
            for start in range(0, len(batch), size):
                micro = batch[start : start + size]
                current: list[_Scored | None] = []
                for i in micro:
                    if not valid[i]:
                        current.append(None)
                    elif batch_index == 0:
                        current.append(scored[i])  # same weights as the scoring pass
                    else:
                        current.append(self._forward(data, i))
                new = [
                    c.log_probs if c is not None else np.zeros(data.response_lengths[i])
                    for c, i in zip(current, micro, strict=True)
                ]
                result = micro_batch_loss(
                    args=self.args,
                    new_log_probs=new,
                    old_log_probs=[old[i] for i in micro],
                    trainer_scored_log_probs=[trainer_scored[i] for i in micro],
                    rollout_log_probs=None
                    if data.rollout_log_probs is None
                    else [data.rollout_log_probs[i] for i in micro],
                    advantages=[advantages[i] for i in micro],
                    loss_masks=[data.loss_masks[i] for i in micro],
                    response_lengths=[data.response_lengths[i] for i in micro],
                    total_lengths=[data.total_lengths[i] for i in micro],
                    denominators=[data.rollout_mask_sums[i] for i in micro],
                    normalizer=normalizer,
                    tis_function=self.tis_function,
                    reducer_factory=self.reducer_factory,
                )
                for c, dlogprobs in zip(current, result.dlogprobs, strict=True):
                    if c is not None:
                        self.model.backward(c.tape, dlogprobs, grads)
                batch_loss += result.loss
                batch_scale += sum(result.coefficient_sums)
                weight_of.update(zip(micro, result.coefficient_sums, strict=True))
                pg_clip += [r for r, i in zip(result.pg_clipfrac, micro, strict=True) if valid[i]]
                tis_clip += [r for r, i in zip(result.tis_clipfrac, micro, strict=True) if valid[i]]
                for key, value in result.tis_metrics.items():
                    tis_hook.setdefault(key, []).append(value)
            ideal_of = self._ideal_weights([i for i in batch if valid[i]], data)
            ideal = sum(ideal_of.values())
            scales.append(batch_scale / ideal if ideal else 0.0)
            relative_weights += [weight_of[i] / w for i, w in ideal_of.items() if w]
            norms.append(self.optimizer.step(grads, self.config.clip_grad or None))
            losses.append(batch_loss)
        self.steps_done += 1
        metrics["train/pg_loss"] = float(np.mean(losses))
        metrics["train/grad_norm"] = float(np.mean(norms))
        metrics["train/loss_scale"] = float(np.mean(scales))
        if relative_weights:
            metrics["train/effective_weight_min"] = float(min(relative_weights))
            metrics["train/effective_weight_max"] = float(max(relative_weights))
        for name, values in (("train/pg_clipfrac", pg_clip), ("train/tis_clipfrac", tis_clip)):
            mean = _nanmean(values)
            if mean is not None:
                metrics[name] = mean
        for key, values in tis_hook.items():  # Miles sums micro-batches; mean over global batches
            metrics[f"train/tis_hook/{key}"] = float(sum(values)) / len(losses)
        metrics["train/optimizer_steps"] = float(len(norms))
        metrics["train/tokens"] = float(sum(data.total_lengths[i] for i in range(len(data)) if valid[i]))
        metrics["train/time_s"] = time.perf_counter() - started
        return metrics

    def _ideal_weights(self, positions: list[int], data: TrainData) -> dict[int, float]:
        """Each valid sample's gradient weight when the step's valid samples are one micro-batch of
        their own (the reducer on them alone, divided as Miles divides): what the step's weights
        are compared with (`train/loss_scale`, `train/effective_weight_*`)."""
        if not positions:
            return {}
        masks = [data.loss_masks[i] for i in positions]
        lengths = [data.response_lengths[i] for i in positions]
        totals = [data.total_lengths[i] for i in positions]
        per_token = self.config.calculate_per_token_loss
        if self.reducer_factory is None:
            reducer = sum_of_sample_mean(
                totals, lengths, masks, per_token, denominators=[data.rollout_mask_sums[i] for i in positions]
            )
        else:
            reducer = self.reducer_factory(totals, lengths, masks, per_token)
        normalizer = (
            float(sum(max(m.sum(), 1.0) for m in masks))
            if per_token
            else float(len({data.rollout_ids[i] for i in positions}))
        )
        coefficients = reducer_coefficients(reducer, lengths, masks)
        weights, start = {}, 0
        for i, length in zip(positions, lengths, strict=True):
            weights[i] = float(coefficients[start : start + length].sum()) / normalizer
            start += length
        return weights
