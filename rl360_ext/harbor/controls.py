"""Known-good controls: what a task's verifier does on the task's known-good state, once per task digest.

Owns the evidence the attribution rules ask for when a verifier fails on an agent's end state
(`rl360_ext.outcomes.verdict.needs_known_good`): the task audit's oracle runs (`--task-health`,
the audit's `task_health.jsonl`, matched by the task's content digest), else a control regrade
the server runs itself (Harbor's oracle agent in a fresh sandbox, then the task's verifier).
One control per task digest at a time: the attempts that ask meanwhile wait for the same one, and
its answer is kept for the server's life (a control that could not run is tried again); at most
`max_running` controls run at once. An attempt waits for a control no longer than its own
deadline allows; a control still running then goes on for the attempts after it. It does not
decide attribution (the verdict does) and does not build trials (the runner hands it a callable
that runs one).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from rl360_ext.harbor.catalog import TaskInfo
from rl360_ext.outcomes.attribution import AttributionRule, Control, Phase
from rl360_ext.outcomes.known_good import KnownGood, from_audit_evidence
from rl360_ext.outcomes.verdict import TrialFacts
from rl360_ext.util.tree_digest import task_digest

_log = logging.getLogger(__name__)
RunControl = Callable[[], Awaitable[KnownGood]]


def read_task_health(path: Path) -> dict[str, KnownGood]:
    """The audit's evidence by task content digest, from its task_health.jsonl: a ValueError names
    the file and line that is not the audit's record."""
    evidence: dict[str, KnownGood] = {}
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ValueError(f"--task-health {path}: cannot be read ({exc.strerror or exc})") from exc
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)["evidence"]
            digest = record["digest"]
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"--task-health {path}:{number}: not a task audit record ({exc})") from exc
        if isinstance(digest, str) and isinstance(record, Mapping):
            evidence[digest] = from_audit_evidence(record)
    return evidence


def known_good_of(facts: TrialFacts) -> KnownGood:
    """A control regrade's answer from what its trial left (judged by the cause list: no control
    asks for another)."""
    if facts.exception_phase in (Phase.ENVIRONMENT_SETUP, Phase.AGENT) or not facts.verifier_started:
        what = facts.exception_type or "no verifier phase"
        return KnownGood(None, Control.REGRADE, f"the oracle could not produce the known-good state ({what})")
    verifier_hits = [hit for hit in facts.limit_hits if hit.phase == Phase.VERIFIER]
    failure = facts.exception_type or facts.verifier_failure
    if facts.rewards is not None and failure is None and not verifier_hits:
        detail = "the verifier graded the oracle's end state within its budget and limits"
        return KnownGood(True, Control.REGRADE, detail)
    what = failure or (verifier_hits[0].resource.value if verifier_hits else "no reward")
    return KnownGood(False, Control.REGRADE, f"the verifier failed on the oracle's end state too ({what})")


class KnownGoodControls:
    """The known-good evidence of the tasks a server runs (see the module docstring)."""

    def __init__(self, rule: AttributionRule, audit: Mapping[str, KnownGood], max_running: int) -> None:
        self.rule = rule
        self._audit = dict(audit)
        self._audit_digests: dict[str, str] = {}  # snapshot digest -> audit digest
        self._regrades: dict[str, asyncio.Future[KnownGood]] = {}
        self._slots = asyncio.Semaphore(max_running)
        self._background: set[asyncio.Task[Any]] = set()
        self.counts = {"audit": 0, "regrade_started": 0, "regrade_cached": 0, "unanswered": 0}

    async def known_good(self, task: TaskInfo, run_control: RunControl, wait_s: float) -> KnownGood:
        """The evidence for `task`: the audit's where the rule allows and it has the task's digest,
        else a control regrade (`run_control`), waited for at most `wait_s` seconds."""
        if self.rule == AttributionRule.EVIDENCE:
            audited = await self._audited(task)
            if audited is not None and audited.healthy is not None:
                self.counts["audit"] += 1
                return audited
        regrade = self._regrades.get(task.digest)
        if regrade is None or (regrade.done() and regrade.result().control == Control.NONE):
            regrade = self._start(task.digest, run_control)
        else:
            self.counts["regrade_cached"] += 1
        try:
            return await asyncio.wait_for(asyncio.shield(regrade), timeout=max(0.0, wait_s))
        except TimeoutError:
            self.counts["unanswered"] += 1
            detail = f"the control regrade did not finish within the attempt's deadline ({wait_s:.1f}s left)"
            return KnownGood(None, Control.NONE, detail)

    async def _audited(self, task: TaskInfo) -> KnownGood | None:
        if not self._audit or not task.digest:
            return None
        digest = self._audit_digests.get(task.digest)
        if digest is None:
            digest = await asyncio.to_thread(task_digest, task.path)
            self._audit_digests[task.digest] = digest
        return self._audit.get(digest)

    def _start(self, digest: str, run_control: RunControl) -> asyncio.Future[KnownGood]:
        self.counts["regrade_started"] += 1
        future: asyncio.Future[KnownGood] = asyncio.get_running_loop().create_future()
        self._regrades[digest] = future
        runner = asyncio.create_task(self._regrade(run_control, future))
        self._background.add(runner)
        runner.add_done_callback(self._background.discard)
        return future

    async def _regrade(self, run_control: RunControl, future: asyncio.Future[KnownGood]) -> None:
        try:
            async with self._slots:
                answer = await run_control()
        except Exception as exc:  # a control that could not run says nothing about the policy
            _log.exception("a control regrade failed")
            answer = KnownGood(None, Control.NONE, f"the control regrade could not run: {exc!r}"[:500])
        except asyncio.CancelledError:
            future.set_result(KnownGood(None, Control.NONE, "the control regrade was cancelled"))
            raise
        future.set_result(answer)

    async def close(self) -> None:
        """Cancel the controls still running (the server is shutting down)."""
        for runner in list(self._background):
            runner.cancel()
        for runner in list(self._background):
            with contextlib.suppress(BaseException):
                await runner
