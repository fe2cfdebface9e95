"""Attribution by evidence through a real `rl360 harbor serve` (issue 34): a policy that makes its own
failure look like infrastructure (a hanging test, an OOM, a fork bomb, a full disk, a chmod) is
scored, with its attribution and evidence, and the client keeps it scored; a verifier that fails on
the task's known-good state too stays masked (the task's); `--attribution list` keeps today's rule.

The policy is `policy_agent.ScriptPolicy` (a script as the agent phase) on a copy of `fix-mean`
with short timeouts; the oracle's solution is the known-good state the control regrades."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from integration_tests.harbor.policy_agent import IMPORT_PATH
from rl360_ext.local.fixtures import tasks_root as example_tasks_root
from rl360_ext.outcomes.verdict import attempt_class
from rl360_ext.rollout.agent import result_metadata
from rl360_ext.util.procs import Service

pytestmark = [pytest.mark.integration, pytest.mark.slow]

BUDGET_FLAGS = ("--env-setup-s", "20", "--agent-setup-s", "5", "--margin-s", "2", "--min-agent-s", "1")
RIGHT = "def mean(xs):\n    return sum(xs) / len(xs)\n"
WRONG = "def mean(xs):\n    return 0\n"


def writes(module: str) -> str:
    return f"cat > /app/stats.py <<'EOF'\n{module}EOF\n"


DEEP_TREE = 'import os\nos.chdir("/app")\nfor _ in range(3000):\n    os.mkdir("d")\n    os.chdir("d")'
# Each policy: the script of its agent phase.
POLICIES = {
    "wrong": writes(WRONG),
    "hang": writes("def mean(xs):\n    while True:\n        pass\n"),
    "verifier_oom": writes("x = bytearray(1 << 30)\n" + RIGHT),
    "fork_bomb": writes("import os\nwhile True:\n    os.fork()\n" + RIGHT),
    "agent_oom": "python3 -c 'x = bytearray(1 << 30)'\n" + writes(WRONG),
    "agent_over_budget": writes(WRONG) + "sleep 60\n",
    "chmod": writes(RIGHT) + "chmod 000 /app /tests /logs /logs/verifier 2>/dev/null; true\n",
    "fills_disk": writes(RIGHT) + "dd if=/dev/zero of=/app/fill bs=1M 2>/dev/null; true\n",
    "fills_inodes": writes(RIGHT)
    + "mkdir /app/many && cd /app/many && seq 1 200000 | xargs touch 2>/dev/null; true\n",
    "deep_tree": writes(RIGHT) + f"python3 -c '{DEEP_TREE}'\n",
    "forging_daemon": writes(
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        time.sleep(1.5)\n"
        "        open('/logs/verifier/reward.txt', 'w').write('1')\n"
        "        os._exit(0)\n"
        "    os._exit(0)\n" + WRONG
    ),
}
# (attempt class, reward, reward source, attributed_to, evidence phase, control); ANY: whichever.
ANY = object()
EXPECTED: dict[str, tuple[Any, ...]] = {
    "wrong": ("valid", 0.0, "verifier", None, None, None),
    "hang": ("valid", 0.0, "floor", "policy", "verifier", "regrade"),
    "verifier_oom": ("valid", 0.0, "floor", "policy", "verifier", "regrade"),
    # a fork bomb in the check's child: refused at the pids limit (the check fails: the verifier's 0),
    # or the verifier times out (the floor, by the regrade's evidence); scored either way
    "fork_bomb": ("valid", 0.0, ANY, ANY, ANY, ANY),
    "agent_oom": ("valid", 0.0, "verifier", "policy", "agent", "rule"),
    "agent_over_budget": ("valid", 0.0, "verifier", "policy", "agent", "rule"),
    "chmod": ("valid", 1.0, "verifier", None, None, None),
    "fills_disk": ("valid", 1.0, "verifier", "policy", "agent", "rule"),
    "fills_inodes": ("valid", 1.0, "verifier", "policy", "agent", "rule"),
    "deep_tree": ("valid", 1.0, "verifier", None, None, None),
    "forging_daemon": ("valid", 0.0, "verifier", None, None, None),
}


@pytest.fixture(scope="module")
def tasks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`mean` (fix-mean with a 4 s verifier and an 8 s agent) and `always-hangs` (a verifier that
    never finishes, on any state)."""
    root = tmp_path_factory.mktemp("tasks")
    for name, test in (("mean", None), ("always-hangs", "#!/bin/bash\nsleep 3600\n")):
        task = root / name
        shutil.copytree(example_tasks_root() / "fix-mean", task)
        toml = (task / "task.toml").read_text()
        toml = toml.replace("[verifier]\ntimeout_sec = 30.0", "[verifier]\ntimeout_sec = 4.0")
        toml = toml.replace("[agent]\ntimeout_sec = 120.0", "[agent]\ntimeout_sec = 8.0")
        (task / "task.toml").write_text(toml.replace("memory_mb = 512", "memory_mb = 256"))
        if test is not None:
            (task / "tests" / "test.sh").write_text(test)
    return root


def serve(harbor_server: Callable[..., Any], log_dir: Path, tasks: Path, *flags: str) -> Any:
    return harbor_server(
        log_dir,
        "--tasks-root",
        str(tasks),
        "--agent",
        f"policy={IMPORT_PATH}",
        "--max-concurrent",
        "4",
        *BUDGET_FLAGS,
        *flags,
    )


@pytest.fixture(scope="module")
def server(
    harbor_server: Callable[..., Any], tmp_path_factory: pytest.TempPathFactory, tasks: Path
) -> Iterator[Service]:
    with serve(harbor_server, tmp_path_factory.mktemp("harbor-logs"), tasks) as service:
        yield service


async def run(service: Service, bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(base_url=service.url, timeout=180) as http:
        responses = await asyncio.gather(*(http.post("/run", json=body) for body in bodies))
    assert all(r.status_code == 200 for r in responses), [r.text for r in responses]
    return [r.json() for r in responses]


def policy_run(name: str) -> dict[str, Any]:
    return {"task": "mean", "deadline_s": 90, "agent": "policy", "agent_kwargs": {"script": POLICIES[name]}}


async def test_a_policys_own_failure_is_scored_with_its_evidence(server: Service) -> None:
    results = await run(server, [policy_run(name) for name in POLICIES])
    for name, result in zip(POLICIES, results, strict=True):
        expected = EXPECTED[name]
        klass, reward, who = expected[0], expected[1], expected[3]
        evidence = result["evidence"] or {}
        seen = (
            result["attempt_class"],
            result["reward"],
            result["reward_source"],
            result["attributed_to"],
            evidence.get("phase"),
            evidence.get("control"),
        )
        assert all(want is ANY or want == got for want, got in zip(expected, seen, strict=True)), (
            name,
            result,
        )
        # The client keeps it as the server scored it: the agent function's metadata and its class.
        metadata = result_metadata(result)
        assert (metadata["attempt_class"], metadata["reward"]) == (klass, reward), (name, metadata)
        assert who is ANY or metadata["attributed_to"] == who
        assert metadata["evidence"] == result["evidence"]
        assert attempt_class(result) == klass
    hang = results[list(POLICIES).index("hang")]
    assert (hang["failure_cause"], hang["evidence"]["resource"]) == ("verifier_timeout", "time"), hang
    oom = results[list(POLICIES).index("verifier_oom")]
    assert oom["evidence"]["resource"] == "memory", oom
    health = httpx.get(server.url + "/health").json()["attribution"]
    assert health["rule"] == "evidence" and health["regrade_started"] == 1, health  # one control per task


async def test_a_verifier_that_fails_on_the_known_good_state_stays_masked(server: Service) -> None:
    (result,) = await run(server, [{"task": "always-hangs", "deadline_s": 90, "agent": "policy"}])
    assert (result["attempt_class"], result["reward"], result["attributed_to"]) == (
        "infra:verifier_timeout",
        None,
        "task",
    ), result
    assert result["evidence"]["control"] == "regrade", result
    assert result_metadata(result)["attempt_class"] == "infra:verifier_timeout"


async def test_the_list_rule_masks_what_the_cause_list_names(
    harbor_server: Callable[..., Any], tmp_path: Path, tasks: Path
) -> None:
    with serve(harbor_server, tmp_path, tasks, "--attribution", "list") as service:
        hang, over_budget = await run(service, [policy_run("hang"), policy_run("agent_over_budget")])
    assert (hang["attempt_class"], hang["attributed_to"]) == ("infra:verifier_timeout", "infrastructure")
    assert (over_budget["attempt_class"], over_budget["reward"]) == ("infra:agent_timeout", None)
