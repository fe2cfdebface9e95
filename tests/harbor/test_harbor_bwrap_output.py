"""The bwrap environment's output cap: what a command printed is kept as its head and tail,
never more than the cap, and the dropped middle is counted exactly."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rl360_ext.harbor.envs.bwrap import HeadTail


@settings(max_examples=300, deadline=None)
@given(
    cap=st.integers(min_value=2, max_value=64),
    chunks=st.lists(st.binary(min_size=0, max_size=80), max_size=20),
)
def test_head_and_tail_are_kept_and_the_middle_is_counted(cap: int, chunks: list[bytes]) -> None:
    kept = HeadTail(cap)
    for chunk in chunks:
        kept.add(chunk)
    stream, half = b"".join(chunks), cap // 2
    if len(stream) <= 2 * half:
        assert kept.dropped == 0 and kept.text() == stream.decode(errors="replace")
    else:
        assert kept.dropped == len(stream) - 2 * half
        marker = f"\n[... {kept.dropped} bytes of output dropped ...]\n".encode()
        assert kept.text() == (stream[:half] + marker + stream[-half:]).decode(errors="replace")


def test_a_huge_stream_keeps_only_the_cap() -> None:
    kept = HeadTail(1000)
    for _ in range(2000):
        kept.add(b"y" * 65536)
    assert kept.dropped == 2000 * 65536 - 1000
    assert len(kept.text()) < 1100
