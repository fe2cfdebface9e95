"""Prometheus metrics of one session server (its own registry, so servers in one process don't mix).

Owns the metric names and their updates from turn records. It does not own serving `/metrics`
(the FastAPI adapter calls `render()`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from rl360_ext.session.samples.merge import TurnRecord
from rl360_ext.session.samples.policy_versions import turn_routing_source
from rl360_ext.sglang.versions import RoutingSource
from rl360_ext.util.loop_lag import LOOP_LAG_BUCKETS

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class SessionMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.sessions_open = Gauge("rl360_session_sessions_open", "Sessions held in memory", registry=r)
        self.sessions_created = Counter("rl360_session_sessions_created", "Sessions created", registry=r)
        self.sessions_expired = Counter(
            "rl360_session_sessions_expired", "Sessions dropped by the idle TTL", registry=r
        )
        self.turns = Counter("rl360_session_turns", "Recorded turns", ["finish_reason"], registry=r)
        self.turn_errors = Counter(
            "rl360_session_turn_errors", "Turns not recorded, by cause", ["cause"], registry=r
        )
        self.forks = Counter(
            "rl360_session_history_forks", "History mismatches that started a segment", registry=r
        )
        self.rejects = Counter(
            "rl360_session_history_rejects", "History mismatches answered with 409", registry=r
        )
        self.replays = Counter(
            "rl360_session_replayed_turns", "Retried requests answered with the recorded turn", registry=r
        )
        self.prompt_tokens = Counter(
            "rl360_session_prompt_tokens", "Prompt tokens sent to the engine", registry=r
        )
        self.cached_tokens = Counter(
            "rl360_session_cached_tokens", "Prompt tokens the engine served from its prefix cache", registry=r
        )
        self.output_tokens = Counter("rl360_session_output_tokens", "Tokens the policy sampled", registry=r)
        self.routing_wire_bytes = Counter(
            "rl360_session_routing_wire_bytes", "Base64 routing bytes received from the engine", registry=r
        )
        self.routing_rows = Counter("rl360_session_routing_rows", "Routing rows received", registry=r)
        self.merged_bytes = Counter(
            "rl360_session_merged_bytes", "Bytes of merged samples served", registry=r
        )
        self.cache_hit_fraction = Gauge(
            "rl360_session_cache_hit_fraction", "cached_tokens / prompt_tokens over all turns", registry=r
        )
        self.prefill_fraction = Gauge(
            "rl360_session_r3_rows_from_prefill_fraction",
            "Of routing rows of sampled tokens, the fraction that came from a later prefill",
            registry=r,
        )
        self.turn_latency = Histogram(
            "rl360_session_turn_latency_seconds",
            "Engine round trip per turn",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
            registry=r,
        )
        self.loop_lag = Histogram(
            "rl360_session_loop_lag_seconds",
            "How late the event loop woke a timer that was due (a stalled loop shows here)",
            buckets=LOOP_LAG_BUCKETS,
            registry=r,
        )
        self.drift_checked = Counter(
            "rl360_session_template_drift_checked",
            "Merged trajectories re-rendered with the canonical template",
            registry=r,
        )
        self.drift = Counter(
            "rl360_session_template_drift",
            "Merged trajectories whose tokens differ from the canonical render, by kind",
            ["kind"],
            registry=r,
        )
        self._sampled_rows = 0
        self._prefill_rows = 0
        self._prompt = 0
        self._cached = 0

    def record_turn(self, turn: TurnRecord) -> None:
        self.turns.labels(turn.finish_reason).inc()
        self.prompt_tokens.inc(turn.prompt_tokens)
        self.cached_tokens.inc(turn.cached_tokens)
        self.output_tokens.inc(len(turn.output_ids))
        self.turn_latency.observe(turn.latency_s)
        self._prompt += turn.prompt_tokens
        self._cached += turn.cached_tokens
        if self._prompt:
            self.cache_hit_fraction.set(self._cached / self._prompt)
        sources = turn_routing_source(turn.versions())  # a retract's re-prefilled rows relabelled
        if sources is not None:
            self.routing_wire_bytes.inc(turn.routing_wire_bytes)
            self.routing_rows.inc(len(sources))
            later = int(np.count_nonzero(sources == RoutingSource.REPREFILL))
            self._sampled_rows += later + int(np.count_nonzero(sources == RoutingSource.DECODE))
            self._prefill_rows += later
            if self._sampled_rows:
                self.prefill_fraction.set(self._prefill_rows / self._sampled_rows)

    def record_drift(self, record: dict[str, Any]) -> None:
        """Count one merged trajectory's drift record (`rl360_ext.templates.drift`)."""
        if record.get("checked"):
            self.drift_checked.inc()
        if record.get("mismatch"):
            self.drift.labels(str(record.get("kind") or "unclassified")).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
