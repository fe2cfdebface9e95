"""Assembling a server: the startup append-only check and resolving the R3 routing shape."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from rl360_ext.reference.engine.tokenizer import chat_template, default_tokenizer_dir, write_tokenizer_dir
from rl360_ext.session.samples.routing import RoutingShape
from rl360_ext.session.service import (
    ServiceStartupError,
    SessionServerConfig,
    build_core,
    resolve_routing_shape,
)

UNREACHABLE = "http://127.0.0.1:9"


def newline_after_end_token(directory: Path) -> Path:
    """The reference tokenizer with a template that renders "\\n" after <|im_end|> (not append-only)."""
    write_tokenizer_dir(directory)
    config = json.loads((directory / "tokenizer_config.json").read_text())
    template = chat_template()
    patched = template.replace(
        "<|im_end|>\n{%- endif -%}\n{%- endfor -%}", "<|im_end|>{{ '\\n' }}\n{%- endif -%}\n{%- endfor -%}"
    )
    assert patched != template
    config["chat_template"] = patched
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


def test_the_reference_template_passes_and_its_facts_are_recorded() -> None:
    core = build_core(
        SessionServerConfig(backend_url=UNREACHABLE, tokenizer_dir=str(default_tokenizer_dir()))
    )
    facts = core.config.template_facts
    assert facts["append_only"] is True and facts["end_token"] == "<|im_end|>" and facts["violations"] == []
    assert facts["incremental_suffix"] is True and core.tito.renderer.incremental  # decided at start
    assert (
        core.session_facts(core.create())["template"]["chat_template_sha256"] == facts["chat_template_sha256"]
    )


def test_the_incremental_probe_runs_once_at_start_and_the_check_reports_it(monkeypatch) -> None:
    from rl360_ext.templates import render

    calls: list[object] = []
    probe = render.incremental_probe

    def counted(renderer, *args, **kwargs):
        calls.append(renderer)
        return probe(renderer, *args, **kwargs)

    monkeypatch.setattr(render, "incremental_probe", counted)
    core = build_core(
        SessionServerConfig(backend_url=UNREACHABLE, tokenizer_dir=str(default_tokenizer_dir()))
    )
    assert calls == [core.tito.renderer]  # the checker used the server's renderer: one probe
    assert core.config.template_facts["incremental_suffix"] is core.tito.renderer.incremental is True


def test_a_template_the_checker_rejects_stops_the_server_unless_allowed(tmp_path, caplog) -> None:
    directory = str(newline_after_end_token(tmp_path / "tok"))
    with pytest.raises(ServiceStartupError, match="text-after-end-token") as refused:
        build_core(SessionServerConfig(backend_url=UNREACHABLE, tokenizer_dir=directory))
    assert "--allow-non-append-only" in str(refused.value)
    core = build_core(
        SessionServerConfig(backend_url=UNREACHABLE, tokenizer_dir=directory, allow_non_append_only=True)
    )
    assert core.config.template_append_only is False
    with caplog.at_level(logging.WARNING, logger="rl360.session"):
        session = core.create()
    assert f"session {session.id}: the chat template is not append-only" in caplog.text


def test_routing_shape_from_options_config_json_or_a_clear_error(tmp_path) -> None:
    base = {"backend_url": UNREACHABLE, "tokenizer_dir": str(tmp_path), "r3": True}
    assert resolve_routing_shape(SessionServerConfig(**{**base, "r3": False})) is None
    explicit = {"routing_layers": 61, "routing_top_k": 8, "routing_experts": 384}
    assert resolve_routing_shape(SessionServerConfig(**base, **explicit)) == RoutingShape(61, 8, 384)
    with pytest.raises(ServiceStartupError, match="--r3-layers"):
        resolve_routing_shape(SessionServerConfig(**base))
    (tmp_path / "config.json").write_text(
        json.dumps({"num_hidden_layers": 4, "num_experts_per_tok": 2, "num_experts": 8})
    )
    assert resolve_routing_shape(SessionServerConfig(**base, routing_top_k=1)) == RoutingShape(4, 1, 8)
