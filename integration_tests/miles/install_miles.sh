#!/usr/bin/env bash
# Installs the Miles checkout MILES_SRC into the scratch venv (MILES_VENV, default /tmp/miles-venv),
# editable and without its dependencies, unless `miles` there already resolves to MILES_SRC.
#
#   MILES_SRC=/path/to/miles integration_tests/miles/install_miles.sh
#
# setup_venv.sh runs it when it builds the venv; run.sh runs it before every run, so a venv built
# before Miles was installed there, or from another checkout, is pointed at MILES_SRC. --no-deps:
# Miles' requirements.txt pins GPU builds; the import-time packages are setup_venv.sh's.
set -euo pipefail
VENV="${MILES_VENV:-/tmp/miles-venv}"
: "${MILES_SRC:?set MILES_SRC to a radixark/miles checkout (see integration_tests/miles/README.md)}"
SRC="$(cd "$MILES_SRC" 2>/dev/null && pwd -P)" && [ -f "$SRC/setup.py" ] && [ -f "$SRC/miles/__init__.py" ] \
  || { echo "install_miles.sh: MILES_SRC=$MILES_SRC is not a radixark/miles checkout (no setup.py, miles/)" >&2; exit 2; }

installed() {
  # find_spec locates the package without importing it; run outside any checkout so that the
  # current directory cannot shadow the installed one.
  (cd / && "$VENV/bin/python" -c 'import importlib.util, sys
spec = importlib.util.find_spec("miles")
sys.stdout.write("" if spec is None or spec.origin is None else spec.origin)' 2>/dev/null) || true
}

if [ "$(installed)" = "$SRC/miles/__init__.py" ]; then
  exit 0
fi
echo "install_miles.sh: installing $SRC into $VENV (editable, --no-deps)" >&2
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps -e "$SRC"
found="$(installed)"
if [ "$found" != "$SRC/miles/__init__.py" ]; then
  echo "install_miles.sh: after installing, miles in $VENV resolves to '${found:-nothing}', not $SRC" >&2
  exit 1
fi
