"""The fault matrix: inject every infrastructure failure into real rollouts and show none of them scores.

Owns the matrix's cases (what is injected, how, and which attempt classes are acceptable), how
they run (`FaultStack`: the rl360 generate hook against the local stack of
`rl360_ext.local.stack` with the tiny engine, the real SMG gateway, two real Harbor `/run` servers
with bubblewrap sandboxes and a SessionPool on local Ray), and the
exclusion check: each sample goes into a group with real valid samples, through
`valid_group_advantages`, the valid-reward filter and the rollout metrics hook, and the check
reports whether its reward moved any other sample's advantage or the kept/unfiltered means (with
its reward as returned, and poisoned to 0.0 and 1.0). For comparison it also reports how far the
others' advantages move when the failure is scored 0.0, as upstream's Harbor example does.

Used by `integration_tests/rollout/test_fault_matrix.py` and `rl360 bench faults`. It does not
own any rule it checks (infra, rewards, filters, metrics do).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import math
import os
import shutil
import signal
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx

from rl360_ext.local.stack import HarborServer, StackConfig, local_stack
from rl360_ext.outcomes.attribution import ATTRIBUTED_TO
from rl360_ext.outcomes.provenance import ATTEMPT_CLASS, REWARD_SOURCE, VALID, attempt_class
from rl360_ext.rollout import agent as agent_module
from rl360_ext.rollout.filters import check_valid_reward_nonzero_std
from rl360_ext.rollout.generate import generate
from rl360_ext.rollout.metrics import log_rollout_metrics, read_metrics
from rl360_ext.rollout.rewards import valid_group_advantages
from rl360_ext.rollout.sample import GenerateFnInput, Sample
from rl360_ext.util.procs import LOOPBACK
from rl360_ext.util.progress import stage

DEMO_AGENT = "rl360_ext.local.fixtures.agents:BashToolAgent"
PASS_TASK = "matrix-any-answer"  # fixture: a verifier that writes 1 for any final state
SAMPLING_PARAMS = {"max_new_tokens": 16, "temperature": 1.0, "logit_bias": {"2": 4.0}}
HARBOR_BUDGET_FLAGS = ("--env-setup-s", "20", "--agent-setup-s", "5", "--margin-s", "2", "--min-agent-s", "1")
DELETE_AFTER_S = 0.5  # run_and_delete_session: how long into the attempt the session is deleted
IN_FLIGHT_AFTER_S = 1.0  # flush / kill the Harbor server this long into an attempt
SLOW_ENGINE = {"latency_s": 2.0}  # keeps a model call in flight while a fault is injected
EPSILON = 1e-9


@dataclass(frozen=True)
class FaultCase:
    name: str
    injected: str  # what is injected, for the table
    task: str
    expected: tuple[str, ...]  # acceptable attempt classes
    how: str = "task"  # task | engine | delete_session | flush | harbor_stalled | harbor_killed | ...
    agent: str | None = None  # Harbor agent for /run; None: the server's default (the demo agent)
    engine_faults: dict[str, float] | None = None
    deadline_s: float = 120.0
    attributed: str | None = None  # who the server must attribute the failure to (None: not checked)


# The class each case must get (a tuple, so a case may accept more than one precise class).
CASES: tuple[FaultCase, ...] = (
    FaultCase("policy_failure", "none: the policy's answer fails the tests (verifier writes 0)", "fizzbuzz",
              (VALID,)),
    FaultCase("policy_success", "none: the verifier writes 1", PASS_TASK, (VALID,)),
    FaultCase("env_start_fails", "environment setup exits 1", "fault-env-start-fails",
              ("infra:no_sandbox",)),
    FaultCase("env_start_hangs", "environment setup never finishes", "fault-env-start-hangs",
              ("infra:environment_start_timeout",)),
    FaultCase("verifier_crashes", "tests/test.sh dies before writing a reward", "fault-verifier-crashes",
              ("infra:verifier_crash",)),
    FaultCase("judge_fails", "the verifier's judge fails: test.sh writes a fallback 0 and exits 75",
              "fault-judge-fails", ("infra:judge_failure",)),
    FaultCase("verifier_hangs", "tests/test.sh never finishes", "fault-verifier-hangs",
              ("infra:verifier_timeout",)),
    FaultCase("verifier_no_reward", "tests/test.sh exits 0 without a reward file", "fault-verifier-no-reward",
              ("infra:reward_file_missing",)),
    # The policy's own failures (issue 34): the server grades them and attributes them to the policy.
    # The oracle makes no model call, so the graded attempt has no tokens to train: aborted here.
    FaultCase("memory_hog", "the agent uses 4x its memory reservation (graded, the policy's)",
              "fault-memory-hog", ("infra:aborted",), agent="oracle", attributed="policy"),
    FaultCase("agent_over_budget", "the agent runs past its 3 s budget (graded, the policy's)",
              "fault-agent-over-budget", ("infra:aborted",), agent="oracle", attributed="policy"),
    FaultCase("insufficient_budget", "a deadline too short for the task (no sandbox started)", "fizzbuzz",
              ("infra:no_sandbox",), deadline_s=20.0),
    FaultCase("engine_503", "every engine call answers 503", "fizzbuzz", ("infra:no_engine_available",),
              how="engine", engine_faults={"error_rate": 1.0}),
    FaultCase("engine_aborts", "the engine aborts every generation part-way", "fizzbuzz", ("infra:aborted",),
              how="engine", engine_faults={"abort_rate": 1.0}),
    FaultCase("session_deleted", "the session is deleted mid-run (DELETE /sessions/{id})", "fizzbuzz",
              ("infra:session_vanished",), how="delete_session", engine_faults=SLOW_ENGINE),
    FaultCase("flushed", "Miles aborts the rollout: agent.abort -> POST /flush mid-run", "fizzbuzz",
              ("infra:aborted",), how="flush", engine_faults=SLOW_ENGINE),
    FaultCase("harbor_stalled", "the Harbor server stops answering (SIGSTOP) past the client deadline",
              "fizzbuzz", ("infra:client_deadline",), how="harbor_stalled", deadline_s=3.0),
    FaultCase("harbor_killed", "the Harbor server is killed (SIGKILL) mid-run", "fizzbuzz",
              ("infra:sandbox_lost",), how="harbor_killed", engine_faults=SLOW_ENGINE),
    FaultCase("harbor_unreachable", "nothing listens at the Harbor URL", "fizzbuzz",
              ("infra:no_sandbox",), how="harbor_unreachable"),
    FaultCase("gateway_no_engine", "the gateway's only engine is dead (killed)", "fizzbuzz",
              ("infra:no_engine_available",), how="engine_killed"),
)  # fmt: skip


@dataclass
class CaseResult:
    case: FaultCase
    sample: Any
    seconds: float
    note: str = ""


@dataclass
class Exclusion:
    """How one sample's reward reached the group statistics."""

    moves_advantages: bool  # some other sample's advantage changed when it joined the group
    moves_means: bool  # reward/kept_mean or reward/unfiltered_mean changed
    upstream_shift: float | None  # max |change| of others' advantages if it were scored 0.0 (upstream)

    @property
    def enters_means(self) -> bool:
        return self.moves_advantages or self.moves_means


@dataclass
class MatrixRow:
    case: str
    injected: str
    attempt_class: str
    expected: list[str]
    class_ok: bool
    failure_cause: str | None
    attributed_to: str | None
    reward: Any
    status: str
    loss_tokens: int  # response tokens with loss mask 1
    response_tokens: int
    remove_sample: bool
    enters_means: bool
    upstream_shift: float | None
    kept_policy_failure: bool  # a valid attempt the verifier scored 0, kept with its tokens
    seconds: float
    note: str = ""
    detail: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return dict(vars(self))


# ---- a fault-injecting agent function ------------------------------------------------------------------


async def run_and_delete_session(
    base_url: str, prompt: Any, request_kwargs: dict[str, Any], metadata: dict[str, Any], **kwargs: Any
) -> dict[str, Any] | None:
    """rl360's agent function, with the session deleted DELETE_AFTER_S into the attempt (or right
    after the run when it ends sooner). `metadata["session_deleted_mid_run"]` says which happened."""
    run = asyncio.create_task(agent_module.run(base_url, prompt, request_kwargs, metadata, **kwargs))
    done, _ = await asyncio.wait({run}, timeout=DELETE_AFTER_S)
    async with httpx.AsyncClient(timeout=30) as http:
        await http.delete(base_url)
    result = await run
    if result is not None:
        result["session_deleted_mid_run"] = not done
    return result


# ---- the stack ------------------------------------------------------------------------------------------


def matrix_tasks_root(directory: Path) -> Path:
    """rl360's task fixtures (example, fault and fault-matrix tasks), copied under `directory`."""
    from rl360_ext.local.fixtures import tasks_root

    root = directory / "tasks"
    if root.exists():
        shutil.rmtree(root)
    shutil.copytree(tasks_root(), root)
    return root


def matrix_stack_config(work_dir: Path) -> StackConfig:
    """The matrix's stack in `work_dir`: one tiny engine behind SMG, two Harbor servers with the demo's
    bash agent over the fixtures copied to `work_dir/tasks` (`harbor-victim` is the one stalled, then
    killed), the SessionPool's Ray (reused under pytest)."""
    flags = ("--max-concurrent", "4", "--keep-trials", "none", *HARBOR_BUDGET_FLAGS)
    return StackConfig(
        out=work_dir,
        harbors=(HarborServer("harbor", DEMO_AGENT, flags), HarborServer("harbor-victim", DEMO_AGENT, flags)),
        tasks_root=work_dir / "tasks",
        reuse_ray=True,
    )


class FaultStack:
    """Real services for the matrix; `with FaultStack(work_dir) as stack: await stack.run(case)`."""

    def __init__(self, work_dir: Path) -> None:
        self.work_dir = work_dir
        self.logs = work_dir / "logs"
        self.anchors: list[Any] = []
        self._running = contextlib.ExitStack()

    def __enter__(self) -> FaultStack:
        self.tasks_root = matrix_tasks_root(self.work_dir)
        stack = self._running.enter_context(
            local_stack(matrix_stack_config(self.work_dir), "the fault matrix")
        )
        self.stack = stack
        self.tokenizer_dir = str(stack.tokenizer_dir)
        self.engine = stack.engines[0]
        self.gateway = stack.smg
        self.harbor = stack.harbors["harbor"]
        self.victim = stack.harbors["harbor-victim"]
        return self

    def __exit__(self, *exc: Any) -> None:
        self._running.close()

    def args(self, case: FaultCase, **overrides: Any) -> SimpleNamespace:
        values: dict[str, Any] = {
            "rl360_harbor_url": self.harbor.url,
            "rl360_session_backend": self.gateway.url,
            "rl360_session_host": LOOPBACK,
            "rl360_tokenizer": self.tokenizer_dir,
            "rl360_r3": True,
            "rl360_deadline_s": case.deadline_s,
            "rl360_client_margin_s": 1.0,
            "rl360_agent": case.agent,
            "rl360_task_key": "task",
            "reward_key": None,
            "custom_agent_function_path": None,
            "max_seq_len": None,
        }
        values.update(overrides)
        return SimpleNamespace(**values)

    async def _generate(self, args: SimpleNamespace, case: FaultCase, index: int) -> Any:
        sample = Sample(group_index=index, index=index, prompt=case.task, metadata={"task": case.task})
        state = SimpleNamespace(args=args)
        output = await generate(GenerateFnInput(state, sample, dict(SAMPLING_PARAMS), False))
        return output.samples

    async def run(self, case: FaultCase, index: int = 0) -> CaseResult:
        """Inject the case's fault around one generate call and return the sample."""
        from rl360_ext.util.procs import free_port

        args = self.args(case)
        note = ""
        started = time.monotonic()
        self.stack.set_engine_faults(case.engine_faults)
        try:
            if case.how == "delete_session":
                args.custom_agent_function_path = f"{__name__}.run_and_delete_session"
            elif case.how == "harbor_unreachable":
                args.rl360_harbor_url = f"http://127.0.0.1:{free_port()}"
            elif case.how in ("harbor_stalled", "harbor_killed"):
                args.rl360_harbor_url = self.victim.url
            elif case.how == "engine_killed":
                self.engine.stop()
            attempt = asyncio.create_task(self._generate(args, case, index))
            if case.how == "harbor_stalled":
                os.kill(self.victim.pid, signal.SIGSTOP)
                try:
                    sample = await attempt
                finally:
                    os.kill(self.victim.pid, signal.SIGCONT)
            else:
                if case.how in ("flush", "harbor_killed"):
                    await asyncio.sleep(IN_FLIGHT_AFTER_S)
                    note = (
                        "fault while the attempt was running" if not attempt.done() else "attempt ended first"
                    )
                    if case.how == "flush":
                        await agent_module.abort(args)
                    else:
                        os.killpg(self.victim.pid, signal.SIGKILL)
                sample = await attempt
        finally:
            self.stack.set_engine_faults(None)
        if case.how == "delete_session":
            mid_run = sample.metadata.get("session_deleted_mid_run")
            note = "deleted while the run was in flight" if mid_run else "deleted after the run ended"
        if attempt_class(sample) == VALID:
            self.anchors.append(copy.deepcopy(sample))
        return CaseResult(case, sample, time.monotonic() - started, note)

    async def run_all(self, cases: Sequence[FaultCase] = CASES) -> list[CaseResult]:
        """Every case in order (valid cases first: their samples anchor the exclusion check)."""
        results = []
        for index, case in enumerate(cases):
            stage(f"case {index + 1}/{len(cases)}: {case.name}")
            results.append(await self.run(case, index))
        return results


# ---- the exclusion check --------------------------------------------------------------------------------


def _hook_args(metrics_path: Path) -> SimpleNamespace:
    return SimpleNamespace(
        advantage_estimator="grpo",
        rewards_normalization=True,
        grpo_std_normalization=True,
        reward_key=None,
        rl360_metrics_path=str(metrics_path),
        rl360_metrics_attempts=False,
        dynamic_sampling_filter_path="rl360_ext.rollout.filters.check_valid_reward_nonzero_std",
    )


def _group_stats(group: list[Any], metrics_path: Path) -> tuple[list[float], float | None, float | None]:
    """(advantages, reward/kept_mean, reward/unfiltered_mean) of one group through the rl360 hooks."""
    args = _hook_args(metrics_path)
    _, advantages = valid_group_advantages(args, group)
    kept = check_valid_reward_nonzero_std(args, group).keep
    if metrics_path.exists():
        metrics_path.unlink()
    log_rollout_metrics(0, args, group if kept else [], None, 0.0)
    steps, _ = read_metrics(metrics_path)
    metrics = steps[-1]["metrics"]
    return advantages, metrics["reward/kept_mean"], metrics["reward/unfiltered_mean"]


def _differs(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return (a is None) != (b is None)
    return abs(a - b) > EPSILON


def _in_group(samples: Sequence[Any]) -> list[Any]:
    group = [copy.deepcopy(s) for s in samples]
    for position, sample in enumerate(group):
        sample.group_index, sample.index = 0, position
    return group


def exclusion(sample: Any, anchors: Sequence[Any], work_dir: Path) -> Exclusion:
    """Whether `sample`'s reward reaches the anchors' advantages or the logged means."""
    if len(anchors) < 2:
        raise ValueError("the exclusion check needs at least two valid anchor samples")
    path = work_dir / "exclusion-metrics.jsonl"
    base_adv, base_kept, base_unfiltered = _group_stats(_in_group(anchors), path)
    valid = attempt_class(sample) == VALID
    rewards = [sample.reward] if valid else [sample.reward, 0.0, 1.0]
    moves_adv = moves_means = False
    for reward in rewards:
        probe = replace_reward(sample, reward)
        adv, kept, unfiltered = _group_stats(_in_group([*anchors, probe]), path)
        moves_adv |= any(abs(a - b) > EPSILON for a, b in zip(base_adv, adv, strict=False))
        moves_means |= _differs(base_kept, kept) or _differs(base_unfiltered, unfiltered)
    upstream = None
    if not valid:
        scored_zero = replace_reward(sample, 0.0)
        scored_zero.metadata[ATTEMPT_CLASS], scored_zero.metadata[REWARD_SOURCE] = VALID, "verifier"
        args = _hook_args(path)
        _, upstream_adv = valid_group_advantages(args, _in_group([*anchors, scored_zero]))
        upstream = max(abs(a - b) for a, b in zip(base_adv, upstream_adv, strict=False))
    return Exclusion(moves_adv, moves_means, upstream)


def replace_reward(sample: Any, reward: Any) -> Any:
    probe = copy.deepcopy(sample)
    probe.reward = reward
    probe.metadata = dict(probe.metadata)
    return probe


def matrix_rows(results: Sequence[CaseResult], anchors: Sequence[Any], work_dir: Path) -> list[MatrixRow]:
    rows = []
    for result in results:
        sample = result.sample
        cls = attempt_class(sample)
        check = exclusion(sample, anchors, work_dir)
        loss_mask = list(sample.loss_mask or [])
        valid_zero = cls == VALID and sample.reward is not None and float(sample.reward) == 0.0
        rows.append(
            MatrixRow(
                case=result.case.name,
                injected=result.case.injected,
                attempt_class=cls,
                expected=list(result.case.expected),
                class_ok=cls in result.case.expected
                and result.case.attributed in (None, sample.metadata.get(ATTRIBUTED_TO)),
                failure_cause=sample.metadata.get("failure_cause"),
                attributed_to=sample.metadata.get(ATTRIBUTED_TO),
                reward=sample.reward,
                status=getattr(sample.status, "value", str(sample.status)),
                loss_tokens=int(sum(loss_mask)),
                response_tokens=int(sample.response_length),
                remove_sample=bool(sample.remove_sample),
                enters_means=check.enters_means,
                upstream_shift=None if check.upstream_shift is None else round(check.upstream_shift, 4),
                kept_policy_failure=valid_zero and not sample.remove_sample and sum(loss_mask) > 0,
                seconds=round(result.seconds, 2),
                note=result.note,
                detail=sample.metadata.get("infra_detail"),
            )
        )
    return rows


async def run_matrix(work_dir: Path, cases: Sequence[FaultCase] = CASES) -> list[MatrixRow]:
    """Start the stack, run every case, check exclusion; the rows of the table."""
    work_dir.mkdir(parents=True, exist_ok=True)
    with FaultStack(work_dir) as stack:
        results = await stack.run_all(cases)
        anchors = list(stack.anchors)
    return matrix_rows(results, anchors, work_dir)


@dataclass
class MatrixSummary:
    rows: int
    classes_ok: int
    infra_rows: int
    infra_entering_means: int
    policy_failures_kept: int
    max_upstream_shift: float | None
    failures: list[str] = field(default_factory=list)


def summarize(rows: Sequence[MatrixRow]) -> MatrixSummary:
    infra = [r for r in rows if r.attempt_class != VALID]
    shifts = [
        r.upstream_shift for r in infra if r.upstream_shift is not None and not math.isnan(r.upstream_shift)
    ]
    failures = [
        f"{r.case}: class {r.attempt_class} not in {r.expected} (attributed to {r.attributed_to})"
        for r in rows
        if not r.class_ok
    ]
    failures += [f"{r.case}: an infra reward entered a mean or baseline" for r in infra if r.enters_means]
    return MatrixSummary(
        rows=len(rows),
        classes_ok=sum(r.class_ok for r in rows),
        infra_rows=len(infra),
        infra_entering_means=sum(r.enters_means for r in infra),
        policy_failures_kept=sum(r.kept_policy_failure for r in rows),
        max_upstream_shift=max(shifts) if shifts else None,
        failures=failures,
    )


@contextlib.contextmanager
def _quiet_loggers(names: Sequence[str]) -> Iterator[None]:
    import logging

    levels = {name: logging.getLogger(name).level for name in names}
    for name in names:
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        yield
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


def quiet() -> contextlib.AbstractContextManager[None]:
    """Silence the expected warnings of a matrix run (every case is a failure on purpose)."""
    return _quiet_loggers(
        ["rl360_ext.rollout.agent", "rl360_ext.rollout.generate", "rl360_ext.rollout.metrics"]
    )
