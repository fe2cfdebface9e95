#!/bin/bash
# Grade: run the check, write 1 or 0 to the reward file.
if python3 /tests/check.py; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
