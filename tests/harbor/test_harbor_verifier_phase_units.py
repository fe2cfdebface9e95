"""The verifier phase's ends, without a sandbox: the test command is the one that ends every
process (in the form each environment runs it, its exit code kept), and the sandbox's limit hits
are told apart by phase. Nothing here runs a command: the environments only record."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from harbor.environments.base import ExecResult

from rl360_ext.harbor.envs import bwrap
from rl360_ext.harbor.envs.bwrap import environment
from rl360_ext.harbor.envs.limits import SandboxLimits
from rl360_ext.harbor.verifier import KILL_ALL_COMMAND, _ExitCodeProbe
from rl360_ext.outcomes.attribution import LimitHit, Phase, Resource
from tests.harbor.test_harbor_bwrap_lifecycle import make_env

STDOUT = "/logs/verifier/test-stdout.txt"
HARBOR_COMMAND = f"(/tests/test.sh) > {STDOUT} 2>&1"  # build_execution_command's form


class Recorder:
    """An environment that records the commands it is given and answers `answer`."""

    def __init__(self, answer: ExecResult) -> None:
        self.commands: list[str] = []
        self.answer = answer

    async def exec(self, command: str, **_: Any) -> ExecResult:
        self.commands.append(command)
        return self.answer


class Ending(Recorder):
    """An environment that ends a command's processes itself (`exec_and_end`, as bwrap's)."""

    async def exec_and_end(self, command: str, **_: Any) -> ExecResult:
        self.commands.append(f"and_end: {command}")
        return self.answer


def test_an_environment_that_ends_processes_gets_the_script_exec_d_by_its_shell() -> None:
    env = Ending(ExecResult(stdout="", stderr="", return_code=4))
    probe = _ExitCodeProbe(env, STDOUT)  # type: ignore[arg-type]
    asyncio.run(probe.exec(HARBOR_COMMAND))
    assert env.commands == [f"and_end: exec > {STDOUT} 2>&1 || exit 1; exec /tests/test.sh"]
    assert probe.test_exit_code == 4
    asyncio.run(probe.exec("chmod +x /tests/test.sh"))  # any other command goes as it is
    assert env.commands[-1] == "chmod +x /tests/test.sh"


def test_any_other_environment_kills_in_the_test_command_s_own_shell_and_keeps_the_exit_code() -> None:
    # the shell printed the script's exit code, then went with its own kill (137)
    env = Recorder(ExecResult(stdout="rl360-exit=0\nrl360-exit=3\n", stderr="", return_code=137))
    probe = _ExitCodeProbe(env, STDOUT)  # type: ignore[arg-type]
    asyncio.run(probe.exec(HARBOR_COMMAND))
    (sent,) = env.commands
    ending = f"; rl360_rc=$?; echo rl360-exit=$rl360_rc; {KILL_ALL_COMMAND}; exit $rl360_rc"
    assert sent == HARBOR_COMMAND + ending
    assert probe.test_exit_code == 3  # the last line: the one after the script


def test_a_test_command_of_another_form_is_followed_by_a_kill_command() -> None:
    env = Recorder(ExecResult(stdout="", stderr="", return_code=2))
    probe = _ExitCodeProbe(env, STDOUT)  # type: ignore[arg-type]
    odd = f"bash /tests/test.sh > {STDOUT}"
    asyncio.run(probe.exec(odd))
    assert env.commands == [odd, KILL_ALL_COMMAND] and probe.test_exit_code == 2


def test_the_tracer_s_exit_line_is_the_command_s_exit_code() -> None:
    answer = ExecResult(stdout="out\nrl360-exit=0\nrl360-exit=7\n", stderr="e", return_code=137)
    traced = bwrap.reported_exit(answer)
    assert traced.return_code == 7 and traced.stdout == "out\nrl360-exit=0\n" and traced.stderr == "e"
    plain = ExecResult(stdout="no tag here\n", stderr="", return_code=5)
    assert bwrap.reported_exit(plain) is plain
    glued = ExecResult(stdout="xrl360-exit=0\n", stderr="", return_code=137)  # not a line of its own
    assert bwrap.reported_exit(glued) is glued


class Counters(SandboxLimits):
    """Limits whose OOM kill and refused-fork counts the test sets."""

    oom = 0
    refused = 0
    pids_cgroup = True

    def oom_kills(self) -> int:
        return self.oom

    def pids_refusals(self) -> int:
        return self.refused


def test_limit_hits_and_the_memory_state_belong_to_the_phase_they_happened_in(tmp_path: Path) -> None:
    env = make_env(tmp_path)
    limits = Counters()
    env._limits = limits
    assert env._phase == Phase.ENVIRONMENT_SETUP and env.limit_hits() == []
    env._enter_phase(Phase.AGENT)
    limits.oom = 1
    env._observe()
    env._observe()  # one hit per phase and resource, however often it is seen
    assert env._memory_exceeded()
    env._enter_phase(Phase.VERIFIER)  # grading starts: the agent's OOM is not the verifier's
    assert not env._memory_exceeded()
    env._observe()
    limits.refused = 3
    limits.oom = 2
    env._observe()
    assert env._memory_exceeded()
    assert [(hit.phase, hit.resource) for hit in env.limit_hits()] == [
        (Phase.AGENT, Resource.MEMORY),
        (Phase.VERIFIER, Resource.MEMORY),
        (Phase.VERIFIER, Resource.PIDS),
    ]
    assert env.limit_hits()[2] == LimitHit(Phase.VERIFIER, Resource.PIDS, "3 forks refused at pids.max 1024")
    assert env._nproc() == env.options.max_pids + environment._PIDS_SLACK  # the cgroup refuses first
