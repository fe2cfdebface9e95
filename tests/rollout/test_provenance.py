"""The metadata contract: only a verifier-written reward or a recorded "valid" class counts."""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given
from hypothesis import strategies as st

from rl360_ext.outcomes.provenance import UNCLASSIFIED, VALID, attempt_class, infra_cause, is_valid


def test_recorded_class_wins() -> None:
    sample = SimpleNamespace(metadata={"attempt_class": "infra:verifier_crash", "reward_source": "verifier"})
    assert attempt_class(sample) == "infra:verifier_crash"
    assert infra_cause(sample) == "verifier_crash"


def test_verifier_source_without_class_is_valid() -> None:
    assert is_valid(SimpleNamespace(metadata={"reward_source": "verifier"}))
    assert is_valid({"metadata": {"attempt_class": VALID}})


@given(
    st.one_of(
        st.none(),
        st.dictionaries(
            st.sampled_from(["reward_source", "attempt_class", "reward", "other"]),
            st.one_of(st.none(), st.text(max_size=12), st.floats(allow_nan=True)),
        ),
    )
)
def test_nothing_unrecognised_becomes_valid(metadata) -> None:
    sample = SimpleNamespace(metadata=metadata)
    recognised = isinstance(metadata, dict) and (
        metadata.get("attempt_class") == VALID
        or (
            metadata.get("reward_source") == "verifier"
            and not (
                isinstance(metadata.get("attempt_class"), str)
                and metadata["attempt_class"].startswith("infra:")
            )
        )
    )
    assert is_valid(sample) == recognised
    if not recognised:
        assert attempt_class(sample) == UNCLASSIFIED or attempt_class(sample).startswith("infra:")
