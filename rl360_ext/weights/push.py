"""Weight pushes through the SMG gateway's RL control plane, observed and reported.

Owns one weight push as an operator sees it: pause generation, `update_weights_from_disk` fanned
out to every matching engine (`POST /v1/rl/engine/{path}?selector=...`, SMG `--enable-rl`), resume,
then a read-back of every engine's `weight_version`. The result says which path the push took,
how long it took, how many engines it reached and how many update calls each engine received, so
a push that silently took a slow path (per-tensor broadcast instead of one refit per engine)
shows up in the numbers. It does not own checkpoint writing or the trainer side.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

FANOUT_PATH = "smg_fanout:update_weights_from_disk"


class WeightPushError(RuntimeError):
    """The gateway refused the push, or some engine did not end on the new weight version."""


@dataclass
class WeightPush:
    path: str
    weight_version: str
    model_path: str
    duration_s: float
    engines_targeted: int
    engines_reached: int
    update_calls_per_engine: dict[str, int]
    control_calls_per_engine: dict[str, int]
    engine_versions: dict[str, str | None]
    failures: list[dict[str, Any]] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return not self.failures and all(v == self.weight_version for v in self.engine_versions.values())

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "complete": self.complete}


def _fanout(client: httpx.Client, engine_path: str, body: dict[str, Any], selector: str) -> dict[str, Any]:
    response = client.post(f"/v1/rl/engine/{engine_path}", params={"selector": selector}, json=body)
    if response.status_code not in (200, 207):
        raise WeightPushError(
            f"gateway fan-out {engine_path} answered {response.status_code}: {response.text[:500]}"
        )
    return response.json()


def _engine_versions(client: httpx.Client, worker_urls: list[str]) -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for url in worker_urls:
        try:
            versions[url] = httpx.get(f"{url}/model_info", timeout=10.0).json().get("weight_version")
        except (httpx.HTTPError, ValueError):
            versions[url] = None
    return versions


def push_weights_from_disk(
    gateway_url: str,
    model_path: str,
    weight_version: str,
    selector: str = "engine=sglang",
    pause_mode: str = "in_place",
    timeout_s: float = 600.0,
    flush_cache: bool = True,
) -> WeightPush:
    """Pause, refit every matching engine from `model_path`, resume; report what happened.

    `flush_cache=False` keeps the prefix cache: SGLang refuses the flush (and fails the update
    call) while an `in_place` pause holds requests with KV, so an in-flight push needs it."""
    control_calls: Counter[str] = Counter()
    update_calls: Counter[str] = Counter()
    failures: list[dict[str, Any]] = []
    with httpx.Client(base_url=gateway_url, timeout=timeout_s) as client:
        started = time.perf_counter()
        steps = (
            ("pause_generation", {"mode": pause_mode}),
            (
                "update_weights_from_disk",
                {"model_path": model_path, "weight_version": weight_version, "flush_cache": flush_cache},
            ),
            ("continue_generation", {}),
        )
        reached: set[str] = set()
        total = 0
        for engine_path, body in steps:
            report = _fanout(client, engine_path, body, selector)
            total = max(total, int(report.get("total", 0)))
            failures.extend({**f, "call": engine_path} for f in report.get("failed", []))
            for envelope in report.get("results", {}).values():
                url = envelope.get("url", envelope.get("worker_id", "?"))
                control_calls[url] += 1
                if engine_path == "update_weights_from_disk" and 200 <= int(envelope.get("status", 0)) < 300:
                    update_calls[url] += 1
                    reached.add(url)
        duration = time.perf_counter() - started
        versions = _engine_versions(client, sorted(control_calls))
    return WeightPush(
        path=FANOUT_PATH,
        weight_version=weight_version,
        model_path=model_path,
        duration_s=duration,
        engines_targeted=total,
        engines_reached=len(reached),
        update_calls_per_engine=dict(update_calls),
        control_calls_per_engine=dict(control_calls),
        engine_versions=versions,
        failures=failures,
    )
