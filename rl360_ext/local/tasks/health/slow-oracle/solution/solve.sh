#!/bin/bash
# The reference solution needs most of the agent budget.
sleep 4
echo C > /app/answer.txt
