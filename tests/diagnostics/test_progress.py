"""Progress on stderr: stages update the spinner, stdout is never captured, no-op when inactive."""

from __future__ import annotations

import io

from rich.console import Console

from rl360_ext.util.progress import _active, showing_progress, stage


def test_stage_is_a_no_op_without_progress() -> None:
    stage("nothing shown")
    assert _active.get() is None


def test_stages_update_the_spinner_and_stdout_is_left_alone(capsys) -> None:
    terminal = io.StringIO()
    console = Console(file=terminal, force_terminal=True, width=100)
    with showing_progress("rl360 bench demo", console=console):
        spinner, title, _ = _active.get()
        stage("2/3 routing bytes")
        assert title == "rl360 bench demo"
        assert "2/3 routing bytes" in str(spinner.text)
        print('{"json": true}')
    assert _active.get() is None
    assert capsys.readouterr().out == '{"json": true}\n'
