"""The local stack launcher: what each run's config asks for, and that everything started is stopped
when a later start fails (processes replaced by fakes; the real ones run in the integration tests)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from rl360_ext.cli.fields import fields_command
from rl360_ext.local import stack as stack_module
from rl360_ext.local.bench.fault_matrix import DEMO_AGENT, matrix_stack_config
from rl360_ext.local.demo import stack as demo_stack_module
from rl360_ext.local.demo.plan import DemoConfig
from rl360_ext.local.demo.stack import demo_stack_config
from rl360_ext.local.fixtures.quiz_agent import IMPORT_PATH as QUIZ_AGENT
from rl360_ext.local.stack import StackConfig, local_stack
from rl360_ext.util.procs import ServiceStartError


def _flag(flags: tuple[str, ...], name: str) -> str:
    return flags[flags.index(name) + 1]


def test_demo_config_without_faults(tmp_path: Path) -> None:
    config = demo_stack_config(DemoConfig(tasks=3, attempts=4, engines=3, seed=7, out=tmp_path))
    flags = ("--seed", "7", "--dtype", "float64")
    assert (config.engines, config.engine_flags, config.engine_faults) == (3, flags, None)
    # SMG times an engine control call out after the confirm timeout: a push fences a silent engine
    assert config.gateway_flags == ("--enable-rl", "--rl-control-timeout-secs", "10")
    (harbor,) = config.harbors
    flags = harbor.argv_flags()
    assert harbor.agent == QUIZ_AGENT and _flag(flags, "--max-concurrent") == "12"
    assert _flag(flags, "--trials-dir") == str(tmp_path / "trials")
    assert _flag(flags, "--keep-trials") == "failed" and _flag(flags, "--env-setup-s") == "20.0"
    assert config.harbor_pool is None
    assert config.tokenizer_dir == tmp_path / "tokenizer" and config.tasks_root is None
    assert config.prerequisites() == (("bwrap", "tmux"), ("harbor",))
    assert not config.reuse_ray


def test_demo_config_with_faults_lets_503s_through(tmp_path: Path) -> None:
    config = demo_stack_config(DemoConfig(faults=0.4, seed=3, out=tmp_path))
    assert config.gateway_flags == (
        "--enable-rl",
        "--rl-control-timeout-secs",
        "10",
        "--disable-retries",
        "--disable-circuit-breaker",
    )
    assert config.engine_faults == {"error_rate": pytest.approx(0.1), "seed": 3}
    assert _flag(config.harbors[0].argv_flags(), "--max-concurrent") == "32"


def test_demo_config_with_replicas_serves_harbor_from_a_ray_pool(tmp_path: Path) -> None:
    config = demo_stack_config(DemoConfig(tasks=3, attempts=4, harbor_replicas=2, out=tmp_path))
    assert config.harbors == () and config.harbor_pool is not None
    pool = config.harbor_pool
    assert pool.replicas == 2 and pool.start_rate == (12, demo_stack_module.DEMO_START_INTERVAL_S)
    assert config.prerequisites() == (("bwrap", "tmux"), ("harbor",))
    # the replica serves what the process would parse from its flags
    settings = pool.server.server_settings(tmp_path / "tasks")
    assert (settings.max_concurrent, settings.keep_trials, settings.env) == (12, "failed", "bwrap")
    assert settings.trials_dir == tmp_path / "trials" and settings.agent == (QUIZ_AGENT,)
    assert (
        settings.budget
        == stack_module.HarborServerConfig(
            tasks_root=tmp_path, trials_dir=tmp_path, **demo_stack_module.DEMO_HARBOR_BUDGET
        ).budget
    )


def test_settings_flags_parse_back_to_the_same_settings(tmp_path: Path) -> None:
    seen: dict[str, object] = {}
    values = {
        "max_concurrent": 7,
        "keep_trials": "none",
        "agent": ("oracle", "nop"),
        **demo_stack_module.DEMO_HARBOR_BUDGET,
    }
    flags = stack_module.settings_flags({**values, "trials_dir": tmp_path, "max_turns": None})

    def capture(parsed: dict[str, object]) -> None:
        seen.update(parsed)

    command = fields_command(stack_module.HarborServerConfig, capture, optional=("tasks_root", "trials_dir"))

    app = typer.Typer()
    app.command()(command)
    result = CliRunner().invoke(app, list(flags))
    assert result.exit_code == 0, result.output
    assert {k: seen[k] for k in values} == values and Path(str(seen["trials_dir"])) == tmp_path
    with pytest.raises(ValueError, match="not a HarborServerConfig field"):
        stack_module.settings_flags({"max_concurency": 3})


def test_matrix_config(tmp_path: Path) -> None:
    config = matrix_stack_config(tmp_path)
    assert [h.name for h in config.harbors] == ["harbor", "harbor-victim"]
    assert {h.agent for h in config.harbors} == {DEMO_AGENT}
    assert config.tasks_root == tmp_path / "tasks" and config.reuse_ray and config.engines == 1
    assert config.gateway_flags == () and config.engine_faults is None
    assert config.prerequisites() == (("bwrap",), ("harbor",))
    assert StackConfig(out=tmp_path, gateway=False).prerequisites() == ((), ())


@dataclass
class FakeService:
    name: str
    argv: list[str]
    port: int
    log_path: Path
    stopped: list[str] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return os.getpid()  # _stop_all sends SIGCONT first: harmless to this process

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def alive(self) -> bool:
        return not self.stopped

    def stop(self) -> None:
        self.stopped.append(self.name)


@pytest.fixture
def fakes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[FakeService]:
    """Every service the launcher starts is a FakeService (listed here); SMG fails to start."""
    started: list[FakeService] = []

    def fake(name: str, argv: list[str]) -> FakeService:
        service = FakeService(name, argv, 10000 + len(started), tmp_path / f"{name}.log")
        started.append(service)
        return service

    def start_smg(urls: list[str], logs: Path, **kwargs: object) -> FakeService:
        raise ServiceStartError("smg exited with 1 before it was ready", logs / "smg.log", "bad flag")

    monkeypatch.setattr(stack_module, "preflight", lambda *args, **kwargs: None)
    monkeypatch.setattr(
        stack_module, "start_engine", lambda logs, *flags, name: fake(name, ["engine", *flags])
    )
    monkeypatch.setattr(
        stack_module,
        "start_harbor",
        lambda logs, root, agent, *flags, name: fake(name, ["harbor", str(root), agent, *flags]),
    )
    monkeypatch.setattr(stack_module, "start_smg", start_smg)
    return started


def test_a_failed_start_stops_everything_started(tmp_path: Path, fakes: list[FakeService]) -> None:
    config = StackConfig(
        out=tmp_path,
        engines=2,
        engine_flags=("--seed", "1"),
        harbors=matrix_stack_config(tmp_path).harbors,
        tasks_root=tmp_path / "tasks",
        tokenizer_dir=tmp_path / "tokenizer",
        ray=False,
    )
    with pytest.raises(ServiceStartError, match="smg exited"), local_stack(config):
        pytest.fail("the stack must not be yielded when SMG fails")
    assert sorted(s.name for s in fakes) == ["engine0", "engine1", "harbor", "harbor-victim"]
    assert all(s.stopped == [s.name] for s in fakes)
    assert all(s.argv[1:] == ["--seed", "1"] for s in fakes if s.argv[0] == "engine")
    assert all(s.argv[1] == str(tmp_path / "tasks") for s in fakes if s.argv[0] == "harbor")


def test_the_manifest_lists_what_started(
    tmp_path: Path, fakes: list[FakeService], monkeypatch: pytest.MonkeyPatch
) -> None:
    def start_smg(urls: list[str], logs: Path, **kwargs: object) -> FakeService:
        service = FakeService("smg", ["smg", "launch", "--prometheus-port", "29001"], 29000, logs / "smg.log")
        fakes.append(service)
        return service

    monkeypatch.setattr(stack_module, "start_smg", start_smg)
    config = StackConfig(out=tmp_path, tokenizer_dir=tmp_path / "tokenizer", ray=False)
    with local_stack(config) as stack:
        manifest = json.loads((tmp_path / "logs" / "services.json").read_text())
        assert stack.gateway_url == "http://127.0.0.1:29000"
    assert [(s["name"], s["ports"]) for s in manifest["services"]] == [
        ("smg", [29000, 29001]),
        ("engine0", [10000]),
    ]
    assert all(s.stopped for s in fakes)


def test_a_joining_engine_is_loaded_before_the_gateway_routes_to_it_and_stops_with_the_stack(
    tmp_path: Path, fakes: list[FakeService], monkeypatch: pytest.MonkeyPatch
) -> None:
    from rl360_ext.weights import push as push_module

    def start_smg(urls: list[str], logs: Path, **kwargs: object) -> FakeService:
        service = FakeService("smg", ["smg", "launch"], 29000, logs / "smg.log")
        fakes.append(service)
        return service

    order: list[tuple[str, ...]] = []
    monkeypatch.setattr(stack_module, "start_smg", start_smg)
    monkeypatch.setattr(
        push_module, "load_engine", lambda url, path, version: order.append(("load", url, version))
    )
    monkeypatch.setattr(stack_module, "add_gateway_worker", lambda gateway, url: order.append(("join", url)))
    config = StackConfig(
        out=tmp_path, engine_flags=("--seed", "1"), tokenizer_dir=tmp_path / "tokenizer", ray=False
    )
    with local_stack(config) as stack:
        joined = stack.add_engine("/w/v3.npz", "3")
        manifest = json.loads((tmp_path / "logs" / "services.json").read_text())
    assert joined.name == "engine1" and joined.argv == ["engine", "--seed", "1"]
    assert order == [("load", joined.url, "3"), ("join", joined.url)]  # weights first, then routing
    assert [s["name"] for s in manifest["services"]] == ["smg", "engine0", "engine1"]
    assert all(s.stopped for s in fakes)  # the replacement is stopped with the stack
