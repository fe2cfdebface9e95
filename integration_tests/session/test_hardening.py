"""Hardening through real processes: the openai client's own retries, a restart, a 10 MB message.

Each test starts its own tiny engine and session server (loopback) so a fault setting or a
restart never leaks into another test.
"""

from __future__ import annotations

import contextlib
import socket
import statistics
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from rl360_ext.local.services import start_engine
from rl360_ext.util.procs import running

from .conftest import END_OF_TURN_BIAS, SYSTEM, USER, merged, new_session, start_session_server

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ENGINE_LATENCY_S = 1.5
CLIENT_TIMEOUT_S = 1.0  # shorter than the engine: every first attempt times out, the client retries


def test_the_openai_clients_default_retries_keep_every_turn(log_dir) -> None:
    engine = start_engine(log_dir, name="slow-engine")
    server = start_session_server(log_dir, engine.url, "--r3", name="retry-session")
    with running(engine, server):
        faults = {"latency_s": ENGINE_LATENCY_S}
        httpx.post(engine.url + "/rl360/faults", json=faults, timeout=10).raise_for_status()
        session_id, base_url = new_session(server)
        client = openai.OpenAI(base_url=base_url, api_key="unused", timeout=CLIENT_TIMEOUT_S)
        assert client.max_retries == 2  # the official client's default, left as it is
        messages = [SYSTEM, USER]
        replies = []
        for turn in range(3):
            reply = client.chat.completions.create(
                model="p", messages=messages, max_tokens=6, logit_bias=END_OF_TURN_BIAS, temperature=1.0
            )
            replies.append(reply)
            messages = [
                *messages,
                reply.choices[0].message.model_dump(exclude_none=True),
                {"role": "user", "content": f"go on ({turn})"},
            ]
        sample = merged(server, session_id)
        facts = sample.metadata["session"]
        assert len(sample.turns) == 3, f"kept {len(sample.turns)} of 3 turns"
        assert facts["forks"] == [] and sample.metadata["merge"]["segments"] == 1
        metrics = httpx.get(server.url + "/metrics", timeout=10).text
        (replayed,) = (
            float(line.split()[1])
            for line in metrics.splitlines()
            if line.startswith("rl360_session_replayed_turns_total ")
        )
        assert replayed >= 3  # each turn's first attempt timed out and a retry got its recorded reply
        for reply, recorded in zip(replies, sample.turns, strict=True):
            assert reply.usage.completion_tokens == recorded["output_tokens"]


def test_a_restarted_server_answers_session_lost(log_dir, engine) -> None:
    port_flags = ("--max-sessions", "8")
    first = start_session_server(log_dir, engine.url, *port_flags, name="before-restart")
    with running(first):
        session_id, _ = new_session(first)
    second = start_session_server(log_dir, engine.url, *port_flags, name="after-restart")
    with running(second):
        url = f"{second.url}/sessions/{session_id}/v1/chat/completions"
        lost = httpx.post(url, json={"messages": [USER]}, timeout=30)
        assert lost.status_code == 410 and lost.json()["error"]["code"] == "session_lost"
        unknown = httpx.get(f"{second.url}/sessions/not-a-session-id-at-all/merged", timeout=30)
        assert unknown.status_code == 404 and unknown.json()["code"] == "unknown_session"  # Miles' shape


def test_the_bearer_token_from_a_file_guards_the_server(log_dir, engine, tmp_path) -> None:
    token_file = tmp_path / "session-token"
    token_file.write_text("t0ken-from-file\n")
    server = start_session_server(log_dir, engine.url, "--api-key-file", str(token_file), name="token")
    with running(server):
        assert httpx.get(server.url + "/health", timeout=10).status_code == 200
        assert httpx.post(server.url + "/sessions", json={}, timeout=10).status_code == 401
        headers = {"Authorization": "Bearer t0ken-from-file"}
        created = httpx.post(server.url + "/sessions", json={}, headers=headers, timeout=10).json()
        good = openai.OpenAI(base_url=created["base_url"], api_key="t0ken-from-file", max_retries=0)
        reply = good.chat.completions.create(model="p", messages=[USER], max_tokens=4)
        assert reply.choices[0].message is not None
        bad = openai.OpenAI(base_url=created["base_url"], api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            bad.chat.completions.create(model="p", messages=[USER], max_tokens=4)


def _poll_health(url: str, stop: threading.Event, latencies: list[float]) -> None:
    with httpx.Client(timeout=120) as http:
        while not stop.is_set():
            started = time.perf_counter()
            http.get(url + "/health").raise_for_status()
            latencies.append(time.perf_counter() - started)
            time.sleep(0.01)


def _p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[98] if len(values) >= 2 else values[0]


@pytest.mark.parametrize("limit", [None, 32 * 1024 * 1024], ids=["default-limit", "32MiB-limit"])
def test_health_stays_responsive_while_a_10mb_message_is_handled(log_dir, engine, limit) -> None:
    flags = () if limit is None else ("--max-request-bytes", str(limit))
    server = start_session_server(log_dir, engine.url, *flags, name=f"big-{limit}")
    with running(server):
        session_id, _ = new_session(server)
        big = {"role": "user", "content": ("fix the failing test in module.py " * 400_000)[:10_000_000]}
        stop, latencies = threading.Event(), []
        poller = threading.Thread(target=_poll_health, args=(server.url, stop, latencies))
        poller.start()
        time.sleep(0.3)
        started = time.perf_counter()
        response = httpx.post(
            f"{server.url}/sessions/{session_id}/v1/chat/completions",
            json={"messages": [big], "max_tokens": 4},
            timeout=600,
        )
        handled_s = time.perf_counter() - started
        stop.set()
        poller.join()
        p99, worst = _p99(latencies), max(latencies)
        print(
            f"\n10 MB message ({'default' if limit is None else limit} limit): HTTP {response.status_code} "
            f"in {handled_s:.2f} s; /health n={len(latencies)} p99={p99 * 1000:.1f} ms "
            f"max={worst * 1000:.1f} ms"
        )
        if limit is None:
            assert response.status_code == 413 and "8388608 bytes" in response.json()["error"]["message"]
        else:
            # over the tiny engine's context (32k tokens, /v1/models max_model_len) times its longest
            # token: refused before it is rendered or tokenized (issue 36), naming the message
            assert response.status_code == 400, response.text
            assert response.json()["error"]["param"] == "messages[0]"
        # the event loop never waited on the message: a loop blocked while it is handled answers one
        # /health only after the whole handling (p99 over these few polls ~ handled_s); the bound
        # grows with handled_s so a machine busy with other work does not fail a loop that was free
        assert p99 < max(0.5, handled_s / 4), (p99, handled_s)
        assert httpx.get(server.url + "/health", timeout=10).status_code == 200


def _peak_rss_kb(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:")))


def _send_head(url: str, head: bytes, chunk: bytes, limit: int) -> tuple[bytes, int]:
    """Send `head`, then `chunk` until the server answers (or `limit` bytes); (answer, bytes sent)."""
    host, port = url.removeprefix("http://").split(":")
    sent = 0
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(head)
        sock.setblocking(False)
        answer = b""
        deadline = time.monotonic() + 30
        while sent < limit and time.monotonic() < deadline and not answer:
            with contextlib.suppress(BlockingIOError):
                answer = sock.recv(65536)
            try:
                sent += sock.send(chunk)
            except BlockingIOError:
                time.sleep(0.001)
            except OSError:
                break
        sock.setblocking(True)
        with contextlib.suppress(OSError):
            answer += sock.recv(65536)
    return answer, sent


def test_an_oversized_head_costs_the_session_server_and_the_engine_under_1mb(log_dir, engine) -> None:
    """Issue 36: the head is capped at the protocol, before the token (431 and close)."""
    server = start_session_server(log_dir, engine.url, "--api-key", "k-36", name="heads-session")
    with running(server):
        targets = (("session", server, b"POST /sessions"), ("engine", engine, b"POST /generate"))
        for name, service, line in targets:
            before = _peak_rss_kb(service.pid)
            head = line + b" HTTP/1.1\r\nHost: x\r\nX-Big: "
            answer, sent = _send_head(service.url, head, b"a" * 65536, 64 << 20)
            grown = _peak_rss_kb(service.pid) - before
            print(f"\n{name}: 64 MB header line: {sent >> 10} KiB sent before the 431; peak RSS +{grown} kB")
            assert answer.startswith(b"HTTP/1.1 431"), answer[:200]
            assert grown < 1024, grown
            many = line + b" HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-%d: v\r\n" % i for i in range(20000))
            assert _send_head(service.url, many + b"\r\n", b"", 1)[0].startswith(b"HTTP/1.1 431")
        assert httpx.get(server.url + "/health", timeout=10).status_code == 200


def test_the_red_teams_appended_message_is_refused_before_it_is_tokenized(log_dir, engine) -> None:
    """Issue 36: a 7.8 MB message appended as a second turn was tokenized on the event loop
    (/health stalled 18-29 s); it is over the context x longest-token budget: 400 at once."""
    server = start_session_server(log_dir, engine.url, name="append-session")
    with running(server):
        session_id, _ = new_session(server)
        url = f"{server.url}/sessions/{session_id}/v1/chat/completions"
        first = httpx.post(url, json={"messages": [SYSTEM, USER], "max_tokens": 2}, timeout=60)
        history = [SYSTEM, USER, first.json()["choices"][0]["message"]]
        big = {"role": "user", "content": ("def f(x): return x  # " * 400_000)[:7_800_000]}
        started = time.perf_counter()
        response = httpx.post(url, json={"messages": [*history, big], "max_tokens": 2}, timeout=120)
        took = time.perf_counter() - started
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == "messages[3]"
        assert "before it is tokenized" in response.json()["error"]["message"]
        print(f"\n7.8 MB appended message: 400 in {took:.2f} s")
