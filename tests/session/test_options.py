"""`SessionServerConfig` is the single source of the session server's flags, defaults and help."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from rl360_ext.cli import session as cli
from rl360_ext.reference.engine.tokenizer import load_tiny_tokenizer
from rl360_ext.session import service
from rl360_ext.session.core import SessionCoreConfig
from rl360_ext.session.options import SessionServerConfig, default_of
from rl360_ext.util.fielddocs import field_docs, field_flags

OLD_FLAGS = [
    "--backend", "--tokenizer", "--host", "--port", "--r3", "--history-mismatch",
    "--allow-non-append-only", "--max-sessions", "--idle-ttl", "--model-name", "--r3-layers",
    "--r3-top-k", "--r3-experts", "--public-url", "--chat-template",
]  # fmt: skip


def _serve(monkeypatch: pytest.MonkeyPatch, *argv: str) -> tuple[Any, dict[str, Any]]:
    seen: dict[str, Any] = {}

    def fake_serve(options: SessionServerConfig, host: str, port: int) -> None:
        seen.update(options=options, host=host, port=port)

    monkeypatch.setattr(service, "serve", fake_serve)
    result = CliRunner().invoke(cli.app, list(argv))  # one command: typer runs it directly
    return result, seen


def test_every_field_has_a_docstring_and_a_flag() -> None:
    docs = field_docs(SessionServerConfig)
    assert set(docs) == {f.name for f in dataclasses.fields(SessionServerConfig)}
    assert all(docs.values())


def test_flags_keep_their_names_and_take_defaults_from_the_dataclass(monkeypatch) -> None:
    result, seen = _serve(monkeypatch, "--backend", "http://e:1", "--tokenizer", "/tok")
    assert result.exit_code == 0, result.output
    assert seen["options"] == SessionServerConfig(backend_url="http://e:1", tokenizer_dir="/tok")
    assert (seen["host"], seen["port"]) == ("127.0.0.1", 8100)
    helped = CliRunner().invoke(cli.app, ["--help"], env={"COLUMNS": "200"}).output
    for flag in [*OLD_FLAGS, "--engine-timeout", "--max-request-bytes", "--api-key", "--api-key-file"]:
        assert flag in helped


def test_flags_reach_the_options(monkeypatch) -> None:
    result, seen = _serve(
        monkeypatch,
        *("--backend", "http://e:1", "--tokenizer", "/tok", "--r3", "--idle-ttl", "5"),
        *("--r3-layers", "2", "--engine-timeout", "7.5", "--max-request-bytes", "1000", "--port", "9"),
    )
    assert result.exit_code == 0, result.output
    options = seen["options"]
    assert options.r3 and options.idle_ttl_s == 5.0 and options.routing_layers == 2
    assert options.engine_timeout_s == 7.5 and options.max_request_bytes == 1000 and seen["port"] == 9


def test_bad_flag_values_are_usage_errors(monkeypatch) -> None:
    base = ("--backend", "http://e:1", "--tokenizer", "/tok")
    for extra in (("--history-mismatch", "merge"), ("--max-sessions", "0"), ("--engine-timeout", "0")):
        result, seen = _serve(monkeypatch, *base, *extra)
        assert result.exit_code == 2 and seen == {}


def test_the_core_config_takes_its_defaults_from_the_options() -> None:
    config = SessionCoreConfig()
    for name in ("max_sessions", "idle_ttl_s", "history_mismatch", "r3", "samples_wire"):
        assert getattr(config, name) == default_of(name)
    assert default_of("engine_timeout_s") == 3600.0


def test_the_vocabulary_is_the_larger_of_tokenizer_and_config(tmp_path: Path) -> None:
    tokenizer = load_tiny_tokenizer()
    options = SessionServerConfig(backend_url="u", tokenizer_dir=str(tmp_path))
    assert service.resolve_vocab_size(tokenizer, options) == len(tokenizer)
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": len(tokenizer) + 64}))
    assert service.resolve_vocab_size(tokenizer, options) == len(tokenizer) + 64
    assert service.resolve_vocab_size(tokenizer, dataclasses.replace(options, vocab_size=9)) == 9


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    values=st.fixed_dictionaries(
        {"backend_url": st.just("http://e:1"), "tokenizer_dir": st.just("/tok")},
        optional={
            "r3": st.booleans(),
            "allow_non_append_only": st.booleans(),
            "history_mismatch": st.sampled_from(["fork", "reject"]),
            "max_sessions": st.integers(1, 10**6),
            "idle_ttl_s": st.floats(0.001, 1e6, allow_nan=False),
            "model_name": st.none() | st.text("abcXYZ019._/", min_size=1, max_size=12),
            "routing_layers": st.none() | st.integers(1, 128),
            "routing_top_k": st.integers(1, 16),
            "engine_timeout_s": st.floats(0.001, 1e5, allow_nan=False),
        },
    )
)
def test_field_flags_parse_back_to_the_same_options(monkeypatch, values: dict[str, Any]) -> None:
    result, seen = _serve(monkeypatch, *field_flags(SessionServerConfig, values))
    assert result.exit_code == 0, result.output
    assert seen["options"] == SessionServerConfig(**values)


def test_field_flags_refuse_what_no_flag_says() -> None:
    with pytest.raises(ValueError, match="'max_sesions' is not a SessionServerConfig field"):
        field_flags(SessionServerConfig, {"max_sesions": 3})

    @dataclasses.dataclass
    class Switches:
        on: bool = True

    with pytest.raises(ValueError, match="on: no flag turns it off"):
        field_flags(Switches, {"on": False})
    assert field_flags(Switches, {"on": True}) == ("--on",)
