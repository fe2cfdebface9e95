"""`rl360 engine` commands: tokenizer directory, save-weights (loadable by /update_weights_from_disk)."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from rl360_ext.cli import app
from rl360_ext.reference.engine.engine import EngineConfig, TinyEngine
from rl360_ext.reference.engine.model import init_weights
from rl360_ext.reference.engine.protocol import RequestError

runner = CliRunner()


def test_tokenizer_command_writes_loadable_directory(tmp_path) -> None:
    result = runner.invoke(app, ["engine", "tokenizer", str(tmp_path / "tok")])
    assert result.exit_code == 0, result.output
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tmp_path / "tok"), local_files_only=True)
    engine = TinyEngine(EngineConfig(tokenizer_dir=str(tmp_path / "tok")))
    assert tokenizer.eos_token == "<|im_end|>" and len(tokenizer) == engine.vocab_size


def test_save_weights_perturbed_and_loaded_by_engine(tmp_path) -> None:
    out = tmp_path / "step-3.npz"
    result = runner.invoke(app, ["engine", "save-weights", str(out), "--seed", "0", "--perturb", "0.01"])
    assert result.exit_code == 0, result.output
    engine = TinyEngine(EngineConfig(seed=0))
    base = init_weights(engine.model_config, 0)
    engine.update_weights_from_disk(str(out), "step-3")
    delta = engine.model.weights["embed"] - base["embed"]
    assert 0.005 < float(np.std(delta)) < 0.02
    assert engine.weight_version == "step-3"


def test_save_weights_for_another_shape_is_rejected(tmp_path) -> None:
    out = tmp_path / "big.npz"
    assert runner.invoke(app, ["engine", "save-weights", str(out), "--layers", "2"]).exit_code == 0
    engine = TinyEngine(EngineConfig())
    with pytest.raises(RequestError) as err:
        engine.update_weights_from_disk(str(out), "bad")
    assert err.value.field == "model_path" and "layers" in err.value.message
    assert engine.weight_version == "default"


def test_serve_rejects_bad_fault_flag() -> None:
    result = runner.invoke(app, ["engine", "serve", "--faults", "error_rate=lots"])
    assert result.exit_code != 0 and "error_rate" in result.output
