"""The demo's local stack: what `rl360 demo` starts, read from its `DemoConfig`.

Owns `demo_stack_config` and `demo_stack`. With `--faults` above 0, SMG runs with
`--disable-retries --disable-circuit-breaker`: by default SMG retries a 503 up to five times and
opens a circuit after ten failures, which would hide the injected engine 503s (or take a whole
engine out for a minute) instead of letting them reach the agent, where the demo shows them masked.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

from rl360_ext.local.demo.plan import DemoConfig
from rl360_ext.local.fixtures.quiz_agent import CRASH_TOOL_IMPORT_PATH as CRASH_TOOL_QUIZ_AGENT
from rl360_ext.local.fixtures.quiz_agent import IMPORT_PATH as QUIZ_AGENT
from rl360_ext.local.stack import HarborPoolSpec, HarborServer, LocalStack, StackConfig, local_stack
from rl360_ext.reference.engine.faults import FaultKey
from rl360_ext.tasks.health import TASK_HEALTH_FILE

DEMO_HARBOR_BUDGET: dict[str, Any] = {
    # Phase budgets sized for the quiz tasks (the defaults are for real coding tasks: 120 s setup).
    "env_setup_s": 20.0,
    "agent_setup_s": 5.0,
    "max_verifier_s": 20.0,
    "margin_s": 3.0,
    "min_agent_s": 5.0,
}
DEMO_START_INTERVAL_S = 1.0  # the demo pool's start-rate window: a step's sandboxes start within it
DEMO_HOST_TOOLS = ("bwrap", "tmux")


def demo_stack_config(config: DemoConfig, reuse_ray: bool = False) -> StackConfig:
    """The demo's stack: `--engines` seeded engines behind SMG with the RL fan-out, Harbor for the quiz
    agent (one `rl360 harbor serve` process; with `--harbor-replicas` 2 or more a `HarborPool` of
    Ray actors under one pool-wide start-rate limit), local Ray (with `reuse_ray`, the one this
    process runs: `local.stack.shared_ray`); with `--faults`, engine 503s that SMG does not retry."""
    # SMG times out an engine control call after the confirm timeout, so a push fences a silent
    # engine instead of waiting on it (rl360_ext.weights.push.push_with_fencing).
    gateway_flags = ["--enable-rl", "--rl-control-timeout-secs", str(math.ceil(config.confirm_timeout_s))]
    if config.faults > 0:
        gateway_flags += ["--disable-retries", "--disable-circuit-breaker"]
    concurrent = max(8, config.tasks * config.attempts)
    # the A/B's rl360-list arm: the server's --attribution (HarborServerConfig.attribution); else its default
    attribution: dict[str, Any] = {} if config.attribution is None else {"attribution": config.attribution}
    if config.quarantine_file is not None:  # --audit-tasks: the audit's evidence on each verifier
        attribution["task_health"] = config.quarantine_file.parent / TASK_HEALTH_FILE
    server = HarborServer(
        name="harbor",
        agent=CRASH_TOOL_QUIZ_AGENT if config.crash_tool else QUIZ_AGENT,
        settings={
            "max_concurrent": concurrent,
            "trials_dir": config.out / "trials",
            "keep_trials": "failed",
            # a step's sandboxes are started while the previous step trains, not when it asks
            "env_kwarg": (f"warm_sandboxes={concurrent}",),
            **DEMO_HARBOR_BUDGET,
            **attribution,
        },
    )
    harbors: tuple[HarborServer, ...] = (server,)
    pool = None
    if config.harbor_replicas > 1:
        harbors = ()
        pool = HarborPoolSpec(server, config.harbor_replicas, start_rate=(concurrent, DEMO_START_INTERVAL_S))
    faults: dict[str, Any] | None = None
    if config.faults > 0:
        faults = {"error_rate": config.engine_error_rate, "seed": config.seed}
        if config.seeded_sampling:  # each attempt samples with its own seed: key its 503s by it too
            faults["draw_by"] = FaultKey.SAMPLING_SEED.value
    return StackConfig(
        out=config.out,
        engines=config.engines,
        engine_flags=("--seed", str(config.seed), "--dtype", config.engine_dtype),
        engine_faults=faults,
        gateway_flags=tuple(gateway_flags),
        harbors=harbors,
        harbor_pool=pool,
        tokenizer_dir=config.out / "tokenizer",
        reuse_ray=reuse_ray,
        host_tools=DEMO_HOST_TOOLS,
    )


def demo_stack(config: DemoConfig, reuse_ray: bool = False) -> contextlib.AbstractContextManager[LocalStack]:
    """Start everything the demo needs; stop all of it on exit, whatever the exit."""
    return local_stack(demo_stack_config(config, reuse_ray), "rl360 demo")
