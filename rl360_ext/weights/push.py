"""Weight pushes through the SMG gateway's RL control plane, observed and reported.

Owns one weight push as an operator sees it: pause generation, `update_weights_from_disk` fanned
out to every matching engine (`POST /v1/rl/engine/{path}?selector=...`, SMG `--enable-rl`), resume,
then a read-back of every engine's `weight_version`. The result says which path the push took,
how long it took, how many engines it reached and how many update calls each engine received, so
a push that silently took a slow path (per-tensor broadcast instead of one refit per engine)
shows up in the numbers. It does not own checkpoint writing or the trainer side.

Under engine churn (`push_with_fencing`) every push rebuilds its plan from the gateway's worker
set at that moment (`GET /workers`): the fan-out stays the path of every push (nothing retires it
for the rest of the run); `push_reason` names why this push's plan differs from the last one
(`first`, `new_engines`, `stale`, `retry`, else `steady`). An engine that does not confirm a call
within the confirm timeout T (SMG's `--rl-control-timeout-secs`, so the gateway answers 207 with
that engine under `failed` instead of waiting on it) is fenced by the caller's `fence` (removed
from the gateway and killed), and the push is retried, at most `max_retries` times, against the
refreshed set. A joining engine is loaded directly (`load_engine`, path `DIRECT_PATH`) before
the gateway routes to it. `abort_all_requests` is sent as false: SGLang's
`UpdateWeightFromDiskReqInput.abort_all_requests` defaults to false (its
`UpdateWeightVersionReqInput` defaults to true), and the pause mode alone decides what happens
to in-flight requests (`abort` aborts them; `in_place` and `retract` keep them).
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from rl360_ext.errors import Rl360Error

FANOUT_PATH = "smg_fanout:update_weights_from_disk"
DIRECT_PATH = "direct:update_weights_from_disk"  # one engine, before it joins the gateway
FIRST, NEW_ENGINES, STALE, RETRY, STEADY = "first", "new_engines", "stale", "retry", "steady"
PUSH_REASONS = (FIRST, NEW_ENGINES, STALE, RETRY, STEADY)
DEGRADED_FACTOR = 2.0  # calls per engine over this many times the path's rolling median: degraded
DEGRADED_WINDOW = 8  # pushes of the same path in the rolling median
CONFIRM_TIMEOUT_S = 10.0  # an engine that does not confirm a call within this is fenced
MAX_RETRIES = 2  # retries of one push after fencing (bounded)
VERSION_READ_S = 2.0  # the pre-push version read of each engine (an engine silent that long reads None)


class WeightPushError(Rl360Error, RuntimeError):
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
    pause_s: float | None = None  # from the pause call's start to the continue call's answer
    missed: list[str] = field(default_factory=list)  # engines that did not confirm every call

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


def engine_versions(worker_urls: Sequence[str], timeout_s: float = 10.0) -> dict[str, str | None]:
    """Each engine's `weight_version` (`GET /model_info`), None when it does not answer in time."""
    versions: dict[str, str | None] = {}
    for url in worker_urls:
        try:
            versions[url] = httpx.get(f"{url}/model_info", timeout=timeout_s).json().get("weight_version")
        except (httpx.HTTPError, ValueError):
            versions[url] = None
    return versions


def update_body(model_path: str, weight_version: str, flush_cache: bool) -> dict[str, Any]:
    """The `update_weights_from_disk` body: `abort_all_requests` false (SGLang's default for this
    call), so only the pause mode decides what happens to in-flight requests."""
    return {
        "model_path": model_path,
        "weight_version": weight_version,
        "flush_cache": flush_cache,
        "abort_all_requests": False,
    }


def confirmed(report: Mapping[str, Any]) -> set[str]:
    """URLs of the engines that answered a fan-out call with a 2xx."""
    return {
        str(envelope.get("url", envelope.get("worker_id", "?")))
        for envelope in report.get("results", {}).values()
        if 200 <= int(envelope.get("status", 0)) < 300
    }


def answered(report: Mapping[str, Any]) -> set[str]:
    """URLs of the engines that answered a fan-out call at all: a result, or a failure that carries
    the engine's HTTP status (an engine that refused a call is alive; one that timed out or
    dropped the connection is not)."""
    urls = {
        str(envelope.get("url", envelope.get("worker_id", "?")))
        for envelope in report.get("results", {}).values()
    }
    urls |= {str(f.get("url")) for f in report.get("failed", []) if isinstance(f.get("status"), int)}
    return urls


def missed_engines(expected: Sequence[str], reports: Sequence[Mapping[str, Any]]) -> list[str]:
    """The `expected` engines that did not answer some fan-out call in `reports`, in order: the
    engines to fence (an engine that answered with an error is not fenced; the push is then
    incomplete)."""
    missing: list[str] = []
    for report in reports:
        heard = answered(report)
        missing += [url for url in expected if url not in heard and url not in missing]
    return missing


def push_weights_from_disk(
    gateway_url: str,
    model_path: str,
    weight_version: str,
    selector: str = "engine=sglang",
    pause_mode: str = "in_place",
    timeout_s: float = 600.0,
    flush_cache: bool = True,
    expected: Sequence[str] | None = None,
) -> WeightPush:
    """Pause, refit every matching engine from `model_path`, resume; report what happened.

    `flush_cache=False` keeps the prefix cache: SGLang refuses the flush (and fails the update
    call) while an `in_place` pause holds requests with KV, so an in-flight push needs it.
    With `expected` (the engine URLs the gateway should fan out to), an engine among them that did
    not confirm the pause is reported in `missed` and nothing is updated: the caller fences it and
    retries (`push_with_fencing`); the engines stay paused for that retry."""
    control_calls: Counter[str] = Counter()
    update_calls: Counter[str] = Counter()
    failures: list[dict[str, Any]] = []
    reports: list[dict[str, Any]] = []
    pause_s: float | None = None
    with httpx.Client(base_url=gateway_url, timeout=timeout_s) as client:
        started = time.perf_counter()
        steps = (
            ("pause_generation", {"mode": pause_mode}),
            ("update_weights_from_disk", update_body(model_path, weight_version, flush_cache)),
            ("continue_generation", {}),
        )
        reached: set[str] = set()
        total = 0
        for engine_path, body in steps:
            report = _fanout(client, engine_path, body, selector)
            reports.append(report)
            total = max(total, int(report.get("total", 0)))
            failures.extend({**f, "call": engine_path} for f in report.get("failed", []))
            for envelope in report.get("results", {}).values():
                url = envelope.get("url", envelope.get("worker_id", "?"))
                control_calls[url] += 1
                if engine_path == "update_weights_from_disk" and 200 <= int(envelope.get("status", 0)) < 300:
                    update_calls[url] += 1
                    reached.add(url)
            if engine_path == "continue_generation":
                pause_s = time.perf_counter() - started
            if (
                expected is not None
                and engine_path == "pause_generation"
                and missed_engines(expected, [report])
            ):
                break
        duration = time.perf_counter() - started
        versions = engine_versions(sorted(control_calls), min(timeout_s, 10.0))
    missed = [] if expected is None else missed_engines(expected, reports)
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
        pause_s=pause_s,
        missed=missed,
    )


# ---- pushes under engine churn ---------------------------------------------------------------


def push_reason(
    attempt: int,
    previous_engines: Sequence[str] | None,
    engines: Sequence[str],
    versions: Mapping[str, str | None],
    published: str | None,
) -> str:
    """Why this push's plan is what it is (PUSH_REASONS): `retry` after a fence, `first` for the
    run's first push, `new_engines` when an engine joined since the last push, `stale` when an
    engine does not serve the last published version, else `steady`."""
    if attempt > 0:
        return RETRY
    if previous_engines is None:
        return FIRST
    if set(engines) - set(previous_engines):
        return NEW_ENGINES
    if any(versions.get(url) != published for url in engines):
        return STALE
    return STEADY


def is_degraded(calls_max: float, previous: Sequence[float], window: int = DEGRADED_WINDOW) -> bool:
    """Whether a push's most update calls per engine exceed DEGRADED_FACTOR times the rolling
    median of the same path's last `window` pushes (`previous`, oldest first); never for a
    path's first push."""
    history = list(previous)[-window:] if window > 0 else []
    return bool(history) and calls_max > DEGRADED_FACTOR * statistics.median(history)


def gateway_workers(gateway_url: str, timeout_s: float = 10.0) -> dict[str, str]:
    """The gateway's workers (`GET /workers`): URL -> worker id."""
    body = httpx.get(f"{gateway_url}/workers", timeout=timeout_s).json()
    workers = body.get("workers", body) if isinstance(body, dict) else body
    return {str(w["url"]): str(w.get("id") or w.get("worker_id")) for w in workers if "url" in w}


def load_engine(url: str, model_path: str, weight_version: str, timeout_s: float = 120.0) -> float:
    """Load `model_path` as `weight_version` directly into one engine (`DIRECT_PATH`), as a joining
    engine gets the current weights before the gateway routes to it; returns the seconds it took.
    WeightPushError when the engine refuses or does not end on `weight_version`."""
    started = time.perf_counter()
    reply = httpx.post(
        f"{url}/update_weights_from_disk",
        json=update_body(model_path, weight_version, True),
        timeout=timeout_s,
    )
    version = httpx.get(f"{url}/model_info", timeout=timeout_s).json().get("weight_version")
    if reply.status_code != 200 or version != weight_version:
        raise WeightPushError(
            f"engine {url} did not load v{weight_version} ({reply.status_code}: {reply.text[:300]}; "
            f"serves v{version})"
        )
    return time.perf_counter() - started


@dataclass
class FencedPush:
    """One push under churn: its attempts (one `WeightPush` each), why it was planned as it was,
    and which engines it fenced."""

    weight_version: str
    reason: str
    engines_expected: list[str]
    attempts: list[WeightPush]
    fenced: list[str]
    duration_s: float
    path: str = FANOUT_PATH
    reasons: list[str] = field(default_factory=list)  # one per attempt
    pause_s: float | None = None  # from the first pause call to the last continue's answer
    degraded: bool = False
    stale_served_tokens: int | None = None

    @property
    def final(self) -> WeightPush:
        return self.attempts[-1]

    @property
    def engines_reached(self) -> list[str]:
        return sorted(url for url, n in self.final.update_calls_per_engine.items() if n > 0)

    @property
    def calls_per_engine_max(self) -> int:
        calls: Counter[str] = Counter()
        for attempt in self.attempts:
            calls.update(attempt.update_calls_per_engine)
        return max(calls.values(), default=0)

    @property
    def complete(self) -> bool:
        """Every engine the gateway routes to at the end was updated, and ends on the version."""
        final = self.final
        live = set(self.engines_expected) - set(self.fenced)
        return (
            not final.missed
            and live <= set(self.engines_reached)
            and all(final.engine_versions.get(url) == self.weight_version for url in live)
        )

    def metrics(self) -> dict[str, Any]:
        """The push's `weights/*` metrics (metrics.jsonl, the report, the console line)."""
        return {
            "weights/path": self.path,
            "weights/reason": self.reason,
            "weights/engines_expected": len(set(self.engines_expected) - set(self.fenced)),
            "weights/engines_reached": len(self.engines_reached),
            "weights/engines_fenced": len(self.fenced),
            "weights/attempts": len(self.attempts),
            "weights/calls_per_engine_max": self.calls_per_engine_max,
            "weights/pause_s": self.pause_s,
            "weights/duration_s": self.duration_s,
            "weights/degraded": self.degraded,
            "weights/stale_served_tokens": self.stale_served_tokens,
        }

    def to_dict(self) -> dict[str, Any]:
        """The final attempt's `WeightPush` fields (what the report reads), with the push's totals,
        every attempt and the `weights/*` metrics."""
        final = self.final.to_dict()
        calls: Counter[str] = Counter()
        for attempt in self.attempts:
            calls.update(attempt.update_calls_per_engine)
        return {
            **final,
            "duration_s": self.duration_s,
            "update_calls_per_engine": dict(calls),
            "complete": self.complete,
            "reason": self.reason,
            "reasons": list(self.reasons),
            "engines_expected": list(self.engines_expected),
            "fenced": list(self.fenced),
            "attempts": [a.to_dict() for a in self.attempts],
            "metrics": self.metrics(),
        }


def push_with_fencing(
    gateway_url: str,
    model_path: str,
    weight_version: str,
    *,
    fence: Callable[[str], None],
    previous_engines: Sequence[str] | None = None,
    published: str | None = None,
    pause_mode: str = "in_place",
    flush_cache: bool = True,
    confirm_timeout_s: float = CONFIRM_TIMEOUT_S,
    max_retries: int = MAX_RETRIES,
    selector: str = "engine=sglang",
) -> FencedPush:
    """One push under churn: plan it on the gateway's current worker set, fan out, fence every
    engine that missed a call (`fence(url)` removes it from the gateway and kills it), retry on the
    refreshed set, at most `max_retries` times. The gateway must time its engine calls out
    (`--rl-control-timeout-secs`, at most `confirm_timeout_s`); this client waits that long plus
    a margin for each fan-out. The engines are resumed whatever happens."""
    started = time.perf_counter()
    attempts: list[WeightPush] = []
    fenced: list[str] = []
    reasons: list[str] = []
    expected_first: list[str] = []
    resumed = True
    paused_at: float | None = None  # an engine that confirmed a pause stays paused through the retries
    resumed_at: float | None = None
    try:
        for attempt in range(max_retries + 1):
            engines = sorted(url for url in gateway_workers(gateway_url) if url not in fenced)
            if attempt == 0:
                expected_first = list(engines)
                versions = engine_versions(engines, min(confirm_timeout_s, VERSION_READ_S))
            reasons.append(push_reason(attempt, previous_engines, engines, versions, published))
            resumed = False
            attempt_started = time.perf_counter()
            paused_at = attempt_started if paused_at is None else paused_at
            push = push_weights_from_disk(
                gateway_url,
                model_path,
                weight_version,
                selector=selector,
                pause_mode=pause_mode,
                timeout_s=confirm_timeout_s * 3 + 5.0,
                flush_cache=flush_cache,
                expected=engines,
            )
            attempts.append(push)
            resumed = push.pause_s is not None
            if push.pause_s is not None:
                resumed_at = attempt_started + push.pause_s
            if not push.missed:
                break
            for url in push.missed:
                fence(url)
                fenced.append(url)
    finally:
        if not resumed:  # a pause went out and no continue followed: never leave engines paused
            with httpx.Client(base_url=gateway_url, timeout=confirm_timeout_s * 3 + 5.0) as client:
                _fanout(client, "continue_generation", {}, selector)
    expected = sorted(set(expected_first) | {url for a in attempts for url in a.control_calls_per_engine})
    return FencedPush(
        weight_version=weight_version,
        reason=reasons[0] if reasons else FIRST,
        engines_expected=expected,
        attempts=attempts,
        fenced=fenced,
        duration_s=time.perf_counter() - started,
        reasons=reasons,
        pause_s=None if paused_at is None or resumed_at is None else resumed_at - paused_at,
    )
