"""A SessionPool built on a worker thread that then exits keeps working (Ray outlives the thread).

Ray starts its local head with a parent-death signal, which Linux sends when the *thread* that
started it exits; the generate hook builds its pool on a short-lived thread. The pool must start
Ray on a thread that lives as long as the process (`rl360_ext.session.pool.ensure_ray`). Runs in a
fresh interpreter, so Ray is not already up and the thread's exit is real.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SCRIPT = """
import sys, threading, time
import httpx, ray
from rl360_ext.session.pool import SessionPool
from rl360_ext.reference.engine.tokenizer import default_tokenizer_dir

box = {}

def build():
    box["pool"] = SessionPool(
        1, sys.argv[1], str(default_tokenizer_dir()), host="127.0.0.1", actor_num_cpus=0.5
    )

builder = threading.Thread(target=build, name="short-lived")
builder.start()
builder.join()
assert not builder.is_alive() and "pool" in box
time.sleep(5)  # a parent-death signal from the builder's exit would have killed Ray's head by now
pool = box["pool"]
session_id, _ = pool.create_session(metadata={"after": "thread exit"})
assert httpx.get(pool.urls[0] + "/health", timeout=10).status_code == 200
pool.delete(session_id)
owner = [t.name for t in threading.enumerate() if t.name == "rl360-ray-owner"]
print("POOL_OK", len([n for n in ray.nodes() if n["Alive"]]), owner, flush=True)
pool.shutdown()
ray.shutdown()
"""


def test_pool_started_on_an_exiting_thread_keeps_working(engine) -> None:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, engine.url], capture_output=True, text=True, timeout=240
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert "POOL_OK 1 ['rl360-ray-owner']" in result.stdout, result.stdout
