"""Runs `mean` from /app/stats.py in a child process and prints "pass NONCE" (NONCE: the first line
of stdin) only when every result is right. The work product never runs in this process and never
sees the nonce, so code that exits 0 at import, or prints anything, earns nothing."""

import json
import subprocess
import sys

CASES = [([1, 2, 3], 2.0), ([5], 5.0), ([0.5, 1.5, 4.0], 2.0)]
CHILD = (
    "import json, sys; sys.path.insert(0, '/app'); from stats import mean; "
    "print(json.dumps([mean(xs) for xs in json.loads(sys.argv[1])]))"
)

nonce = sys.stdin.readline().strip()
done = subprocess.run(
    [sys.executable, "-I", "-c", CHILD, json.dumps([xs for xs, _ in CASES])],
    stdin=subprocess.DEVNULL,
    capture_output=True,
    text=True,
    timeout=10,
    cwd="/app",
)
try:
    results = json.loads(done.stdout.strip().splitlines()[-1])
except (ValueError, IndexError):
    sys.exit(1)
right = (
    done.returncode == 0
    and isinstance(results, list)
    and len(results) == len(CASES)
    and all(
        isinstance(got, int | float) and abs(got - want) < 1e-9
        for got, (_, want) in zip(results, CASES, strict=True)
    )
)
if nonce and right:
    print(f"pass {nonce}")
