"""Stale-served tokens: policy tokens sampled on weights older than the published version."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rl360_ext.sglang.versions import UNVERSIONED, VERSIONS_KEY
from rl360_ext.weights.stale import stale_served_tokens


def sample(token_version: list[int], response_length: int, loss_mask: list[int] | None = None) -> dict:
    return {
        "tokens": list(range(len(token_version))),
        "response_length": response_length,
        "loss_mask": loss_mask,
        "metadata": {VERSIONS_KEY: {"token_version": token_version}},
    }


def test_counts_policy_tokens_older_than_published() -> None:
    prompt = [UNVERSIONED] * 3
    # response: two tokens on v1, a tool token (masked out), two on v2
    s = sample([*prompt, 1, 1, UNVERSIONED, 2, 2], 5, [1, 1, 0, 1, 1])
    assert stale_served_tokens(s, "2") == 2
    assert stale_served_tokens(s, "1") == 0
    assert stale_served_tokens(s, None) == 0  # nothing published yet
    # an engine on its initial, unnumbered weights: its tokens count as older
    assert stale_served_tokens(sample([*prompt, UNVERSIONED, UNVERSIONED], 2), "0") == 2


def test_samples_without_versions_count_zero_and_bad_lengths_are_named() -> None:
    assert stale_served_tokens({"tokens": [1, 2], "response_length": 1, "metadata": {}}, "3") == 0
    with pytest.raises(ValueError, match="token_version has 2 entries for 3 tokens"):
        stale_served_tokens({**sample([1, 1], 1), "tokens": [1, 2, 3]}, "3")
    with pytest.raises(ValueError, match="loss_mask has 1 entries"):
        stale_served_tokens(sample([0, 1, 1], 2, [1]), "3")


@given(st.lists(st.integers(-1, 6), min_size=1, max_size=30), st.integers(0, 6))
def test_never_more_than_the_policy_tokens(versions: list[int], published: int) -> None:
    s = sample(versions, len(versions))
    count = stale_served_tokens(s, str(published))
    assert count == sum(1 for v in versions if v < published)
