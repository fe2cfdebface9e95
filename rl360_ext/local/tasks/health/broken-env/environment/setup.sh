#!/bin/bash
# The environment cannot be built: a dependency it fetches is gone.
echo "setup: cannot fetch dependencies" >&2
exit 1
