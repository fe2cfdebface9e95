"""Miles' own session server as the session bench's contender.

With a Miles checkout (`miles_src`), every case also runs Miles' own session server
(`miles_server.py`, Miles' code unchanged) in front of the same backend with the same
conversations, alternating with rl360's (A/B, then B/A in the next round; each run gets fresh
server processes), without R3 once and with R3 in both of Miles' modes (`full`: its default, every
turn records the whole routing; `in_place`: deltas); each Miles row is followed by the ratio
rl360/Miles of every measure. Miles' server forwards `/v1/chat/completions` with `input_ids`,
which the instant backend answers as SGLang does; the tiny engine serves only `/generate`, so
there rl360 runs alone and the bench says so. Miles' server imports torch and sglang: it runs
under `miles_python`, an interpreter where it imports (integration_tests/miles/setup_venv.sh).
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from rl360_ext.errors import Rl360Error
from rl360_ext.local.bench.session_case import Case
from rl360_ext.local.bench.session_load import CLIENT_TIMEOUT_S
from rl360_ext.util.procs import LOOPBACK, Service, free_port, start_service

MILES_MODES = ("full", "in_place")  # Miles' R3 modes: its default (whole routing per turn), deltas


MILES_SERVERS = {"full": "miles", "in_place": "miles in_place"}  # a mode's server name in the table


MILES_SCRIPT = Path(__file__).with_name("miles_server.py")


MILES_READY_TIMEOUT_S = 300.0  # Miles imports torch, transformers and sglang before it serves


MILES_VENV_ENV = "MILES_VENV"  # setup_venv.sh's variable: the venv Miles' modules import in


DEFAULT_MILES_VENV = Path("/tmp/miles-venv")


@dataclass(frozen=True)
class Miles:
    """A Miles checkout and the interpreter its session server imports in."""

    src: Path
    python: str


class MilesUnavailable(Rl360Error, ValueError):
    """--miles-src is not a Miles checkout, or Miles' session server imports under no interpreter."""


def start_miles_server(
    case: Case, mode: str, backend: Service, tokenizer: str, logs: Path, miles: Miles, number: int
) -> Service:
    port = free_port()
    argv = [
        miles.python, str(MILES_SCRIPT), "--miles-src", str(miles.src), "--backend", backend.url,
        "--tokenizer", tokenizer, "--host", LOOPBACK, "--port", str(port), "--mode", mode,
        "--timeout", str(CLIENT_TIMEOUT_S), *(["--r3"] if case.r3 else []),
    ]  # fmt: skip
    return start_service(
        f"miles{number}", argv, port, logs, ready_timeout_s=MILES_READY_TIMEOUT_S, repick_port=True
    )


def find_miles(src: str | None, python: str | None = None) -> Miles | None:
    """The Miles checkout (`src`, else $MILES_SRC) and an interpreter its session server imports in.

    None without a checkout. The interpreter is `python`, else this one if Miles imports here, else
    $MILES_VENV/bin/python, else /tmp/miles-venv/bin/python; MilesUnavailable if it imports in none.
    """
    src = src or os.environ.get("MILES_SRC")
    if not src:
        return None
    root = Path(src).expanduser().resolve()
    if not (root / "miles" / "rollout" / "session" / "server.py").is_file():
        raise MilesUnavailable(
            f"--miles-src: {root} is not a radixark/miles checkout (no miles/rollout/session/server.py)"
        )
    venv = os.environ.get(MILES_VENV_ENV)
    candidates = (
        [python]
        if python
        else [
            sys.executable,
            *([str(Path(venv) / "bin" / "python")] if venv else []),
            str(DEFAULT_MILES_VENV / "bin" / "python"),
        ]
    )
    errors = []
    for candidate in candidates:
        error = _miles_import_error(root, candidate)
        if error is None:
            return Miles(root, candidate)
        errors.append(f"{candidate}: {error}")
    raise MilesUnavailable(
        "Miles' session server does not import under " + "; ".join(errors) + " (it needs torch and sglang: "
        "build a venv with integration_tests/miles/setup_venv.sh and pass --miles-python or set MILES_VENV)"
    )


def _miles_import_error(root: Path, python: str) -> str | None:
    if not Path(python).is_file():
        return "no such interpreter"
    probe = f"import sys; sys.path.insert(0, {str(root)!r}); import miles.rollout.session.server"
    try:
        done = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if done.returncode == 0:
        return None
    lines = done.stderr.strip().splitlines()
    return lines[-1] if lines else f"exit status {done.returncode}"
