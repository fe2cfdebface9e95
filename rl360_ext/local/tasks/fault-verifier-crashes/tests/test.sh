#!/bin/bash
# Simulates a grader that crashes.
echo 'Traceback: grader exploded' >&2
exit 3
