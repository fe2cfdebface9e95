#!/bin/bash
# Trusts the agent's report instead of its work: 1 when the agent's log says its checks passed.
if grep -rqs "ALL CHECKS PASSED" /logs/agent; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
