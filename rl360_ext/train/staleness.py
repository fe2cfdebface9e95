"""Staleness metrics at training time, from the per-token version arrays (`sglang.versions`).

Owns reading a sample's `metadata[VERSIONS_KEY]` arrays (`parse_versions`, which checks every
length and names the field it rejects), the per-step metric arithmetic (`staleness_metrics`, a
pure function of `TrainedSample`s and the trainer's version) and the adapter over Miles-shaped or
rollout samples (`sample_staleness_metrics`). It does not decide which samples train (the caller
says which are valid), drop groups or mask tokens (`rl360_ext.rollout.version_buffer`).

Definitions (every metric is over *trained tokens*: the loss-masked-in response tokens of valid
samples; a position's version comes from the arrays over the full token sequence):

- token age = trainer version - token version. Tokens whose version is UNVERSIONED are left out
  and counted in `staleness/unversioned_tokens`; tokens newer than the trainer (negative age, a
  bookkeeping error upstream) are left out and counted in `staleness/future_tokens`.
  `staleness/token_age_{mean,p90,max}` over the rest (p90 by nearest rank: the smallest age `a`
  with at least 90% of the tokens aged <= a), and
  `staleness/token_age_hist/{0,1,2,3,4+}`: each bucket's share of those tokens (they sum to 1);
  `staleness/aged_tokens` is their count.
- `staleness/group_version_spread_max`: max over groups (samples sharing `group_index`) of the
  newest minus the oldest version among the group's versioned trained tokens.
- `staleness/mixed_version_frac`: of the valid samples with a versioned trained token, the share
  whose versioned trained tokens carry more than one version.
- `kv/stale_prefix_tokens_frac`: over every kept turn of valid samples whose first version is
  known, the turn's context is the positions before its first output token
  (`turn_output_start`); the metric is the number of context positions whose `kv_version` is
  known and older than the turn's `turn_first_version`, divided by the number of context
  positions whose `kv_version` is known (`kv/context_tokens`). `kv_version` holds one version per
  position (the producer's best effort), so a position a later forward rewrote counts with that
  later version for every turn.
- `r3/rows_from_later_prefill_frac`: of the R3 rows of trained tokens (row p is the routing of
  the forward over token p; the sequence's last token has none), the share whose
  `routing_source` is REPREFILL: the routing kept for a token the policy sampled came from a
  later prefill, not from the decode step that sampled its successor. `r3/rows` is the count.
  With `turn_output_start` and `turn_cached_tokens` the rows of tokens that a later turn follows
  are split by that next turn's prefix cache: `.../cache_hit` when the next turn's cached prefix
  covered the token (`turn_cached_tokens[t + 1] > p`), `.../cache_miss` otherwise.

`turn_output_start` and `turn_cached_tokens` (`sglang.versions` contract, emitted by the session
merge): one entry per kept turn like `turn_first_version`, the full-sequence index of the turn's
first output token and the number of the turn's prompt tokens its first forward read from the
prefix cache (SGLang's `cached_tokens`). Without them the kv metric and the cache split are not
reported.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rl360_ext.sglang.versions import (
    TURN_CACHED_TOKENS,
    TURN_OUTPUT_START,
    UNVERSIONED,
    VERSIONS_KEY,
    RoutingSource,
)

AGE_BUCKETS = ("0", "1", "2", "3", "4+")


@dataclass(frozen=True)
class VersionArrays:
    """One sample's per-token version arrays, as int64 numpy arrays (see `sglang.versions`)."""

    token_version: np.ndarray  # [n]
    kv_version: np.ndarray  # [n]
    turn_first_version: np.ndarray  # [kept turns]
    routing_source: np.ndarray | None = None  # [n - 1]
    routing_version: np.ndarray | None = None  # [n - 1]
    turn_output_start: np.ndarray | None = None  # [kept turns]
    turn_cached_tokens: np.ndarray | None = None  # [kept turns]


def _int_array(value: Any, where: str) -> np.ndarray:
    try:
        array = np.asarray(value, dtype=np.int64)
    except (TypeError, ValueError, OverflowError) as error:
        raise ValueError(f"{where} must be a list of integers ({error})") from None
    if array.ndim != 1:
        raise ValueError(f"{where} must be a flat list of integers, got shape {array.shape}")
    return array


def parse_versions(raw: Any, n_tokens: int, where: str = f"metadata[{VERSIONS_KEY!r}]") -> VersionArrays:
    """The version arrays of a sample with `n_tokens` tokens; ValueError names the bad field."""
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where} must be a mapping of version arrays, got {type(raw).__name__}")
    arrays: dict[str, np.ndarray | None] = {}
    expected = {
        "token_version": n_tokens,
        "kv_version": n_tokens,
        "routing_source": max(n_tokens - 1, 0),
        "routing_version": max(n_tokens - 1, 0),
    }
    for key in ("token_version", "kv_version", "turn_first_version"):
        if raw.get(key) is None:
            raise ValueError(f"{where}[{key!r}] is missing")
    for key in ("token_version", "kv_version", "turn_first_version", "routing_source", "routing_version"):
        value = raw.get(key)
        arrays[key] = None if value is None else _int_array(value, f"{where}[{key!r}]")
    for key, length in expected.items():
        array = arrays[key]
        if array is not None and len(array) != length:
            raise ValueError(f"{where}[{key!r}] has {len(array)} entries, expected {length}")
    turns = len(arrays["turn_first_version"])  # type: ignore[arg-type]
    for key in (TURN_OUTPUT_START, TURN_CACHED_TOKENS):
        value = raw.get(key)
        array = None if value is None else _int_array(value, f"{where}[{key!r}]")
        if array is not None and len(array) != turns:
            raise ValueError(
                f"{where}[{key!r}] has {len(array)} entries, expected {turns} (one per kept turn)"
            )
        if array is not None and ((array < 0) | (array > n_tokens)).any():
            raise ValueError(f"{where}[{key!r}] has an entry outside [0, {n_tokens}]")
        if key == TURN_OUTPUT_START and array is not None and (np.diff(array) < 0).any():
            raise ValueError(f"{where}[{key!r}] must not decrease (turns in order)")
        arrays[key] = array
    sources = arrays["routing_source"]
    if sources is not None and len(sources) and not np.isin(sources, [int(s) for s in RoutingSource]).all():
        raise ValueError(f"{where}['routing_source'] has a value that is not a RoutingSource")
    return VersionArrays(**arrays)  # type: ignore[arg-type]


@dataclass(frozen=True)
class TrainedSample:
    """A valid sample as the metrics see it: its version arrays and which tokens train."""

    versions: VersionArrays
    prompt_length: int  # tokens before the response (len(tokens) - response_length)
    loss_mask: np.ndarray  # [response_length], > 0 where the token trains
    group: Hashable = None

    @property
    def trained_positions(self) -> np.ndarray:
        """Full-sequence indices of the loss-masked-in tokens."""
        return self.prompt_length + np.flatnonzero(np.asarray(self.loss_mask) > 0)


def _p90(ages: np.ndarray) -> float:
    """Nearest rank: the smallest age with at least 90% of the tokens at or below it."""
    ordered = np.sort(ages)
    return float(ordered[int(np.ceil(0.9 * len(ordered))) - 1])


def _age_metrics(ages: np.ndarray) -> dict[str, float]:
    if not len(ages):
        return {}
    metrics = {
        "staleness/token_age_mean": float(ages.mean()),
        "staleness/token_age_p90": _p90(ages),
        "staleness/token_age_max": float(ages.max()),
    }
    for bucket, label in enumerate(AGE_BUCKETS):
        hits = ages >= bucket if label.endswith("+") else ages == bucket
        metrics[f"staleness/token_age_hist/{label}"] = float(hits.sum()) / len(ages)
    return metrics


def _kv_counts(versions: VersionArrays) -> tuple[int, int]:
    """(stale, known) context positions summed over the sample's turns."""
    starts = versions.turn_output_start
    if starts is None:
        return 0, 0
    turns = versions.turn_first_version != UNVERSIONED
    firsts, starts = versions.turn_first_version[turns], starts[turns]
    if not len(firsts):
        return 0, 0
    kv = versions.kv_version
    stale = known = 0
    for value in np.unique(kv[kv != UNVERSIONED]):  # few distinct versions: one prefix count each
        before = np.concatenate([[0], np.cumsum(kv == value)])[starts]  # positions < start with it
        known += int(before.sum())
        stale += int(before[value < firsts].sum())
    return stale, known


def _next_turn_cache_hit(versions: VersionArrays, positions: np.ndarray) -> np.ndarray | None:
    """Per position: 1 when the next kept turn read it from the prefix cache, 0 when not, -1 when
    no kept turn follows; None without the turn arrays."""
    starts, cached = versions.turn_output_start, versions.turn_cached_tokens
    if starts is None or cached is None:
        return None
    turn = np.searchsorted(starts, positions, side="right") - 1  # the turn whose output holds p
    has_next = (turn >= 0) & (turn + 1 < len(starts))
    next_cached = np.where(has_next, cached[np.clip(turn + 1, 0, len(cached) - 1)], 0)
    return np.where(has_next, (next_cached > positions).astype(np.int64), -1)


def staleness_metrics(
    samples: Sequence[TrainedSample], trainer_version: int | Sequence[int]
) -> dict[str, float]:
    """The staleness, stale-KV and R3-provenance metrics of one step (see the module docstring).

    `trainer_version` is the step's, or one per sample (a buffer that handed samples out at
    different versions). A metric whose population is empty is left out, never reported as 0.
    """
    if isinstance(trainer_version, (int, np.integer)):
        trainer_versions: Sequence[int] = [int(trainer_version)] * len(samples)
    elif len(trainer_version) != len(samples):
        raise ValueError(f"{len(samples)} samples but {len(trainer_version)} trainer versions")
    else:
        trainer_versions = trainer_version
    ages: list[np.ndarray] = []
    unversioned = future = 0
    group_versions: dict[Hashable, list[np.ndarray]] = {}
    versioned_samples = mixed_samples = 0
    kv_stale = kv_known = 0
    r3_rows = r3_later = 0
    split = {1: [0, 0], 0: [0, 0]}  # cache hit / miss: [rows, later-prefill rows]
    for position, (sample, version) in enumerate(zip(samples, trainer_versions, strict=True)):
        versions = sample.versions
        trained = sample.trained_positions
        token = versions.token_version[trained]
        is_versioned = token != UNVERSIONED
        unversioned += int((~is_versioned).sum())
        own = token[is_versioned]
        age = version - own
        future += int((age < 0).sum())
        ages.append(age[age >= 0])
        if len(own):
            key = ("sample", position) if sample.group is None else ("group", sample.group)
            group_versions.setdefault(key, []).append(own)
            versioned_samples += 1
            mixed_samples += int(own.min() != own.max())
        stale, known = _kv_counts(versions)
        kv_stale += stale
        kv_known += known
        if versions.routing_source is not None:
            rows = trained[trained < len(versions.routing_source)]
            later = versions.routing_source[rows] == RoutingSource.REPREFILL
            r3_rows += len(rows)
            r3_later += int(later.sum())
            hit = _next_turn_cache_hit(versions, rows)
            if hit is not None:
                for kind in (1, 0):
                    split[kind][0] += int((hit == kind).sum())
                    split[kind][1] += int((later & (hit == kind)).sum())
    flat = np.concatenate(ages) if ages else np.zeros(0, np.int64)
    metrics: dict[str, float] = {}
    if samples:
        metrics["staleness/aged_tokens"] = float(len(flat))
        metrics["staleness/unversioned_tokens"] = float(unversioned)
        metrics["staleness/future_tokens"] = float(future)
    metrics.update(_age_metrics(flat))
    if group_versions:
        spreads = [np.ptp(np.concatenate(arrays)) for arrays in group_versions.values()]
        metrics["staleness/group_version_spread_max"] = float(max(spreads))
    if versioned_samples:
        metrics["staleness/mixed_version_frac"] = mixed_samples / versioned_samples
    if kv_known:
        metrics["kv/stale_prefix_tokens_frac"] = kv_stale / kv_known
        metrics["kv/context_tokens"] = float(kv_known)
    if r3_rows:
        metrics["r3/rows"] = float(r3_rows)
        metrics["r3/rows_from_later_prefill_frac"] = r3_later / r3_rows
        for kind, name in ((1, "cache_hit"), (0, "cache_miss")):
            rows, later = split[kind]
            if rows:
                metrics[f"r3/rows_from_later_prefill_frac/{name}"] = later / rows
    return metrics


def _field(sample: Any, name: str) -> Any:
    return sample.get(name) if isinstance(sample, Mapping) else getattr(sample, name, None)


def trained_sample(sample: Any, where: str = "sample") -> TrainedSample | None:
    """A Miles-shaped or rollout sample's `TrainedSample`, or None when it carries no version arrays
    or no loss-masked-in token (`remove_sample` set, or a zero mask)."""
    metadata = _field(sample, "metadata") or {}
    raw = metadata.get(VERSIONS_KEY) if isinstance(metadata, Mapping) else None
    if raw is None:
        return None
    tokens = _field(sample, "tokens")
    n = 0 if tokens is None else len(tokens)
    length = int(_field(sample, "response_length") or 0)
    if not 0 <= length <= n:
        raise ValueError(f"{where}.response_length {length} is outside [0, {n}]")
    mask = _field(sample, "loss_mask")
    mask = np.ones(length) if mask is None else np.asarray(mask, dtype=np.float64)
    if len(mask) != length:
        raise ValueError(f"{where}.loss_mask has {len(mask)} entries, response_length is {length}")
    if _field(sample, "remove_sample") or not (mask > 0).any():
        return None
    versions = parse_versions(raw, n, f"{where}.metadata[{VERSIONS_KEY!r}]")
    return TrainedSample(versions, n - length, mask, _field(sample, "group_index"))


def sample_staleness_metrics(
    samples: Sequence[Any], trainer_version: int, is_valid: Callable[[Any], bool] | None = None
) -> dict[str, float]:
    """`staleness_metrics` over the samples that carry version arrays and train (and pass `is_valid`).

    Empty when no sample carries version arrays (a run without them logs nothing)."""
    trained = []
    for position, sample in enumerate(samples):
        if is_valid is not None and not is_valid(sample):
            continue
        item = trained_sample(sample, f"samples[{position}]")
        if item is not None:
            trained.append(item)
    return staleness_metrics(trained, trainer_version) if trained else {}
