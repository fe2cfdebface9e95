#!/bin/bash
# Simulates a broken environment build.
echo 'setup: cannot fetch dependencies' >&2
exit 1
