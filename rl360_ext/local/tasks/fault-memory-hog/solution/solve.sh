#!/bin/bash
# Allocates and touches 512 MB, holds it, then finishes the task.
python3 -c 'import time; x = bytearray(b"\x01") * (512 * 2**20); time.sleep(5)'
echo done > /app/done.txt
