"""Headless Debian Chromium driven over the DevTools protocol on a pipe (no port, no network).

Owns one browser process for the report's rendering test: load a file:// page, collect every
console message and log entry (JavaScript errors, content-security-policy violations, failed
loads), evaluate expressions in the page, and capture a full-page PNG. It does not know what the
report contains. `--remote-debugging-pipe` makes Chromium read protocol messages from fd 3 and
write them to fd 4, NUL-separated.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

CHROMIUM = "/usr/bin/chromium"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--remote-debugging-pipe",
)


def chromium_path() -> str | None:
    found = Path(CHROMIUM)
    return str(found) if found.exists() else shutil.which("chromium")


class BrowserError(RuntimeError):
    pass


class Browser:
    """`with Browser(profile_dir) as b: b.open(url); b.evaluate(js); b.screenshot(path)`."""

    def __init__(self, profile_dir: Path, timeout_s: float = 30.0) -> None:
        self.profile_dir = profile_dir
        self.timeout_s = timeout_s
        self.events: list[dict[str, Any]] = []
        self._buffer = b""
        self._next_id = 0
        self._session: str | None = None

    def __enter__(self) -> Browser:
        binary = chromium_path()
        if binary is None:
            raise BrowserError("chromium is not installed")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def wire_pipes() -> None:  # runs in the child: the protocol expects fds 3 (in) and 4 (out)
            os.dup2(to_browser_r, 3)
            os.dup2(from_browser_w, 4)

        self.process = subprocess.Popen(
            [binary, *FLAGS, f"--user-data-dir={self.profile_dir}", "about:blank"],
            preexec_fn=wire_pipes,
            pass_fds=(3, 4),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        try:
            target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
            attached = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})
            self._session = attached["sessionId"]
            for domain in ("Runtime.enable", "Log.enable", "Page.enable"):
                self.call(domain)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._send("Browser.close", {}, session=False)
            self.process.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            os.killpg(self.process.pid, signal.SIGKILL)  # its own session: the renderer and gpu children too
            self.process.wait(timeout=10)
        finally:
            os.close(self._to_browser)
            os.close(self._from_browser)

    def _send(self, method: str, params: dict[str, Any], session: bool = True) -> int:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session and self._session is not None:
            message["sessionId"] = self._session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        return self._next_id

    def _receive(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            if time.monotonic() > deadline:
                raise BrowserError("no answer from chromium before the deadline")
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                raise BrowserError(f"chromium closed the protocol pipe (exit {self.process.poll()})")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)

    def call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        call_id = self._send(method, params or {})
        deadline = time.monotonic() + self.timeout_s
        while True:
            message = self._receive(deadline)
            if message.get("id") == call_id:
                if "error" in message:
                    raise BrowserError(f"{method}: {message['error']}")
                return message.get("result", {})
            self.events.append(message)

    def wait_for(self, event: str) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout_s
        for message in self.events:
            if message.get("method") == event:
                return message
        while True:
            message = self._receive(deadline)
            self.events.append(message)
            if message.get("method") == event:
                return message

    def open(self, url: str, width: int, height: int) -> None:
        self.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )
        self.call("Page.navigate", {"url": url})
        self.wait_for("Page.loadEventFired")

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in result:
            raise BrowserError(f"evaluation failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def problems(self) -> list[str]:
        """Console messages, uncaught exceptions and browser log entries (CSP violations, failed loads)."""
        found = []
        for message in self.events:
            method, params = message.get("method"), message.get("params", {})
            if method == "Runtime.consoleAPICalled":
                found.append(f"console.{params.get('type')}: {params.get('args')}")
            elif method == "Runtime.exceptionThrown":
                found.append(f"exception: {params.get('exceptionDetails')}")
            elif method == "Log.entryAdded":
                entry = params.get("entry", {})
                found.append(f"{entry.get('level')} {entry.get('source')}: {entry.get('text')}")
        return found

    def screenshot(self, path: Path) -> bytes:
        data = base64.b64decode(
            self.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})["data"]
        )
        path.write_bytes(data)
        return data
