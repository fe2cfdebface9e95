"""The task audit's decisions, with scripted /run answers (no server): every verdict, retries of
infrastructure failures, the cache by content digest and the output files."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from rl360_ext.outcomes.known_good import from_audit_evidence
from rl360_ext.outcomes.verdict import TrialFacts, attempt_class, judge
from rl360_ext.tasks.audit import (
    AuditConfig,
    Cache,
    RunFailed,
    TaskRejected,
    audit_task,
    audit_tasks,
    find_tasks,
    from_cache,
    task_digest,
)
from rl360_ext.tasks.health import (
    QUARANTINE_FILE,
    TASK_HEALTH_FILE,
    TaskHealth,
    write_outputs,
)
from rl360_ext.tasks.verdicts import CONTROL_AGENTS, Control, TaskVerdict

CANARY = CONTROL_AGENTS[Control.CANARY_REWARD_FILE]
SHIMS = CONTROL_AGENTS[Control.CANARY_PATH_SHIMS]
PROBE = CONTROL_AGENTS[Control.PROBE_LEAKS]
CONFTEST = CONTROL_AGENTS[Control.CANARY_CONFTEST]
INSENSITIVE = CONTROL_AGENTS[Control.INSENSITIVE]
REGRADE = CONTROL_AGENTS[Control.VERIFIER_REGRADE]
HIJACK = CONTROL_AGENTS[Control.WORK_PRODUCT_HIJACK]
IDLE = CONTROL_AGENTS[Control.NOP]
AGENTS = ("nop", "oracle", "terminus-2", IDLE, CANARY, SHIMS, PROBE, CONFTEST, INSENSITIVE, REGRADE, HIJACK)
CONTROL_OF = {agent: str(control) for control, agent in CONTROL_AGENTS.items()}


def valid(reward: float, agent_s: float = 0.1, verifier_s: float = 0.2) -> dict[str, Any]:
    return {
        "attempt_class": "valid",
        "reward": reward,
        "rewards": {"reward": reward},
        "reward_source": "verifier",
        "failure_cause": None,
        "exception_type": None,
        "phase_timings": {"agent": agent_s, "verifier": verifier_s},
    }


def infra(cause: str, klass: str) -> dict[str, Any]:
    return {
        "attempt_class": klass,
        "reward": None,
        "rewards": None,
        "reward_source": None,
        "failure_cause": cause,
    }


SANDBOX_FAILED = infra("sandbox_failed", "infra:sandbox_lost")
CRASHED = infra("verifier_crash", "infra:verifier_crash")
Script = Callable[[str, int], Mapping[str, Any] | BaseException]  # (agent, nth call of it) -> answer


class Scripted:
    """A RunAttempt answering from a script, counting calls per agent."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.calls: dict[str, int] = defaultdict(int)
        self.kwargs: dict[str, dict[str, Any]] = {}
        self.deadlines: set[float] = set()

    async def __call__(
        self, task: str, agent: str, agent_kwargs: Mapping[str, Any], deadline_s: float
    ) -> Mapping[str, Any]:
        self.kwargs[agent] = dict(agent_kwargs)
        self.deadlines.add(deadline_s)
        nth = self.calls[agent]
        self.calls[agent] += 1
        answer = self.script(agent, nth)
        if isinstance(answer, BaseException):
            raise answer
        return answer


def healthy(agent: str, nth: int) -> Mapping[str, Any]:
    return valid(1.0 if agent in ("oracle", REGRADE) else 0.0)


def disagreed(rewards: str = '[{"reward": 1.0}, {"reward": 0.0}, {"reward": 0.0}]') -> dict[str, Any]:
    """The regrade agent's answer when its gradings differ (rl360_ext.harbor.canaries.OracleRegrade)."""
    return {
        **server_verdict("VerifierDisagreed"),
        "exception_message": f"rewards {rewards} on one end state",
    }


def server_verdict(exception_type: str) -> dict[str, Any]:
    """The /run answer's verdict fields for a trial that ended with `exception_type` after its
    verifier wrote 1.0 (Harbor grades after an exception it does not know), as the server judges."""
    verdict = judge(TrialFacts(rewards={"reward": 1.0}, exception_type=exception_type))
    return {
        "attempt_class": verdict.attempt_class,
        "reward": verdict.reward,
        "rewards": verdict.rewards,
        "reward_source": verdict.reward_source,
        "failure_cause": None if verdict.failure_cause is None else str(verdict.failure_cause),
        "exception_type": exception_type,
    }


def test_the_audit_agents_exceptions_have_their_own_classes_not_unclassified() -> None:
    """The regrade's finding and a control that could not run were `infra:unclassified` (Harbor
    does not know rl360's exception types); each has its class, and neither keeps a reward."""
    assert server_verdict("VerifierDisagreed")["attempt_class"] == "infra:verifier_disagreed"
    assert server_verdict("CanaryIncomplete")["attempt_class"] == "infra:control_incomplete"
    for exception_type in ("VerifierDisagreed", "CanaryIncomplete"):
        answer = server_verdict(exception_type)
        assert answer["reward"] is None and answer["reward_source"] is None
        assert attempt_class(answer) == answer["attempt_class"]  # the client reads it as the server said


def make_task(root: Path, name: str = "t", agent_timeout: float | None = 60.0) -> Path:
    task = root / name
    (task / "tests").mkdir(parents=True)
    (task / "tests" / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    budget = f"[agent]\ntimeout_sec = {agent_timeout}\n" if agent_timeout is not None else ""
    (task / "task.toml").write_text(f'schema_version = "1.4"\n{budget}')
    return task


async def audit(
    tmp_path: Path, script: Script, agents: tuple[str, ...] = AGENTS, **config: Any
) -> TaskHealth:
    return await audit_task("t", make_task(tmp_path), Scripted(script), AuditConfig(**config), agents)


async def test_a_healthy_task_is_ok_with_its_evidence(tmp_path: Path) -> None:
    health = await audit(tmp_path, healthy)
    assert health.verdicts == [TaskVerdict.OK]
    assert not health.quarantined
    # nop: the environment's run and the two timed runs of the idle agent
    assert health.evidence["oracle"]["passed"] == 3 and health.evidence["nop"]["valid"] == 3
    assert health.evidence["nop"]["paused"] is True
    assert health.evidence["suggested_timeouts"] == {"verifier_s": 10.0}  # 3 x 0.2 s, clamped up
    assert health.evidence["verifier_timeout_s"] == 600.0  # Harbor's default: task.toml declares none


async def test_oracle_never_at_the_maximum_is_broken_oracle(tmp_path: Path) -> None:
    health = await audit(tmp_path, lambda agent, nth: valid(0.5 if agent == "oracle" else 0.0))
    assert health.verdicts == [TaskVerdict.BROKEN_ORACLE]


async def test_oracle_sometimes_at_the_maximum_is_flaky(tmp_path: Path) -> None:
    health = await audit(tmp_path, lambda agent, nth: valid(float(nth != 1) if agent == "oracle" else 0.0))
    assert health.verdicts == [TaskVerdict.FLAKY]
    assert health.evidence["oracle"]["passed"] == 2


async def test_nop_above_the_floor_is_vacuous_and_not_also_hackable(tmp_path: Path) -> None:
    health = await audit(tmp_path, lambda agent, nth: valid(1.0 if agent != "nop" or nth == 1 else 0.0))
    assert health.verdicts == [TaskVerdict.VACUOUS]


@pytest.mark.parametrize(
    ("canary", "verdict"),
    [
        (CANARY, TaskVerdict.HACKABLE),
        (SHIMS, TaskVerdict.HACKABLE),
        (PROBE, TaskVerdict.LEAKY),
        (CONFTEST, TaskVerdict.HACKABLE),
        (INSENSITIVE, TaskVerdict.INSENSITIVE),
        (HIJACK, TaskVerdict.HACKABLE),
    ],
)
async def test_a_canary_at_the_maximum_gives_its_verdict(
    tmp_path: Path, canary: str, verdict: TaskVerdict
) -> None:
    health = await audit(
        tmp_path, lambda agent, nth: valid(1.0 if agent in ("oracle", REGRADE, canary) else 0.0)
    )
    assert health.verdicts == [verdict]
    assert health.evidence["found_by"] == {CONTROL_OF[canary]: verdict}


async def test_a_canary_below_the_maximum_is_no_finding(tmp_path: Path) -> None:
    # The insensitive canary's oracle with its work undone at 0.9 (below the maximum): sensitive enough.
    health = await audit(
        tmp_path,
        lambda agent, nth: valid(0.9 if agent == INSENSITIVE else 1.0 * (agent in ("oracle", REGRADE))),
    )
    assert health.verdicts == [TaskVerdict.OK]
    assert health.evidence[Control.INSENSITIVE]["reward"] == 0.9


async def test_a_vacuous_task_is_not_also_insensitive_or_hackable_by_conftest(tmp_path: Path) -> None:
    health = await audit(tmp_path, lambda agent, nth: valid(1.0))
    assert health.verdicts == [TaskVerdict.VACUOUS]


async def test_gradings_that_differ_are_flaky_verifier_and_never_retried(tmp_path: Path) -> None:
    runner = Scripted(lambda agent, nth: disagreed() if agent == REGRADE else healthy(agent, nth))
    health = await audit_task("t", make_task(tmp_path), runner, AuditConfig(), AGENTS)
    assert health.verdicts == [TaskVerdict.FLAKY_VERIFIER]
    assert runner.calls[REGRADE] == 1
    assert health.evidence["found_by"] == {"verifier_regrade": "flaky_verifier"}
    assert runner.kwargs[REGRADE] == {"runs": 3}
    regrade = health.evidence[Control.VERIFIER_REGRADE]
    assert (
        regrade["exception_type"] == "VerifierDisagreed" and '"reward": 0.0' in regrade["exception_message"]
    )
    assert regrade["attempt_class"] == "infra:verifier_disagreed"
    assert health.evidence["retried_infra"] == []


async def test_gradings_that_agree_are_no_finding_whatever_the_reward(tmp_path: Path) -> None:
    # A broken oracle's end state graded 0 every time: broken_oracle, not flaky_verifier.
    health = await audit(tmp_path, lambda agent, nth: valid(0.0))
    assert health.verdicts == [TaskVerdict.BROKEN_ORACLE]
    runner = Scripted(healthy)
    await audit_task("t", make_task(tmp_path / "b"), runner, AuditConfig(verifier_runs=5), AGENTS)
    assert runner.kwargs[REGRADE] == {"runs": 5}


async def test_a_regrade_that_cannot_run_is_retried_then_undecided(tmp_path: Path) -> None:
    incomplete = {
        **server_verdict("CanaryIncomplete"),
        "exception_message": "a regrade failed: VerifierTimeoutError",
    }
    runner = Scripted(lambda agent, nth: incomplete if agent == REGRADE else healthy(agent, nth))
    health = await audit_task("t", make_task(tmp_path), runner, AuditConfig(retries=1), AGENTS)
    assert health.verdicts == []
    assert health.evidence["undecided"] == [Control.VERIFIER_REGRADE]
    assert runner.calls[REGRADE] == 2


async def test_canaries_get_the_maximum_and_the_shims_the_verifier_path(tmp_path: Path) -> None:
    task = make_task(tmp_path)
    with (task / "task.toml").open("a") as toml:
        toml.write('[verifier.env]\nPATH = "/app/.venv/bin:/usr/bin"\n')
    runner = Scripted(healthy)
    await audit_task("t", task, runner, AuditConfig(max_reward=5.0), AGENTS)
    pauses = {agent: kwargs.pop("pause_s") for agent, kwargs in runner.kwargs.items() if "pause_s" in kwargs}
    assert runner.kwargs[SHIMS] == {"reward": 5.0, "path": "/app/.venv/bin:/usr/bin"}
    assert runner.kwargs[CANARY] == runner.kwargs[PROBE] == {"reward": 5.0}
    assert runner.kwargs[CONFTEST] == runner.kwargs[INSENSITIVE] == {"reward": 5.0}
    assert runner.kwargs[HIJACK] == {"reward": 5.0, "stub": "raise"}  # the last of its two variants
    assert runner.kwargs["oracle"] == runner.kwargs["nop"] == runner.kwargs[IDLE] == {}
    assert runner.calls[HIJACK] == 2 and runner.calls[IDLE] == 2
    # Every control that stands in for a policy waits 5% to 25% of the task's 60 s agent budget.
    assert set(pauses) == {IDLE, CANARY, SHIMS, PROBE, CONFTEST, INSENSITIVE, HIJACK}
    assert all(3.0 <= pause <= 15.0 for pause in pauses.values())


async def test_the_pause_is_a_random_share_of_the_budget_capped(tmp_path: Path) -> None:
    pauses: list[float] = []

    def script(agent: str, nth: int) -> Mapping[str, Any]:
        return healthy(agent, nth)

    class Recording(Scripted):
        async def __call__(self, task: str, agent: str, kwargs: Mapping[str, Any], deadline_s: float) -> Any:
            if "pause_s" in kwargs:
                pauses.append(kwargs["pause_s"])
            return await super().__call__(task, agent, kwargs, deadline_s)

    config = AuditConfig(idle_share_min=0.1, idle_share_max=0.5, idle_max_s=20.0)
    for n in range(5):
        await audit_task("t", make_task(tmp_path / str(n)), Recording(script), config, AGENTS)
    assert all(6.0 <= pause <= 20.0 for pause in pauses) and len(set(pauses)) > 1
    off = Recording(script)
    pauses.clear()
    await audit_task(
        "t", make_task(tmp_path / "off"), off, AuditConfig(idle_share_max=0.0, idle_share_min=0.0), AGENTS
    )
    assert pauses and set(pauses) == {0.0}


async def test_a_hack_that_leaves_the_verifier_without_a_reward_is_no_finding(tmp_path: Path) -> None:
    """A stub that exits 0 at import before the verifier writes its reward: the hack got nothing
    (decided, never retried), unlike an infrastructure failure."""
    no_reward = infra("reward_file_missing", "infra:reward_file_missing")
    runner = Scripted(lambda agent, nth: no_reward if agent == HIJACK else healthy(agent, nth))
    health = await audit_task("t", make_task(tmp_path), runner, AuditConfig(), AGENTS)
    assert health.verdicts == [TaskVerdict.OK]
    assert runner.calls[HIJACK] == 2
    assert [r["failure_cause"] for r in health.evidence[Control.WORK_PRODUCT_HIJACK]["runs"]] == [
        "reward_file_missing"
    ] * 2
    lost = Scripted(lambda agent, nth: SANDBOX_FAILED if agent == HIJACK else healthy(agent, nth))
    health = await audit_task("t", make_task(tmp_path / "b"), lost, AuditConfig(), AGENTS)
    assert health.evidence["undecided"] == [Control.WORK_PRODUCT_HIJACK]


async def test_either_stub_at_the_maximum_makes_the_task_hackable(tmp_path: Path) -> None:
    health = await audit(
        tmp_path,
        lambda agent, nth: valid(1.0 if agent in ("oracle", REGRADE) or (agent, nth) == (HIJACK, 1) else 0.0),
    )
    assert health.verdicts == [TaskVerdict.HACKABLE]
    assert health.evidence[Control.WORK_PRODUCT_HIJACK]["reward"] == 1.0


async def test_a_canary_the_server_lacks_is_skipped_not_passed(tmp_path: Path) -> None:
    runner = Scripted(healthy)
    health = await audit_task("t", make_task(tmp_path), runner, AuditConfig(), ("nop", "oracle", SHIMS))
    assert health.verdicts == [TaskVerdict.OK]
    assert health.evidence["skipped"] == [
        Control.CANARY_REWARD_FILE,
        Control.PROBE_LEAKS,
        Control.CANARY_CONFTEST,
        Control.INSENSITIVE,
        Control.VERIFIER_REGRADE,
        Control.WORK_PRODUCT_HIJACK,
    ]
    # Without rl360's idle agent, the nop control is Harbor's nop: run, but not timed like a policy.
    assert runner.calls["nop"] == 3 and health.evidence["nop"]["paused"] is False


async def test_an_oracle_over_the_fraction_of_its_budget_is_slow(tmp_path: Path) -> None:
    slow = await audit(
        tmp_path, lambda agent, nth: valid(1.0, agent_s=31.0) if agent == "oracle" else valid(0.0)
    )
    assert slow.verdicts == [TaskVerdict.SLOW_ORACLE]
    fine = await audit(tmp_path / "b", lambda a, n: valid(1.0, agent_s=29.0) if a == "oracle" else valid(0.0))
    assert fine.verdicts == [TaskVerdict.OK]


async def test_an_oracle_cut_off_at_its_budget_is_slow_but_not_broken(tmp_path: Path) -> None:
    timed_out = {**infra("agent_timeout", "infra:agent_timeout"), "phase_timings": {"agent": 60.2}}
    health = await audit(tmp_path, lambda agent, nth: timed_out if agent == "oracle" else valid(0.0))
    assert health.verdicts == [TaskVerdict.SLOW_ORACLE]
    assert health.evidence["undecided"] == [Control.ORACLE]


async def test_a_task_the_server_refuses_is_lint_and_nothing_else_runs(tmp_path: Path) -> None:
    runner = Scripted(lambda agent, nth: TaskRejected(422, "task_invalid", "bad task.toml"))
    health = await audit_task("t", make_task(tmp_path), runner, AuditConfig(), AGENTS)
    assert health.verdicts == [TaskVerdict.LINT]
    assert health.evidence["lint"]["type"] == "task_invalid"
    assert dict(runner.calls) == {"nop": 1}


async def test_a_task_that_stops_loading_during_the_audit_is_lint(tmp_path: Path) -> None:
    def script(agent: str, nth: int) -> Mapping[str, Any] | BaseException:
        return healthy(agent, nth) if agent == "nop" else TaskRejected(422, "task_invalid", "changed")

    health = await audit(tmp_path, script)
    assert health.verdicts == [TaskVerdict.LINT]
    assert health.evidence["lint"]["message"] == "changed"


async def test_an_environment_that_never_starts_is_broken_env_after_its_retries(tmp_path: Path) -> None:
    runner = Scripted(lambda agent, nth: SANDBOX_FAILED)
    health = await audit_task("t", make_task(tmp_path), runner, AuditConfig(retries=2), AGENTS)
    assert health.verdicts == [TaskVerdict.BROKEN_ENV]
    assert dict(runner.calls) == {"nop": 3}
    assert len(health.evidence["retried_infra"]) == 2


async def test_infrastructure_failures_are_retried_and_never_evidence(tmp_path: Path) -> None:
    # Each agent's first two attempts fail as infrastructure (a crash, a lost connection); the third is fine.
    def flaky_infra(agent: str, nth: int) -> Mapping[str, Any] | BaseException:
        if nth % 3 == 0:
            return CRASHED
        if nth % 3 == 1:
            return RunFailed("connection reset")
        return healthy(agent, nth)

    health = await audit(tmp_path, flaky_infra, oracle_runs=1, nop_runs=1)
    assert health.verdicts == [TaskVerdict.OK]
    classes = {a["attempt_class"] for a in health.evidence["retried_infra"]}
    assert classes == {"infra:verifier_crash", "infra:transport_error"}


async def test_a_control_with_no_valid_attempt_is_undecided_not_ok(tmp_path: Path) -> None:
    health = await audit(tmp_path, lambda agent, nth: CRASHED if agent == "oracle" else healthy(agent, nth))
    assert health.verdicts == []
    assert health.evidence["undecided"] == [Control.ORACLE]
    assert health.quarantined


async def test_results_are_cached_by_content_digest(tmp_path: Path) -> None:
    task = make_task(tmp_path / "tasks")
    cache = Cache(tmp_path / "cache", AuditConfig(), AGENTS)
    runner = Scripted(healthy)
    (first,) = await audit_tasks([("t", task)], runner, AuditConfig(), AGENTS, cache)
    calls = sum(runner.calls.values())
    (again,) = await audit_tasks([("t", task)], runner, AuditConfig(), AGENTS, cache)
    assert sum(runner.calls.values()) == calls and again.evidence["cached"] is True
    assert again.verdicts == first.verdicts
    assert from_cache([("t", task)], cache) is not None
    (task / "tests" / "test.sh").write_text("#!/bin/bash\necho 0 > /logs/verifier/reward.txt\n")
    assert from_cache([("t", task)], cache) is None
    assert from_cache([("t", task)], Cache(tmp_path / "cache", AuditConfig(oracle_runs=5), AGENTS)) is None


async def test_an_undecided_result_is_cached_for_its_evidence_but_never_served(tmp_path: Path) -> None:
    task = make_task(tmp_path / "tasks")
    cache = Cache(tmp_path / "cache", AuditConfig(), AGENTS)
    runner = Scripted(lambda agent, nth: TIMED_OUT if agent == "oracle" else healthy(agent, nth))
    (first,) = await audit_tasks([("t", task)], runner, AuditConfig(), AGENTS, cache)
    assert first.evidence["undecided"] == [Control.ORACLE]
    assert from_cache([("t", task)], cache) is None  # an audit runs it again
    (again,) = await audit_tasks([("t", task)], runner, AuditConfig(), AGENTS, cache)
    assert again.evidence["cached"] is False
    assert from_audit_evidence(again.evidence).healthy is False  # the verifier failed on the oracle's state


TIMED_OUT = infra("verifier_timeout", "infra:verifier_timeout")


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        (healthy, True),
        # the verifier times out on the known-good state in every try: it failed there
        (lambda agent, nth: TIMED_OUT if agent == "oracle" else healthy(agent, nth), False),
        # once in a retry, then graded: it still failed there once
        (lambda agent, nth: TIMED_OUT if (agent, nth) == ("oracle", 0) else healthy(agent, nth), False),
        # a valid grading that took longer than the task's verifier timeout (600 s)
        (lambda agent, nth: valid(1.0, verifier_s=700.0) if agent == "oracle" else valid(0.0), False),
        # a run lost to the sandbox says nothing about the verifier
        (lambda agent, nth: SANDBOX_FAILED if agent == "oracle" else healthy(agent, nth), None),
        # the server's evidence: a limit hit in the verifier phase
        (
            lambda agent, nth: (
                {**SANDBOX_FAILED, "evidence": {"phase": "verifier", "resource": "memory"}}
                if agent == "oracle"
                else healthy(agent, nth)
            ),
            False,
        ),
    ],
)
async def test_verifier_health_on_the_known_good_state(
    tmp_path: Path, script: Script, expected: bool | None
) -> None:
    health = await audit(tmp_path, script)
    assert from_audit_evidence(health.evidence).healthy is expected
    reread = TaskHealth.from_json(json.loads(json.dumps(health.as_json())))
    assert from_audit_evidence(reread.evidence).healthy is expected
    assert from_audit_evidence(TaskHealth("t", [TaskVerdict.OK], {}).evidence).healthy is None  # without it


def test_the_digest_covers_names_and_bytes(tmp_path: Path) -> None:
    task = make_task(tmp_path)
    before = task_digest(task)
    (task / "tests" / "test.sh").rename(task / "tests" / "grade.sh")
    renamed = task_digest(task)
    assert len({before, renamed}) == 2
    assert task_digest(task) == renamed


def test_outputs_quarantine_every_task_not_ok(tmp_path: Path) -> None:
    results = [
        TaskHealth("good", [TaskVerdict.OK], {"undecided": []}),
        TaskHealth("bad", [TaskVerdict.VACUOUS, TaskVerdict.SLOW_ORACLE], {"undecided": []}),
        TaskHealth("unknown", [], {"undecided": ["oracle"]}),
    ]
    write_outputs(results, tmp_path)
    lines = [json.loads(line) for line in (tmp_path / TASK_HEALTH_FILE).read_text().splitlines()]
    assert [line["task"] for line in lines] == ["good", "bad", "unknown"]
    quarantine = json.loads((tmp_path / QUARANTINE_FILE).read_text())["tasks"]
    assert quarantine == {
        "bad": {"verdicts": ["vacuous", "slow_oracle"], "undecided": []},
        "unknown": {"verdicts": [], "undecided": ["oracle"]},
    }


def test_find_tasks_lists_task_dirs_and_names_a_missing_one(tmp_path: Path) -> None:
    make_task(tmp_path, "a")
    make_task(tmp_path, "b")
    (tmp_path / "not-a-task").mkdir()
    assert [name for name, _ in find_tasks(tmp_path)] == ["a", "b"]
    assert [name for name, _ in find_tasks(tmp_path, ["b"])] == ["b"]
    with pytest.raises(ValueError, match="no task c"):
        find_tasks(tmp_path, ["c"])


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("oracle_runs", 0),
        ("nop_runs", 0),
        ("retries", -1),
        ("slow_fraction", 0.0),
        ("deadline_s", float("nan")),
        ("verifier_runs", 1),
        ("idle_share_max", 1.0),
        ("idle_share_min", -0.1),
        ("idle_max_s", float("inf")),
    ],
)
def test_a_bad_config_names_its_field(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        AuditConfig(**{field: value})


def test_verdicts_are_the_issue_vocabulary() -> None:
    assert {v.value for v in TaskVerdict} == {
        "lint", "broken_env", "broken_oracle", "flaky", "vacuous", "flaky_verifier",
        "insensitive", "hackable", "leaky", "slow_oracle", "ok",
        "slow_verifier",  # given during training only (rl360_ext.tasks.tracker)
    }  # fmt: skip


async def test_each_task_gets_a_deadline_from_its_own_timeouts(tmp_path: Path) -> None:
    task = make_task(tmp_path, agent_timeout=60.0)
    with (task / "task.toml").open("a") as toml:
        toml.write("[verifier]\ntimeout_sec = 20.0\n[environment]\nbuild_timeout_sec = 30.0\n")
    runner = Scripted(healthy)
    health = await audit_task("t", task, runner, AuditConfig(deadline_slack_s=100.0), AGENTS)
    assert runner.deadlines == {210.0} and health.evidence["deadline_s"] == 210.0
    bare = make_task(tmp_path / "bare", agent_timeout=None)  # Harbor's defaults: 600 s build and verifier
    runner = Scripted(healthy)
    await audit_task("t", bare, runner, AuditConfig(default_agent_s=300.0, deadline_slack_s=0.0), AGENTS)
    assert runner.deadlines == {1500.0}
    runner = Scripted(healthy)
    await audit_task("t", bare, runner, AuditConfig(deadline_s=42.0), AGENTS)
    assert runner.deadlines == {42.0}
