#!/bin/bash
# Injected fault: the grader dies before it writes a reward (an infrastructure failure, not a 0).
echo 'Traceback: demo grader crashed (injected fault)' >&2
exit 3
