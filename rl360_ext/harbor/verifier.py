"""Harbor's verifier, grading reward files by rl360's rule, plus a record of the test script's exit code.

Reward files are parsed by `rl360_ext.outcomes.rewards` (through `rl360_ext.harbor.outcome.read_reward`:
capped, never through a link) instead of Harbor's own parser: finite numbers within the server's
`--reward-min`/`--reward-max` (this verifier's `reward_min`/`reward_max` kwargs), else Harbor's
`RewardFileEmptyError` / `VerifierOutputParseError` carrying the reason, so nothing in reward
parsing raises anything but those two.

Owns the end of the verifier phase's processes: when the test script exits, every process it
left is killed before Harbor reads the reward files, so a daemon the code under test
double-forked cannot rewrite the reward after `test.sh` exited. An environment with
`exec_and_end` (the bwrap sandbox) gets the script exec'd by its shell and runs it traced: every
process is killed as the script begins to exit, then the PID namespace from the host. Any other
environment (Harbor's docker, a cloud sandbox) gets Harbor's command followed, in the same
shell, by `kill -KILL -1` (every process the verifier's user may signal); a test command of
another form is followed by that kill as a command. See docs/harbor.md for what is promised
where.

Owns one more thing Harbor does not keep: whether `tests/test.sh` exited non-zero. Harbor reports a
test script that crashed before writing its reward and one that exited 0 without writing it
with the same `RewardFileNotFoundError`; the exit code recorded here lets the result adapter
(`rl360_ext.harbor.outcome`) call the first `verifier_crash` and the second
`reward_file_missing`. Grading itself is Harbor's `Verifier`, unchanged; the environment it is
given is wrapped so that the one command whose output goes to the test-stdout file has its
exit code written next to the trial's result, with how the verifier phase failed (the exception
type, or `VerifierTimeoutError` when Harbor's timeout cancelled it): Harbor keeps only the first
exception of a trial, so after an agent-phase one the verifier's own would be lost, and the
attribution rules need it. Selected per trial with
`VerifierConfig(import_path="rl360_ext.harbor.verifier:ExitRecordingVerifier")`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from pathlib import Path
from typing import Any

from harbor.environments.base import BaseEnvironment, ExecResult
from harbor.models.trial.paths import EnvironmentPaths
from harbor.models.verifier.result import VerifierResult
from harbor.verifier.verifier import RewardFileEmptyError, Verifier, VerifierOutputParseError

from rl360_ext.harbor.envs.bwrap import EXIT_TAG, reported_exit
from rl360_ext.harbor.outcome import VERIFIER_EXIT_FILE, read_reward
from rl360_ext.outcomes.causes import Cause
from rl360_ext.outcomes.harbor_exceptions import VERIFIER_TIMEOUT_ERROR
from rl360_ext.outcomes.rewards import RewardParse, RewardRange

_log = logging.getLogger(__name__)

IMPORT_PATH = "rl360_ext.harbor.verifier:ExitRecordingVerifier"
KILL_ALL_COMMAND = "kill -KILL -1 2>/dev/null"  # every process its user may signal but itself
_KILL_TIMEOUT_S = 30
# Harbor's `build_execution_command(script, stdout_path=...)` for a .sh script, both quoted
_HARBOR_TEST_COMMAND = re.compile(r"\((?P<script>[^()]+)\) > (?P<stdout>\S+) 2>&1")


class _ExitCodeProbe:
    """Forwards everything to the environment; records the exit code of the test-script command
    and ends every process of the verifier phase when that command returns."""

    def __init__(self, environment: BaseEnvironment, marker: str) -> None:
        self._environment = environment
        self._marker = marker
        self.test_exit_code: int | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._environment, name)

    async def exec(self, command: str, *args: Any, **kwargs: Any) -> ExecResult:
        if self._marker not in command:
            return await self._environment.exec(command, *args, **kwargs)
        match = _HARBOR_TEST_COMMAND.fullmatch(command)
        run_and_end = getattr(self._environment, "exec_and_end", None)
        if run_and_end is not None:
            # the script exec'd by the shell: it is the process `exec_and_end` sees exit
            script = f"exec > {match['stdout']} 2>&1 || exit 1; exec {match['script']}" if match else command
            result: ExecResult = await run_and_end(script, *args, **kwargs)
            self.test_exit_code = result.return_code
            return result
        # the script's exit code told before the kill: its shell may go with it (a container
        # whose init it kills)
        ending = f"{command}; rl360_rc=$?; echo {EXIT_TAG}$rl360_rc; {KILL_ALL_COMMAND}; exit $rl360_rc"
        try:
            result = await self._environment.exec(ending if match else command, *args, **kwargs)
        finally:
            if match is None:
                await asyncio.shield(_kill_all(self._environment))
        self.test_exit_code = reported_exit(result).return_code
        return result


async def _kill_all(environment: BaseEnvironment) -> None:
    """`kill -KILL -1` run in `environment`, a failure logged, never raised: the reward files are
    read either way, and the trial's teardown kills what is left."""
    try:
        await environment.exec(KILL_ALL_COMMAND, timeout_sec=_KILL_TIMEOUT_S)
    except Exception:
        _log.warning("could not end the verifier phase's processes", exc_info=True)


class ExitRecordingVerifier(Verifier):
    def __init__(
        self,
        *args: Any,
        reward_min: float = RewardRange.low,
        reward_max: float = RewardRange.high,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.reward_range = RewardRange(reward_min, reward_max)

    def _graded(self, path: Path) -> dict[str, float | int]:
        parsed = read_reward(path, self.reward_range) or RewardParse(
            cause=Cause.REWARD_FILE_INVALID, reason=f"{path.name} disappeared while it was read"
        )
        if parsed.rewards is not None:
            return dict(parsed.rewards)
        if parsed.cause == Cause.REWARD_FILE_EMPTY:
            raise RewardFileEmptyError(parsed.reason)
        raise VerifierOutputParseError(parsed.reason)

    def _parse_reward_json(self) -> dict[str, float | int]:
        return self._graded(self.trial_paths.reward_json_path)

    def _parse_reward_text(self) -> dict[str, float | int]:
        return self._graded(self.trial_paths.reward_text_path)

    async def _remove_reward_files(self) -> None:
        """Harbor's removal of stale reward files, done by an environment that removes files on
        the host (the bwrap sandbox's `remove_files`: no `rm -f` command started in it); any
        other environment runs Harbor's command."""
        remove = getattr(self.environment, "remove_files", None)
        if remove is None:
            await super()._remove_reward_files()
            return
        paths = EnvironmentPaths.for_os(self.environment.os)
        await remove([str(paths.reward_text_path), str(paths.reward_json_path)])
        if not self.environment.is_path_mounted(paths.verifier_dir, self.trial_paths.verifier_dir):
            self.trial_paths.reward_text_path.unlink(missing_ok=True)
            self.trial_paths.reward_json_path.unlink(missing_ok=True)

    async def verify(self) -> VerifierResult:
        marker = str(EnvironmentPaths.for_os(self.environment.os).verifier_dir / "test-stdout.txt")
        environment = self.environment
        probe = _ExitCodeProbe(environment, marker)
        self.environment = probe  # type: ignore[assignment]
        record = self.trial_paths.trial_dir / VERIFIER_EXIT_FILE
        record.unlink(missing_ok=True)
        failure: str | None = None
        try:
            return await super().verify()
        except asyncio.CancelledError:
            failure = VERIFIER_TIMEOUT_ERROR  # Harbor's verifier timeout cancels `verify`
            raise
        except Exception as exc:
            failure = type(exc).__name__
            raise
        finally:
            self.environment = environment
            entry: dict[str, Any] = {} if failure is None else {"failure": failure}
            if probe.test_exit_code is not None:
                entry["test_exit_code"] = probe.test_exit_code
            if entry:
                record.write_text(json.dumps(entry))
