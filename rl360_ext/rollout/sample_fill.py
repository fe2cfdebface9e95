"""The generate hook's pure part: Miles' `Sample` filled from one attempt's merged sample and the
verdict the agent function returned (`finish_sample`): tokens, masks, log-probs, routing and
versions through `rl360_ext.session.samples.miles_sample.to_miles_sample` (`fill_from_merged`),
the session's and the run's metadata, template-drift masking, the attempt's class through
`rl360_ext.outcomes.verdict` (`classify`), and the time outside generation. No I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from rl360_ext.outcomes import verdict
from rl360_ext.outcomes.causes import Cause, infra_class
from rl360_ext.outcomes.infra import mark_infra_sample
from rl360_ext.outcomes.provenance import ATTEMPT_CLASS, FAILURE_CAUSE, PHASE_TIMINGS, REWARD_SOURCE, VALID
from rl360_ext.outcomes.verdict import worst_engine_failure
from rl360_ext.rollout.agent import EVALUATION_KEY
from rl360_ext.rollout.occupancy import MODEL_TIME
from rl360_ext.rollout.rewards import verifier_reward_value
from rl360_ext.rollout.sample import Sample
from rl360_ext.session.samples.merge import ABORTED, FAILED, MERGE_KEY, MergedSample
from rl360_ext.session.samples.miles_sample import MilesSample, to_miles_sample
from rl360_ext.sglang.top_logprobs import TOP_LOGPROBS_KEY
from rl360_ext.sglang.versions import VERSIONS_KEY
from rl360_ext.templates.drift import DRIFT_KEY

_NOT_METADATA = frozenset({"reward", "rewards", ATTEMPT_CLASS})  # not copied into the metadata


def fill_from_merged(
    sample: Any, merged: MergedSample, decode: Callable[[list[int]], str], max_seq_len: int | None = None
) -> tuple[MilesSample | None, str | None]:
    """Put the merged sample into `sample`: (what was filled or None, why it cannot be trained on).

    The fields are exactly `rl360_ext.session.samples.miles_sample.to_miles_sample`'s, the converter the
    `/samples` wire uses too (Miles' truncation rule: whole turns while they fit, the overflowing
    turn's output cut, a turn left without output dropped), copied into Miles' types: tokens,
    response, response_length, loss_mask and rollout_log_probs (response part, as lists),
    rollout_routed_experts (int32, every token but the last), weight_versions, status,
    prefix_cache_info. Nothing is filled (None) when no turn survives or no response token does.
    """
    if merged.status == FAILED or len(merged.tokens) == 0:
        return None, "the agent made no model calls (the session recorded no turns)"
    miles = to_miles_sample(merged, decode, max_seq_len)
    if miles is None:
        return None, (
            f"the first turn's output does not fit --max-seq-len {max_seq_len} "
            f"(the first prompt has {merged.prompt_length} tokens)"
        )
    if miles.response_length <= 0:
        return None, "the model produced no response tokens"
    sample.tokens = miles.tokens.tolist()
    sample.response = miles.response
    sample.response_length = miles.response_length
    sample.loss_mask = miles.loss_mask.astype(int).tolist()
    sample.rollout_log_probs = miles.rollout_log_probs.tolist()
    sample.rollout_routed_experts = miles.rollout_routed_experts
    sample.weight_versions = list(miles.weight_versions)
    sample.status = Sample.Status(miles.status)
    sample.prefix_cache_info = Sample.PrefixCacheInfo.from_dict(miles.prefix_cache_info)
    if merged.status == ABORTED:
        return miles, "the engine aborted a turn, so the sample is a prefix of what the verifier graded"
    return miles, None


def session_metadata(merged: MergedSample | None) -> dict[str, Any]:
    """Template/session facts and the token counters the metrics hook reads."""
    if merged is None:
        return {"cached_tokens": 0, "prompt_tokens": 0, "routing_bytes": 0}
    merge_facts = merged.metadata.get("merge", {})
    return {
        "session": merged.metadata.get("session"),
        "merge": merge_facts,
        "turns": merged.turns,
        "cached_tokens": int(merge_facts.get("cached_tokens_total", 0)),
        "prompt_tokens": int(merge_facts.get("prompt_tokens_total", 0)),
        "routing_bytes": int(merge_facts.get("routing_wire_bytes_moved", 0)),
        "r3_rows_from_prefill_fraction": merged.r3_rows_from_prefill_fraction,
        DRIFT_KEY: merged.metadata.get(DRIFT_KEY),
    }


def mask_template_drift(sample: Any, policy: str) -> bool:
    """`--rl360-on-template-drift mask`: a trajectory whose tokens drift from the canonical render
    is kept out of the loss (loss mask all zero; its verifier reward still counts in the group
    baseline). True when the sample was masked."""
    record = (sample.metadata or {}).get(DRIFT_KEY) or {}
    if policy != "mask" or not record.get("mismatch") or not sample.loss_mask:
        return False
    sample.loss_mask = [0] * len(sample.loss_mask)
    sample.metadata["template_drift_masked"] = True
    return True


def run_metadata(result: Mapping[str, Any] | None) -> dict[str, Any]:
    """The agent function's answer as Sample.metadata entries (as Miles merges an agent's dict), less
    the reward itself (it goes to Sample.reward, and only when valid) and its class (decided here)."""
    if result is None:
        return {REWARD_SOURCE: None, FAILURE_CAUSE: None, PHASE_TIMINGS: {}}
    entries = {key: value for key, value in result.items() if key not in _NOT_METADATA}
    entries[REWARD_SOURCE] = result.get(REWARD_SOURCE)
    timings = result.get(PHASE_TIMINGS)
    entries[PHASE_TIMINGS] = dict(timings) if isinstance(timings, Mapping) else {}
    return entries


def classify(
    result: Mapping[str, Any] | None,
    session_error: str | None,
    agent_timeout_policy: str,
    merged: MergedSample | None = None,
) -> str:
    """The attempt's class: the verdict the agent's answer carries (or None), read, plus what only
    this client saw (`rl360_ext.outcomes.verdict.attempt_class`; nothing is classified again).

    A turn the engine side failed with a 5xx during the attempt (recorded by the session server)
    makes the attempt `infra:no_engine_available` even when the agent carried on and a verifier
    graded it: the trajectory it graded was cut short by infrastructure, not by the policy.
    """
    return verdict.attempt_class(
        result,
        transport_error=(result or {}).get("transport_error"),
        client_deadline=bool((result or {}).get("client_deadline")),
        session_error=session_error,
        gateway_status=worst_engine_failure(None if merged is None else merged.metadata),
        agent_timeout_policy=agent_timeout_policy,
    )


def non_generation_time(
    result: Mapping[str, Any] | None, agent_wall_s: float, merged: MergedSample | None
) -> float:
    """Seconds the attempt spent outside the engine: the agent's total_tool_time when it reports one
    (Miles' convention), else the agent's wall time minus the engine time of its turns."""
    reported = ((result or {}).get("agent_metrics") or {}).get("total_tool_time")
    if isinstance(reported, int | float):
        return float(reported)
    return max(0.0, agent_wall_s - model_seconds(merged))


def model_seconds(merged: MergedSample | None) -> float:
    """Seconds the attempt waited on the model: the engine latency of its turns (session-measured)."""
    return sum(float(turn.get("latency_s") or 0.0) for turn in (merged.turns if merged else []))


def finish_sample(
    sample: Any,
    *,
    merged: MergedSample | None,
    result: Mapping[str, Any] | None,
    attempt_class: str,
    detail: str | None,
    decode: Callable[[list[int]], str],
    fallback_token_id: int,
    routing_shape: tuple[int, int] | None,
    max_seq_len: int | None = None,
    reward_key: str | None = None,
    evaluation: bool = False,
) -> Any:
    """Fill `sample` from what the attempt produced. A valid class whose tokens cannot be trained on
    becomes "infra:aborted"; every infra attempt goes through `mark_infra_sample` (status ABORTED).

    With `evaluation` (see the module docstring) the sample carries no R3 rows, its metadata says
    `evaluation: True`, and an infra attempt's reward is `{reward_key: None}` under a reward key."""
    filled, unusable = (
        (None, "no merged sample was collected")
        if merged is None
        else fill_from_merged(sample, merged, decode, max_seq_len)
    )
    if attempt_class == VALID and unusable is not None:
        attempt_class, detail = infra_class(Cause.ABORTED), unusable
    reward = None
    if attempt_class == VALID:
        assert result is not None
        reward, missing = verifier_reward_value(result, reward_key)
        if missing is not None:
            attempt_class, detail = infra_class(Cause.REWARD_FILE_INVALID), missing
    sample.metadata = {**(sample.metadata or {}), **run_metadata(result), **session_metadata(merged)}
    if merged is not None:  # the phase only the session server saw: time spent waiting on the model
        sample.metadata[PHASE_TIMINGS][MODEL_TIME] = model_seconds(merged)
    if filled is not None:  # the converter's merge facts: what max_seq_len kept, as the wire says
        sample.metadata[MERGE_KEY] = filled.metadata[MERGE_KEY]
        sample.metadata[VERSIONS_KEY] = filled.metadata[VERSIONS_KEY]  # per-token policy versions
        if TOP_LOGPROBS_KEY in filled.metadata:  # the engine's top-k per response token (opt-in)
            sample.metadata[TOP_LOGPROBS_KEY] = filled.metadata[TOP_LOGPROBS_KEY]
    if evaluation:
        sample.metadata[EVALUATION_KEY] = True
        sample.rollout_routed_experts = None
    if attempt_class == VALID:
        sample.metadata[ATTEMPT_CLASS] = VALID
        sample.reward = reward
        sample.remove_sample = False
        return sample
    if filled is None:
        _reset_response(sample)
    mark_infra_sample(
        sample,
        attempt_class,
        detail=detail,
        fallback_token_id=fallback_token_id,
        routed_experts_shape=None if evaluation else routing_shape,
    )
    sample.status = Sample.Status.ABORTED
    if evaluation and reward_key:
        sample.reward = {reward_key: None}
    return sample


def _reset_response(sample: Any) -> None:
    """No usable turns: whatever the input sample held as a response is not this attempt's."""
    if int(getattr(sample, "response_length", 0) or 0) > 0:
        sample.tokens = list(sample.tokens)[: -int(sample.response_length)]
    sample.response_length = 0
    sample.response = ""
    sample.loss_mask = None
    sample.rollout_log_probs = None
    sample.rollout_routed_experts = None
