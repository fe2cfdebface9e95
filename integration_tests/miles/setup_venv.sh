#!/usr/bin/env bash
# Builds the scratch virtualenv in which Miles' modules import on a CPU machine, with rl360-ext
# installed from this repo, for integration_tests/miles/ and tests/recipes/ (run.sh runs them).
#
#   MILES_SRC     the radixark/miles checkout to install (required; editable, without its dependencies)
#   MILES_VENV    where to build it (default /tmp/miles-venv; outside the repo)
#   MILES_PYTHON  a Python 3.11 interpreter (Miles' CI is 3.11; default: python3.11 on PATH or pyenv's)
#   MILES_TORCH   the torch requirement (default torch==2.13.0: a CPU wheel where pip finds one locally;
#                 elsewhere PyPI's torch is a multi-GB CUDA build: point pip at a CPU index instead)
#
# Miles itself (not on PyPI) is installed from MILES_SRC, editable and with --no-deps (its
# requirements are GPU builds; the import-time ones are pinned below), so that `import miles` works
# in this venv outside the suite too (rl360 bench sessions, a REPL). tests/recipes/ puts
# MEGATRON_SRC on sys.path, as integration_tests/megatron/ does (Megatron-core imports and runs on the
# CPU torch wheel with nothing more than the packages below; its run.sh uses this venv). Every package below is pinned to the version tested; the README here
# says why each one is needed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${MILES_VENV:-/tmp/miles-venv}"
: "${MILES_SRC:?set MILES_SRC to a radixark/miles checkout (see integration_tests/miles/README.md)}"

find_python() {
  local candidate
  for candidate in "${MILES_PYTHON:-}" python3.11 "$HOME/.pyenv/versions/3.11.7/bin/python3"; do
    [ -n "$candidate" ] || continue
    if command -v "$candidate" >/dev/null 2>&1 \
        && "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
      echo "$candidate"; return 0
    fi
  done
  echo "setup_venv.sh: Python 3.11 not found (install it, or set MILES_PYTHON)" >&2
  return 1
}

if [ ! -x "$VENV/bin/python" ]; then
  PY="$(find_python)"
  echo "setup_venv.sh: creating $VENV with $PY" >&2
  "$PY" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check)
"${PIP[@]}" --upgrade pip

# torch first, so that nothing below pulls a CUDA build in its place.
"${PIP[@]}" "${MILES_TORCH:-torch==2.13.0}"

# SGLang: Miles imports its protocol, server-args and chat-encoding modules. 0.5.22 is the newest
# release that still ships sglang.srt.entrypoints.openai.encoding_dsv4 (Miles imports it; 0.5.23
# dropped it). --no-deps: its runtime deps are GPU kernels; the import-time ones follow.
"${PIP[@]}" --no-deps sglang==0.5.22
"${PIP[@]}" \
  triton==3.7.1 \
  sglang-router==0.3.2 \
  transformers==5.12.1 \
  pillow==13.0.0 \
  msgspec==0.23.0 \
  pyzmq==27.3.0 \
  ipython==9.18.1 \
  openai==2.6.1 \
  partial-json-parser==0.2.1.1.post7 \
  xgrammar==0.2.7 \
  pybase64==1.5.1 \
  psutil==7.2.2 \
  polars==1.42.1 \
  pylatexenc==2.11 \
  pyyaml==6.0.4 \
  setproctitle==1.3.8 \
  safetensors==0.8.0 \
  tqdm==4.70.1 \
  six==1.17.0

# rl360-ext from this repo (core only: the harbor extra needs Python >= 3.12), the SMG gateway
# binary for the end-to-end rollout test, and the test tools.
"${PIP[@]}" -e "$ROOT" smg==1.13.0 pytest==9.2.0 pytest-asyncio==1.5.0 pytest-timeout==2.4.0 hypothesis==6.170.17

bash "$(dirname "${BASH_SOURCE[0]}")/install_miles.sh"

"$VENV/bin/python" -m pip freeze --disable-pip-version-check --exclude-editable > "$VENV/rl360-miles-freeze.txt"
echo "setup_venv.sh: ready: $VENV (package list: $VENV/rl360-miles-freeze.txt)" >&2
