"""The one converter from rl360's `MergedSample` to the fields of a Miles `Sample`.

Owns `to_miles_sample`: what Miles' own session server would assemble from the same turns
(radixark/miles `miles/rollout/session/samples/merge.py` at 31f1ca96:
`truncate_samples_by_total_tokens`, run before `merge_samples`). Both consumers of a trajectory
call it: the `/samples` wire (`rl360_ext.session.samples.miles_wire`, for Miles' stock
`agentic_tool_call.generate`) and rl360's generate hook (`rl360_ext.rollout.generate`), so a
trajectory trains the same under either path.

The rule, as Miles applies it: `response`, `response_length`, `loss_mask` and
`rollout_log_probs` cover everything after the first prompt; with `max_seq_len`, turns are kept
while their end (prompt + output so far) fits; the first turn that overflows keeps the output
that fits and the sample ends there with status truncated; if none of its output fits it is
dropped and the sample keeps the previous turn's status; when no turn survives there is no
sample (`None`). It lives in `session/` because the wire does, and `rollout/` stands above
`session/`. It imports neither Miles nor torch, and decides nothing about rewards.

`weight_versions` holds every weight-version span of every kept turn, in order (one entry per
span, not one per turn; a cut turn keeps the spans with kept tokens): Miles reads them as
`Sample.oldest_weight_version` (the minimum numeric entry, `miles/utils/types.py`), which
`fully_async_data_buffer.group_oldest_weight_version` and `FullyAsyncDataBuffer._staleness` hold
against `--max-weight-staleness`, and as `len(set(weight_versions)) > 1` for
`weight_version/mixed_version_ratio` (`miles/ray/rollout/metrics.py`
`_compute_metrics_from_samples`; all at 31f1ca96). Miles' own generate appends one
`meta_info.weight_version` per engine call (`Sample.update_from_meta_info`), the newest span, so
a turn whose weights changed mid-generation looked single-version; with every span both figures
are token-true without a Miles change. The per-token version arrays go to
`metadata[VERSIONS_KEY]` (`rl360_ext.sglang.versions`), cut like `tokens`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rl360_ext.session.core import SESSION_KEY
from rl360_ext.session.samples.merge import MERGE_KEY, MergedSample
from rl360_ext.session.samples.policy_versions import to_lists
from rl360_ext.sglang.top_logprobs import TOP_LOGPROBS_KEY, empty_top_logprobs
from rl360_ext.sglang.versions import VERSIONS_KEY

Decode = Callable[[Sequence[int]], str]

# Miles' Sample.Status values by the finish reason of the last kept turn
# (`_compute_sample_from_openai_record` in the Miles file above).
STATUS_OF_FINISH = {"stop": "completed", "tool_calls": "completed", "length": "truncated", "abort": "aborted"}
TRUNCATED = "truncated"


@dataclass
class MilesSample:
    """The fields of one Miles `Sample` rl360 computes (status as Miles' value string)."""

    tokens: np.ndarray  # int64 [n]
    response: str
    response_length: int
    loss_mask: np.ndarray  # uint8 [response_length]
    rollout_log_probs: np.ndarray  # float64 [response_length]
    rollout_routed_experts: np.ndarray | None  # int32 [n - 1, layers, top_k], None without R3
    status: str
    weight_versions: list[str]
    prefix_cache_info: dict[str, int]  # Miles' Sample.PrefixCacheInfo.to_dict()
    metadata: dict[str, Any]
    rollout_indexer_topk: np.ndarray | None = None  # always None: rl360 records no indexer replay


def cut(sample: MergedSample, max_seq_len: int | None) -> tuple[list[dict[str, Any]], int, bool]:
    """The turns kept under `max_seq_len`, the token count kept, and whether a turn's output was cut."""
    turns = sample.turns
    if max_seq_len is None:
        return list(turns), len(sample.tokens), False
    kept: list[dict[str, Any]] = []
    for turn in turns:
        end = turn["input_start"] + turn["input_tokens"] + turn["output_tokens"]
        if end <= max_seq_len:
            kept.append(turn)
            continue
        if turn["output_tokens"] - (end - max_seq_len) > 0:
            kept.append(turn)
            return kept, max_seq_len, True
        break
    n = 0 if not kept else kept[-1]["input_start"] + kept[-1]["input_tokens"] + kept[-1]["output_tokens"]
    return kept, n, False


def span_versions(turns: list[dict[str, Any]], n: int) -> list[str]:
    """Every weight-version span label of `turns` in order, cut at `n` tokens (see the docstring);
    a turn without spans contributes its `weight_version`."""
    labels: list[str] = []
    for turn in turns:
        output_start = turn["input_start"] + turn["input_tokens"]
        kept = min(turn["output_tokens"], n - output_start)
        spans = turn.get("weight_versions") or []
        visible = [s for s in spans if int(s["start"]) < kept or int(s["start"]) == 0]
        if visible:
            labels.extend(str(s["version"]) for s in visible)
        elif turn["weight_version"] is not None:
            labels.append(turn["weight_version"])
    return labels


def _response_text(tokens: np.ndarray, turns: list[dict[str, Any]], n: int, decode: Decode) -> str:
    """Miles' `response`: each turn's output and each later turn's input, decoded piece by piece."""
    pieces: list[str] = []
    for i, turn in enumerate(turns):
        start = turn["input_start"]
        output_start = start + turn["input_tokens"]
        if i > 0 and output_start > start:
            pieces.append(decode(tokens[start:output_start].tolist()))
        end = min(output_start + turn["output_tokens"], n)
        if end > output_start:
            pieces.append(decode(tokens[output_start:end].tolist()))
    return "".join(pieces)


def to_miles_sample(
    sample: MergedSample,
    decode: Decode,
    max_seq_len: int | None = None,
    metadata: dict[str, Any] | None = None,
) -> MilesSample | None:
    """`sample` as Miles' session server would assemble it, or None when no turn survives.

    `decode` turns token ids into text (the tokenizer's decode, special tokens kept); `metadata`
    is merged over the sample's own metadata (the `/samples` body's `metadata`). The result's
    metadata carries the merge facts under "merge", with what `max_seq_len` dropped.
    """
    turns, n, was_cut = cut(sample, max_seq_len)
    if not turns:
        return None
    prompt = sample.prompt_length
    status = TRUNCATED if was_cut else STATUS_OF_FINISH.get(turns[-1]["finish_reason"], sample.status.lower())
    routed = sample.routed_experts
    merge_facts = {
        **sample.metadata.get(MERGE_KEY, {}),
        "turns": turns,
        "max_seq_len": max_seq_len,
        "turns_dropped_by_max_seq_len": len(sample.turns) - len(turns),
        "tokens_cut_by_max_seq_len": len(sample.tokens) - n,
        "rl360_status": sample.status,
    }
    own = {k: v for k, v in sample.metadata.items() if k not in (SESSION_KEY, MERGE_KEY)}
    return MilesSample(
        tokens=sample.tokens[:n].astype(np.int64),
        response=_response_text(sample.tokens, turns, n, decode),
        response_length=n - prompt,
        loss_mask=sample.loss_mask[prompt:n].astype(np.uint8),
        rollout_log_probs=sample.rollout_log_probs[prompt:n].astype(np.float64),
        rollout_routed_experts=None if routed is None else routed[: n - 1].astype(np.int32),
        status=status,
        weight_versions=span_versions(turns, n),
        prefix_cache_info={
            "cached_tokens": int(sum(t["cached_tokens"] for t in turns)),
            "total_prompt_tokens": int(sum(t["prompt_tokens"] for t in turns)),
        },
        metadata={
            **own,
            **(metadata or {}),
            MERGE_KEY: merge_facts,
            VERSIONS_KEY: to_lists(sample.version_arrays(), n, len(turns)),
            **top_logprobs_metadata(sample, prompt, n),
        },
    )


def top_logprobs_metadata(sample: MergedSample, prompt: int, n: int) -> dict[str, Any]:
    """`{TOP_LOGPROBS_KEY: {"ids", "logprobs"}}` over the response positions kept (lists, one row per
    response token; rows of tokens the policy did not generate hold NO_TOKEN ids), or {} without
    top-k log-probs."""
    if sample.top_logprob_ids is None or sample.top_logprobs is None:
        return {}
    generated = np.flatnonzero(np.asarray(sample.loss_mask) > 0)
    if len(generated) != len(sample.top_logprob_ids):
        raise ValueError(
            f"top_logprob_ids has {len(sample.top_logprob_ids)} rows for {len(generated)} generated tokens"
        )
    kept = (generated >= prompt) & (generated < n)
    ids, values = empty_top_logprobs(n - prompt, sample.top_logprob_ids.shape[1])
    ids[generated[kept] - prompt] = sample.top_logprob_ids[kept]
    values[generated[kept] - prompt] = sample.top_logprobs[kept]
    return {TOP_LOGPROBS_KEY: {"ids": ids.tolist(), "logprobs": values.astype(np.float64).tolist()}}
