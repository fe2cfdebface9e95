"""The agent function's pure parts: the /run body, and the mapping from an answer (or none) to metadata."""

from __future__ import annotations

import argparse
import dataclasses
import json
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl360_ext.outcomes.provenance import ATTEMPT_CLASS
from rl360_ext.outcomes.verdict import attempt_class_of
from rl360_ext.rollout import agent
from rl360_ext.rollout.agent import (
    AgentConfigError,
    build_run_body,
    failure_metadata,
    response_metadata,
    result_metadata,
)
from rl360_ext.rollout.config import AgentConfig, env_name

SETTINGS = AgentConfig(harbor_url="http://harbor:8765", deadline_s=600.0)


def verifier_answer(reward: float = 1.0, **fields: object) -> dict:
    """A /run answer as the rl360 Harbor server sends it: the fields and its verdict on them."""
    answer = {
        "reward": reward,
        "rewards": {"reward": reward},
        "reward_source": "verifier",
        "failure_cause": None,
        "exception_type": None,
        "phase_timings": {"queue": 0.1, "agent": 2.0, "verifier": 0.5},
        "agent_metrics": {"turns": 3},
        "placement": {"node_label": "local", "image_group": "py"},
        **fields,
    }
    return {**answer, ATTEMPT_CLASS: attempt_class_of(answer)}


def test_run_body_carries_the_session_and_the_remaining_deadline() -> None:
    metadata = {
        "task": "fizzbuzz",
        "session_id": "s1",
        "session_server_instance_id": "inst",
        "max_seq_len": 4096,
        "deadline_s": 123.5,
        "unrelated": "not sent",
    }
    body = build_run_body(
        AgentConfig(harbor_url="x", agent="oracle"), "http://s:1/sessions/s1/", {"max_tokens": 8}, metadata
    )
    assert body == {
        "task": "fizzbuzz",
        "deadline_s": 123.5,
        "base_url": "http://s:1/sessions/s1/v1",
        "model": "rl360-policy",
        "sampling_params": {"max_tokens": 8},
        "session_id": "s1",
        "session_server_instance_id": "inst",
        "max_seq_len": 4096,
        "agent": "oracle",
    }


def test_run_body_defaults_to_the_configured_deadline_and_the_servers_agent() -> None:
    body = build_run_body(SETTINGS, "http://s:1/sessions/a", {}, {"task": "t", "max_seq_len": None})
    assert body["deadline_s"] == 600.0
    assert "agent" not in body and "max_seq_len" not in body and "session_id" not in body


def test_run_body_names_the_missing_task_key() -> None:
    with pytest.raises(AgentConfigError, match=r"metadata\['instance'\].*--rl360-task-key"):
        build_run_body(replace_key("instance"), "http://s", {}, {"task": "t"})
    with pytest.raises(AgentConfigError, match="deadline_s"):
        build_run_body(SETTINGS, "http://s", {}, {"task": "t", "deadline_s": 0})


def replace_key(task_key: str) -> AgentConfig:
    return AgentConfig(harbor_url="x", task_key=task_key)


def test_a_verifier_reward_is_kept_with_its_provenance() -> None:
    meta = result_metadata(verifier_answer(0.0))
    assert (meta["reward"], meta["reward_source"], meta["attempt_class"]) == (0.0, "verifier", "valid")
    assert meta["exit_status"] == "completed"
    assert meta["phase_timings"]["agent"] == 2.0
    assert meta["placement"] == {"node_label": "local", "image_group": "py"}


def test_a_reward_next_to_an_infra_failure_is_dropped() -> None:
    meta = result_metadata(verifier_answer(1.0, failure_cause="verifier_timeout"))
    assert (meta["reward"], meta["rewards"], meta["attempt_class"]) == (None, None, "infra:verifier_timeout")
    assert meta["exit_status"] == "verifier_timeout"


def test_agent_timeout_follows_the_policy() -> None:
    timed_out = verifier_answer(0.0, exception_type="AgentTimeoutError")
    assert result_metadata(timed_out, "score")["attempt_class"] == "valid"
    masked = result_metadata(timed_out, "mask")
    assert (masked["attempt_class"], masked["reward"]) == ("infra:agent_timeout", None)


@pytest.mark.parametrize(
    ("status", "body", "cause", "attempt_class"),
    [
        (
            422,
            {"detail": [{"loc": ["body", "task"], "msg": "no such task"}]},
            "run_rejected",
            "infra:unclassified",
        ),
        (401, {"detail": "missing or wrong bearer token"}, "run_rejected", "infra:unclassified"),
        (500, "Internal Server Error", "harbor_internal_error", "infra:harbor_internal_error"),
        (502, "Bad Gateway", "transport_error", "infra:transport_error"),
        (200, "not json", "harbor_internal_error", "infra:harbor_internal_error"),
    ],
)
def test_answers_without_a_result_are_infra(
    status: int, body: object, cause: str, attempt_class: str
) -> None:
    meta = response_metadata(status, body)
    assert (meta["failure_cause"], meta["attempt_class"], meta["reward"], meta["reward_source"]) == (
        cause,
        attempt_class,
        None,
        None,
    )
    assert str(status) in meta["exception_message"] or status == 200


def test_client_side_failures_never_carry_a_reward() -> None:
    deadline = failure_metadata("client_deadline", "no answer in 605 s", "TimeoutError", 605.0)
    assert (deadline["attempt_class"], deadline["client_deadline"], deadline["reward"]) == (
        "infra:client_deadline",
        True,
        None,
    )
    assert deadline["phase_timings"] == {"client_wait": 605.0}
    transport = failure_metadata("transport_error", "connection reset")
    assert (transport["attempt_class"], transport["transport_error"]) == (
        "infra:transport_error",
        "connection reset",
    )


def test_the_environment_configures_the_stock_path_and_flags_win_over_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(env_name("harbor_url"), "http://env:1")
    monkeypatch.setenv(env_name("deadline_s"), "90")
    monkeypatch.setenv(env_name("task_key"), "instance_id")
    monkeypatch.setenv(env_name("harbor_token"), "secret")
    assert AgentConfig.from_env() == AgentConfig(
        harbor_url="http://env:1", harbor_token="secret", deadline_s=90.0, task_key="instance_id"
    )
    assert env_name("harbor_url") == "RL360_HARBOR_URL"
    # Miles' args without rl360's flags (stock generate): the environment
    assert AgentConfig.from_args(argparse.Namespace()) == AgentConfig.from_env()
    # rl360's flags: they decide; only the token may still come from the environment
    flags = {f"rl360_{f.name}": None for f in dataclasses.fields(AgentConfig)}
    args = argparse.Namespace(**{**flags, "rl360_harbor_url": "http://flag:2", "rl360_deadline_s": 30.0})
    assert AgentConfig.from_args(args) == AgentConfig(
        harbor_url="http://flag:2", harbor_token="secret", deadline_s=30.0
    )
    monkeypatch.setenv(env_name("deadline_s"), "soon")
    with pytest.raises(ValueError, match="RL360_DEADLINE_S"):
        AgentConfig.from_env()


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [("deadline_s", 0.0, "deadline_s"), ("agent_timeout_policy", "drop", "agent_timeout_policy"),
     ("client_margin_s", -1.0, "client_margin_s"), ("task_key", "", "task_key")],
)  # fmt: skip
def test_bad_settings_name_the_field(field: str, value: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        AgentConfig(**{field: value})


async def test_run_without_a_harbor_url_is_a_configuration_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(env_name("harbor_url"), raising=False)
    with pytest.raises(AgentConfigError, match="--rl360-harbor-url"):
        await agent.run("http://s", "p", {}, {"task": "t"})


answers = st.dictionaries(
    st.sampled_from(
        [
            "reward",
            "rewards",
            "reward_source",
            "failure_cause",
            "exception_type",
            "phase_timings",
            "attempt_class",
        ]
    ),
    st.one_of(
        st.none(),
        st.floats(allow_nan=True),
        st.integers(-3, 3),
        st.booleans(),
        st.sampled_from(
            [
                "verifier",
                "judge",
                "cancelled",
                "verifier_crash",
                "AgentTimeoutError",
                "",
                "oops",
                "valid",
                "infra:sandbox_lost",
                "infra:bogus",
            ]
        ),
        st.dictionaries(st.text(max_size=3), st.floats(allow_nan=True), max_size=2),
    ),
)


@settings(max_examples=300, deadline=None)
@given(status=st.sampled_from([200, 200, 200, 400, 404, 422, 500, 502, 503]), body=answers,
       policy=st.sampled_from(["score", "mask"]))  # fmt: skip
def test_a_reward_is_returned_only_for_a_valid_verifier_answer(status: int, body: dict, policy: str) -> None:
    meta = response_metadata(status, body, policy)
    if meta["attempt_class"] == "valid":
        assert status == 200 and body.get("reward_source") == "verifier"
        assert body.get("attempt_class") == "valid"  # the server's verdict, never one made up here
        assert body.get("failure_cause") in (None, "") and meta["reward"] == body["reward"]
    else:
        assert meta["reward"] is None and meta["rewards"] is None
        assert meta["attempt_class"].startswith("infra:")


def test_the_client_names_only_client_side_causes() -> None:
    with pytest.raises(ValueError, match="client-side"):
        failure_metadata("verifier_crash", "the server's to say")


# ---- several Harbor replicas ----------------------------------------------------------------------


def _replicas(monkeypatch: pytest.MonkeyPatch, handler: Any) -> list[str]:
    """Route the agent's HTTP through `handler` (an httpx MockTransport handler), fresh routers."""
    monkeypatch.setattr(agent, "_routers", {})
    real = httpx.AsyncClient
    monkeypatch.setattr(httpx, "AsyncClient", lambda **kw: real(transport=httpx.MockTransport(handler), **kw))
    return ["http://replica-a:8765", "http://replica-b:8765"]


def _graded(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, json=verifier_answer())


async def test_attempts_follow_their_image_group_across_replicas(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.host)
        return _graded(request)

    urls = _replicas(monkeypatch, handler)
    config = AgentConfig(harbor_url=",".join(urls))
    for _ in range(3):
        result = await agent.run("http://s/sessions/x", None, {}, {"task": "fizzbuzz", "image_group": "py3"},
                                 rl360_config=config)  # fmt: skip
        assert result["attempt_class"] == "valid"
    pinned = agent.harbor_router(config).pinned("py3")
    assert seen == [pinned.split("//")[1].split(":")[0]] * 3


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (httpx.ReadError("connection reset mid-run"), "infra:sandbox_lost"),
        (httpx.RemoteProtocolError("server disconnected"), "infra:sandbox_lost"),
    ],
)
async def test_a_replica_that_goes_away_masks_its_attempt_and_is_routed_around(
    monkeypatch: pytest.MonkeyPatch, error: httpx.HTTPError, expected: str
) -> None:
    config = AgentConfig(harbor_url="http://replica-a:8765,http://replica-b:8765")
    victim = agent.harbor_router(config).pinned("g")

    def handler(request: httpx.Request) -> httpx.Response:
        if str(request.url).startswith(victim):
            raise error
        return _graded(request)

    _replicas(monkeypatch, handler)
    lost = await agent.run(
        "http://s/sessions/x", None, {}, {"task": "t", "image_group": "g"}, rl360_config=config
    )
    assert (lost["attempt_class"], lost["reward"]) == (expected, None)
    again = await agent.run(
        "http://s/sessions/x", None, {}, {"task": "t", "image_group": "g"}, rl360_config=config
    )
    assert again["attempt_class"] == "valid"  # the next attempt went to the other replica
    assert agent.harbor_router(config).in_flight == {url: 0 for url in agent.harbor_router(config).urls}


async def test_a_refused_attempt_moves_to_the_next_live_replica(monkeypatch: pytest.MonkeyPatch) -> None:
    """A refused connection ran nothing, so the attempt is sent on to a replica it has not tried
    (the pool is replacing the dead one): it is graded, not lost; the dead replica is routed around."""
    config = AgentConfig(harbor_url="http://replica-a:8765,http://replica-b:8765")
    victim = agent.harbor_router(config).pinned("g")
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        if str(request.url).startswith(victim):
            raise httpx.ConnectError("refused")
        return _graded(request)

    _replicas(monkeypatch, handler)
    moved = await agent.run(
        "http://s/sessions/x", None, {}, {"task": "t", "image_group": "g"}, rl360_config=config
    )
    assert moved["attempt_class"] == "valid" and moved["reward"] == 1.0
    assert len(seen) == 2 and seen[0].startswith(victim) and not seen[1].startswith(victim)
    again = await agent.run(
        "http://s/sessions/x", None, {}, {"task": "t", "image_group": "g"}, rl360_config=config
    )
    assert again["attempt_class"] == "valid" and len(seen) == 3  # straight to the live one
    assert agent.harbor_router(config).in_flight == {url: 0 for url in agent.harbor_router(config).urls}


@pytest.mark.parametrize("replicas", [1, 3])
async def test_an_attempt_every_replica_refused_is_no_sandbox(
    monkeypatch: pytest.MonkeyPatch, replicas: int
) -> None:
    config = AgentConfig(harbor_url=",".join(f"http://refusing-{i}:8765" for i in range(replicas)))
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.host)
        raise httpx.ConnectError("refused")

    _replicas(monkeypatch, handler)
    lost = await agent.run("http://s/sessions/x", None, {}, {"task": "t"}, rl360_config=config)
    assert (lost["attempt_class"], lost["reward"]) == ("infra:no_sandbox", None)
    assert sorted(seen) == [f"refusing-{i}" for i in range(replicas)]  # each tried once


async def test_abort_flushes_every_replica(monkeypatch: pytest.MonkeyPatch) -> None:
    flushed: list[tuple[str, str]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        flushed.append((request.url.host, json.loads(request.content)["session_server_instance_id"]))
        return httpx.Response(200, json={"cancelled": 0})

    urls = _replicas(monkeypatch, handler)
    args = SimpleNamespace(session_server_instance_id="inst-1")
    monkeypatch.setenv(env_name("harbor_url"), ",".join(urls))
    await agent.abort(args)
    assert sorted(flushed) == [("replica-a", "inst-1"), ("replica-b", "inst-1")]


async def test_an_eval_attempt_sends_the_eval_sampling_params_and_says_it_is_an_eval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bodies: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return _graded(request)

    urls = _replicas(monkeypatch, handler)
    config = AgentConfig(harbor_url=urls[0])
    eval_params = {"temperature": 0.0, "top_p": 1.0, "max_tokens": 64}
    eval_meta = {"task": "fizzbuzz", "evaluation": True}
    result = await agent.run("http://s/sessions/x", None, eval_params, eval_meta, rl360_config=config)
    trained = await agent.run("http://s/sessions/y", None, {"temperature": 1.0}, {"task": "fizzbuzz"},
                              rl360_config=config)  # fmt: skip
    assert result["evaluation"] is True and result["attempt_class"] == "valid"
    assert "evaluation" not in trained
    assert bodies[0]["sampling_params"] == eval_params and "evaluation" not in bodies[0]


# ---- the task audit's quarantine ------------------------------------------------------------------


async def test_a_quarantined_task_is_not_run_and_its_attempt_is_masked(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    from rl360_ext.tasks.health import TaskHealth, write_outputs
    from rl360_ext.tasks.verdicts import TaskVerdict

    good, bad = TaskHealth("good", [TaskVerdict.OK], {}), TaskHealth("bad", [TaskVerdict.VACUOUS], {})
    write_outputs([good, bad], tmp_path)
    ran: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        ran.append(json.loads(request.content)["task"])
        return _graded(request)

    (url, _) = _replicas(monkeypatch, handler)
    config = AgentConfig(harbor_url=url, quarantine_file=str(tmp_path / "quarantine.json"))
    masked = await agent.run("http://s/sessions/x", None, {}, {"task": "bad"}, rl360_config=config)
    assert masked["attempt_class"] == "infra:task_quarantined"
    assert masked["reward"] is None and masked["reward_source"] is None
    assert "vacuous" in masked["exception_message"]
    graded = await agent.run("http://s/sessions/x", None, {}, {"task": "good"}, rl360_config=config)
    assert graded["attempt_class"] == "valid" and ran == ["good"]
    assert attempt_class_of(masked) == "infra:task_quarantined"


async def test_a_task_added_to_the_live_list_mid_run_is_masked_from_the_next_attempt(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """The training-time tracker adds a task to quarantine_live.json next to the audit's file: the
    attempt after that is masked (never a 0 reward); clearing the entry runs the task again."""
    from rl360_ext.tasks.health import TaskHealth, write_outputs
    from rl360_ext.tasks.tracker import LIVE_QUARANTINE_FILE, add_to_live
    from rl360_ext.tasks.verdicts import TaskVerdict

    write_outputs([TaskHealth("t", [TaskVerdict.OK], {})], tmp_path)
    ran: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        ran.append(json.loads(request.content)["task"])
        return _graded(request)

    (url, _) = _replicas(monkeypatch, handler)
    config = AgentConfig(harbor_url=url, quarantine_file=str(tmp_path / "quarantine.json"))
    before = await agent.run("http://s/sessions/x", None, {}, {"task": "t"}, rl360_config=config)
    evidence = {"vacuous": {"vacuous_signature_attempts": 3}}
    add_to_live(
        tmp_path / LIVE_QUARANTINE_FILE,
        [{"task": "t", "verdicts": ["vacuous"], "evidence": evidence, "rollout_id": 4}],
    )
    masked = await agent.run("http://s/sessions/x", None, {}, {"task": "t"}, rl360_config=config)
    assert before["attempt_class"] == "valid" and ran == ["t"]
    assert (
        masked["attempt_class"] == "infra:task_quarantined" and masked["failure_cause"] == "task_quarantined"
    )
    assert masked["reward"] is None and masked["rewards"] is None and masked["reward_source"] is None
    assert LIVE_QUARANTINE_FILE in masked["exception_message"] and "vacuous" in masked["exception_message"]
    (tmp_path / LIVE_QUARANTINE_FILE).write_text('{"tasks": {}}')  # an operator clears it
    again = await agent.run("http://s/sessions/x", None, {}, {"task": "t"}, rl360_config=config)
    assert again["attempt_class"] == "valid" and ran == ["t", "t"]


@settings(max_examples=25, deadline=None)
@given(tasks=st.lists(st.sampled_from(["a", "b", "c", "d"]), min_size=1, max_size=8))
def test_masking_never_yields_a_reward(tmp_path_factory: pytest.TempPathFactory, tasks: list[str]) -> None:
    """Whatever the live list holds, a listed task's result has no reward (no 0), and an unlisted
    task is not masked."""
    from rl360_ext.tasks.tracker import LIVE_QUARANTINE_FILE, add_to_live

    directory = tmp_path_factory.mktemp("q")
    (directory / "quarantine.json").write_text('{"tasks": {}}')
    add_to_live(
        directory / LIVE_QUARANTINE_FILE,
        [{"task": t, "verdicts": ["slow_verifier"], "evidence": {}, "rollout_id": 0} for t in tasks],
    )
    config = AgentConfig(harbor_url="http://h:1", quarantine_file=str(directory / "quarantine.json"))
    for task in ("a", "b", "c", "d"):
        masked = agent._quarantined(config, task)
        assert (masked is not None) == (task in tasks)
        if masked is not None:
            assert masked["reward"] is None and masked["rewards"] is None
            assert attempt_class_of(masked) == "infra:task_quarantined"


async def test_a_quarantine_file_that_is_not_one_is_a_configuration_error(tmp_path: Any) -> None:
    bad = tmp_path / "quarantine.json"
    bad.write_text('{"tasks": ["a"]}')
    config = AgentConfig(harbor_url="http://h:1", quarantine_file=str(bad))
    with pytest.raises(AgentConfigError, match="quarantine"):
        await agent.run("http://s", None, {}, {"task": "a"}, rl360_config=config)
