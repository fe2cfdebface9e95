#!/bin/bash
# Runs the project's checks with /app as the test root (as `cd /app && pytest` would).
cd /app && python3 /tests/run_tests.py /app
