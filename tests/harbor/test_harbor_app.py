"""The /run server without sandboxes: schema errors name the field, auth on every route,
insufficient budget and flush of queued attempts never start a sandbox, a trial's directory is
removed off the event loop."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import httpx
import pytest

from rl360_ext.harbor import outcome
from rl360_ext.harbor import runner as runner_module
from rl360_ext.harbor.admission import Reservation
from rl360_ext.harbor.app import create_app
from rl360_ext.harbor.catalog import TaskInfo
from rl360_ext.harbor.runner import HarborServerConfig, RunRequest, TrialRunner
from rl360_ext.local.fixtures import tasks_root as example_tasks_root

POLICY = {"env_setup_s": 5, "agent_setup_s": 1, "max_verifier_s": 5, "margin_s": 1, "min_agent_s": 1}


def make_runner(tmp_path: Path, max_concurrent: int = 4, **settings: object) -> TrialRunner:
    return TrialRunner(
        HarborServerConfig(
            tasks_root=settings.pop("tasks_root", example_tasks_root()),  # type: ignore[arg-type]
            trials_dir=tmp_path / "trials",
            env_kwarg=(f"sandbox_root={tmp_path / 'sandboxes'}",),
            max_concurrent=max_concurrent,
            **POLICY,  # type: ignore[arg-type]
            **settings,  # type: ignore[arg-type]
        )
    )


def client(
    runner: TrialRunner, token: str | None = None, headers: dict[str, str] | None = None
) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=create_app(runner, token))
    return httpx.AsyncClient(transport=transport, base_url="http://harbor", headers=headers)


def field_of(response: httpx.Response) -> str:
    return response.json()["detail"][0]["loc"][-1]


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"task": "fix-mean"}, 422, "deadline_s"),
        ({"task": "fix-mean", "deadline_s": 0}, 422, "deadline_s"),
        ({"task": "fix-mean", "deadline_s": 60, "max_seq_len": 0}, 422, "max_seq_len"),
        ({"task": "fix-mean", "deadline_s": 60, "colour": "blue"}, 422, "colour"),
        ({"task": "", "deadline_s": 60}, 422, "task"),
        ({"task": "../etc", "deadline_s": 60}, 400, "task"),
        ({"task": "/etc/passwd", "deadline_s": 60}, 400, "task"),
        ({"task": "no-such-task", "deadline_s": 60}, 404, "task"),
        ({"task": "fix-mean", "deadline_s": 60, "agent": "nobody"}, 422, "agent"),
        ({"task": "fix-mean", "deadline_s": 60, "agent": "terminus-2", "model": "m"}, 422, "base_url"),
        (
            {"task": "fix-mean", "deadline_s": 60, "agent": "terminus-2", "base_url": "http://x/v1"},
            422,
            "model",
        ),
    ],
)
async def test_bad_requests_name_the_field(tmp_path: Path, body: dict, status: int, field: str) -> None:
    async with client(make_runner(tmp_path)) as http:
        response = await http.post("/run", json=body)
    assert response.status_code == status, response.text
    assert field_of(response) == field


async def test_every_route_needs_the_token(tmp_path: Path) -> None:
    runner = make_runner(tmp_path)
    routes = [
        ("GET", "/health", None),
        ("GET", "/metrics", None),
        ("POST", "/flush", {"session_server_instance_id": "a"}),
    ]
    routes.append(("POST", "/run", {"task": "fix-mean", "deadline_s": 1}))
    async with (
        client(runner, token="s3cret") as anonymous,
        client(runner, "s3cret", {"authorization": "Bearer nope"}) as wrong,
    ):
        for method, path, body in routes:
            assert (await anonymous.request(method, path, json=body)).status_code == 401, path
            assert (await wrong.request(method, path, json=body)).status_code == 401, path
        assert (await anonymous.get("/docs")).status_code == 401  # no path is answered without it
        assert (await anonymous.get("/no-such-route")).status_code == 401
    async with client(runner, "s3cret", {"authorization": "Bearer s3cret"}) as allowed:
        for method, path, body in routes:
            assert (await allowed.request(method, path, json=body)).status_code == 200, path


async def test_an_insufficient_deadline_starts_no_sandbox(tmp_path: Path) -> None:
    runner = make_runner(tmp_path)
    async with client(runner) as http:
        body = (
            await http.post("/run", json={"task": "fix-mean", "deadline_s": 3, "session_id": "s1"})
        ).json()
        metrics = (await http.get("/metrics")).text
        health = (await http.get("/health")).json()
    assert (body["failure_cause"], body["reward"], body["reward_source"]) == (
        "insufficient_budget",
        None,
        None,
    )
    assert "no sandbox was started" in body["exception_message"]
    assert body["session_id"] == "s1" and body["placement"]["image_group"] == "rl360-python-3"
    assert body["timeline"].get("sandbox_started_at") is None
    assert 'rl360_harbor_attempts_total{failure_cause="insufficient_budget"} 1.0' in metrics
    assert "rl360_harbor_sandbox_starts_total 0.0" in metrics
    assert health["running"] == 0 and health["peak_running"] == 0
    assert not (tmp_path / "sandboxes").exists()


async def test_a_queued_attempt_gives_up_when_its_deadline_no_longer_fits(tmp_path: Path) -> None:
    runner = make_runner(tmp_path, max_concurrent=1)
    occupied = await runner.admission.acquire(Reservation(1, 1), timeout_s=1)
    # fixed cost 5 + 1 + 5 + 1 = 12 s, floor 1 s: a 13.3 s deadline may queue about 0.3 s
    result = await runner.run(RunRequest(task="fix-mean", deadline_s=13.3))
    runner.admission.release(occupied)
    assert result["failure_cause"] == "insufficient_budget"
    assert 0.2 < result["phase_timings"]["queue"] < 5
    assert runner.admission.queue_depth == 0


async def test_flush_cancels_queued_attempts_of_that_instance_only(tmp_path: Path) -> None:
    runner = make_runner(tmp_path, max_concurrent=1)
    occupied = await runner.admission.acquire(Reservation(1, 1), timeout_s=1)
    doomed = [
        asyncio.create_task(
            runner.run(RunRequest(task="fix-mean", deadline_s=600, session_server_instance_id="A"))
        )
        for _ in range(3)
    ]
    other = asyncio.create_task(
        runner.run(RunRequest(task="fix-mean", deadline_s=13.5, session_server_instance_id="B"))
    )
    await asyncio.sleep(0)
    assert runner.health()["in_flight"] == {"A": 3, "B": 1}  # in flight while their tasks load
    flushed = await runner.flush("A")
    assert flushed["cancelled"] == 3 and flushed["still_stopping"] == 0
    for result in await asyncio.gather(*doomed):
        assert (result["failure_cause"], result["reward"], result["reward_source"]) == (
            "cancelled",
            None,
            None,
        )
    assert (await other)[
        "failure_cause"
    ] == "insufficient_budget"  # B was left alone to time out in the queue
    runner.admission.release(occupied)
    assert runner.health()["in_flight"] == {} and runner.admission.queue_depth == 0
    assert (await runner.flush("nobody"))["cancelled"] == 0


@pytest.mark.parametrize("stop", ["flush", "shutdown"])
async def test_an_attempt_stopped_while_its_task_loads_is_cancelled_and_leaves_no_snapshot(
    tmp_path: Path, stop: str
) -> None:
    runner = make_runner(tmp_path)
    loading, may_finish, loaded = threading.Event(), threading.Event(), threading.Event()
    load = runner.catalog.load

    def slow_load(name: str) -> TaskInfo:
        loading.set()
        may_finish.wait(timeout=30)
        try:
            return load(name)
        finally:
            loaded.set()

    runner.catalog.load = slow_load  # type: ignore[method-assign]
    attempt = asyncio.create_task(
        runner.run(RunRequest(task="fix-mean", deadline_s=600, session_server_instance_id="A"))
    )
    assert await asyncio.to_thread(loading.wait, 30)
    stopping = asyncio.create_task(runner.flush("A") if stop == "flush" else runner.shutdown())
    await asyncio.sleep(0)
    may_finish.set()
    await stopping
    result = await attempt
    assert (result["failure_cause"], result["reward"], result["placement"]) == ("cancelled", None, None)
    assert "while its task was loading" in result["exception_message"]
    assert await asyncio.to_thread(loaded.wait, 30)  # the load went on in its thread; then
    snapshots = runner.catalog.snapshots.root

    def taken() -> list[Path]:
        return [path for path in snapshots.iterdir() if path.is_dir()] if snapshots.exists() else []

    for _ in range(300):  # the snapshot is removed off the loop once its load ends
        if not taken():
            break
        await asyncio.sleep(0.01)
    assert taken() == []
    assert runner.health()["in_flight"] == {}


@pytest.mark.parametrize(
    ("raw", "status", "field"),
    [
        ('{"task": "fix-mean", "deadline_s": NaN}', 422, "deadline_s"),
        ('{"task": "fix-mean", "deadline_s": Infinity}', 422, "deadline_s"),
        ('{"task": "fix-mean", "deadline_s": -Infinity}', 422, "deadline_s"),
        ('{"task": "fix-mean", "deadline_s": 1e308}', 422, "deadline_s"),
        ('{"task": "fix-mean", "deadline_s": 86401}', 422, "deadline_s"),
        ('{"task": "fix\\u0000mean", "deadline_s": 60}', 400, "task"),
        ('{"task": "fix-mean\\n", "deadline_s": 60}', 400, "task"),
        ('{"task": "' + "a" * 300 + '", "deadline_s": 60}', 422, "task"),
        ('{"task": "' + "a/" * 127 + "a" + '", "deadline_s": 60}', 404, "task"),
        ('{"task": "fix-mean", "deadline_s": 60, "agent": "os:system"}', 422, "agent"),
        ('{"task": "fix-mean", "deadline_s": 60, "agent_kwargs": {"logs_dir": "/etc"}}', 422, "agent_kwargs"),
        ('{"task": "fix-mean", "deadline_s": 60, "agent_kwargs": {"model_name": "x"}}', 422, "agent_kwargs"),
    ],
)
async def test_hostile_values_get_a_4xx_naming_the_field(
    tmp_path: Path, raw: str, status: int, field: str
) -> None:
    async with client(make_runner(tmp_path)) as http:
        response = await http.post("/run", content=raw, headers={"content-type": "application/json"})
    assert response.status_code == status, response.text
    assert field_of(response) == field
    assert "agent_kwarg_reserved" in response.text or field != "agent_kwargs"


async def test_a_client_named_module_is_never_imported(tmp_path: Path) -> None:
    import sys

    async with client(make_runner(tmp_path)) as http:
        response = await http.post(
            "/run", json={"task": "fix-mean", "deadline_s": 60, "agent": "antigravity:X"}
        )
    assert response.status_code == 422 and "oracle" in response.json()["detail"][0]["msg"]
    assert "antigravity" not in sys.modules


async def test_a_stopping_server_takes_no_new_attempts(tmp_path: Path) -> None:
    runner = make_runner(tmp_path)
    await runner.shutdown()
    async with client(runner) as http:
        response = await http.post("/run", json={"task": "fix-mean", "deadline_s": 60})
    assert response.status_code == 503 and response.json()["detail"][0]["type"] == "shutting_down"


async def test_shutdown_answers_every_queued_attempt_cancelled(tmp_path: Path) -> None:
    runner = make_runner(tmp_path, max_concurrent=1)
    occupied = await runner.admission.acquire(Reservation(1, 1), timeout_s=1)
    waiting = [
        asyncio.create_task(
            runner.run(RunRequest(task="fix-mean", deadline_s=600, session_server_instance_id=key))
        )
        for key in ("A", "B", None)
    ]
    await asyncio.sleep(0)
    await runner.shutdown()
    runner.admission.release(occupied)
    assert [r["failure_cause"] for r in await asyncio.gather(*waiting)] == ["cancelled"] * 3


async def test_a_trial_dir_is_removed_off_the_loop_and_a_flush_then_keeps_the_outcome(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = make_runner(tmp_path, keep_trials="none")
    trial_dir = tmp_path / "trials" / "t"
    (trial_dir / "agent").mkdir(parents=True)
    removing, may_remove = threading.Event(), threading.Event()
    rmtree = runner_module.shutil.rmtree

    def slow_rmtree(path: Path, ignore_errors: bool = False) -> None:
        removing.set()
        may_remove.wait(timeout=30)
        rmtree(path, ignore_errors=ignore_errors)

    monkeypatch.setattr(runner_module.shutil, "rmtree", slow_rmtree)
    result = outcome.failure("cancelled")
    tidy = asyncio.create_task(runner._tidy(trial_dir, result))
    assert await asyncio.to_thread(removing.wait, 30)  # the loop runs while the tree is removed
    tidy.cancel()  # a flush that comes after the trial ended
    await asyncio.sleep(0)
    may_remove.set()
    await tidy
    assert not tidy.cancelled() and not trial_dir.exists()
