#!/usr/bin/env bash
# The project's test command: sets up .venv on first use, then runs lint and every test CI can run.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/bootstrap.sh"
cd "$ROOT"
.venv/bin/ruff check rl360_ext tests integration_tests
.venv/bin/lint-imports --no-cache >/dev/null || .venv/bin/lint-imports --no-cache
.venv/bin/python -m pytest -q -p no:cacheprovider -n "${RL360_TEST_WORKERS:-4}" --dist loadscope --durations=15 "$@"
