#!/bin/bash
# Simulates a grader that forgets the reward file.
echo 'all checks passed'
exit 0
