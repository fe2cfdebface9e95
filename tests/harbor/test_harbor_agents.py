"""Agent configs: utility agents get no model, terminus-2 and import-path agents get the session URL."""

from __future__ import annotations

import pytest

from rl360_ext.harbor import agents
from rl360_ext.local.agents import request_params

SETTINGS = agents.ModelSettings(
    base_url="http://127.0.0.1:9/sessions/abc/v1",
    model="policy",
    sampling_params={"temperature": 0.7, "top_p": 0.9, "top_k": 20, "max_new_tokens": 256},
    max_seq_len=4096,
)


def test_utility_agents_get_no_model() -> None:
    config = agents.agent_config("oracle", SETTINGS, None, {}, timeout_s=30, setup_timeout_s=5)
    assert (config.name, config.model_name, config.base_url) == ("oracle", None, None)
    assert (config.override_timeout_sec, config.override_setup_timeout_sec) == (30, 5)


def test_terminus_2_talks_to_the_session_through_litellm() -> None:
    config = agents.agent_config("terminus-2", SETTINGS, 6, {"enable_summarize": False}, 100, 10)
    assert config.model_name == "openai/policy"
    kwargs = config.kwargs
    assert kwargs["api_base"] == SETTINGS.base_url
    assert kwargs["temperature"] == 0.7 and kwargs["max_turns"] == 6
    assert kwargs["llm_call_kwargs"] == {"top_p": 0.9, "top_k": 20, "max_tokens": 256}
    assert kwargs["model_info"]["max_input_tokens"] == 4096
    assert kwargs["record_terminal_session"] is False and kwargs["enable_summarize"] is False


def test_import_path_agents_get_the_rl360_kwargs() -> None:
    config = agents.agent_config(agents.DEMO_AGENT, SETTINGS, 3, {"command_timeout_s": 5}, 100, 10)
    assert config.import_path == agents.DEMO_AGENT and config.name is None
    assert config.kwargs["api_base"] == SETTINGS.base_url and config.kwargs["api_model"] == "policy"
    assert config.kwargs["max_turns"] == 3 and config.kwargs["command_timeout_s"] == 5


def test_model_agents_need_a_url() -> None:
    missing = agents.ModelSettings(None, "policy", {}, None)
    with pytest.raises(ValueError, match="base_url"):
        agents.agent_config("terminus-2", missing, None, {}, 10, 10)


@pytest.mark.parametrize(
    "spec", ["no-such-agent", "nowhere.module:Agent", "rl360_ext.harbor.outcome:Outcome"]
)
def test_unknown_agents_are_rejected(spec: str) -> None:
    with pytest.raises(agents.UnknownAgent):
        agents.validate_agent(spec)


def test_known_agents_validate() -> None:
    for spec in ("oracle", "nop", "terminus-2", agents.DEMO_AGENT):
        assert agents.validate_agent(spec) == spec
    assert not agents.needs_model("nop") and agents.needs_model("terminus-2")


def test_demo_agent_maps_sglang_sampling_params() -> None:
    params, extra = request_params({"temperature": 1.0, "max_new_tokens": 64, "top_k": 5, "seed": 3})
    assert params == {"temperature": 1.0, "seed": 3, "max_tokens": 64}
    assert extra == {"top_k": 5}
