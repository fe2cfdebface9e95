"""Agent configs: utility agents get no model, terminus-2 and import-path agents get the session URL;
the agent table is fixed at start and a request only looks names up in it."""

from __future__ import annotations

import pytest

from rl360_ext.harbor import agents
from rl360_ext.local.bench.fault_matrix import DEMO_AGENT
from rl360_ext.local.fixtures.agents import request_params

TABLE = agents.AgentTable([DEMO_AGENT, f"demo={DEMO_AGENT}"])


def entry(name: str) -> agents.AgentEntry:
    found = TABLE.get(name)
    assert found is not None
    return found


SETTINGS = agents.AgentModelConfig(
    base_url="http://127.0.0.1:9/sessions/abc/v1",
    model="policy",
    sampling_params={"temperature": 0.7, "top_p": 0.9, "top_k": 20, "max_new_tokens": 256},
    max_seq_len=4096,
)


def test_utility_agents_get_no_model() -> None:
    config = agents.agent_config(entry("oracle"), SETTINGS, None, {}, timeout_s=30, setup_timeout_s=5)
    assert (config.name, config.model_name, config.base_url) == ("oracle", None, None)
    assert (config.override_timeout_sec, config.override_setup_timeout_sec) == (30, 5)


def test_terminus_2_talks_to_the_session_through_litellm() -> None:
    config = agents.agent_config(entry("terminus-2"), SETTINGS, 6, {"enable_summarize": False}, 100, 10)
    assert config.model_name == "openai/policy"
    kwargs = config.kwargs
    assert kwargs["api_base"] == SETTINGS.base_url
    assert kwargs["temperature"] == 0.7 and kwargs["max_turns"] == 6
    assert kwargs["llm_call_kwargs"] == {"top_p": 0.9, "top_k": 20, "max_tokens": 256}
    assert kwargs["model_info"]["max_input_tokens"] == 4096
    assert kwargs["record_terminal_session"] is False and kwargs["enable_summarize"] is False


def test_import_path_agents_get_the_rl360_kwargs() -> None:
    config = agents.agent_config(entry("demo"), SETTINGS, 3, {"command_timeout_s": 5}, 100, 10)
    assert config.import_path == DEMO_AGENT and config.name is None
    assert config.kwargs["api_base"] == SETTINGS.base_url and config.kwargs["api_model"] == "policy"
    assert config.kwargs["max_turns"] == 3 and config.kwargs["command_timeout_s"] == 5


def test_model_agents_need_a_url() -> None:
    missing = agents.AgentModelConfig(None, "policy", {}, None)
    with pytest.raises(ValueError, match="base_url"):
        agents.agent_config(entry("terminus-2"), missing, None, {}, 10, 10)


@pytest.mark.parametrize(
    "spec", ["no-such-agent", "nowhere.module:Agent", "rl360_ext.harbor.outcome:Outcome", "x=", "=oracle"]
)
def test_unknown_agents_are_refused_at_start(spec: str) -> None:
    with pytest.raises(agents.UnknownAgent):
        agents.AgentTable([spec])


def test_the_table_holds_the_defaults_and_what_the_operator_named() -> None:
    assert TABLE.names == sorted(["oracle", "nop", "terminus-2", DEMO_AGENT, "demo"])
    assert TABLE.default == DEMO_AGENT  # the first --agent
    assert agents.AgentTable().default == "oracle"
    assert agents.AgentTable(["claude-code"], default="nop").default == "nop"
    assert entry("demo").import_path == DEMO_AGENT and entry("nop").harbor_name == "nop"
    assert not entry("nop").needs_model and entry("terminus-2").needs_model
    with pytest.raises(agents.UnknownAgent, match="default agent"):
        agents.AgentTable(default="demo")


def test_a_request_never_imports_what_it_names(monkeypatch: pytest.MonkeyPatch) -> None:
    imported: list[str] = []
    monkeypatch.setattr(agents, "import_class", lambda path, **_: imported.append(path))
    assert TABLE.get("rl360_ext.harbor.outcome:Outcome") is None
    assert TABLE.get("os:system") is None and imported == []


@pytest.mark.parametrize(
    "key", ["logs_dir", "model_name", "extra_env", "load_trajectory", "task_dir", "mcp_servers"]
)
def test_harbor_s_own_kwargs_are_reserved(key: str) -> None:
    assert agents.reserved_kwargs({key: 1, "max_turns": 2}) == [key]
    with pytest.raises(ValueError, match=key):
        agents.agent_config(entry("oracle"), SETTINGS, None, {key: 1}, 10, 10)


def test_demo_agent_maps_sglang_sampling_params() -> None:
    params, extra = request_params({"temperature": 1.0, "max_new_tokens": 64, "top_k": 5, "seed": 3})
    assert params == {"temperature": 1.0, "seed": 3, "max_tokens": 64}
    assert extra == {"top_k": 5}


def test_an_agent_class_that_declares_itself_model_free_runs_like_oracle() -> None:
    from rl360_ext.harbor.canaries import CANARY_AGENTS

    (name, path), *_ = CANARY_AGENTS.items()
    canary = agents.parse_entry(f"{name}={path}")
    assert canary.model_free and not canary.needs_model
    no_model = agents.AgentModelConfig(None, None, {}, None)
    config = agents.agent_config(canary, no_model, 4, {"reward": 2.0}, timeout_s=30, setup_timeout_s=5)
    assert (config.import_path, config.model_name, config.kwargs) == (path, None, {"reward": 2.0})
    assert agents.parse_entry(f"demo={DEMO_AGENT}").needs_model
