#!/bin/bash
# Grades /app/answer.txt, but moves it into the verifier's log first: the grade is not a function of
# the end state, since grading the same files again finds no answer.
expected="$(tr -d '[:space:]' < /tests/expected.txt)"
mv /app/answer.txt /logs/verifier/answer.graded 2>/dev/null
given="$(tr -d '[:space:]' < /logs/verifier/answer.graded 2>/dev/null)"
if [ -n "$given" ] && [ "$given" = "$expected" ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
