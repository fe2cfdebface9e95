#!/bin/bash
# A reference solution that is right half the time: a coin from /dev/urandom picks C or A.
if [ $(( $(od -An -N1 -tu1 /dev/urandom) % 2 )) -eq 0 ]; then echo C; else echo A; fi > /app/answer.txt
