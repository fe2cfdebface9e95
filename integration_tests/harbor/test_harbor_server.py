"""`rl360 harbor serve` as a real process running real Harbor trials in bubblewrap sandboxes."""

from __future__ import annotations

import asyncio
import re
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from integration_tests.harbor.conftest import sandbox_root
from rl360_ext.harbor.envs.limits import cgroups_usable
from rl360_ext.local.fixtures import tasks_root
from rl360_ext.util.procs import Service

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CODING_TASKS = ("fix-mean", "fizzbuzz", "slow-sum")
# Each fault task run by the oracle: its cause, who it is attributed to (issue 34: a verifier that
# fails on the oracle's own end state is the task's, the known-good state reproduces it; a limit
# the agent's processes hit, or its time budget, is the policy's and is graded), and its reward.
FAULTS: dict[str, tuple[str, str, float | None]] = {
    "fault-env-start-fails": ("sandbox_failed", "infrastructure", None),
    "fault-env-start-hangs": ("environment_start_timeout", "infrastructure", None),
    "fault-verifier-crashes": ("verifier_crash", "task", None),
    "fault-judge-fails": ("judge_failure", "infrastructure", None),
    "fault-verifier-no-reward": ("reward_file_missing", "task", None),
    "fault-verifier-hangs": ("verifier_timeout", "task", None),
    "fault-agent-over-budget": ("agent_timeout", "policy", 0.0),
    "fault-memory-hog": ("memory_limit_exceeded", "policy", 1.0),
}
BUDGET_FLAGS = ("--env-setup-s", "20", "--agent-setup-s", "5", "--margin-s", "2", "--min-agent-s", "1")
FORK_TASK, FORK_PIDS = "fork-fizzbuzz", 32
# The oracle's fizzbuzz, after which the agent forks until the sandbox's pids limit refuses a fork.
_FORK_PAST_THE_LIMIT = """
python3 - <<'PY'
import os, time
children = []
for _ in range(4 * 32):  # FORK_PIDS
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(1)
        os._exit(0)
    children.append(pid)
for pid in children:
    os.waitpid(pid, 0)
PY
"""


def fork_task(root: Path) -> Path:
    """A tasks root holding `FORK_TASK`: fizzbuzz whose oracle, once done, forks past a pids limit of
    `FORK_PIDS` (run the server with `--env-kwarg max_pids=32`)."""
    shutil.copytree(tasks_root() / "fizzbuzz", root / FORK_TASK)
    solve = root / FORK_TASK / "solution" / "solve.sh"
    solve.write_text(solve.read_text() + _FORK_PAST_THE_LIMIT)
    return root


def assert_fork_is_the_policys(result: dict[str, Any]) -> None:
    """Graded (the work is done), the policy's, with the pids limit as the evidence."""
    graded = (result["reward"], result["failure_cause"], result["attributed_to"])
    assert graded == (1.0, None, "policy"), result
    assert result["evidence"]["resource"] == "pids" and result["evidence"]["phase"] == "agent", result


async def run_all(service: Service, bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(base_url=service.url, timeout=300) as http:
        responses = await asyncio.gather(*(http.post("/run", json=body) for body in bodies))
    for response in responses:
        assert response.status_code == 200, response.text
    return [response.json() for response in responses]


def max_in_window(times: list[float], interval: float) -> int:
    times = sorted(times)
    return max(sum(1 for t in times if start <= t < start + interval) for start in times)


@pytest.fixture(scope="module")
def server(harbor_server: Callable[..., Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    logs = tmp_path_factory.mktemp("harbor-logs")
    with harbor_server(logs, "--max-concurrent", "4", *BUDGET_FLAGS) as service:
        yield service


async def test_oracle_passes_and_nop_fails_on_every_coding_task(server: Service) -> None:
    bodies = [{"task": t, "deadline_s": 120, "agent": a} for t in CODING_TASKS for a in ("oracle", "nop")]
    for body, result in zip(bodies, await run_all(server, bodies), strict=True):
        expected = 1.0 if body["agent"] == "oracle" else 0.0
        assert (result["reward"], result["reward_source"], result["failure_cause"]) == (
            expected,
            "verifier",
            None,
        ), (
            body,
            result,
        )
        assert result["rewards"] == {"reward": expected}
        timings = result["phase_timings"]
        assert all(
            timings[phase] is not None for phase in ("queue", "environment_setup", "agent", "verifier")
        )
        assert result["placement"] == {"node_label": "local", "image_group": "rl360-python-3"}


async def test_each_fault_task_fails_with_its_cause_and_its_attribution(server: Service) -> None:
    bodies = [{"task": task, "deadline_s": 120, "agent": "oracle"} for task in FAULTS]
    for body, result in zip(bodies, await run_all(server, bodies), strict=True):
        cause, who, reward = FAULTS[body["task"]]
        source = None if reward is None else "verifier"
        assert (
            result["failure_cause"],
            result["attributed_to"],
            result["reward"],
            result["reward_source"],
        ) == (
            cause,
            who,
            reward,
            source,
        ), result
        assert (result["attempt_class"] == "valid") == (reward is not None), result
        assert result["evidence"]["control"] == ("regrade" if who == "task" else "rule"), result
        assert result["exception_message"], result
        # Every fault but the judge's surfaces as a Harbor exception; a failed judge is reported by
        # the test script's exit code (75) while Harbor itself saw a normal grading.
        assert (result["exception_type"] is None) == (body["task"] == "fault-judge-fails"), result


async def test_a_task_over_its_memory_reservation_fails_alone(server: Service) -> None:
    bodies = [{"task": "fault-memory-hog", "deadline_s": 120}] + [{"task": "slow-sum", "deadline_s": 120}] * 3
    hog, *neighbours = await run_all(server, bodies)
    assert (hog["failure_cause"], hog["attributed_to"], hog["evidence"]["resource"]) == (
        "memory_limit_exceeded",
        "policy",
        "memory",
    ), hog
    for result in neighbours:
        assert (result["reward"], result["reward_source"], result["failure_cause"]) == (1.0, "verifier", None)


async def test_a_fork_past_the_pids_limit_is_the_policys(
    harbor_server: Callable[..., Any], tmp_path: Path
) -> None:
    if not cgroups_usable():
        pytest.skip("no pids cgroup here: RLIMIT_NPROC refuses the fork and nothing counts it")
    root = fork_task(tmp_path / "tasks")
    flags = ("--tasks-root", str(root), "--env-kwarg", f"max_pids={FORK_PIDS}", *BUDGET_FLAGS)
    with harbor_server(tmp_path / "logs", *flags) as service:
        (result,) = await run_all(service, [{"task": FORK_TASK, "deadline_s": 120, "agent": "oracle"}])
    assert_fork_is_the_policys(result)


async def test_waves_hold_the_rolling_start_limit(harbor_server: Callable[..., Any], tmp_path: Path) -> None:
    waves = ("--rolling-start-size", "2", "--rolling-start-interval", "0.5")
    with harbor_server(tmp_path, "--max-concurrent", "16", *waves, *BUDGET_FLAGS) as service:
        results = await run_all(service, [{"task": "fix-mean", "deadline_s": 120, "agent": "nop"}] * 10)
        metrics = httpx.get(service.url + "/metrics").text
    # The limit holds on the slots the gate granted (its own clock: a busy machine cannot bunch
    # them), and no sandbox starts before its slot.
    slots = [r["timeline"]["start_slot_at"] for r in results]
    assert all(r["reward_source"] == "verifier" for r in results)
    assert max_in_window(slots, 0.5 - 0.01) <= 2
    assert max(slots) - min(slots) >= 2.0  # 10 starts at 2 per 0.5 s cannot take less
    assert all(r["timeline"]["sandbox_started_at"] >= r["timeline"]["start_slot_at"] - 0.01 for r in results)
    assert "rl360_harbor_sandbox_starts_total 10.0" in metrics
    assert "rl360_harbor_starts_per_wave_count" in metrics


async def test_fifty_concurrent_runs_are_bounded_and_all_answered(server: Service) -> None:
    results = await run_all(server, [{"task": "slow-sum", "deadline_s": 180, "agent": "oracle"}] * 50)
    assert all((r["reward"], r["failure_cause"]) == (1.0, None) for r in results)
    health = httpx.get(server.url + "/health").json()
    assert health["peak_running"] == 4 and health["running"] == 0 and health["queue_depth"] == 0
    # Independently of the server's own count: sandbox lifetimes (start to end of verification) overlap <= 4.
    events = []
    for r in results:
        start, t = r["timeline"]["sandbox_started_at"], r["phase_timings"]
        end = start + t["environment_setup"] + t["agent_setup"] + t["agent"] + t["verifier"]
        events += [(start, 1), (end, -1)]
    live = peak = 0
    for _, step in sorted(events, key=lambda e: (e[0], e[1])):
        live += step
        peak = max(peak, live)
    assert peak <= 4
    assert max(r["phase_timings"]["queue"] for r in results) > 5  # most of them really queued


async def test_flush_cancels_an_instance_and_releases_its_sandboxes(
    harbor_server: Callable[..., Any], descendants: Callable[[int], list[tuple[int, str]]], tmp_path: Path
) -> None:
    sandboxes = sandbox_root(tmp_path)
    flags = ("--max-concurrent", "4", "--env-kwarg", f"sandbox_root={sandboxes}", *BUDGET_FLAGS)
    doomed_body = {"task": "slow-sum", "deadline_s": 120, "session_server_instance_id": "A"}
    with harbor_server(tmp_path, *flags) as service:
        async with httpx.AsyncClient(base_url=service.url, timeout=120) as http:
            doomed = [asyncio.create_task(http.post("/run", json=doomed_body)) for _ in range(3)]
            survivor = asyncio.create_task(
                http.post(
                    "/run", json={"task": "fix-mean", "deadline_s": 120, "session_server_instance_id": "B"}
                )
            )
            deadline = time.monotonic() + 30
            while len(started := list(sandboxes.glob("slow-sum__*"))) < 3 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert len(started) == 3  # all three sandboxes are up before the flush
            flushed = (await http.post("/flush", json={"session_server_instance_id": "A"})).json()
            results = [(await task).json() for task in doomed]
            kept = (await survivor).json()
            health = (await http.get("/health")).json()
        leftovers = [cmd for _, cmd in descendants(service.pid) if "bwrap" in cmd or "sleep" in cmd]
        remaining = sorted(p.name for p in sandboxes.iterdir()) if sandboxes.exists() else []
    assert flushed == {"session_server_instance_id": "A", "cancelled": 3, "finished": 3, "still_stopping": 0}
    for r in results:
        assert (r["failure_cause"], r["reward"], r["reward_source"]) == ("cancelled", None, None), r
        assert r["timeline"]["sandbox_started_at"] is not None
    assert (kept["reward"], kept["failure_cause"]) == (1.0, None)
    assert health["in_flight"] == {} and health["running"] == 0
    assert leftovers == [] and remaining == []


async def test_the_agent_budget_comes_from_the_client_deadline(server: Service) -> None:
    # fixed cost: setup 20 + agent setup 5 + verifier 30 + margin 2 = 57 s, so a 59 s deadline leaves 2 s
    (result,) = await run_all(server, [{"task": "fault-agent-over-budget", "deadline_s": 59}])
    # graded after the timeout (the policy's): the oracle never wrote done.txt
    assert (result["failure_cause"], result["reward"], result["attributed_to"]) == (
        "agent_timeout",
        0.0,
        "policy",
    )
    agent_timeout = float(re.search(r"timed out after ([0-9.]+) seconds", result["exception_message"])[1])
    assert 1.5 < agent_timeout <= 2.0  # what the deadline left, not the task's own 3 s
    assert result["phase_timings"]["total"] < 59
    (refused,) = await run_all(server, [{"task": "fault-agent-over-budget", "deadline_s": 57.5}])
    assert (
        refused["failure_cause"] == "insufficient_budget"
        and refused["timeline"].get("sandbox_started_at") is None
    )
