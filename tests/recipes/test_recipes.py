"""The launch recipes in recipes/ only name hooks that import and flags their parsers accept.

Always: every `rl360_ext.` dotted path in a recipe (or in the recipes/lib file it sources)
imports (a hook module that does not exist yet fails here, loudly), and the recipe's Harbor
server flags parse with `rl360 harbor serve`'s own command. With MILES_SRC and MEGATRON_SRC set
(integration_tests/miles/run.sh sets both, in the scratch venv): the recipe's train argv,
printed by the recipe itself with DRY_RUN=1 (Miles' own model_args_utils.py expands the model
flags), parses with the parser Miles builds for training, built for real: Megatron-LM's
`add_megatron_arguments` plus Miles' `get_miles_extra_args_provider`, with sys.argv naming the
rl360 generate hook so that Miles itself adds the hook's flags.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RECIPES = sorted((ROOT / "recipes").glob("*.sh"))  # recipes/lib/ holds what they share, not recipes
LIB = ROOT / "recipes" / "lib"
HOOK_PATH = re.compile(r"\brl360_ext(?:\.[A-Za-z_]\w*)+")


def _recipe_id(path: Path) -> str:
    return path.stem


def hook_paths(recipe: Path) -> list[str]:
    """The rl360 dotted paths named in the recipe and in the shared recipes/lib files it sources."""
    text = recipe.read_text()
    sourced = [lib.read_text() for lib in sorted(LIB.glob("*.sh")) if f"lib/{lib.name}" in text]
    return sorted(set(HOOK_PATH.findall("\n".join([text, *sourced]))))


def dry_run(
    recipe: Path, miles_dir: Path | None, extra_env: dict[str, str] | None = None
) -> dict[str, list[str]]:
    """The recipe's argv sections ("harbor", "train") as the recipe prints them with DRY_RUN=1."""
    env = {**os.environ, "DRY_RUN": "1", "MILES_DIR": str(miles_dir or ROOT / "no-miles-checkout")}
    env.pop("RL360_STEP_GATE", None)
    env.update(extra_env or {})
    result = subprocess.run(
        ["bash", str(recipe)], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in result.stdout.splitlines():
        if line.startswith("== "):
            current = sections.setdefault(line[3:], [])
        else:
            assert current is not None, f"output before the first section: {line!r}"
            current.append(line)
    return sections


def test_there_are_recipes() -> None:
    assert {recipe.stem for recipe in RECIPES} >= {"dense-8b-coding-agent", "moe-r3-coding-agent"}


@pytest.mark.parametrize("recipe", RECIPES, ids=_recipe_id)
def test_every_hook_path_imports(recipe: Path) -> None:
    paths = hook_paths(recipe)
    assert paths, f"{recipe.name} wires no rl360 hook"
    for path in paths:
        module_name, _, attr = path.rpartition(".")
        module = importlib.import_module(module_name)
        assert callable(getattr(module, attr)), f"{recipe.name}: {path} is not callable"


@pytest.mark.parametrize("recipe", RECIPES, ids=_recipe_id)
def test_recipe_wires_every_rl360_hook(recipe: Path) -> None:
    train = dry_run(recipe, None)["train"]
    flags = {
        flag: value for flag, value in zip(train, [*train[1:], ""], strict=True) if flag.startswith("--")
    }
    assert flags["--custom-generate-function-path"] == "rl360_ext.rollout.generate.generate"
    assert flags["--custom-agent-function-path"] == "rl360_ext.rollout.agent.run"
    assert (
        flags["--dynamic-sampling-filter-path"] == "rl360_ext.rollout.filters.check_valid_reward_nonzero_std"
    )
    assert flags["--custom-reward-post-process-path"] == "rl360_ext.rollout.rewards.valid_group_advantages"
    assert flags["--custom-rollout-log-function-path"] == "rl360_ext.rollout.metrics.log_rollout_metrics"
    assert flags["--custom-pg-loss-reducer-function-path"].startswith("rl360_ext.train.reducers.")
    assert flags["--custom-tis-function-path"] == "rl360_ext.train.tis.valid_token_tis"
    assert flags["--sglang-router-policy"] == "manual"
    assert "--rl360-harbor-url" in flags and "--rl360-deadline-s" in flags
    assert "--custom-convert-samples-to-train-data-path" not in flags  # the gate needs patch 0011
    gated = dry_run(recipe, None, {"RL360_STEP_GATE": "1"})["train"]
    index = gated.index("--custom-convert-samples-to-train-data-path")
    assert gated[index + 1] == "rl360_ext.gate.miles_hook.gated_train_data"


@pytest.mark.parametrize("recipe", RECIPES, ids=_recipe_id)
def test_client_deadline_exceeds_the_agent_budget(recipe: Path) -> None:
    sections = dry_run(recipe, None)
    train, harbor = sections["train"], sections["harbor"]

    def value(argv: list[str], flag: str) -> float:
        return float(argv[argv.index(flag) + 1])

    deadline = value(train, "--rl360-deadline-s")
    overhead = sum(value(harbor, flag) for flag in ("--env-setup-s", "--max-verifier-s", "--margin-s"))
    assert deadline - overhead > 0.5 * deadline, "the agent would get less than half the client deadline"


@pytest.mark.parametrize("recipe", RECIPES, ids=_recipe_id)
def test_harbor_flags_parse_with_rl360_harbor_serve(recipe: Path) -> None:
    import typer.main

    from rl360_ext.cli.harbor import app

    serve = typer.main.get_command(app).commands["serve"]  # type: ignore[attr-defined]
    harbor = dry_run(recipe, None)["harbor"]
    context = serve.make_context("serve", list(harbor))
    assert context.params["rolling_start_size"] is not None
    assert context.params["token"]


def _miles_parser_or_skip() -> None:
    missing = [name for name in ("MILES_SRC", "MEGATRON_SRC") if not os.environ.get(name)]
    if missing:
        pytest.skip(
            f"{' and '.join(missing)} not set: Miles' training parser is Megatron-LM's plus Miles'; "
            "run integration_tests/miles/run.sh"
        )
    for name in ("MILES_SRC", "MEGATRON_SRC"):
        if os.environ[name] not in sys.path:
            sys.path.append(os.environ[name])
    try:
        importlib.import_module("megatron.training.arguments")
        importlib.import_module("miles.utils.arguments")
    except ImportError as error:
        if os.environ.get("RL360_MILES_STRICT") == "1":
            raise
        pytest.skip(
            f"Miles' parser does not import in this interpreter ({error}); run integration_tests/miles/run.sh"
        )


@pytest.mark.parametrize("recipe", RECIPES, ids=_recipe_id)
def test_train_flags_exist_in_miles_parser(recipe: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _miles_parser_or_skip()
    from megatron.training.arguments import add_megatron_arguments
    from miles.utils.arguments import get_miles_extra_args_provider

    train = dry_run(recipe, Path(os.environ["MILES_SRC"]))["train"]
    assert "--num-layers" in train, (
        "the recipe did not expand the model flags with Miles' model_args_utils.py"
    )
    monkeypatch.setattr(sys, "argv", ["train.py", *train])  # Miles finds the generate hook in sys.argv
    parser = argparse.ArgumentParser(
        allow_abbrev=False
    )  # as megatron.training.arguments.parse_args builds it
    add_megatron_arguments(parser)
    get_miles_extra_args_provider()(parser)
    known = {option for action in parser._actions for option in action.option_strings}
    unknown = sorted({token for token in train if token.startswith("--") and token not in known})
    assert not unknown, (
        f"{recipe.name}: flags neither Megatron-LM nor Miles (nor the rl360 hooks) define: {unknown}"
    )
    parser.parse_args(train)  # values parse too (types, choices)
