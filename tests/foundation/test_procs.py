"""Local service processes: readiness, failure reporting, and stopping the whole process group."""

from __future__ import annotations

import socket
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


# Serves /health on `--port PORT`; a taken port ends it as uvicorn does ("address already in use").
PORT_SERVER = textwrap.dedent(
    """
    import http.server, sys
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers()
        def log_message(self, *a): pass
    port = int(sys.argv[sys.argv.index("--port") + 1])
    try:
        server = http.server.HTTPServer(("127.0.0.1", port), H)
    except OSError as exc:
        print(f"ERROR: {exc}: address already in use"); sys.exit(3)
    server.serve_forever()
    """
)


@pytest.mark.parametrize("repick", [True, False])
def test_a_port_taken_before_the_service_binds_it_is_picked_again(tmp_path, repick: bool) -> None:
    """Another process takes the free port first: with repick_port the service starts on a new
    one (the Service says which); without it, or for a port the caller chose, the start fails."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = [sys.executable, "-c", PORT_SERVER, "--port", str(port), "--other", "x"]
        if not repick:
            with pytest.raises(ServiceStartError, match="address already in use"):
                start_service("taken", argv, port, tmp_path, ready_timeout_s=20)
            return
        service = start_service("moved", argv, port, tmp_path, ready_timeout_s=20, repick_port=True)
        with running(service):
            assert service.port != port and service.argv[-4:] == ["--port", str(service.port), "--other", "x"]
            assert httpx.get(service.url + "/health").status_code == 200
