#!/bin/bash
# Injected fault: the sandbox cannot be prepared, so the trial never starts.
echo 'setup: cannot fetch dependencies (injected fault)' >&2
exit 1
