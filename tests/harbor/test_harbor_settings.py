"""Server settings: one dataclass; every flag of `rl360 harbor serve` is one of its fields, with
the field's docstring as help; values are checked at start, naming the flag."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import pytest
import typer.main

from rl360_ext.cli.harbor import app
from rl360_ext.harbor.envs import bwrap
from rl360_ext.harbor.envs.limits import owner_alive, owner_tag
from rl360_ext.harbor.settings import HarborServerConfig
from rl360_ext.util.fielddocs import field_docs

FLAGS_BEFORE = (
    "host",
    "port",
    "tasks-root",
    "env",
    "env-kwarg",
    "max-concurrent",
    "rolling-start-size",
    "rolling-start-interval",
    "agent",
    "token",
    "trials-dir",
    "keep-trials",
    "nodes",
    "placement-kwarg",
    "capacity-cpus",
    "capacity-memory-mb",
    "default-cpus",
    "default-memory-mb",
    "env-setup-s",
    "agent-setup-s",
    "max-verifier-s",
    "margin-s",
    "min-agent-s",
    "max-turns",
    "log-level",
)


def serve_command() -> Any:
    return typer.main.get_command(app).commands["serve"]  # type: ignore[attr-defined]


def test_every_field_is_a_flag_with_its_docstring_as_help() -> None:
    options = {param.name: param for param in serve_command().params if param.param_type_name == "option"}
    names = [item.name for item in dataclasses.fields(HarborServerConfig)]
    assert sorted(options) == sorted(names)
    docs = field_docs(HarborServerConfig)
    for name in names:
        assert options[name].help == docs[name] and len(docs[name]) > 5
    flags = {flag.removeprefix("--") for option in options.values() for flag in option.opts}
    assert set(FLAGS_BEFORE) <= flags and {"token-file", "default-agent", "max-deadline-s"} <= flags
    assert options["agent"].multiple and options["env_kwarg"].multiple
    assert options["token"].envvar == "RL360_HARBOR_TOKEN"


def settings(tmp_path: Path, **values: object) -> HarborServerConfig:
    return HarborServerConfig(tasks_root=tmp_path, trials_dir=tmp_path / "trials", **values)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("values", "flag"),
    [
        ({"max_concurrent": 0}, "--max-concurrent"),
        ({"margin_s": float("nan")}, "--margin-s"),
        ({"keep_trials": "some"}, "--keep-trials"),
        ({"capacity_cpus": 4.0}, "--capacity-memory-mb"),
        ({"env_kwarg": ("novalue",)}, "--env-kwarg"),
        ({"nodes": " , "}, "--nodes"),
        ({"reward_min": 1.0, "reward_max": 1.0}, "--reward-min"),
        ({"reward_max": float("inf")}, "--reward-max"),
        ({"allow_env": ("OK", "NOT-A-NAME")}, "--allow-env"),
        ({"max_body_bytes": 0}, "--max-body-bytes"),
        ({"header_timeout_s": 0.0}, "--header-timeout-s"),
    ],
)
def test_bad_settings_name_the_flag(tmp_path: Path, values: dict[str, object], flag: str) -> None:
    with pytest.raises(ValueError, match=flag):
        settings(tmp_path, **values)


def test_the_token_comes_from_a_file_first(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("from-file\n")
    assert settings(tmp_path, token="flag", token_file=token_file).bearer_token() == "from-file"
    assert settings(tmp_path, token="flag").bearer_token() == "flag"
    assert settings(tmp_path).bearer_token() is None
    token_file.write_text("\n")
    with pytest.raises(ValueError, match="--token-file"):
        settings(tmp_path, token_file=token_file).bearer_token()


def test_env_kwargs_are_json_when_they_parse(tmp_path: Path) -> None:
    parsed = settings(tmp_path, env_kwarg=("allow_network=true", "limits=cgroup", "x=3")).parse_env_kwargs()
    assert parsed == {"allow_network": True, "limits": "cgroup", "x": 3}


def test_leftovers_of_a_dead_server_are_removed_and_others_kept(tmp_path: Path) -> None:
    dead_tag = "999999999.12345"
    assert not owner_alive(dead_tag) and owner_alive(owner_tag()) and owner_alive(owner_tag(1))
    for name, tag in (("dead", dead_tag), ("mine", owner_tag()), ("pid1", owner_tag(1)), ("untagged", None)):
        (tmp_path / name / "app").mkdir(parents=True)
        if tag is not None:
            (tmp_path / name / bwrap.OWNER_FILE).write_text(tag)
    (tmp_path / "linked").mkdir()
    (tmp_path / "linked" / bwrap.OWNER_FILE).symlink_to(tmp_path / "dead" / bwrap.OWNER_FILE)
    removed = bwrap.clean_stale(tmp_path)
    assert [Path(p).name for p in removed if not p.startswith("/sys")] == ["dead"]
    assert sorted(os.listdir(tmp_path)) == ["linked", "mine", "pid1", "untagged"]
