"""The behaviour policy per token: the weights of the last K versions and the parity metrics.

Owns what Miles' `--keep-old-actor` stands for in the reference trainer (radixark/miles 31f1ca96,
`miles/backends/megatron_utils/actor.py`: at start-up `load_other_checkpoint("old_actor")` and a
`rollout_actor` backup; after each weight push the queue `rollout_actor -> old_actor, actor ->
rollout_actor` (`weights_backuper.copy` / `backup`); `train` switches to `old_actor` before
`compute_log_prob`, so the PPO old log-probs and TIS's `train_log_probs` are the weights the
engines sampled with). Miles keeps exactly the one version its one-step-off schedule samples
with; here `VersionHistory` keeps the last K (K = the oldest token age the schedule may train on,
plus one) and every token is scored with the version that sampled it, read from the session's
per-token `token_version` (`metadata[VERSIONS_KEY]`, `rl360_ext.sglang.versions`), so in-flight
samples that mix versions inside one turn get each token's own behaviour policy.

Two metric families, never mixed (`parity_metrics`), over the trained tokens (loss-masked-in
response tokens of valid samples) whose version the trainer holds:

- mismatch, the trainer *at the sampling version* against the engine's recorded log-probs (under
  R3 that version's forward replays only the rows recorded at it, `routing_version`, and routes
  the others with its own top-k, as the engine's forward did; `Trainer._behaviour_forward`):
  `train/logprob_abs_diff_mean|max` (Miles' `train_rollout_logprob_abs_diff` under
  `--keep-old-actor`, here a mean over tokens), `train/logprob_abs_diff_first_token_mean` (the
  first generated token of each turn: `turn_output_start`, or where a run of loss-masked-in
  tokens starts when the sample has no turn positions) beside
  `train/logprob_abs_diff_later_tokens_mean` (the rest); split by the KV the sampler read,
  `train/logprob_abs_diff_{fresh,stale,unknown}_kv_max` and `train/{fresh,stale,unknown}_kv_tokens`
  (`KvContext` from `kv_version`: stale when the context held KV older than the token's version,
  which an in-flight push under `in_place` keeps, so the sampler's forward mixed two versions and
  scoring at one version cannot reproduce it; unknown when a context position's writer is not
  known, a prefix-cache hit on another request's KV); and `train/routing_agreement` (the
  trainer's own top-k at the row's version against the recorded routing; a row's version is
  `routing_version`, else the version of the token its forward sampled);
- policy lag, the current weights against the sampling version on the same tokens:
  `train/policy_lag_abs_diff_mean|max` and `train/policy_lag_kl` (Miles' `low_var_kl` estimator
  of KL(behaviour || current), `loss_hub/math_utils.py:compute_approx_kl`, mean over tokens).

Beyond sampled tokens (mismatch family too), where the engine recorded its top-k log-probs per
generated token (SGLang's `top_logprobs_num`, kept by the session server opt-in under
`metadata[TOP_LOGPROBS_KEY]`, `rl360_ext.sglang.top_logprobs`), against the trainer's full
distribution at the sampling version on the same position (`topk_parity`):
`train/topk_kl` (KL over the engine's top-k support S, both distributions renormalised on S, both
directions summed: KL(e||t) + KL(t||e); each direction also as `train/topk_kl_engine_trainer`,
`train/topk_kl_trainer_engine`), `train/topk_overlap` (|S ∩ the trainer's own top-|S||/|S|) and
`train/tv_bound`, `_max` (an upper bound on the total variation between the full distributions:
1/2 (sum over S of |p_e - p_t| + the mass each puts outside S), computable from the top-k alone).

Tokens whose version is unknown (no version arrays and no single numbered `weight_versions`
label) or older than the history holds are in neither family: `train/parity_unscored_tokens`
counts them. It does not run the loss (`loss.py`) or own the step (`trainer.py`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import numpy as np

from rl360_ext.reference.trainer.loss import LOG_RATIO_LIMIT
from rl360_ext.sglang.top_logprobs import NO_TOKEN, TOP_LOGPROBS_KEY
from rl360_ext.sglang.versions import UNVERSIONED, VERSIONS_KEY, version_number
from rl360_ext.train.staleness import parse_versions

KL_CLAMP = 10.0  # Miles' low_var_kl clamps each token's estimate to [-10, 10]

Weights = dict[str, np.ndarray]


class KvContext(IntEnum):
    """What KV the engine's forward that sampled a token read (from `kv_version`)."""

    FRESH = 0  # every earlier position's KV written at the token's version or later
    STALE = 1  # some earlier position's KV written at an older version
    UNKNOWN = 2  # some earlier position's writer unknown (a cross-request prefix-cache hit)


class VersionHistory:
    """The weights of the last `keep` versions, by version number (copies, never the live arrays)."""

    def __init__(self, keep: int) -> None:
        if keep < 1:
            raise ValueError(f"a version history keeps at least 1 version, got {keep}")
        self.keep = keep
        self._weights: dict[int, Weights] = {}

    def remember(self, version: int, weights: Mapping[str, np.ndarray]) -> None:
        """`weights` are `version` now; forget versions outside [version - keep + 1, version]."""
        self._weights[version] = {name: np.array(value, copy=True) for name, value in weights.items()}
        oldest = version - self.keep + 1
        for held in [v for v in self._weights if not oldest <= v <= version]:
            del self._weights[held]

    def get(self, version: int) -> Weights | None:
        return self._weights.get(version)

    @property
    def versions(self) -> list[int]:
        return sorted(self._weights)


@dataclass(frozen=True)
class SampleVersions:
    """One sample's behaviour versions: per full-sequence position, and per R3 row."""

    token: np.ndarray  # int64 [n_tokens], UNVERSIONED where unknown
    row: np.ndarray  # int64 [n_tokens - 1], the version of the forward over each position
    turn_output_start: np.ndarray | None = None  # full-sequence index of each kept turn's first output
    kv: np.ndarray | None = None  # int64 [n_tokens] `kv_version`, None without version arrays

    def context_kv(self, prompt_length: int) -> np.ndarray | None:
        """Per response token, the KV its sampler read (`KvContext`): STALE when a position before it
        holds KV (`kv_version`) older than the token's version (an in-flight push under `in_place`
        keeps the old KV), else UNKNOWN when a position before it has no known writer (a prefix-cache
        hit on KV another request wrote) or the token has no version, else FRESH; None without
        `kv_version`."""
        if self.kv is None:
            return None
        top = np.iinfo(np.int64).max
        oldest_before = np.concatenate(
            [[top], np.minimum.accumulate(np.where(self.kv == UNVERSIONED, top, self.kv))]
        )
        unknown_before = np.concatenate([[False], np.logical_or.accumulate(self.kv == UNVERSIONED)])
        token = self.token[prompt_length:]
        oldest, unknown = oldest_before[prompt_length:-1], unknown_before[prompt_length:-1]
        context = np.full(len(token), KvContext.FRESH, np.int8)
        context[unknown | (token == UNVERSIONED)] = KvContext.UNKNOWN
        context[(token != UNVERSIONED) & (oldest < token)] = KvContext.STALE
        return context


def sample_versions(sample: Any, n_tokens: int, where: str = "sample") -> SampleVersions:
    """The version that produced each position of `sample`: the session's `token_version` (and
    `routing_version` for rows), else one numbered label shared by every `weight_versions` span
    on the response tokens; UNVERSIONED where neither says. ValueError names a malformed field."""
    metadata = _field(sample, "metadata") or {}
    raw = metadata.get(VERSIONS_KEY) if isinstance(metadata, Mapping) else None
    rows = max(n_tokens - 1, 0)
    if raw is not None:
        arrays = parse_versions(raw, n_tokens, f"{where}.metadata[{VERSIONS_KEY!r}]")
        token = arrays.token_version
        row = np.array(token[1 : rows + 1], np.int64)
        if arrays.routing_version is not None:
            known = arrays.routing_version != UNVERSIONED
            row[known] = arrays.routing_version[known]
        return SampleVersions(token, row, arrays.turn_output_start, arrays.kv_version)
    token = np.full(n_tokens, UNVERSIONED, np.int64)
    labels = {_label(span) for span in _field(sample, "weight_versions") or []}
    numbers = {version_number(label) for label in labels}
    if len(numbers) == 1 and UNVERSIONED not in numbers:
        length = int(_field(sample, "response_length") or 0)
        token[n_tokens - length :] = numbers.pop()
    return SampleVersions(token, token[1:].copy())


def sample_top_logprobs(
    sample: Any, response_length: int, where: str = "sample"
) -> tuple[np.ndarray, np.ndarray] | None:
    """(ids int64 [response_length, k], logprobs float64 [response_length, k]) from
    `metadata[TOP_LOGPROBS_KEY]`, or None when the sample has none; ValueError names a bad field."""
    metadata = _field(sample, "metadata") or {}
    raw = metadata.get(TOP_LOGPROBS_KEY) if isinstance(metadata, Mapping) else None
    if raw is None:
        return None
    name = f"{where}.metadata[{TOP_LOGPROBS_KEY!r}]"
    if not isinstance(raw, Mapping) or "ids" not in raw or "logprobs" not in raw:
        raise ValueError(f"{name} must be a mapping with 'ids' and 'logprobs'")
    try:
        ids = np.asarray(raw["ids"], np.int64)
        values = np.asarray(raw["logprobs"], np.float64)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{name} must hold two [response_length, k] number arrays ({error})") from None
    if ids.ndim != 2 or ids.shape != values.shape or len(ids) != response_length:
        raise ValueError(
            f"{name} has ids {ids.shape} and logprobs {values.shape}; expected both [{response_length}, k]"
        )
    return ids, values


def topk_parity(
    engine_ids: np.ndarray, engine_logprobs: np.ndarray, trainer_probs: np.ndarray
) -> dict[str, np.ndarray]:
    """Per row (a generated token): the top-k metrics of the module docstring, from the engine's
    ids [rows, k] (NO_TOKEN slots ignored; a row needs one entry) and log-probs [rows, k], and the
    trainer's full distribution [rows, vocab] at the same positions."""
    rows = len(engine_ids)
    present = engine_ids != NO_TOKEN
    safe = np.where(present, engine_ids, 0)
    p_engine = np.where(present, np.exp(engine_logprobs), 0.0)
    p_trainer = np.where(present, np.take_along_axis(trainer_probs, safe, axis=1), 0.0)
    tiny = np.finfo(np.float64).tiny
    e = p_engine / np.maximum(p_engine.sum(axis=1, keepdims=True), tiny)
    t = p_trainer / np.maximum(p_trainer.sum(axis=1, keepdims=True), tiny)
    log_e, log_t = np.log(np.maximum(e, tiny)), np.log(np.maximum(t, tiny))
    kl_et = np.where(present, e * (log_e - log_t), 0.0).sum(axis=1)
    kl_te = np.where(present, t * (log_t - log_e), 0.0).sum(axis=1)
    counts = present.sum(axis=1)
    order = np.argsort(-trainer_probs, axis=1, kind="stable")
    overlap = np.zeros(rows)
    for row in range(rows):
        own = order[row, : counts[row]]
        overlap[row] = len(np.intersect1d(own, engine_ids[row][present[row]])) / max(counts[row], 1)
    outside_e = np.clip(1.0 - p_engine.sum(axis=1), 0.0, 1.0)
    outside_t = np.clip(1.0 - p_trainer.sum(axis=1), 0.0, 1.0)
    tv = 0.5 * (np.abs(p_engine - p_trainer).sum(axis=1) + outside_e + outside_t)
    return {
        "kl_engine_trainer": kl_et,
        "kl_trainer_engine": kl_te,
        "overlap": overlap,
        "tv_bound": np.minimum(tv, 1.0),
    }


def _label(span: Any) -> str | None:
    """A `weight_versions` entry: Miles' label string, or a session span with a `weight_version`."""
    if isinstance(span, Mapping):
        return span.get("weight_version")
    return span if isinstance(span, str) else getattr(span, "weight_version", None)


def _field(sample: Any, name: str) -> Any:
    return sample.get(name) if isinstance(sample, Mapping) else getattr(sample, name, None)


def select_per_token(
    by_version: Mapping[int, np.ndarray], versions: np.ndarray, fallback: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(values, known): per position the entry of `by_version[versions[j]]`, `fallback` where that
    version is not in `by_version`; `known` marks the positions that found their version."""
    selected = np.array(fallback, dtype=np.float64, copy=True)
    known = np.zeros(len(versions), bool)
    for version, values in by_version.items():
        hit = versions == version
        selected[hit] = np.asarray(values)[hit]
        known |= hit
    return selected, known


def turn_first_tokens(
    mask: np.ndarray, prompt_length: int, turn_output_start: np.ndarray | None
) -> np.ndarray:
    """Per response token: True on the first generated token of a turn (loss-masked-in only)."""
    active = np.asarray(mask) > 0
    first = np.zeros(len(active), bool)
    if turn_output_start is not None:
        starts = np.asarray(turn_output_start, np.int64) - prompt_length
        starts = starts[(starts >= 0) & (starts < len(active))]
        first[starts] = True
    elif len(active):
        first[0] = True
        first[1:] = ~active[:-1]
    return first & active


def low_var_kl(behaviour: np.ndarray, current: np.ndarray) -> np.ndarray:
    """Miles' `compute_approx_kl(behaviour, current, "low_var_kl")`: per token k3 estimate of
    KL(behaviour || current) from tokens the behaviour policy sampled."""
    log_ratio = np.clip(current - behaviour, -LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    return np.clip(np.exp(log_ratio) - 1 - log_ratio, -KL_CLAMP, KL_CLAMP)


@dataclass
class ParityTally:
    """The step's per-token pieces of both families, gathered sample by sample."""

    mismatch: list[np.ndarray] = field(default_factory=list)
    first_token: list[np.ndarray] = field(default_factory=list)
    kv_context: list[np.ndarray] = field(default_factory=list)
    lag: list[np.ndarray] = field(default_factory=list)
    lag_kl: list[np.ndarray] = field(default_factory=list)
    topk: dict[str, list[np.ndarray]] = field(default_factory=dict)
    unscored: int = 0
    rows_agreeing: int = 0
    rows: int = 0

    def add_sample(
        self,
        *,
        current: np.ndarray,
        behaviour: np.ndarray,
        known: np.ndarray,
        trained: np.ndarray,
        first: np.ndarray,
        rollout: np.ndarray | None,
        kv_context: np.ndarray | None = None,
    ) -> None:
        """One sample's response tokens: current and behaviour log-probs, which found their version,
        which train, which open a turn, the engine's recorded log-probs (None: none recorded), and
        and the KV each one's sampler read (`SampleVersions.context_kv`; None: all UNKNOWN)."""
        scored = known & trained
        self.unscored += int((trained & ~known).sum())
        if rollout is not None:
            diff = np.abs(behaviour - rollout)
            self.mismatch.append(diff[scored])
            self.first_token.append(first[scored])
            context = np.full(len(diff), KvContext.UNKNOWN, np.int8) if kv_context is None else kv_context
            self.kv_context.append(context[scored])
        self.lag.append(np.abs(current - behaviour)[scored])
        self.lag_kl.append(low_var_kl(behaviour[scored], current[scored]))

    def add_topk(
        self, engine_ids: np.ndarray, engine_logprobs: np.ndarray, trainer_probs: np.ndarray
    ) -> None:
        """Generated tokens at one version: the engine's top-k rows against the trainer's distributions."""
        keep = (engine_ids != NO_TOKEN).any(axis=1)
        for name, values in topk_parity(engine_ids[keep], engine_logprobs[keep], trainer_probs[keep]).items():
            self.topk.setdefault(name, []).append(values)

    def add_routing(self, own: np.ndarray, recorded: np.ndarray) -> None:
        """Rows (token, layer) of one sample at their own versions: the trainer's top-k vs recorded."""
        same = np.sort(own, axis=-1) == np.sort(np.asarray(recorded), axis=-1)
        self.rows_agreeing += int(same.all(axis=-1).sum())
        self.rows += same.shape[0] * same.shape[1] if same.ndim >= 2 else 0

    def metrics(self) -> dict[str, float]:
        return parity_metrics(self)


def _flat(pieces: Sequence[np.ndarray], dtype: Any = np.float64) -> np.ndarray:
    return np.concatenate(pieces).astype(dtype) if pieces else np.zeros(0, dtype)


def parity_metrics(tally: ParityTally) -> dict[str, float]:
    """Both families from a tally (a metric with no token is left out, never reported as 0)."""
    metrics: dict[str, float] = {"train/parity_unscored_tokens": float(tally.unscored)}
    diff, first = _flat(tally.mismatch), _flat(tally.first_token, bool)
    if diff.size:
        metrics["train/logprob_abs_diff_mean"] = float(diff.mean())
        metrics["train/logprob_abs_diff_max"] = float(diff.max())
        if first.any():
            metrics["train/logprob_abs_diff_first_token_mean"] = float(diff[first].mean())
        if (~first).any():
            metrics["train/logprob_abs_diff_later_tokens_mean"] = float(diff[~first].mean())
        context = _flat(tally.kv_context, np.int8)
        for kind in KvContext:
            name = kind.name.lower()
            hit = context == kind
            metrics[f"train/{name}_kv_tokens"] = float(hit.sum())
            if hit.any():
                metrics[f"train/logprob_abs_diff_{name}_kv_max"] = float(diff[hit].max())
    lag, kl = _flat(tally.lag), _flat(tally.lag_kl)
    if lag.size:
        metrics["train/policy_lag_abs_diff_mean"] = float(lag.mean())
        metrics["train/policy_lag_abs_diff_max"] = float(lag.max())
        metrics["train/policy_lag_kl"] = float(kl.mean())
    if tally.rows:
        metrics["train/routing_agreement"] = tally.rows_agreeing / tally.rows
    topk = {name: _flat(pieces) for name, pieces in tally.topk.items()}
    if topk and topk["overlap"].size:
        et, te = topk["kl_engine_trainer"], topk["kl_trainer_engine"]
        metrics["train/topk_kl"] = float((et + te).mean())
        metrics["train/topk_kl_engine_trainer"] = float(et.mean())
        metrics["train/topk_kl_trainer_engine"] = float(te.mean())
        metrics["train/topk_overlap"] = float(topk["overlap"].mean())
        metrics["train/tv_bound"] = float(topk["tv_bound"].mean())
        metrics["train/tv_bound_max"] = float(topk["tv_bound"].max())
    return metrics
