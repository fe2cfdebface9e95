"""`rl360 demo` end to end, as a user runs it (the CLI in its own process), small.

Checks what the demo promises: the metrics JSONL agrees with its own per-attempt lines and with
the demo's summary, infrastructure attempts never reach a reward mean, every planned fault is
masked, weight versions advance on Miles' one-step-off schedule, the report has every chart, and
afterwards no process or listening port the demo opened is left, also after Ctrl-C or SIGTERM
in the middle of a rollout.

Leftover processes are found by an environment marker the demo process passes to everything it
starts (procs, Ray, Harbor, bubblewrap all inherit the environment), so a process re-parented to
init after its parent died is still found; ports come from the demo's `logs/services.json`.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from integration_tests.components import bwrap_problem, skip_if_missing
from rl360_ext.local.demo_plan import DemoConfig, expected_weight_version, plan_step
from rl360_ext.local.fixtures import quiz_task_names
from rl360_ext.local.stack import demo_stack_config, preflight
from rl360_ext.rollout.metrics import read_metrics, read_records
from rl360_ext.util.prereqs import Unavailable
from rl360_ext.util.procs import LOOPBACK, rl360_argv
from tests.diagnostics.report_fixtures import CHARTS

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MARKER = "RL360_DEMO_TEST_MARKER"
STEPS, TASKS, ATTEMPTS, FAULTS = 3, 2, 3, 0.5
UNKNOWN_PID = -1
# Bounds for a small demo run while the other test workers share the machine's 2 cores.
DEMO_RUN_S = 420
FIRST_ROLLOUT_S = 300


@pytest.fixture(autouse=True)
def _needs_the_stack() -> None:
    try:
        preflight(demo_stack_config(DemoConfig()))
    except Unavailable as exc:
        pytest.skip(str(exc))
    skip_if_missing(bwrap_problem)


def _demo_argv(out: Path, *flags: str) -> list[str]:
    return rl360_argv("demo", "--out", str(out), *flags)


def _with_ctrl_c(argv: list[str]) -> list[str]:
    """`argv` with Ctrl-C at its default, as a terminal gives it: a shell without job control (CI
    scripts, `cmd &`) starts background commands with SIGINT ignored, and Python keeps it ignored."""
    reset = (
        "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
        "os.execv(sys.argv[1], sys.argv[1:])"
    )
    return [sys.executable, "-c", reset, *argv]


def _env(token: str) -> dict[str, str]:
    return {**os.environ, MARKER: token, "COLUMNS": "160"}


def _live(pid: int) -> str | None:
    """The command line of a live (not zombie) process, else None."""
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat[stat.rindex(")") + 2] != "Z":
            return (
                Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:200]
            )
    return None


def _marked_processes(token: str) -> list[tuple[int, str]]:
    """Live processes whose environment carries this run's marker."""
    needle = f"{MARKER}={token}".encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if needle in Path(f"/proc/{entry.name}/environ").read_bytes().split(b"\0"):
                cmdline = _live(int(entry.name))
                if cmdline is not None:
                    found.append((int(entry.name), cmdline))
    return found


def _manifest_ports(out: Path) -> list[int]:
    manifest = json.loads((out / "logs" / "services.json").read_text())
    ports = [port for service in manifest["services"] for port in service["ports"]]
    replicas = [replica["url"] for replica in manifest.get("harbor_replicas", [])]
    for url in [*manifest["session_servers"], *replicas, manifest["ray_gcs_address"] or ""]:
        if match := re.search(r":(\d+)/?$", url):
            ports.append(int(match.group(1)))
    return ports


def _listeners(port: int) -> list[int]:
    """Pids listening on TCP `port` (any address), from `ss -ltnpH`; without `ss`, [UNKNOWN_PID]
    when a connection to the port on loopback succeeds."""
    if shutil.which("ss") is None:
        with contextlib.suppress(OSError), socket.create_connection((LOOPBACK, port), timeout=0.5):
            return [UNKNOWN_PID]
        return []
    result = subprocess.run(
        ["ss", "-ltnpH", f"sport = :{port}"], capture_output=True, text=True, timeout=10, check=True
    )
    return [int(pid) for pid in re.findall(r"pid=(\d+)", result.stdout)]


def _assert_nothing_left(token: str, out: Path, grace_s: float = 20.0) -> None:
    """No marked process, no process from the manifest (SMG rewrites its environment block, so
    the marker cannot find it), and no listener of theirs on a port the demo opened."""
    manifest = json.loads((out / "logs" / "services.json").read_text())
    service_pids = {service["pid"] for service in manifest["services"]}
    ports = _manifest_ports(out)
    assert ports and service_pids, "the demo wrote no services to logs/services.json"
    deadline = time.monotonic() + grace_s
    while True:
        left = _marked_processes(token) + [(pid, cmd) for pid in service_pids if (cmd := _live(pid))]
        ours = {UNKNOWN_PID} | {pid for pid, _ in left}
        held = {port: pids for port in ports if (pids := [p for p in _listeners(port) if p in ours])}
        if (not left and not held) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert not left, f"processes the demo started are still running: {left}"
    assert not held, f"ports the demo opened are still listened on by its processes: {held}"


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _close(a: float | None, b: float | None) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and math.isclose(a, b, abs_tol=1e-9))


def _check_step(step: dict[str, Any], lines: list[dict[str, Any]], row: dict[str, Any]) -> None:
    """One step record against its attempt lines and the demo's own summary row."""
    metrics = step["metrics"]
    assert step["prefilter"] == "filter_hook"
    valid = [a for a in lines if a["attempt_class"] == "valid"]
    infra = [a for a in lines if a["attempt_class"] != "valid"]
    assert all(a["attempt_class"].startswith("infra:") for a in infra)
    assert all(a["reward"] is None for a in infra), "an infra attempt carries a reward"
    assert all(isinstance(a["reward"], float) and a["reward_source"] == "verifier" for a in valid)
    assert metrics["count/attempts"] == len(lines) == TASKS * ATTEMPTS
    assert metrics["count/valid"] == len(valid) and metrics["count/infra"] == len(infra)
    causes = Counter(a["attempt_class"].removeprefix("infra:") for a in infra)
    assert {
        k.removeprefix("count/infra/"): v for k, v in metrics.items() if k.startswith("count/infra/")
    } == causes
    assert _close(metrics["reward/unfiltered_mean"], _mean([a["reward"] for a in valid]))
    trained = [a for a in lines if a["trained"]]
    kept_valid = [a["reward"] for a in trained if a["attempt_class"] == "valid"]
    assert _close(metrics["reward/kept_mean"], _mean(kept_valid))  # infra attempts never in the kept mean
    assert metrics["count/trained"] == len(trained)
    assert metrics["count/masked"] == len(trained) - len(kept_valid)
    groups: dict[Any, list[dict[str, Any]]] = {}
    for attempt in lines:
        groups.setdefault(attempt["group_index"], []).append(attempt)
    assert len(groups) == TASKS
    kept_groups = 0
    for members in groups.values():
        verdicts = {a["filter"] for a in members}
        assert len(verdicts) == 1, f"one group, several filter verdicts: {verdicts}"
        rewards = [a["reward"] for a in members if a["attempt_class"] == "valid"]
        if verdicts == {"kept"}:
            kept_groups += 1
            assert len(rewards) >= 2 and len(set(rewards)) > 1
        else:
            assert verdicts == {"dropped"} and members[0]["dropped_reason"] in (
                "insufficient_valid_rewards",
                "zero_std_valid",
            )
    assert metrics["count/kept_groups"] == kept_groups
    # the demo's summary row is computed from the samples themselves, not from the JSONL
    assert row["attempts"] == len(lines) and row["valid"] == len(valid)
    assert row["infra_by_cause"] == dict(causes) and row["kept_groups"] == kept_groups
    assert _close(row["unfiltered_mean"], metrics["reward/unfiltered_mean"])
    assert _close(row["kept_mean"], metrics["reward/kept_mean"])


@pytest.mark.timeout(480)
def test_demo_runs_the_loop_in_order_and_leaves_nothing_behind(tmp_path: Path) -> None:
    out, token = tmp_path / "demo", uuid.uuid4().hex
    flags = [
        "--steps",
        str(STEPS),
        "--tasks",
        str(TASKS),
        "--attempts",
        str(ATTEMPTS),
        "--faults",
        str(FAULTS),
    ]
    run = subprocess.run(
        _demo_argv(out, *flags), env=_env(token), capture_output=True, text=True, timeout=DEMO_RUN_S
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-4000:]
    assert "MISMATCH" not in output, output[-4000:]
    _assert_nothing_left(token, out)

    steps, attempts = read_metrics(out / "metrics.jsonl")
    summary = json.loads((out / "summary.json").read_text())
    assert [s["rollout_id"] for s in steps] == list(range(STEPS))
    for step, row in zip(steps, summary["steps"], strict=True):
        _check_step(step, [a for a in attempts if a["rollout_id"] == step["rollout_id"]], row)

    # every fault the plan aimed at an attempt was masked as infrastructure
    config = DemoConfig(steps=STEPS, tasks=TASKS, attempts=ATTEMPTS, faults=FAULTS, out=out)
    planned = {
        a.index: a.fault for k in range(STEPS) for g in plan_step(k, config, quiz_task_names()) for a in g
    }
    by_index = {a["index"]: a for a in attempts}
    assert set(by_index) == set(planned)
    assert any(planned.values())
    for index, fault in planned.items():
        if fault is not None:
            assert by_index[index]["attempt_class"].startswith("infra:"), (fault, by_index[index])

    # weights: one push before step 0, one after each step's update; turns on the expected version
    pushes = read_records(out / "metrics.jsonl", "weight_push")
    assert [p["rollout_id"] for p in pushes] == [None, *range(STEPS)]
    assert [p["weight_version"] for p in pushes] == [str(v) for v in range(STEPS + 1)]
    for push in pushes:
        assert push["complete"] and push["engines_reached"] == push["engines_targeted"] == 2
        assert sorted(push["update_calls_per_engine"].values()) == [1, 1]
    seen = []
    for number, row in enumerate(summary["steps"]):
        assert row["version_problems"] == []
        if row["valid"]:
            assert row["versions_seen"] == [expected_weight_version(number)]
            seen.append(int(row["versions_seen"][0]))
    assert seen == sorted(seen) and seen[-1] > seen[0] == 0, summary["steps"]

    html = (out / "report.html").read_text()
    for chart in CHARTS:
        assert f'id="{chart}"' in html, chart
    assert summary["wall_s"] < DEMO_RUN_S


@pytest.mark.timeout(420)
@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_interrupt_mid_rollout_stops_every_process(tmp_path: Path, stop_signal: signal.Signals) -> None:
    out, token = tmp_path / "demo", uuid.uuid4().hex
    flags = ["--steps", "3", "--tasks", "4", "--attempts", "3", "--faults", "0.3"]
    process = subprocess.Popen(
        _with_ctrl_c(_demo_argv(out, *flags)),
        env=_env(token),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        metrics = out / "metrics.jsonl"
        deadline = time.monotonic() + FIRST_ROLLOUT_S
        while not (metrics.exists() and read_records(metrics, "weight_push")):  # initial push: rollouts start
            assert process.poll() is None, process.communicate()[0][-4000:]
            assert time.monotonic() < deadline, "the demo did not reach its first rollout"
            time.sleep(0.2)
        time.sleep(1.0)
        process.send_signal(stop_signal)
        output, _ = process.communicate(timeout=90)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode != 0, output[-4000:]
    assert "stopping every process the demo started" in output
    _assert_nothing_left(token, out)


@pytest.mark.timeout(480)
def test_demo_scales_out_over_harbor_replicas_and_session_servers(tmp_path: Path) -> None:
    """Two Harbor replicas as Ray actors of the demo's Ray, both serving attempts: 6 attempts at
    once are more than the router's spill-over (4) lets one replica take alone."""
    out, token = tmp_path / "demo", uuid.uuid4().hex
    flags = ["--steps", "1", "--tasks", "3", "--attempts", "2"]
    flags += ["--harbor-replicas", "2", "--session-servers", "2"]
    run = subprocess.run(
        _demo_argv(out, *flags), env=_env(token), capture_output=True, text=True, timeout=DEMO_RUN_S
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-4000:]
    _assert_nothing_left(token, out)
    manifest = json.loads((out / "logs" / "services.json").read_text())
    assert len(manifest["session_servers"]) == 2, manifest
    assert not [s for s in manifest["services"] if s["name"].startswith("harbor")], manifest
    actors = manifest["harbor_replicas"]
    assert [a["index"] for a in actors] == [0, 1], actors
    assert len({a["pid"] for a in actors}) == 2 and len({a["url"] for a in actors}) == 2, actors
    assert all(a["loop"].startswith("asyncio") for a in actors), actors  # not uvloop
    summary = json.loads((out / "summary.json").read_text())
    served = {r["index"]: r["attempts"] for r in summary["harbor_replicas"]}
    assert sum(served.values()) == 6 and min(served.values()) >= 1, summary["harbor_replicas"]
    assert summary["harbor_replacements"] == []
    steps, attempts = read_metrics(out / "metrics.jsonl")
    assert [s["rollout_id"] for s in steps] == [0]
    assert len(attempts) == 6 and all(a["attempt_class"] for a in attempts)
    assert "Harbor pool attempts served" in output


def _sandboxes_under(pid: int) -> int:
    """bubblewrap processes descended from `pid`."""
    parents: dict[int, tuple[int, str]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            text = stat.read_text()
            parents[int(stat.parent.name)] = (int(text[text.rindex(")") + 2 :].split()[1]), text)
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, (parent, _) in parents.items() if parent in frontier} - found
        found |= frontier
    return sum(1 for child in found if "(bwrap)" in parents[child][1])


@pytest.mark.timeout(480)
def test_a_replica_killed_mid_step_is_replaced_and_its_attempts_are_masked(tmp_path: Path) -> None:
    """SIGKILL one Harbor replica's process while it runs sandboxes: the step completes with that
    replica's attempts masked as infra, the pool's watchdog replaces it on the same URL, and the
    next step's attempts are all graded."""
    out, token = tmp_path / "demo", uuid.uuid4().hex
    flags = ["--steps", "2", "--tasks", "3", "--attempts", "2", "--harbor-replicas", "2"]
    process = subprocess.Popen(
        _demo_argv(out, *flags), env=_env(token), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        manifest_path, deadline = out / "logs" / "services.json", time.monotonic() + FIRST_ROLLOUT_S
        victim = None
        while victim is None:
            assert process.poll() is None, process.communicate()[0][-4000:]
            assert time.monotonic() < deadline, "no replica ran a sandbox"
            with contextlib.suppress(OSError, ValueError, KeyError):
                for replica in json.loads(manifest_path.read_text())["harbor_replicas"]:
                    if _sandboxes_under(replica["pid"]):
                        victim = replica
                        break
            time.sleep(0.05)
        os.kill(victim["pid"], signal.SIGKILL)
        output, _ = process.communicate(timeout=DEMO_RUN_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, output[-4000:]
    _assert_nothing_left(token, out)
    summary = json.loads((out / "summary.json").read_text())
    (replacement,) = summary["harbor_replacements"]
    assert replacement["index"] == victim["index"] and replacement["url"] == victim["url"], replacement
    served = {r["index"]: r for r in summary["harbor_replicas"]}
    assert served[victim["index"]]["generation"] == 1 and served[victim["index"]]["pid"] != victim["pid"]
    first, second = summary["steps"]
    lost = first["infra_by_cause"].get("sandbox_lost", 0) + first["infra_by_cause"].get("no_sandbox", 0)
    assert lost >= 1, first
    assert second["valid"] == second["attempts"] == 6, second
    _, attempts = read_metrics(out / "metrics.jsonl")
    masked = [a for a in attempts if a["attempt_class"] in ("infra:sandbox_lost", "infra:no_sandbox")]
    assert len(masked) == lost and all(a["reward"] is None and not a["trained"] for a in masked), masked
