"""The fault matrix through the real stack: Harbor /run server (bwrap), SessionPool on Ray, tiny engine, SMG.

Every injected infrastructure failure must come out as an infra class whose reward reaches no
advantage and no logged mean, while a valid policy failure (the verifier wrote 0) is kept.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rl360_ext.local.bench.fault_matrix import (
    CASES,
    CaseResult,
    FaultStack,
    MatrixRow,
    matrix_rows,
    quiet,
    summarize,
)
from rl360_ext.rollout import agent as agent_module
from rl360_ext.rollout.config import env_name

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(420)]


@pytest.fixture(scope="module")
def matrix(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[FaultStack, list[CaseResult], list[MatrixRow]]]:
    work = tmp_path_factory.mktemp("fault-matrix")
    with FaultStack(work) as stack, quiet():
        results = asyncio.run(stack.run_all(CASES))
        rows = matrix_rows(results, stack.anchors, work)
        yield stack, results, rows


def by_case(rows: list[Any], name: str) -> Any:
    return next(r for r in rows if (r.case if isinstance(r, MatrixRow) else r.case.name) == name)


def test_every_cause_gets_its_class_and_no_infra_reward_enters_a_statistic(matrix: Any) -> None:
    _, _, rows = matrix
    summary = summarize(rows)
    assert summary.failures == [], "\n".join(summary.failures)
    assert summary.rows == len(CASES) and summary.infra_rows == len(CASES) - 2
    for row in rows:
        if row.attempt_class == "valid":
            continue
        assert (row.reward, row.remove_sample, row.loss_tokens, row.status) == (None, True, 0, "aborted"), row
        assert not row.enters_means, row
        # the check is not vacuous: scored 0.0 as upstream does, the same failure moves the others
        assert row.upstream_shift is not None and row.upstream_shift > 0.1, row


def test_valid_policy_failures_are_kept_and_count(matrix: Any) -> None:
    _, _, rows = matrix
    failure, success = by_case(rows, "policy_failure"), by_case(rows, "policy_success")
    assert (failure.attempt_class, failure.reward, failure.kept_policy_failure) == ("valid", 0.0, True)
    assert (success.attempt_class, success.reward, success.remove_sample) == ("valid", 1.0, False)
    assert failure.enters_means and success.enters_means
    assert failure.loss_tokens > 0 and failure.loss_tokens == failure.response_tokens


def test_in_flight_faults_landed_while_the_attempt_ran(matrix: Any) -> None:
    _, _, rows = matrix
    assert by_case(rows, "harbor_killed").note == "fault while the attempt was running"
    assert by_case(rows, "flushed").note == "fault while the attempt was running"
    assert by_case(rows, "flushed").failure_cause == "cancelled"
    assert by_case(rows, "session_deleted").note == "deleted while the run was in flight"


def test_generated_samples_are_what_miles_expects(matrix: Any) -> None:
    _, results, _ = matrix
    for result in results:
        sample = result.sample
        sample.validate()
        routed = sample.rollout_routed_experts
        assert routed is not None and routed.dtype == np.int32 and routed.shape[0] == len(sample.tokens) - 1
        assert (
            sample.metadata["session_server_instance_id"] and sample.metadata["generate_timings"]["total"] > 0
        )
    valid = by_case(results, "policy_failure").sample
    meta = valid.metadata
    assert (
        meta["attempt_class"] == "valid"
        and meta["reward_source"] == "verifier"
        and meta["task"] == "fizzbuzz"
    )
    assert meta["session"]["template"]["append_only"] is True
    assert meta["prompt_tokens"] >= valid.response_length and meta["routing_bytes"] > 0
    assert meta["phase_timings"]["verifier"] is not None and meta["placement"]["node_label"] == "local"
    assert valid.routing_key == meta["session"]["routing_key"] and valid.weight_versions
    assert valid.response and valid.status.value in ("completed", "truncated")
    assert sum(valid.loss_mask) > 0 and len(valid.rollout_log_probs) == valid.response_length


async def test_the_agent_function_alone_reads_its_settings_from_the_environment(
    matrix: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    stack, _, _ = matrix
    monkeypatch.setenv(env_name("harbor_url"), stack.harbor.url)
    monkeypatch.setenv(env_name("agent"), "oracle")
    result = await agent_module.run("http://127.0.0.1:9/sessions/none", "p", {}, {"task": "fizzbuzz"})
    assert result is not None
    assert (result["reward"], result["reward_source"], result["attempt_class"]) == (1.0, "verifier", "valid")
    missing = await agent_module.run("http://127.0.0.1:9/sessions/none", "p", {}, {"task": "no-such-task"})
    assert missing is not None and (missing["reward"], missing["failure_cause"]) == (None, "run_rejected")
    assert "no-such-task" in missing["exception_message"]


def test_tasks_root_holds_the_fixture(matrix: Any) -> None:
    stack, _, _ = matrix
    assert (Path(stack.tasks_root) / "matrix-any-answer" / "tests" / "test.sh").is_file()
