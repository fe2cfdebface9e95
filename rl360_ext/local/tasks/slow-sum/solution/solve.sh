#!/bin/bash
set -e
sleep 1
awk '{ s += $1 } END { print s }' /app/numbers.txt > /app/sum.txt
