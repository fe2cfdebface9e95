#!/bin/bash
# Simulates a grader stuck on a hung test.
sleep 3600
echo 1 > /logs/verifier/reward.txt
