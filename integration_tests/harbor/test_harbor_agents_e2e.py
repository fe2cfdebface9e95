"""Model-driven agents through the /run server: Harbor's terminus-2 and rl360's demo agent talk to a
real session server in front of the tiny engine (random text, so they do not solve the task: the
checks are that the trial ran through our path and was classified as a verifier-graded failure)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from harbor.models.agent.context import AgentContext
from harbor.models.task.config import EnvironmentConfig, NetworkMode
from harbor.models.trial.paths import TrialPaths

from integration_tests.harbor.conftest import sandbox_root
from rl360_ext.harbor.envs.bwrap import BwrapEnvironment
from rl360_ext.local.fixtures import agents as demo_agent
from rl360_ext.local.fixtures import tasks_root as example_tasks_root
from rl360_ext.local.services import start_engine
from rl360_ext.reference.engine.tokenizer import default_tokenizer_dir
from rl360_ext.util.procs import Service, free_port, rl360_argv, start_service

pytestmark = [pytest.mark.integration, pytest.mark.slow]
SAMPLING = {"temperature": 1.0, "max_new_tokens": 48}


@pytest.fixture(scope="module")
def stack(
    harbor_server: Callable[..., Any], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Service, Service]]:
    logs = tmp_path_factory.mktemp("agents-logs")
    engine = start_engine(logs)
    port = free_port()
    session_argv = rl360_argv(
        "session", "serve", "--backend", engine.url, "--tokenizer", str(default_tokenizer_dir()),
        "--host", "127.0.0.1", "--port", str(port),
    )  # fmt: skip
    try:
        session = start_service("session", session_argv, port, logs)
        flags = (
            "--agent",
            "terminus-2",
            "--agent",
            demo_agent.BashToolAgent.import_path(),
            "--max-turns",
            "2",
            "--env-setup-s",
            "20",
            "--agent-setup-s",
            "20",
        )
        with harbor_server(logs, *flags, "--margin-s", "5", "--min-agent-s", "5") as harbor:
            yield session, harbor
        session.stop()
    finally:
        engine.stop()


def run_through_session(
    session: Service, harbor: Service, **extra: Any
) -> tuple[dict[str, Any], dict[str, Any]]:
    created = httpx.post(session.url + "/sessions", json={}, timeout=10).json()
    body = {
        "task": "fix-mean",
        "deadline_s": 240,
        "base_url": created["base_url"],
        "model": "rl360-policy",
        "sampling_params": SAMPLING,
        "session_id": created["session_id"],
        "session_server_instance_id": "e2e",
        **extra,
    }
    response = httpx.post(harbor.url + "/run", json=body, timeout=300)
    assert response.status_code == 200, response.text
    merged = httpx.get(
        f"{session.url}/sessions/{created['session_id']}/merged", params={"format": "json"}, timeout=30
    )
    assert merged.status_code == 200, merged.text
    return response.json(), merged.json()


def test_terminus_2_runs_through_the_session_server(stack: tuple[Service, Service]) -> None:
    result, merged = run_through_session(*stack)
    assert result["agent"] == "terminus-2"
    assert (result["reward"], result["reward_source"], result["failure_cause"]) == (0.0, "verifier", None), (
        result
    )
    assert result["agent_metrics"]["turns"] == 2 and result["agent_metrics"]["input_tokens"] > 0
    assert len(merged["tokens"]) > result["agent_metrics"]["output_tokens"] > 0  # the session saw the calls


def test_the_demo_agent_runs_through_the_session_server(stack: tuple[Service, Service]) -> None:
    result, merged = run_through_session(
        *stack, agent=demo_agent.BashToolAgent.import_path(), agent_kwargs={"max_turns": 2}
    )
    assert result["reward_source"] == "verifier" and result["reward"] in (0.0, 1.0), result
    assert 1 <= result["agent_metrics"]["turns"] <= 2
    assert len(merged["tokens"]) > 0


def scripted_model(replies: list[dict[str, Any]], seen: list[dict[str, Any]]) -> httpx.MockTransport:
    """A stand-in for a model provider: returns the scripted assistant turns in order."""

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        message = replies[len(seen) - 1]
        body = {
            "id": f"c{len(seen)}",
            "object": "chat.completion",
            "created": 0,
            "model": "scripted",
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        }
        return httpx.Response(200, json=body)

    return httpx.MockTransport(handle)


async def test_the_demo_agent_runs_its_bash_tool_in_the_sandbox(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fix = "printf 'def mean(xs):\\n    return sum(xs) / len(xs)\\n' > /app/stats.py && echo fixed"
    call = {
        "id": "t1",
        "type": "function",
        "function": {"name": "bash", "arguments": json.dumps({"command": fix})},
    }
    replies = [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "assistant", "content": "Done."},
    ]
    seen: list[dict[str, Any]] = []
    real_client = openai.AsyncOpenAI
    transport = scripted_model(replies, seen)
    monkeypatch.setattr(
        demo_agent.openai,
        "AsyncOpenAI",
        lambda **kw: real_client(**kw, http_client=httpx.AsyncClient(transport=transport)),
    )
    task = example_tasks_root() / "fix-mean"
    trial_paths = TrialPaths(tmp_path / "trial")
    trial_paths.mkdir()
    env = BwrapEnvironment(
        environment_dir=task / "environment",
        environment_name="fix-mean",
        session_id="demo-agent-probe",
        trial_paths=trial_paths,
        task_env_config=EnvironmentConfig(network_mode=NetworkMode.NO_NETWORK, cpus=1, memory_mb=512),
        sandbox_root=str(sandbox_root(tmp_path)),
    )
    agent = demo_agent.BashToolAgent(
        trial_paths.agent_dir, api_base="http://model/v1", api_model="m", max_turns=4
    )
    context = AgentContext()
    await env.start(force_build=False)
    try:
        await agent.setup(env)
        await agent.run((task / "instruction.md").read_text(), env, context)
        await env.upload_dir(task / "tests", "/tests")
        graded = await env.exec("bash /tests/test.sh && cat /logs/verifier/reward.txt")
    finally:
        await env.stop(delete=True)
    assert graded.stdout.strip() == "1"
    assert context.metadata == {"turns": 2, "stop": "answered"} and context.n_input_tokens == 20
    tool_result = seen[1]["messages"][-1]
    assert tool_result["role"] == "tool" and tool_result["tool_call_id"] == "t1"
    assert "exit code: 0" in tool_result["content"] and "fixed" in tool_result["content"]
    assert seen[0]["tools"][0]["function"]["name"] == "bash"
