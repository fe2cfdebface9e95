"""Prometheus metrics of one Harbor /run server (its own registry, so servers never share counters).

Owns the metric names and how runner events update them: queue depth, running trials, sandbox
starts and starts per rolling-start wave, per-phase duration histograms, attempts by
failure cause, and rewards by source. It does not own when those events happen.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

PHASE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600)
PHASES = ("queue", "environment_setup", "agent_setup", "agent", "verifier", "total")


class RunMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.queue_depth = Gauge(
            "rl360_harbor_queue_depth", "Attempts waiting for admission.", registry=self.registry
        )
        self.running = Gauge(
            "rl360_harbor_running", "Trials admitted and not finished.", registry=self.registry
        )
        self.sandbox_starts = Counter(
            "rl360_harbor_sandbox_starts", "Sandbox starts admitted.", registry=self.registry
        )
        self.starts_per_wave = Histogram(
            "rl360_harbor_starts_per_wave",
            "Sandbox starts in each closed rolling-start wave (fixed windows of the interval).",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
            registry=self.registry,
        )
        self.phase_seconds = Histogram(
            "rl360_harbor_phase_seconds",
            "Duration of each attempt phase.",
            ["phase"],
            buckets=PHASE_BUCKETS,
            registry=self.registry,
        )
        self.attempts = Counter(
            "rl360_harbor_attempts",
            'Finished /run attempts by failure cause ("none" for a clean verifier reward).',
            ["failure_cause"],
            registry=self.registry,
        )
        self.rewards = Counter(
            "rl360_harbor_rewards",
            'Finished attempts by reward source ("none" when no reward counts).',
            ["reward_source"],
            registry=self.registry,
        )
        self.flushed = Counter(
            "rl360_harbor_flushed_trials", "Trials cancelled by /flush.", registry=self.registry
        )

    def observe_admission(self, queue_depth: int, running: int) -> None:
        self.queue_depth.set(queue_depth)
        self.running.set(running)

    def observe_outcome(self, failure_cause: str | None, reward_source: str | None, timings: dict) -> None:
        self.attempts.labels(failure_cause=failure_cause or "none").inc()
        self.rewards.labels(reward_source=reward_source or "none").inc()
        for phase in PHASES:
            value = timings.get(phase)
            if isinstance(value, int | float):
                self.phase_seconds.labels(phase=phase).observe(value)

    def render(self) -> bytes:
        return generate_latest(self.registry)
