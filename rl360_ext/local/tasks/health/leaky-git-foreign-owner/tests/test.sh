#!/bin/bash
# Grade: 1 if /app/answer.txt holds the expected letter (whitespace ignored), else 0.
expected="$(tr -d '[:space:]' < /tests/expected.txt)"
given="$(tr -d '[:space:]' < /app/answer.txt 2>/dev/null)"
if [ -n "$given" ] && [ "$given" = "$expected" ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
