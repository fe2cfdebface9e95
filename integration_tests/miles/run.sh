#!/usr/bin/env bash
# Runs integration_tests/miles/ and tests/recipes/ against a Miles checkout, in the scratch venv.
#
#   MILES_SRC=/path/to/miles MEGATRON_SRC=/path/to/Megatron-LM integration_tests/miles/run.sh [pytest args]
#
# MILES_SRC: a radixark/miles checkout (required). MEGATRON_SRC: radixark/Megatron-LM, branch
# miles-main (the recipes' flags are checked against Megatron-LM's parser plus Miles'; without it
# that check is skipped). Builds the venv with setup_venv.sh on first use (MILES_VENV, default
# /tmp/miles-venv) and installs MILES_SRC there (install_miles.sh). RL360_MILES_STRICT=1 turns
# "Miles does not import here" into an error.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
VENV="${MILES_VENV:-/tmp/miles-venv}"
: "${MILES_SRC:?set MILES_SRC to a radixark/miles checkout (see integration_tests/miles/README.md)}"
if [ -z "${MEGATRON_SRC:-}" ]; then
  echo "run.sh: MEGATRON_SRC is not set: the recipe flag check will be skipped" >&2
fi
export MILES_SRC
[ -x "$VENV/bin/python" ] || bash "$HERE/setup_venv.sh"
bash "$HERE/install_miles.sh"  # a venv from before Miles was installed there, or from another checkout
echo "run.sh: Miles $(git -C "$MILES_SRC" rev-parse HEAD 2>/dev/null || echo '(not a git checkout)') at $MILES_SRC" >&2
export RL360_MILES_STRICT=1
cd "$ROOT"
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider integration_tests/miles tests/recipes "$@"
