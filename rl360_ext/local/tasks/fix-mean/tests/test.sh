#!/bin/bash
# Grade: 1 only when the check prints "pass NONCE" for this grading's fresh NONCE (its exit code
# alone proves nothing: the work product runs in the check's child process, never in it).
nonce="$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
out="$(printf '%s\n' "$nonce" | python3 -I /tests/check.py 2>/dev/null)"
if [ -n "$nonce" ] && [ "$out" = "pass $nonce" ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
