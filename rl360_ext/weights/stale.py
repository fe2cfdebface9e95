"""Stale-served tokens: policy tokens an engine sampled on weights older than the published ones.

Owns one count (`weights/stale_served_tokens`): of a sample's policy tokens (the response
positions its loss mask keeps), those whose per-token version (`metadata[VERSIONS_KEY]
["token_version"]`, the session's per-token versions, `rl360_ext.sglang.versions`) is older than
the version published when the request was routed. A token whose version is not a number (an
engine still on its initial, unnumbered weights) counts as older. The caller passes the version
published when the attempt started; an attempt's later turns are routed later, when at least
that version was published, so the count is a lower bound, exact when no push lands mid-rollout
(one-step-off). It does not decide anything about training (`rl360_ext.train.staleness`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from rl360_ext.sglang.versions import UNVERSIONED, VERSIONS_KEY, version_number


def _field(sample: Any, name: str) -> Any:
    return sample.get(name) if isinstance(sample, Mapping) else getattr(sample, name, None)


def stale_served_tokens(sample: Any, published: str | None) -> int:
    """Policy tokens of `sample` sampled on a version older than `published` (0 when nothing was
    published as a numbered version, or the sample carries no per-token versions)."""
    floor = version_number(published)
    metadata = _field(sample, "metadata") or {}
    raw = metadata.get(VERSIONS_KEY) if isinstance(metadata, Mapping) else None
    if floor == UNVERSIONED or not isinstance(raw, Mapping) or raw.get("token_version") is None:
        return 0
    tokens = _field(sample, "tokens")
    n = 0 if tokens is None else len(tokens)
    length = int(_field(sample, "response_length") or 0)
    versions = np.asarray(raw["token_version"], dtype=np.int64)
    if not 0 <= length <= n or len(versions) != n:
        raise ValueError(f"token_version has {len(versions)} entries for {n} tokens (response {length})")
    mask = _field(sample, "loss_mask")
    policy = np.ones(length, bool) if mask is None else np.asarray(mask, dtype=np.float64) > 0
    if len(policy) != length:
        raise ValueError(f"loss_mask has {len(policy)} entries, response_length is {length}")
    served = versions[n - length :][policy]
    return int(np.count_nonzero(served < floor))
