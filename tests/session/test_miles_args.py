"""Miles' session-server flags -> rl360's SessionServerConfig (`rl360_ext.session.miles_args`)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from rl360_ext.session.miles_args import MilesFlagError, service_options, session_ports


def _args(**overrides: Any) -> SimpleNamespace:
    """The flags with Miles' parser defaults (miles/utils/arguments.py at the tested commit)."""
    defaults: dict[str, Any] = {
        "hf_checkpoint": "/models/qwen",
        "chat_template_path": None,
        "apply_chat_template_kwargs": {},
        "use_rollout_routing_replay": False,
        "use_rollout_indexer_replay": False,
        "miles_router_timeout": None,
        "use_session_server": True,
        "session_server_port": None,
        "tito_model": "default",
        "session_sample_picker_path": "miles.rollout.session.v2.picker_hub.drop_retries",
        "session_sample_postprocessor_path": "miles.rollout.session.v2.postprocessor_hub.default_postprocess",
        "lora_rank": 0,
        "lora_adapter_path": None,
        "sglang_router_ip": "10.0.0.2",
        "sglang_router_port": 3000,
    }
    return SimpleNamespace(**{**defaults, **overrides})


def test_the_stock_flags_map_to_serve_options() -> None:
    options = service_options(
        _args(
            use_session_server="v2",
            use_rollout_routing_replay=True,
            miles_router_timeout=30,
            chat_template_path="/t.jinja",
            session_server_instance_id="ab" * 16,
        )
    )
    assert (options.backend_url, options.tokenizer_dir, options.chat_template) == (
        "http://10.0.0.2:3000",
        "/models/qwen",
        "/t.jinja",
    )
    assert (options.r3, options.engine_timeout_s, options.samples_wire, options.instance_id) == (
        True,
        30.0,
        "v2",
        "ab" * 16,
    )
    defaults = service_options(_args(), backend_url="http://gw:1")
    assert (defaults.backend_url, defaults.samples_wire, defaults.engine_timeout_s) == (
        "http://gw:1",
        "v1",
        600.0,
    )
    assert defaults.instance_id is None


@pytest.mark.parametrize(
    ("overrides", "flag"),
    [
        ({"apply_chat_template_kwargs": {"enable_thinking": False}}, "--apply-chat-template-kwargs"),
        ({"use_rollout_indexer_replay": True}, "--use-rollout-indexer-replay"),
        ({"lora_rank": 8}, "--lora-rank"),
        ({"tito_model": "qwen3"}, "--tito-model qwen3"),
        ({"session_sample_picker_path": "my.picker"}, "--session-sample-picker-path my.picker"),
        ({"hf_checkpoint": None}, "--hf-checkpoint"),
        ({"sglang_router_ip": None}, "--sglang-router-ip"),
    ],
)
def test_flags_rl360_cannot_honour_are_refused_by_name(overrides: dict[str, Any], flag: str) -> None:
    with pytest.raises(MilesFlagError, match=flag):
        service_options(_args(**overrides))


def test_session_ports_follow_miles_rule() -> None:
    assert session_ports(_args(session_server_port=[30000])) == [30000]
    assert session_ports(_args(session_server_port=[30000, 30003])) == [30000, 30001, 30002]
    for bad in (None, [30003, 30000], [1, 2, 3]):
        with pytest.raises(MilesFlagError, match="--session-server-port"):
            session_ports(_args(session_server_port=bad))
