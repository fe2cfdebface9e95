"""Local service processes: readiness, failure reporting, and stopping the whole process group."""

from __future__ import annotations

import sys
import textwrap
import time

import httpx
import pytest

from rl360_ext.util.procs import ServiceStartError, free_port, running, start_service

SERVER = textwrap.dedent(
    """
    import http.server, subprocess, sys
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers(); self.wfile.write(str(child.pid).encode())
        def log_message(self, *a): pass
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
    """
)


def _pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_service_stops_with_its_children(tmp_path) -> None:
    port = free_port()
    service = start_service(
        "toy", [sys.executable, "-c", SERVER, str(port)], port, tmp_path, ready_timeout_s=20
    )
    with running(service):
        child_pid = int(httpx.get(service.url + "/health").text)
        assert _pid_alive(child_pid)
    assert not service.alive()
    deadline = time.monotonic() + 5.0  # the group was signalled; a loaded machine delivers it late
    while _pid_alive(child_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _pid_alive(child_pid)


def test_exit_before_ready_reports_log(tmp_path) -> None:
    argv = [sys.executable, "-c", "import sys; print('boom: bad flag'); sys.exit(3)"]
    with pytest.raises(ServiceStartError, match="boom: bad flag"):
        start_service("broken", argv, free_port(), tmp_path, ready_timeout_s=20)
