"""The audit's canary agents without a server: the shell they run (on directories of pytest's tmp
dir, never the canaries' own sandbox paths), the conftest.py they plant under a real pytest, and
the regrade agent's decision with a scripted environment and verifier."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("harbor")

from harbor.models.agent.context import AgentContext
from harbor.models.trial.config import TaskConfig, TrialConfig
from harbor.models.verifier.result import VerifierResult

from rl360_ext.harbor import canaries
from rl360_ext.harbor.canaries import (
    CanaryIncomplete,
    OracleRegrade,
    VerifierDisagreed,
    agree,
    conftest_script,
    conftest_source,
    executables_script,
    restore_script,
    snapshot_script,
    stub_script,
    trial_task,
)
from rl360_ext.outcomes.harbor_exceptions import CONTROL_INCOMPLETE_ERROR
from rl360_ext.tasks.verdicts import CONTROL_AGENTS, CONTROL_VARIANTS, VERIFIER_DISAGREED, Control


def bash(script: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", script],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", **env},
    )


def tree(root: Path) -> dict[str, bytes | None]:
    return {
        p.relative_to(root).as_posix(): (p.read_bytes() if p.is_file() else None)
        for p in sorted(root.rglob("*"))
    }


def test_the_work_product_is_restored_exactly_after_the_oracle(tmp_path: Path) -> None:
    work, store = tmp_path / "app", tmp_path / "store"
    (work / "sub").mkdir(parents=True)
    (work / "keep.txt").write_text("kept")
    (work / "sub" / "buggy.py").write_text("return 0")
    (work / "remove-me.txt").write_text("the oracle deletes this")
    (work / ".hidden").write_text("dot file")
    before = tree(work)
    assert bash(snapshot_script(str(store), (str(work), str(work))), tmp_path).returncode == 0
    (work / "sub" / "buggy.py").write_text("return 1")  # what solve.sh does
    (work / "answer.txt").write_text("C")
    (work / "remove-me.txt").unlink()
    (work / "new" / "deep").mkdir(parents=True)
    done = bash(restore_script(str(store)), tmp_path)
    assert done.returncode == 0, done.stderr
    assert tree(work) == before
    assert not store.exists() and not Path(f"{store}.list").exists()


def test_a_restore_without_its_copy_fails_so_the_attempt_is_no_evidence(tmp_path: Path) -> None:
    assert bash(restore_script(str(tmp_path / "never-copied")), tmp_path).returncode != 0


def test_the_snapshot_never_takes_the_root_or_tmp_itself(tmp_path: Path) -> None:
    store = tmp_path / "store"
    assert bash(snapshot_script(str(store), ("/", "/tmp")), tmp_path).returncode == 0
    assert Path(f"{store}.list").read_text() == ""


def test_the_conftest_passes_every_pytest_test_and_writes_the_maximum(tmp_path: Path) -> None:
    project, rewards = tmp_path / "project", tmp_path / "verifier"
    (project / "tests").mkdir(parents=True)
    rewards.mkdir()
    (project / "tests" / "test_answer.py").write_text("def test_wrong():\n    assert 1 == 2\n")
    source = conftest_source(1.0, str(rewards))
    other = tmp_path / "not-writable-parent" / "missing"
    assert (
        bash(conftest_script(source, (str(project), str(other)), (str(project),)), tmp_path).returncode == 0
    )
    assert (project / "conftest.py").read_text() == source
    assert (project / "tests" / "conftest.py").read_text() == source  # a test file's directory too
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:asyncio", str(project)],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout
    assert (rewards / "reward.txt").read_text() == "1.0\n"
    assert (rewards / "reward.json").read_text() == '{"reward": 1.0}\n'


def test_the_conftest_appends_to_the_project_s_own(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text("FIXTURE = 1\n")
    assert bash(conftest_script("# canary\n", (str(tmp_path),), ()), tmp_path).returncode == 0
    assert (tmp_path / "conftest.py").read_text() == "FIXTURE = 1\n# canary\n"


def test_any_python_that_imports_the_conftest_writes_the_maximum_at_exit(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(conftest_source(2.5, str(tmp_path)))
    code = "import conftest; open('reward.txt', 'w').write('0\\n')"  # the runner's own 0, written first
    subprocess.run([sys.executable, "-S", "-c", code], cwd=tmp_path, check=True, timeout=60)
    assert (tmp_path / "reward.txt").read_text() == "2.5\n"


def test_gradings_agree_on_equal_keys_and_values_only() -> None:
    assert agree([{"reward": 1.0}, {"reward": 1.0 + 1e-12}, {"reward": 1.0}])
    assert not agree([{"reward": 1.0}, {"reward": 0.0}])
    assert not agree([{"reward": 1.0}, {"reward": 1.0, "style": 0.5}])


def test_the_task_comes_from_the_trial_s_config(tmp_path: Path) -> None:
    with pytest.raises(CanaryIncomplete, match="no Harbor trial layout"):
        trial_task(tmp_path / "trial" / "agent")
    task_dir = tmp_path / "task"
    (task_dir / "tests").mkdir(parents=True)
    (task_dir / "tests" / "test.sh").write_text("#!/bin/bash\n")
    (task_dir / "instruction.md").write_text("do it\n")
    (task_dir / "task.toml").write_text('schema_version = "1.4"\n')
    trial_dir = tmp_path / "trial"
    (trial_dir / "agent").mkdir(parents=True)
    config = TrialConfig(task=TaskConfig(path=task_dir), trial_name="t", trials_dir=tmp_path)
    (trial_dir / "config.json").write_text(config.model_dump_json())
    task, paths, read = trial_task(trial_dir / "agent")
    assert task.task_dir == task_dir and paths.trial_dir == trial_dir and read.trial_name == "t"


def test_the_regrade_needs_two_gradings_to_compare(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="runs must be at least 2"):
        OracleRegrade(logs_dir=tmp_path, runs=1)


class FakeEnvironment:
    """Records the regrade's calls: shell commands, phase ends, the default user."""

    def __init__(self) -> None:
        self.calls: list[Any] = []
        self.default_user: str | None = None

    async def exec(self, command: str, **kwargs: Any) -> Any:
        self.calls.append(("exec", command))
        return type("Result", (), {"return_code": 0, "stderr": ""})()

    async def end_phase(self, clear: tuple[str, ...], *, grading: bool = False) -> None:
        self.calls.append(("end_phase", tuple(clear), grading))

    def with_default_user(self, user: Any) -> Any:
        import contextlib

        return contextlib.nullcontext()


class FakeOracle:
    def __init__(self, environment: FakeEnvironment) -> None:
        self.environment = environment

    async def run(self, instruction: str, environment: Any, context: AgentContext) -> None:
        self.environment.calls.append(("oracle",))


@pytest.mark.parametrize(("rewards", "disagree"), [([1.0, 1.0, 1.0], False), ([1.0, 0.0, 0.0], True)])
async def test_the_regrade_grades_one_end_state_each_time_as_the_runner_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rewards: list[float], disagree: bool
) -> None:
    environment = FakeEnvironment()
    graded = iter(rewards)

    class Verifier:
        async def verify(self) -> VerifierResult:
            environment.calls.append(("verify",))
            return VerifierResult(rewards={"reward": next(graded)})

    agent = OracleRegrade(logs_dir=tmp_path, runs=3)
    task = type("Task", (), {"config": type("Config", (), {"verifier": type("V", (), {"user": None})()})()})()
    trial_config = type("TrialConfig", (), {"verifier": type("VC", (), {"env": {}})()})()
    monkeypatch.setattr(agent, "_oracle", lambda: (FakeOracle(environment), task, None, trial_config))
    monkeypatch.setattr(
        canaries.VerifierFactory, "create_verifier_from_config", staticmethod(lambda *a, **k: Verifier())
    )
    context = AgentContext()
    if disagree:
        with pytest.raises(VerifierDisagreed, match=r'\[\{"reward": 1.0\}, \{"reward": 0.0\}'):
            await agent.run("do it", environment, context)  # type: ignore[arg-type]
    else:
        await agent.run("do it", environment, context)  # type: ignore[arg-type]
    grading = ("end_phase", ("/logs/verifier", "/tests", "/solution"), True)
    assert [c[0] for c in environment.calls[:2]] == ["exec", "oracle"]
    assert environment.calls[2:] == [grading, ("verify",)] * 3
    assert context.metadata == {"regrade_rewards": [{"reward": r} for r in rewards]}


def test_the_regrade_clears_what_the_runner_clears_and_the_audit_knows_its_finding() -> None:
    from rl360_ext.harbor.runner import GRADING_CLEARS

    assert canaries.REGRADE_CLEARS == GRADING_CLEARS
    assert VerifierDisagreed.__name__ == VERIFIER_DISAGREED
    assert CanaryIncomplete.__name__ == CONTROL_INCOMPLETE_ERROR  # its row in the outcomes table
    for control in (Control.CANARY_CONFTEST, Control.INSENSITIVE, Control.VERIFIER_REGRADE):
        assert CONTROL_AGENTS[control] in canaries.CANARY_AGENTS


def test_every_control_agent_is_a_canary_and_the_hijack_variants_are_its_stubs() -> None:
    for control, agent in CONTROL_AGENTS.items():
        if control not in (Control.ENVIRONMENT, Control.ORACLE):
            assert agent in canaries.CANARY_AGENTS, control
    assert [v["stub"] for v in CONTROL_VARIANTS[Control.WORK_PRODUCT_HIJACK]] == list(canaries.PYTHON_STUBS)


def test_the_hijack_stubs_every_module_and_script_the_oracle_left_and_nothing_else(tmp_path: Path) -> None:
    """What the oracle left is listed, the work product is undone, then each listed path is a stub:
    a module that exits 0 at import, a script that exits 0; data files stay as they were."""
    work, store, listing = tmp_path / "app", tmp_path / "store", tmp_path / "listing"
    (work / "pkg").mkdir(parents=True)
    (work / "stats.py").write_text("def mean(xs):\n    return 0\n")  # the buggy module, there before
    (work / "answer.txt").write_text("")
    (work / ".git").mkdir()
    (work / ".git" / "hook.sh").write_text("#!/bin/sh\n")
    assert bash(snapshot_script(str(store), (str(work),)), tmp_path).returncode == 0
    # what solve.sh does: fixes the module, adds a package, a tool with a shebang, a binary, data
    (work / "stats.py").write_text("def mean(xs):\n    return sum(xs) / len(xs)\n")
    (work / "pkg" / "__init__.py").write_text("VALUE = 1\n")
    (work / "pkg" / "__pycache__").mkdir()
    (work / "pkg" / "__pycache__" / "x.pyc").write_bytes(b"\0")
    (work / "tool").write_text("#!/usr/bin/env python3\nprint('ok')\n")
    (work / "run").write_bytes(b"\x7fELF\0\0")
    (work / "run").chmod(0o755)
    (work / "answer.txt").write_text("C\n")
    assert bash(executables_script(str(store), str(listing)), tmp_path).returncode == 0
    assert bash(restore_script(str(store), keep_list=True), tmp_path).returncode == 0
    assert Path(f"{store}.list").is_file()
    done = bash(stub_script(str(listing), str(store), canaries.PYTHON_STUBS["exit"]), tmp_path)
    assert done.returncode == 0, done.stderr
    assert (work / "answer.txt").read_text() == ""  # data: the state before the oracle
    assert (work / ".git" / "hook.sh").read_text() == "#!/bin/sh\n"
    assert not (work / "pkg" / "__pycache__").exists()
    assert (work / "tool").read_text() == (work / "run").read_text() == canaries.SCRIPT_STUB
    assert os.access(work / "run", os.X_OK) and not os.access(work / "tool", os.X_OK)
    for module in ("stats.py", "pkg/__init__.py"):
        assert (work / module).read_text() == canaries.PYTHON_STUBS["exit"]
    for name, stub in canaries.PYTHON_STUBS.items():
        (work / "stats.py").write_text(stub)
        code = f"import sys; sys.path.insert(0, {str(work)!r}); import stats; print('graded'); sys.exit(1)"
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert (run.returncode, run.stdout) == (0, ""), name  # the importer exits 0, before its check
    assert subprocess.run([str(work / "run")], timeout=60).returncode == 0


def test_the_dry_run_sees_the_path_the_test_script_sets_itself(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    script = tmp_path / "tests" / "test.sh"
    script.write_text(
        "#!/bin/bash\nexport PATH=\"$PWD/.tools/bin:$PATH\"\ncheck() { FOO=1 python3 -c 'pass'; }\n"
        "check\nPATH=rel:$PATH tr a b </dev/null\n"
    )
    hook, record = tmp_path / "hook", tmp_path / "record"
    hook.write_text(canaries.observe_script(str(record)))
    work = tmp_path / "app"
    work.mkdir()
    bash(f"bash {script}", work, BASH_ENV=str(hook))
    dirs, commands = canaries.observed_paths(record.read_text())
    assert dirs[:3] == ["/usr/bin", "/bin", f"{work}/.tools/bin"]  # the script's own entry, seen
    assert f"{work}/rel" in dirs  # a relative entry, against the command's directory
    assert {"python3", "tr", "check"} <= set(commands) and "FOO=1" not in commands
    assert canaries.observed_paths("/w\t:/x\tls\n")[0] == ["/w", "/x"]  # an empty entry: the cwd


def test_the_shims_go_into_every_writable_directory_of_the_path(tmp_path: Path) -> None:
    writable, missing = tmp_path / "bin", tmp_path / "made" / "bin"
    writable.mkdir()
    script = canaries.shim_script(
        "#!/bin/sh\nexit 0\n", [str(writable), str(missing), "/proc/x"], ["python3", "tr"]
    )
    assert bash(script, tmp_path).returncode == 0
    for directory in (writable, missing):
        assert sorted(p.name for p in directory.iterdir()) == ["python3", "tr"]
        assert os.access(directory / "tr", os.X_OK)


@pytest.mark.parametrize(
    ("head", "shell"),
    [
        (b"#!/bin/bash\n", True),
        (b"#!/usr/bin/env bash\n", True),
        (b"#!/bin/sh -e\n", True),
        (b"echo no shebang\n", True),
        (b"#!/usr/bin/env python3\n", False),
        (b"#!/usr/bin/python3 -I\n", False),
    ],
)
def test_a_test_script_bash_runs_is_observed_through_bash(head: bytes, shell: bool) -> None:
    assert canaries.shell_script(head) is shell


def test_git_history_is_probed_whoever_owns_the_repository(tmp_path: Path) -> None:
    """The last commit removed the answer its parent holds; git sees another user's repository
    (GIT_TEST_ASSUME_DIFFERENT_OWNER: what git does for a repository another uid owns)."""
    git = ["git", "-c", "user.name=a", "-c", "user.email=a@example.invalid", "-c", "init.defaultBranch=main"]
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    (tmp_path / "answer.txt").write_text("C\n")
    for args in (["init", "-q"], ["add", "answer.txt"], ["commit", "-qm", "a"], ["rm", "-q", "answer.txt"]):
        subprocess.run([*git, *args], cwd=tmp_path, check=True, env=env, timeout=60)
    subprocess.run([*git, "commit", "-qm", "b"], cwd=tmp_path, check=True, env=env, timeout=60)
    probe = canaries.LeakProbe(logs_dir=tmp_path / "logs").script()
    assert bash(probe, tmp_path, HOME=str(tmp_path), GIT_TEST_ASSUME_DIFFERENT_OWNER="1").returncode == 0
    assert (tmp_path / "answer.txt").read_text() == "C\n"


TELLTALES = re.compile(r"rl360|canary|audit|probe|hijack|shim", re.IGNORECASE)


def test_nothing_a_canary_leaves_for_the_verifier_names_the_audit(tmp_path: Path) -> None:
    """A verifier could look for the audit in what the agent phase left: the files the canaries
    write (conftest.py, shims, stubs, reward files) and the names of their scratch files."""
    left = [
        conftest_source(1.0),
        *canaries.PYTHON_STUBS.values(),
        canaries.SCRIPT_STUB,
        canaries.RewardFileCanary(logs_dir=tmp_path)._write_rewards("/logs/verifier"),
        canaries.observe_script("/tmp/tmp.x/r"),
    ]
    assert not [text for text in left if TELLTALES.search(text)]
    for script in (snapshot_script("/tmp/tmp.x/w"), executables_script("/tmp/tmp.x/w", "/tmp/tmp.x/x")):
        assert not TELLTALES.search(script)


async def test_every_canary_waits_its_pause_before_it_acts(tmp_path: Path) -> None:
    environment = FakeEnvironment()
    agent = canaries.IdleAgent(logs_dir=tmp_path, pause_s=0.05)
    started = asyncio.get_running_loop().time()
    await agent.run("do it", environment, AgentContext())  # type: ignore[arg-type]
    assert asyncio.get_running_loop().time() - started >= 0.05
    assert environment.calls == []  # the idle agent does nothing in the sandbox
    with pytest.raises(ValueError, match="pause_s"):
        canaries.RewardFileCanary(logs_dir=tmp_path, pause_s=-1.0)
    with pytest.raises(ValueError, match="stub"):
        canaries.WorkProductHijack(logs_dir=tmp_path, stub="other")
