#!/usr/bin/env bash
# Creates (once) and refreshes the project's virtualenv at .venv in the repo root, with the exact
# versions of constraints.txt (the lock; regenerate it with `.venv/bin/python scripts/lock.py`).
# Sourced by ./rl360 and scripts/test.sh; safe to run on its own. No Python >= 3.12: one line, exit 2.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
STAMP="$VENV/.rl360-installed"

find_python() {
  local candidate
  for candidate in "${RL360_PYTHON:-}" python3.12 "$HOME/.pyenv/versions/3.12.1/bin/python3"; do
    [ -n "$candidate" ] || continue
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 12))'; then
      echo "$candidate"; return 0
    fi
  done
  if command -v pyenv >/dev/null 2>&1 && (cd "$ROOT" && pyenv which python3 >/dev/null 2>&1); then
    (cd "$ROOT" && pyenv which python3); return 0
  fi
  echo "rl360: Python >= 3.12 not found: install Python 3.12 (e.g. pyenv install 3.12) or point RL360_PYTHON at one" >&2
  exit 2
}

if [ ! -x "$VENV/bin/python" ]; then
  PY="$(find_python)"
  echo "rl360: creating $VENV with $PY" >&2
  "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --upgrade pip
fi
if [ ! -f "$STAMP" ] || [ "$ROOT/pyproject.toml" -nt "$STAMP" ] || [ "$ROOT/constraints.txt" -nt "$STAMP" ]; then
  echo "rl360: installing rl360-ext[harbor,docker,dev] into $VENV (first run takes a few minutes)" >&2
  # --no-compile: byte-compiling all ~140 distributions up front is most of the install's CPU time
  # (measured: 93 s -> 37 s user+sys); Python compiles what a command imports on first use instead.
  "$VENV/bin/python" -m pip install --quiet --no-compile -c "$ROOT/constraints.txt" -e "$ROOT[harbor,docker,dev]"
  touch "$STAMP"
fi
