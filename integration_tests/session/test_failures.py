"""Failures through real processes: engine 5xx (passed through), aborts, a dead engine, reject, limits."""

from __future__ import annotations

import subprocess
import time

import httpx
import openai
import pytest

from rl360_ext.local.services import start_engine
from rl360_ext.util.procs import rl360_argv, running

from .conftest import USER, merged, new_session, newline_after_end_token, session_client, start_session_server

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_engine_errors_pass_through_and_leave_no_turn(log_dir) -> None:
    engine = start_engine(log_dir, "--faults", "error_rate=1.0", name="faulty-engine")
    server = start_session_server(log_dir, engine.url, "--r3", name="faulty-session")
    with running(engine, server):
        session_id, base_url = new_session(server)
        with pytest.raises(openai.InternalServerError, match="injected fault") as err:
            session_client(base_url).chat.completions.create(model="p", messages=[USER], max_tokens=8)
        assert err.value.status_code == 503  # the engine's status and body, as Miles passes them
        assert merged(server, session_id).status == "FAILED"  # nothing recorded

        httpx.post(engine.url + "/rl360/faults", json={"error_rate": 0.0}, timeout=10).raise_for_status()
        # The retry of the failed turn is no history mismatch; a huge end-of-turn bias ends it at once.
        reply = session_client(base_url).chat.completions.create(
            model="p", messages=[USER], max_tokens=8, logit_bias={"2": 100}
        )
        sample = merged(server, session_id)
        assert len(sample.turns) == 1 and sample.metadata["session"]["forks"] == []
        assert sample.status == "COMPLETED"
        failed = {"turn": 0, "status": 503, "cause": "engine_failed"}
        assert sample.metadata["session"]["turn_errors"] == [failed]

        httpx.post(engine.url + "/rl360/faults", json={"abort_rate": 1.0}, timeout=10).raise_for_status()
        history = [
            USER,
            reply.choices[0].message.model_dump(exclude_none=True),
            {"role": "user", "content": "go"},
        ]
        session_client(base_url).chat.completions.create(model="p", messages=history, max_tokens=8)
        aborted = merged(server, session_id)
        assert aborted.status == "ABORTED" and aborted.turns[-1]["finish_reason"] == "abort"

        engine.stop()
        _, other_url = new_session(server)
        with pytest.raises(openai.InternalServerError, match="failed") as dead:
            session_client(other_url).chat.completions.create(model="p", messages=[USER], max_tokens=8)
        assert dead.value.status_code == 502
        metrics = httpx.get(server.url + "/metrics", timeout=10).text
        assert 'rl360_session_turn_errors_total{cause="engine_failed"} 2.0' in metrics


def test_reject_mode_and_limits(log_dir, engine) -> None:
    server = start_session_server(
        log_dir, engine.url, "--history-mismatch", "reject", "--max-sessions", "1", "--idle-ttl", "1",
        name="strict-session",
    )  # fmt: skip
    with running(server):
        session_id, base_url = new_session(server)
        client = session_client(base_url)
        reply = client.chat.completions.create(model="p", messages=[USER], max_tokens=8)
        edited = [
            {"role": "user", "content": "something else"},
            reply.choices[0].message.model_dump(exclude_none=True),
        ]
        with pytest.raises(openai.ConflictError, match=r"messages\[0\]"):
            client.chat.completions.create(model="p", messages=[*edited, USER], max_tokens=8)
        full = httpx.post(server.url + "/sessions", json={}, timeout=10)
        assert full.status_code == 429 and "max_sessions=1" in full.json()["error"]
        time.sleep(2.0)  # idle TTL 1 s; the sweeper runs every 0.25 s
        expired = httpx.get(f"{server.url}/sessions/{session_id}/merged", timeout=10)
        assert expired.status_code == 410 and "idle TTL" in expired.json()["error"]
        new_session(server)  # room again


def test_server_refuses_a_template_that_is_not_append_only(log_dir, engine, tmp_path) -> None:
    directory = str(newline_after_end_token(tmp_path / "tokenizer"))
    argv = rl360_argv("session", "serve", "--backend", engine.url, "--tokenizer", directory, "--port", "9")
    refused = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2
    assert "not append-only" in refused.stderr and "text-after-end-token" in refused.stderr

    server = start_session_server(
        log_dir, engine.url, "--allow-non-append-only", tokenizer_dir=directory, name="lenient-session"
    )
    with running(server):
        session_id, base_url = new_session(server)
        session_client(base_url).chat.completions.create(model="p", messages=[USER], max_tokens=4)
        sample = merged(server, session_id)
        assert sample.metadata["session"]["template"]["append_only"] is False
    assert f"session {session_id}: the chat template is not append-only" in server.log_tail(20000)
