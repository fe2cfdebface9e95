"""Replacing a dead replica without a human: its port is bound again, and when it cannot be, the
clients' routers swap the old URL for the new one (only that replica's image groups move)."""

from __future__ import annotations

import socket

from hypothesis import given, settings
from hypothesis import strategies as st

from rl360_ext.harbor.pool import bind_socket
from rl360_ext.rollout.harbor_routing import HarborRouter, replace_url

LOOPBACK = "127.0.0.1"


def test_a_dead_replicas_port_is_bound_again() -> None:
    first = bind_socket(LOOPBACK, 0)
    port = first.getsockname()[1]
    client = socket.create_connection((LOOPBACK, port))
    accepted, _ = first.accept()
    accepted.close()  # the server side closes first: its port is left in TIME_WAIT
    client.close()
    first.close()
    again = bind_socket(LOOPBACK, port)
    try:
        assert again.getsockname()[1] == port
    finally:
        again.close()


def test_a_taken_port_falls_back_to_a_free_one() -> None:
    taken = socket.socket()
    taken.bind((LOOPBACK, 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        sock = bind_socket(LOOPBACK, port)
        try:
            assert sock.getsockname()[1] not in (port, 0)
        finally:
            sock.close()
    finally:
        taken.close()


@settings(max_examples=100, deadline=None)
@given(
    replicas=st.integers(2, 6),
    victim=st.integers(0, 5),
    groups=st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=40, unique=True),
)
def test_a_swapped_url_moves_only_the_victims_groups(replicas: int, victim: int, groups: list[str]) -> None:
    urls = [f"http://10.0.0.{i}:8000" for i in range(replicas)]
    old = urls[victim % replicas]
    router = HarborRouter(urls)
    before = {group: router.pinned(group) for group in groups}
    router.mark_down(old)
    assert replace_url(old, "http://10.0.9.9:8001") >= 1
    assert old not in router.urls and "http://10.0.9.9:8001" in router.urls
    for group in groups:
        after = router.pinned(group)
        if before[group] != old:
            # rendezvous hashing: a group pinned elsewhere moves only if the new URL outranks its own
            assert after in (before[group], "http://10.0.9.9:8001")
    # the new URL is live at once: the down mark was the old URL's
    assert "http://10.0.9.9:8001" in router._live()


def test_a_replacement_on_the_same_url_is_live_again() -> None:
    router = HarborRouter(["http://a:1", "http://b:2"])
    router.mark_down("http://a:1")
    assert router._live() == ["http://b:2"]
    assert router.swap("http://a:1", "http://a:1")
    assert router._live() == ["http://a:1", "http://b:2"]


def test_swap_ignores_routers_without_the_url() -> None:
    router = HarborRouter(["http://a:1", "http://b:2"])
    assert not router.swap("http://c:3", "http://d:4")
    assert not router.swap("http://a:1", "http://b:2")  # would make two slots one
    assert router.urls == ["http://a:1", "http://b:2"]
