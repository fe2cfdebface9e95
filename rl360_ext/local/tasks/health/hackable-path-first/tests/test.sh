#!/bin/bash
# Grade with the project's tools first on the PATH (the agent can write /app/.tools/bin).
export PATH="/app/.tools/bin:$PATH"
if python3 /tests/check.py; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
