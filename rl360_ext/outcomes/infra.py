"""Infra samples: turning an attempt whose reward does not count into a Miles sample the trainer ignores.

Owns `mark_infra_sample`: the class goes into `Sample.metadata` through the keys of
`rl360_ext.outcomes.provenance`, the loss mask becomes zeros, the reward None (excluded, never 0)
and the per-token fields are made consistent so Miles can still batch the sample. It does not
decide the class (that is `rl360_ext.outcomes.verdict`) and makes no HTTP calls.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rl360_ext.outcomes.causes import infra_class
from rl360_ext.outcomes.provenance import ATTEMPT_CLASS, INFRA_PREFIX, VALID


def mark_infra_sample(
    sample: Any,
    attempt_class: str,
    *,
    detail: str | None = None,
    fallback_token_id: int | None = None,
    routed_experts_shape: tuple[int, int] | None = None,
) -> Any:
    """Make `sample` (a Miles Sample or duck-typed equivalent) an infra sample Miles trains on nothing.

    Sets metadata[ATTEMPT_CLASS] (and metadata["infra_detail"] when `detail` is given), a loss
    mask of zeros, `remove_sample = True` and `reward = None` (excluded, never 0). Per-token
    fields are made consistent with the tokens so Miles can still batch the sample:
    `rollout_log_probs` becomes zeros when missing, `rollout_routed_experts` is padded with zero
    rows to `len(tokens) - 1` (or created from `routed_experts_shape` = (layers, top_k)).

    An attempt with no response tokens (aborted before generating) gets a one-token response that
    borrows the prompt's last token (or `fallback_token_id`, twice, when the sample has no tokens
    at all). That token is masked out (loss mask 0) and carries log-prob 0.0; it only exists so
    tensors line up. `attempt_class` is "infra:<cause>" or a bare cause.
    """
    if attempt_class == VALID:
        raise ValueError("mark_infra_sample needs an infra class or cause, got 'valid'")
    cause = attempt_class.removeprefix(INFRA_PREFIX)
    cls = infra_class(cause)

    metadata = sample.metadata if isinstance(getattr(sample, "metadata", None), dict) else {}
    metadata[ATTEMPT_CLASS] = cls
    if detail is not None:
        metadata["infra_detail"] = detail
    sample.metadata = metadata

    if int(sample.response_length) <= 0:
        _borrow_one_token(sample, fallback_token_id)
    response_length = int(sample.response_length)
    sample.loss_mask = [0] * response_length
    log_probs = getattr(sample, "rollout_log_probs", None)
    if log_probs is None or len(log_probs) != response_length:
        sample.rollout_log_probs = [0.0] * response_length
    _fit_routed_experts(sample, routed_experts_shape)
    sample.remove_sample = True
    sample.reward = None
    return sample


def _borrow_one_token(sample: Any, fallback_token_id: int | None) -> None:
    tokens = list(sample.tokens or [])
    if not tokens:
        if fallback_token_id is None:
            raise ValueError(
                "sample has no tokens; pass fallback_token_id (e.g. the tokenizer's eos or pad id) "
                "so the masked placeholder response can be built"
            )
        tokens = [int(fallback_token_id)]
    tokens.append(tokens[-1])
    sample.tokens = tokens
    sample.response_length = 1
    if getattr(sample, "response", None) is None:
        sample.response = ""


def _fit_routed_experts(sample: Any, routed_experts_shape: tuple[int, int] | None) -> None:
    rows = len(sample.tokens) - 1
    routed = getattr(sample, "rollout_routed_experts", None)
    if routed is None:
        if routed_experts_shape is not None:
            sample.rollout_routed_experts = np.zeros((rows, *routed_experts_shape), dtype=np.int32)
        return
    routed = np.asarray(routed, dtype=np.int32)
    if routed.ndim != 3:
        raise ValueError(
            f"rollout_routed_experts must be [tokens-1, layers, top_k], got shape {routed.shape}"
        )
    if len(routed) < rows:
        padding = np.zeros((rows - len(routed), *routed.shape[1:]), dtype=np.int32)
        routed = np.concatenate([routed, padding])
    sample.rollout_routed_experts = routed[:rows]
