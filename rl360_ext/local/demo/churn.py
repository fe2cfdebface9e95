"""Engine churn in the local stack (`rl360 demo --engine-churn SPEC`): engines die, hang and are
replaced during a run, and the gateway's worker set follows, the way Miles' fault tolerance
replaces a failed rollout engine.

Owns carrying out the SPEC's events (`rl360_ext.weights.churn`) on the running stack:
- `kill:STEP`: once rollout STEP is generating, the oldest live engine is killed (SIGKILL), removed
  from the gateway (`DELETE /workers/{id}`), and a replacement starts; it is loaded with the
  weights last published (directly, `update_weights_from_disk`) and only then added to the gateway
  (`POST /workers`), so the gateway never routes to an engine on older weights.
- `hang:STEP`: just before the push that follows step STEP's training, the newest live engine stops
  answering (SIGSTOP: connections are accepted, nothing is answered, SIGTERM is not acted on, so it
  also hangs on shutdown). The push finds it: it does not confirm the pause within the confirm
  timeout, so the push fences it (`fence`: removed from the gateway, then SIGTERM, then SIGKILL
  after `FENCE_GRACE_S`) and retries on the refreshed set; after the push a replacement joins on
  the pushed weights (`after_push`).
Every event is a record (`kind: engine_churn`) in metrics.jsonl and a console line. It does not
push weights (`rl360_ext.weights.push`) or drive rollouts (`rl360_ext.local.demo.driver`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from rl360_ext.local.engines import remove_gateway_worker, wait_gateway_without
from rl360_ext.local.stack import LocalStack
from rl360_ext.weights.churn import HANG, KILL, ChurnEvent

CHURN_KIND = "engine_churn"


class EngineChurn:
    """The run's churn events against `stack`; `record` gets each event's record."""

    def __init__(
        self,
        stack: LocalStack,
        events: Sequence[ChurnEvent],
        record: Callable[[dict[str, Any]], None],
    ) -> None:
        self.stack = stack
        self.events = {event.step: event for event in events}
        self.record = record
        self.published: tuple[str, str] | None = None  # (model path, version) of the last push
        self.fenced: list[str] = []  # fenced by the current push, replaced after it
        self.lock = asyncio.Lock()  # a kill-and-replace and a push never overlap (in-flight pushes)
        self.records: list[dict[str, Any]] = []

    def _emit(self, record: dict[str, Any]) -> None:
        record = {"kind": CHURN_KIND, **record}
        self.records.append(record)
        self.record(record)

    def publish(self, model_path: str, version: str) -> None:
        """The weights a joining engine must load before it is routed to."""
        self.published = (model_path, version)

    # ---- kill:STEP ------------------------------------------------------------------------------

    async def during_rollout(self, step: int, generating: Callable[[], Awaitable[Any]]) -> None:
        """For `kill:STEP`: once `generating()` returns (the rollout's requests are under way),
        kill an engine and replace it."""
        event = self.events.get(step)
        if event is None or event.kind != KILL:
            return
        await generating()
        async with self.lock:
            await asyncio.to_thread(self.kill_and_replace, step)

    def kill_and_replace(self, step: int) -> dict[str, Any]:
        victim = self.stack.engines[0]
        started = time.monotonic()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(victim.pid, signal.SIGKILL)
        victim.process.wait(timeout=10)
        removed = remove_gateway_worker(self.stack.gateway_url, victim.url)
        dropped = wait_gateway_without(self.stack.gateway_url, victim.url)
        victim.stop()
        self.stack.engines = [e for e in self.stack.engines if e is not victim]
        path, version = self.published or (None, None)
        replacement = self.stack.add_engine(path, version)
        record = {
            "event": KILL,
            "step": step,
            "engine": victim.name,
            "url": victim.url,
            "removed_from_gateway": removed,
            "gateway_dropped": dropped,
            "replacement": replacement.name,
            "replacement_url": replacement.url,
            "replacement_version": version,
            "seconds": time.monotonic() - started,
        }
        self._emit(record)
        return record

    # ---- hang:STEP --------------------------------------------------------------------------------

    def before_push(self, step: int | None) -> dict[str, Any] | None:
        """For `hang:STEP`, before the push after step STEP: the newest engine stops answering."""
        event = None if step is None else self.events.get(step)
        if event is None or event.kind != HANG:
            return None
        victim = self.stack.engines[-1]
        os.killpg(victim.pid, signal.SIGSTOP)
        record = {"event": HANG, "step": step, "engine": victim.name, "url": victim.url}
        self._emit(record)
        return record

    def fence(self, url: str) -> None:
        """The push's fence: remove `url` from the gateway and end it (SIGKILL if SIGTERM does not)."""
        result = self.stack.remove_engine(url)
        self.fenced.append(url)
        self._emit({"event": "fence", **result})

    def after_push(self) -> list[dict[str, Any]]:
        """Replace every engine the push fenced, on the weights it pushed."""
        done = []
        path, version = self.published or (None, None)
        for url in self.fenced:
            started = time.monotonic()
            replacement = self.stack.add_engine(path, version)
            record = {
                "event": "replace",
                "url": url,
                "replacement": replacement.name,
                "replacement_url": replacement.url,
                "replacement_version": version,
                "seconds": time.monotonic() - started,
            }
            self._emit(record)
            done.append(record)
        self.fenced = []
        return done


def churn_line(record: dict[str, Any]) -> str:
    """One console line per churn event."""
    event = record.get("event")
    if event == KILL:
        return (
            f"engine churn: killed {record['engine']} mid-rollout of step {record['step']}; "
            f"{record['replacement']} joined on v{record['replacement_version']} in {record['seconds']:.1f} s"
        )
    if event == HANG:
        return f"engine churn: {record['engine']} stops answering before the push after step {record['step']}"
    if event == "fence":
        return (
            f"engine churn: fenced {record['name'] or record['url']} (gateway removal "
            f"{'ok' if record['gateway_dropped'] else 'pending'}, shutdown {record['shutdown']}) "
            f"in {record['seconds']:.1f} s"
        )
    return (
        f"engine churn: {record['replacement']} replaced {record['url']}, joined on "
        f"v{record['replacement_version']} in {record['seconds']:.1f} s"
    )
