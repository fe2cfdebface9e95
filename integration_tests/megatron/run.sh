#!/usr/bin/env bash
# Runs integration_tests/megatron/ (the tiny engine against Miles' Megatron fork on CPU) in the scratch venv.
#
#   MILES_SRC=/path/to/miles MEGATRON_SRC=/path/to/Megatron-LM integration_tests/megatron/run.sh [pytest args]
#
# MILES_SRC: radixark/miles (tested at 31f1ca96); MEGATRON_SRC: radixark/Megatron-LM, branch
# miles-main (both required). Builds the venv with ../miles/setup_venv.sh on first use
# (MILES_VENV, default /tmp/miles-venv). Figures: add -s, or read megatron_parity.json in pytest's
# base temp folder.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
VENV="${MILES_VENV:-/tmp/miles-venv}"
: "${MILES_SRC:?set MILES_SRC to a radixark/miles checkout (see integration_tests/miles/README.md)}"
: "${MEGATRON_SRC:?set MEGATRON_SRC to a radixark/Megatron-LM checkout, branch miles-main}"
export MILES_SRC MEGATRON_SRC
[ -x "$VENV/bin/python" ] || bash "$HERE/../miles/setup_venv.sh"
bash "$HERE/../miles/install_miles.sh"
echo "run.sh: Miles $(git -C "$MILES_SRC" rev-parse HEAD 2>/dev/null || echo '?'), Megatron-LM $(git -C "$MEGATRON_SRC" rev-parse HEAD 2>/dev/null || echo '?')" >&2
export RL360_MILES_STRICT=1
cd "$ROOT"
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider integration_tests/megatron "$@"
