"""`rl360 ab`: the fault A/B offline, repeated over seeds (`rl360_ext.local.ab.offline`).

Owns the command only: its flags are `OfflineConfig`'s fields (`rl360_ext.cli.fields.config_command`);
the trainer, the sampler and the statistics load when the command runs, not when the CLI starts.
"""

from __future__ import annotations

from rl360_ext.cli.fields import config_command
from rl360_ext.local.ab.config import OfflineConfig


def ab(config: OfflineConfig) -> None:
    """The fault A/B offline: the demo's learning problem in this process (the demo's first policy,
    reference trainer and hooks; the tiny model samples the quiz agent's turns, no servers), every
    arm x fault mode x seed, then the mean and 95% interval of each figure per mode and arm, the
    summary computed from the intervals, and OUT/ab.json (OUT/runs.jsonl as the runs finish)."""
    from rl360_ext.local.ab.offline import run_ab

    run_ab(config)


command = config_command(OfflineConfig, ab)
