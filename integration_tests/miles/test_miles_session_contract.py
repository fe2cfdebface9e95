"""Miles' own HTTP session-server tests, run against `rl360 session serve` (the drop-in contract).

Miles defines its session server's external contract in `tests/fast/router/test_sessions.py`: the
classes there drive a server purely over HTTP through a class-scoped `router_env` fixture
(`url`: the server, `backend`: Miles' `MockSGLangServer`). This module imports those classes from
`MILES_SRC` unchanged (no copy) and supplies its own `router_env`: a real `rl360 session serve`
subprocess in front of Miles' mock backend, extended (not patched) by `mock_backend.py` with what
real SGLang also serves (`output_ids`, `/v1/models`). Both use the tiny engine's tokenizer (a
Qwen-style chat template), which the session server renders with.

Where rl360 differs on purpose, the test is in `EXPECTED_FAILURES` with its reason and runs as a
strict xfail: a Miles upgrade that changes the contract shows up as a new failure, and an
expected failure that starts passing shows up too. docs/session.md keeps the same list as a table
(Miles test, why rl360 differs, what a Miles user sees).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

from integration_tests.miles.mock_backend import sglang_like_mock
from rl360_ext.reference.engine.tokenizer import default_tokenizer_dir
from rl360_ext.util.procs import free_port, rl360_argv, start_service

MILES_TEST_FILE = Path("tests") / "fast" / "router" / "test_sessions.py"

_FORWARDING = (
    "rl360 sends token ids to the engine's native /generate instead of forwarding "
    "/v1/chat/completions with input_ids, so a test that rewrites the backend's chat-completions "
    "reply or reads the forwarded chat body does not reach rl360"
)
_RECORDS = (
    "rl360's records describe the /generate call it made (request.input_ids, "
    "response.meta_info), not a forwarded chat-completions exchange"
)
EXPECTED_FAILURES: dict[str, str] = {
    "TestSessionProxy::test_chat_malformed_json_body_returns_400": (
        "rl360 answers an OpenAI-style error object ({'error': {'message', 'type', 'param', 'code'}}) "
        "that OpenAI clients and agents parse; Miles answers {'error': '<text>'}"
    ),
    "TestSessionProxy::test_chat_template_kwargs_override_reaches_render_and_backend": (
        "rl360 renders every turn with the server's one append-only template; per-request "
        "chat_template_kwargs would change how earlier turns render. " + _FORWARDING
    ),
    "TestSessionProxy::test_chat_upstream_null_message_returns_502": _FORWARDING,
    "TestSessionProxy::test_chat_response_strips_replay_payloads_but_record_keeps_them": (
        "rl360 replies carry no meta_info at all (routing rows and logprobs stay on the server for "
        "the merged sample). " + _RECORDS
    ),
    "TestChatFakeStreaming::test_stream_passes_through_usage_and_length_finish_reason": _FORWARDING,
}


def _load_miles_tests() -> ModuleType | None:
    """Miles' test_sessions.py as a module of its own name (rl360 has a `tests` package too)."""
    src = os.environ.get("MILES_SRC")
    if not src:
        return None
    path = Path(src).expanduser().resolve() / MILES_TEST_FILE
    if str(path.parents[3]) not in sys.path:
        sys.path.append(str(path.parents[3]))
    try:
        spec = importlib.util.spec_from_file_location("miles_tests_fast_router_test_sessions", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except (ImportError, FileNotFoundError):
        return None  # conftest skips (or, under run.sh, errors) with the reason
    return module


_miles = _load_miles_tests()
if _miles is not None:
    TestSessionRoutes = _miles.TestSessionRoutes
    TestSessionProxy = _miles.TestSessionProxy
    TestChatFakeStreaming = _miles.TestChatFakeStreaming
else:

    def test_miles_session_contract() -> None:
        """Stands in for Miles' classes when MILES_SRC is unset (conftest skips it with the reason)."""
        raise AssertionError("MILES_SRC is not set")


@pytest.fixture(autouse=True)
def _expected_failures(request: pytest.FixtureRequest) -> None:
    name = "::".join(request.node.nodeid.split("::")[1:])
    reason = EXPECTED_FAILURES.get(name)
    if reason is not None:
        request.applymarker(pytest.mark.xfail(reason=reason, strict=True))


@pytest.fixture(scope="class")
def router_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    """Miles' `router_env` contract: `url` of the session server, `backend` the mock it calls."""
    from miles.utils.test_utils.mock_sglang_server import ProcessResult

    tokenizer = str(default_tokenizer_dir())
    backend = sglang_like_mock(tokenizer, lambda prompt: ProcessResult(text=f"echo: {prompt}"))
    backend.start()
    try:
        port = free_port()
        argv = rl360_argv(
            "session", "serve", "--backend", backend.url, "--tokenizer", tokenizer,
            "--host", "127.0.0.1", "--port", str(port),
        )  # fmt: skip
        server = start_service("session", argv, port, tmp_path_factory.mktemp("miles-contract"))
        try:
            yield SimpleNamespace(url=server.url, backend=backend)
        finally:
            server.stop()
    finally:
        backend.stop()
