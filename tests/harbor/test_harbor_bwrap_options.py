"""The bwrap environment's options are checked when the server starts: a bad value, or network
allowed where slirp4netns is missing, is a ValueError naming the option, before any trial."""

from __future__ import annotations

from pathlib import Path

import pytest

from rl360_ext.harbor.envs.bwrap import environment
from rl360_ext.harbor.runner import TrialRunner
from rl360_ext.harbor.settings import HarborServerConfig


def runner(tmp_path: Path, *env_kwarg: str) -> TrialRunner:
    root = tmp_path / "sandboxes"
    settings = HarborServerConfig(
        tasks_root=tmp_path,
        trials_dir=tmp_path / "trials",
        env_kwarg=(f"sandbox_root={root}", *env_kwarg),
    )
    return TrialRunner(settings)


@pytest.mark.parametrize(
    ("pair", "option"),
    [
        ("disk_mb=0", "disk_mb"),
        ("max_pids=2", "max_pids"),
        ("max_copy_s=0", "max_copy_s"),
        ("nope=1", "nope"),
    ],
)
def test_a_bad_option_is_refused_at_start(tmp_path: Path, pair: str, option: str) -> None:
    with pytest.raises(ValueError, match=option):
        runner(tmp_path, pair)


def test_network_without_slirp4netns_is_refused_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(environment, "slirp4netns_executable", lambda: None)
    with pytest.raises(ValueError, match="allow_network=true needs slirp4netns"):
        runner(tmp_path, "allow_network=true")
    assert runner(tmp_path, "allow_network=false").environment.name == "bwrap"  # offline is fine
