"""The step gate's evidence: what rl360's hooks already computed for a step, as flat metric names.

Owns `step_evidence` (a step record of the rl360 metrics JSONL, `rl360_ext.rollout.metrics`, plus
the tasks of the samples the step trains on -> the mapping `rl360_ext.gate.rules.decide` reads; it
adds one derived figure, `tasks/unhealthy_trained_frac`: the share of trained samples whose task
the task-health tracker quarantined or saw drift on at this step) and `last_step_record` (the last
step record of a metrics JSONL, read from its end, bounded). It does not judge anything.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from rl360_ext.gate.rules import UNHEALTHY_TASKS

STEP_PREFIX = b'{"kind":"step"'  # orjson keeps insertion order: rollout.metrics writes "kind" first
BLOCK = 1 << 20
MAX_SCAN_BYTES = 1 << 28  # a step's attempt lines at 8,192 attempts are ~6 MB; past this: no record


def unhealthy_tasks(task_health: Any) -> set[str]:
    """Tasks the tracker quarantined or saw drift on at this step, from a step record's `task_health`."""
    if not isinstance(task_health, Mapping):
        return set()
    names: set[str] = set()
    for entry in task_health.get("quarantined") or []:
        task = entry.get("task") if isinstance(entry, Mapping) else None
        if isinstance(task, str):
            names.add(task)
    for key in ("drift_down_tasks", "drift_up_tasks"):
        names.update(t for t in task_health.get(key) or [] if isinstance(t, str))
    return names


def step_evidence(
    record: Mapping[str, Any], trained_tasks: Sequence[str | None] | None = None
) -> dict[str, Any]:
    """The gate's evidence from one step record (its `metrics`), plus `tasks/unhealthy_trained_frac`
    when the record has task health and the trained samples' tasks are known (else it is absent)."""
    metrics = record.get("metrics")
    evidence: dict[str, Any] = dict(metrics) if isinstance(metrics, Mapping) else {}
    health = record.get("task_health")
    if isinstance(health, Mapping) and trained_tasks:
        unhealthy = unhealthy_tasks(health)
        evidence[UNHEALTHY_TASKS] = sum(task in unhealthy for task in trained_tasks) / len(trained_tasks)
    return evidence


def last_step_record(path: Path, max_scan_bytes: int = MAX_SCAN_BYTES) -> dict[str, Any] | None:
    """The last `"kind": "step"` record of an rl360 metrics JSONL, scanning back from its end at most
    `max_scan_bytes` (None: no file, no step record in reach, or not a JSON object)."""
    if not Path(path).is_file():
        return None
    with Path(path).open("rb") as handle:
        end = handle.seek(0, os.SEEK_END)
        position, tail = end, b""
        while position > 0 and end - position < max_scan_bytes:
            start = max(0, position - BLOCK)
            handle.seek(start)
            tail = handle.read(position - start) + tail
            position = start
            found = _last_step_line(tail, at_file_start=position == 0)
            if found is not None:
                try:
                    record = orjson.loads(found)
                except orjson.JSONDecodeError:
                    return None
                return record if isinstance(record, dict) else None
    return None


def _last_step_line(chunk: bytes, *, at_file_start: bool) -> bytes | None:
    index = chunk.rfind(b"\n" + STEP_PREFIX)
    if index >= 0:
        begin = index + 1
    elif at_file_start and chunk.startswith(STEP_PREFIX):
        begin = 0
    else:
        return None
    stop = chunk.find(b"\n", begin)
    return chunk[begin:] if stop < 0 else chunk[begin:stop]
