#!/bin/bash
# Simulates a grader whose LLM judge is down: like many graders it falls back to writing 0, but it
# says what happened the rl360 way, by exiting 75 (EX_TEMPFAIL: the judge failed, not the policy).
echo 'judge request failed: 503 Service Unavailable' >&2
echo 0 > /logs/verifier/reward.txt
exit 75
