"""Schema fuzzing (schemathesis) of the three servers: no input, however malformed, gets a 5xx.

Every operation in each server's /openapi.json is fuzzed with positive and negative cases (100
each) and positive cases with a full-text string (lone surrogates, NUL; 20 each), within a time
budget per server; the assertion is zero 5xx and zero dropped connections.
Operations whose body has no schema yet are still fuzzed (paths, queries, headers) and listed in
the report, so a request model added later is fuzzed without touching this file.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import httpx
import pytest

from rl360_ext.util.procs import Service

from .harness import FuzzReport, fuzz_server

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MAX_EXAMPLES = 100
BUDGET_S = 420.0


def _check(report: FuzzReport, log_dir: Path) -> None:
    (log_dir / f"fuzz-{report.server}.json").write_text(json.dumps(dataclasses.asdict(report), indent=2))
    print("\n" + report.summary())
    if report.bodyless:
        print(f"  {report.server}: POST routes that declare no body: {', '.join(report.bodyless)}")
    assert report.cases > 0 and report.text_cases > 0
    assert report.server_errors == 0 and report.transport_errors == 0, "\n".join(report.failures)


def test_fuzz_tiny_engine(engine: Service, log_dir: Path) -> None:
    def reset(label: str) -> None:
        """A fuzzed pause would hold every later /generate; injected faults would answer them 503."""
        if label == "POST /pause_generation":
            httpx.post(engine.url + "/continue_generation", json={}, timeout=10)
        elif label == "POST /rl360/faults":
            httpx.post(engine.url + "/rl360/faults", json={}, timeout=10)

    report = fuzz_server("tiny-engine", engine.url, max_examples=MAX_EXAMPLES, budget_s=BUDGET_S, reset=reset)
    assert "POST /generate" in report.body_schemas
    assert set(report.bodyless) <= {"POST /health", "POST /health_generate", "POST /flush_cache"}  # no body
    _check(report, log_dir)


def test_fuzz_session_server(session_server: Service, log_dir: Path) -> None:
    report = fuzz_server("session-server", session_server.url, max_examples=MAX_EXAMPLES, budget_s=BUDGET_S)
    _check(report, log_dir)


def test_fuzz_harbor_server(harbor_server: Service, log_dir: Path) -> None:
    report = fuzz_server("harbor", harbor_server.url, max_examples=MAX_EXAMPLES, budget_s=BUDGET_S)
    assert "POST /run" in report.body_schemas
    _check(report, log_dir)
