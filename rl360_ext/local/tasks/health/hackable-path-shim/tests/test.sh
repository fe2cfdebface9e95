#!/bin/bash
# Grade with the project's own interpreter (first on the PATH task.toml gives the verifier).
if python3 /tests/check.py; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
