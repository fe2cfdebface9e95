"""Issue 26's server-side hostile inputs, each through a real `rl360 harbor serve` on loopback with
real bubblewrap trials and host canaries: task env templates, reward files, the /run API under
slow and oversized clients, and a tasks root changed while tasks load. Each test fails if its
attack works. Every attack is bounded in count and time."""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from rl360_ext.local.fixtures import tasks_root as example_tasks_root
from rl360_ext.util.procs import free_port, rl360_argv

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOKEN = "hostile-token-2c9e"
CLOUD_SECRET = "aws-canary-secret-77b2"
ALLOWED_NAME, ALLOWED_VALUE = "RL360_TEST_ALLOWED_VAR", "allowed-value-19ad"
HOST_CANARY = "HOST-CANARY-bytes-4410"
HEADER_TIMEOUT_S, BODY_TIMEOUT_S, MAX_BODY = 1.0, 1.0, 65536
REWARD_RANGE = (-10, 10)
BUDGET_FLAGS = ("--env-setup-s", "20", "--agent-setup-s", "5", "--margin-s", "2", "--min-agent-s", "1")


class Harbor:
    """A real `rl360 harbor serve` on loopback with a bearer token read from a file."""

    def __init__(self, log_dir: Path, args: list[str], env: dict[str, str]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.trials = log_dir / "trials"
        argv = rl360_argv(
            "harbor", "serve", "--port", str(self.port), "--trials-dir", str(self.trials), *args
        )
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log = log_dir / "harbor.log"
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ, **env}
            )
        self.headers = {"authorization": f"Bearer {TOKEN}"}
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.log.read_text()[-3000:]
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/health", headers=self.headers, timeout=2).status_code == 200:
                    return
            time.sleep(0.2)
        raise AssertionError("harbor did not become ready")

    def post(self, body: dict[str, Any]) -> httpx.Response:
        return httpx.post(
            self.url + "/run", json={"deadline_s": 90, **body}, headers=self.headers, timeout=120
        )

    def run(self, body: dict[str, Any], status: int = 200) -> dict[str, Any]:
        response = self.post(body)
        assert response.status_code == status, response.text
        return response.json()

    def peak_rss_kb(self) -> int:
        """The server's peak resident memory so far (VmHWM)."""
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:")))

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, 15)
            self.process.wait(timeout=60)


def make_task(root: Path, name: str, test: str, toml_extra: str = "", solve: str = "true\n") -> Path:
    task = root / name
    shutil.copytree(example_tasks_root() / "fix-mean", task)
    (task / "solution" / "solve.sh").write_text("#!/bin/bash\n" + solve)
    (task / "tests" / "test.sh").write_text("#!/bin/bash\n" + test)
    if toml_extra:
        toml = task / "task.toml"
        toml.write_text(toml.read_text() + "\n" + toml_extra)
    return task


ENV_TASKS = {
    "env-environment": ("environment.env.LEAK", "[environment.env]\nLEAK = '${AWS_SECRET_ACCESS_KEY}'\n"),
    "env-verifier": ("verifier.env.LEAK", "[verifier.env]\nLEAK = '${AWS_SECRET_ACCESS_KEY}'\n"),
    "env-solution": ("solution.env.LEAK", "[solution.env]\nLEAK = '${AWS_SECRET_ACCESS_KEY:-none}'\n"),
    "env-unset": ("verifier.env.LEAK", "[verifier.env]\nLEAK = '${RL360_NO_SUCH_VARIABLE_e0}'\n"),
}
LEAK_TEST = (
    f'if [ -n "$LEAK" ] || grep -rq {CLOUD_SECRET} /app 2>/dev/null; then echo 1; else echo 0; fi'
    " > /logs/verifier/reward.txt\n"
)
REWARD_FILES = {  # task name: (file, content) the verifier writes
    "reward-huge-int": ("reward.json", '{"reward": ' + "9" * 400 + "}"),
    "reward-true": ("reward.json", "true"),
    "reward-bool-value": ("reward.json", '{"reward": true}'),
    "reward-bare-number": ("reward.json", "1"),
    "reward-unicode-digit": ("reward.txt", "\u0661"),
    "reward-underscore": ("reward.txt", "1_000"),
    "reward-1e308": ("reward.txt", "1e308"),
    "reward-minus-1e300": ("reward.json", '{"reward": -1e300}'),
    "reward-nan": ("reward.json", '{"reward": NaN}'),
    "reward-nested": ("reward.json", '{"reward": {"reward": 1}}'),
    "reward-over-range": ("reward.txt", "50"),  # inside the default range, outside this server's
}


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A host-only copy of a task, every file of it a canary, and a victim file."""
    host = tmp_path_factory.mktemp("host")
    shutil.copytree(example_tasks_root() / "fix-mean", host / "task")
    for path in (host / "task").rglob("*"):
        if path.is_file():
            path.write_text(HOST_CANARY + "\n")
    (host / "task" / "task.toml").write_text((example_tasks_root() / "fix-mean" / "task.toml").read_text())
    (host / "task" / "tests" / "test.sh").write_text(
        f"#!/bin/bash\necho {HOST_CANARY}; echo 1 > /logs/verifier/reward.txt\n"
    )
    return host


@pytest.fixture(scope="module")
def tasks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tasks")
    for name, (_, table) in ENV_TASKS.items():
        make_task(root, name, LEAK_TEST, table, solve='echo "$LEAK" > /app/leak\n')
    make_task(
        root,
        "env-allowed",
        f'if [ "$SEEN" = {ALLOWED_VALUE} ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n',
        f"[verifier.env]\nSEEN = '${{{ALLOWED_NAME}}}'\n",
    )
    for name, (file, content) in REWARD_FILES.items():
        task = make_task(root, name, f"cp /tests/payload /logs/verifier/{file}\n")
        (task / "tests" / "payload").write_text(content)
    make_task(
        root, "reward-huge-file", "head -c 3000000 /dev/zero | tr '\\0' 1 > /logs/verifier/reward.txt\n"
    )
    make_task(root, "reward-valid", 'echo \'{"reward": 0.5, "passed": 3}\' > /logs/verifier/reward.json\n')
    loop = make_task(root, "link-loop", "echo 0 > /logs/verifier/reward.txt\n")
    (loop / "tests" / "a").symlink_to("b")
    (loop / "tests" / "b").symlink_to("a")
    up = make_task(root, "link-up", "echo 0 > /logs/verifier/reward.txt\n")
    (up / "environment" / "app" / "up").symlink_to("..")
    make_task(root, "race", "echo race-real; echo 0 > /logs/verifier/reward.txt\n")
    return root


@pytest.fixture(scope="module")
def harbor(tmp_path_factory: pytest.TempPathFactory, tasks: Path) -> Iterator[Harbor]:
    (tasks.parent / "token").write_text(TOKEN + "\n")
    sandboxes = Path("/tmp") / f"rl360-hostile-sandboxes-{os.getpid()}"
    server = Harbor(
        tmp_path_factory.mktemp("harbor-logs"),
        [
            *("--tasks-root", str(tasks), "--keep-trials", "all", "--max-concurrent", "4"),
            *("--token-file", str(tasks.parent / "token"), "--allow-env", ALLOWED_NAME),
            *("--reward-min", str(REWARD_RANGE[0]), "--reward-max", str(REWARD_RANGE[1])),
            *("--header-timeout-s", str(HEADER_TIMEOUT_S), "--body-timeout-s", str(BODY_TIMEOUT_S)),
            *("--max-body-bytes", str(MAX_BODY)),
            *("--env-kwarg", f"sandbox_root={sandboxes}", *BUDGET_FLAGS),
        ],
        env={"AWS_SECRET_ACCESS_KEY": CLOUD_SECRET, ALLOWED_NAME: ALLOWED_VALUE},
    )
    yield server
    server.stop()
    shutil.rmtree(sandboxes, ignore_errors=True)


def _trial_names(harbor: Harbor) -> set[str]:
    return {p.name for p in harbor.trials.iterdir()} if harbor.trials.exists() else set()


# -- 1. task env templates -------------------------------------------------------------------------


def test_env_templates_are_refused_at_load_naming_task_and_key_set_or_not(harbor: Harbor) -> None:
    before = _trial_names(harbor)
    messages = {}
    for name, (key, _) in ENV_TASKS.items():
        detail = harbor.run({"task": name}, status=422)["detail"][0]
        assert detail["loc"] == ["body", "task"] and detail["type"] == "task_invalid"
        assert name in detail["msg"] and key in detail["msg"], detail
        assert CLOUD_SECRET not in json.dumps(detail)
        messages[name] = detail["msg"].replace(name, "TASK").replace(key, "KEY")
    assert messages["env-verifier"] == messages["env-unset"]  # a set and an unset name: the same answer
    assert _trial_names(harbor) == before  # no sandbox was started for any of them


def test_an_allow_listed_name_reaches_the_verifier(harbor: Harbor) -> None:
    result = harbor.run({"task": "env-allowed"})
    assert (result["reward"], result["reward_source"]) == (1.0, "verifier"), result


# -- 2. reward parsing -----------------------------------------------------------------------------


def test_hostile_reward_files_are_reward_file_invalid_with_the_reason(harbor: Harbor) -> None:
    names = [*REWARD_FILES, "reward-huge-file"]
    with ThreadPoolExecutor(4) as pool:
        results = dict(zip(names, pool.map(lambda n: harbor.run({"task": n}), names), strict=True))
    for name, result in results.items():
        assert (result["reward"], result["reward_source"]) == (None, None), (name, result)
        assert result["failure_cause"] == "reward_file_invalid", (name, result)
        assert result["attempt_class"] == "infra:reward_file_invalid", (name, result)
        assert result["exception_message"], name
    assert "outside the reward range" in results["reward-1e308"]["exception_message"]
    assert "JSON object" in results["reward-true"]["exception_message"]
    assert "outside the reward range [-10, 10]" in results["reward-over-range"]["exception_message"]
    valid = harbor.run({"task": "reward-valid"})
    assert (valid["reward"], valid["rewards"], valid["attempt_class"]) == (
        0.5,
        {"reward": 0.5, "passed": 3.0},
        "valid",
    )


# -- 3. the /run API -------------------------------------------------------------------------------


def _wait_closed(sockets: list[socket.socket], timeout_s: float) -> tuple[int, float]:
    """How many of `sockets` the server closed within `timeout_s`, and when the last one closed."""
    selector = selectors.DefaultSelector()
    for sock in sockets:
        selector.register(sock, selectors.EVENT_READ)
    started, closed, last = time.monotonic(), 0, 0.0
    while closed < len(sockets) and time.monotonic() - started < timeout_s:
        for key, _ in selector.select(timeout=0.2):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            try:
                data = sock.recv(65536)
            except (ConnectionResetError, BrokenPipeError):
                data = b""
            if not data:
                selector.unregister(sock)
                closed += 1
                last = time.monotonic() - started
    selector.close()
    return closed, last


def _connect(harbor: Harbor) -> socket.socket:
    return socket.create_connection(("127.0.0.1", harbor.port), timeout=10)


def test_half_sent_requests_are_dropped_within_the_header_timeout(harbor: Harbor) -> None:
    count = 200
    sockets = [_connect(harbor) for _ in range(count)]
    try:
        for index, sock in enumerate(sockets):  # half the start line, or the headers without their end
            sock.sendall(b"POST /run HTTP/1.1\r\nHost: x\r\n" if index % 2 else b"POST /ru")
        health = httpx.get(harbor.url + "/health", headers=harbor.headers, timeout=5)
        assert health.status_code == 200  # the server still answers meanwhile
        closed, last = _wait_closed(sockets, HEADER_TIMEOUT_S + 10)
    finally:
        for sock in sockets:
            sock.close()
    print(f"half-sent: {closed} of {count} closed, the last {last:.2f}s after they were sent")
    assert closed == count, f"{count - closed} of {count} half-sent requests still open"
    assert last <= HEADER_TIMEOUT_S + 5, last


def test_a_stalled_body_is_answered_408_and_closed(harbor: Harbor) -> None:
    with _connect(harbor) as sock:
        sock.sendall(
            b"POST /run HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
            + TOKEN.encode()
            + b'\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"task":'
        )
        sock.settimeout(BODY_TIMEOUT_S + 10)
        started = time.monotonic()
        answer = sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert time.monotonic() - started <= BODY_TIMEOUT_S + 5


def _stream(harbor: Harbor, head: bytes, chunk: bytes, limit_bytes: int) -> tuple[bytes, int]:
    """Send `head`, then `chunk` repeatedly until the server answers and closes or `limit_bytes`
    went out; returns the answer and the bytes sent."""
    sent = 0
    with _connect(harbor) as sock:
        sock.sendall(head)
        sock.setblocking(False)
        answer = b""
        deadline = time.monotonic() + 30
        while sent < limit_bytes and time.monotonic() < deadline:
            with contextlib.suppress(BlockingIOError):
                if data := sock.recv(65536):
                    answer += data
                    break
            try:
                sent += sock.send(chunk)
            except BlockingIOError:
                time.sleep(0.001)
            except (BrokenPipeError, ConnectionResetError):
                break
        sock.setblocking(True)
        sock.settimeout(10)
        with contextlib.suppress(OSError):
            answer += sock.recv(65536)
    return answer, sent


def test_an_unauthenticated_large_body_is_refused_unread_and_does_not_raise_rss(harbor: Harbor) -> None:
    before = harbor.peak_rss_kb()
    chunk = b"x" * 65536
    declared = b"POST /run HTTP/1.1\r\nHost: x\r\nContent-Length: 1073741824\r\n\r\n"
    answer, sent = _stream(harbor, declared, chunk, 256 * 2**20)
    assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
    chunked = b"POST /run HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    framed = b"%x\r\n" % len(chunk) + chunk + b"\r\n"
    answer_chunked, sent_chunked = _stream(harbor, chunked, framed, 256 * 2**20)
    assert answer_chunked.startswith(b"HTTP/1.1 401"), answer_chunked[:200]
    grown_mb = (harbor.peak_rss_kb() - before) / 1024
    print(f"unauthenticated: {sent >> 20} + {sent_chunked >> 20} MiB sent; peak RSS +{grown_mb:.1f} MB")
    assert grown_mb < 32, grown_mb


def test_an_authenticated_body_over_the_cap_is_413(harbor: Harbor) -> None:
    auth = b"Authorization: Bearer " + TOKEN.encode() + b"\r\n"
    declared = b"POST /run HTTP/1.1\r\nHost: x\r\n" + auth + b"Content-Length: %d\r\n\r\n" % (MAX_BODY + 1)
    answer, sent = _stream(harbor, declared, b"x", MAX_BODY + 1)  # never more than it declared
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert sent < MAX_BODY  # answered before the body was sent
    chunked = b"POST /run HTTP/1.1\r\nHost: x\r\n" + auth + b"Transfer-Encoding: chunked\r\n\r\n"
    chunk = b"x" * 4096
    answer, sent = _stream(harbor, chunked, b"%x\r\n" % len(chunk) + chunk + b"\r\n", 64 * 2**20)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert sent < 32 * 2**20  # cut off near the cap, not after the whole stream


def test_an_unauthenticated_64mb_header_line_is_431_unread_and_costs_under_1mb(harbor: Harbor) -> None:
    """Issue 36: the head is capped by the protocol, before the token: 431 and close."""
    before = harbor.peak_rss_kb()
    head = b"POST /run HTTP/1.1\r\nHost: x\r\nX-Big: "
    answer, sent = _stream(harbor, head, b"a" * 65536, 64 * 2**20)
    grown_kb = harbor.peak_rss_kb() - before
    print(f"64 MB header line: {sent >> 10} KiB sent before the answer; peak RSS +{grown_kb} kB")
    assert answer.startswith(b"HTTP/1.1 431"), answer[:200]
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["detail"][0]["loc"] == ["header", "headers"]
    assert sent < 16 * 2**20  # refused after the cap and a read, whatever the kernel buffered
    assert grown_kb < 1024, grown_kb


@pytest.mark.parametrize(
    "head",
    [
        b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (2 << 20) + b"\r\n\r\n",
        b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-%d: v\r\n" % i for i in range(20000)) + b"\r\n",
        b"GET /" + b"a" * (2 << 20) + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    ],
    ids=["2MB-header", "20000-headers", "2MB-url"],
)
def test_oversized_heads_are_431_even_with_the_token(harbor: Harbor, head: bytes) -> None:
    auth = b"Authorization: Bearer " + TOKEN.encode() + b"\r\n"
    start, rest = head.split(b"\r\n", 1)
    answer, _ = _stream(harbor, start + b"\r\n" + auth + rest, b"", len(head))
    assert answer.startswith(b"HTTP/1.1 431"), answer[:200]


HOSTILE_FIELDS = {
    "task": {"task": "\ud800"},
    "session_id": {"task": "fix-mean", "session_id": "\udcff"},
    "session_server_instance_id": {"task": "fix-mean", "session_server_instance_id": "a\udfffb"},
    "agent": {"task": "fix-mean", "agent": "\ud83d"},
    "base_url": {"task": "fix-mean", "base_url": "http://x/\ud800"},
    "model": {"task": "fix-mean", "model": "\udc80"},
    "sampling_params": {"task": "fix-mean", "sampling_params": {"stop": ["\ud800"]}},
    "agent_kwargs": {"task": "fix-mean", "agent_kwargs": {"\ud800": 1}},
}


@pytest.mark.parametrize("field", sorted(HOSTILE_FIELDS))
def test_a_lone_surrogate_in_any_run_field_is_422_naming_it(harbor: Harbor, field: str) -> None:
    """Issue 36: `"\\ud800"` is valid JSON that no UTF-8 encoder takes; it was a 500 (the error echoed it)."""
    body = json.dumps({"deadline_s": 90, **HOSTILE_FIELDS[field]}).encode()  # ensure_ascii: JSON escapes
    response = httpx.post(
        harbor.url + "/run", content=body, headers={**harbor.headers, "content-type": "application/json"}
    )
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"] == ["body", field]


def test_control_characters_in_names_and_invalid_utf8_bodies_are_4xx(harbor: Harbor) -> None:
    detail = harbor.run({"task": "fix-mean", "base_url": "http://x/\x00"}, status=422)["detail"][0]
    assert detail["loc"] == ["body", "base_url"] and "control character" in detail["msg"]
    headers = {**harbor.headers, "content-type": "application/json"}
    not_utf8 = b'{"task": "\xff\xfe", "deadline_s": 9}'
    response = httpx.post(harbor.url + "/run", content=not_utf8, headers=headers)
    assert response.status_code == 400 and response.json()["detail"][0]["loc"] == ["body", "body"]


# -- 4. the tasks root changing under loads --------------------------------------------------------


@pytest.mark.parametrize(("task", "path"), [("link-loop", "tests/a"), ("link-up", "environment/app/up")])
def test_link_loops_are_refused_at_load(harbor: Harbor, task: str, path: str) -> None:
    detail = harbor.run({"task": task}, status=422)["detail"][0]
    assert path in detail["msg"] and "link loop" in detail["msg"], detail


def test_a_task_dir_swapped_for_a_host_link_during_loads_never_copies_a_host_byte(
    harbor: Harbor, tasks: Path, host: Path
) -> None:
    real, parked = tasks / "race", tasks / "race.parked"
    swaps = [
        (real, parked, host / "task"),
        (real / "tests", real / "tests.parked", host / "task" / "tests"),
        (real / "tests" / "test.sh", real / "tests" / "test.sh.parked", host / "task" / "tests" / "test.sh"),
    ]
    stop = threading.Event()

    def swapper() -> None:
        while not stop.is_set():
            for link, keep, target in swaps:
                with contextlib.suppress(OSError):
                    os.rename(link, keep)
                    os.symlink(target, link)
                    time.sleep(0.002)
                    os.unlink(link)
                    os.rename(keep, link)
                stop.wait(0.02)  # the real task stays in place a while, so loads land on both sides

    thread = threading.Thread(target=swapper, daemon=True)
    thread.start()
    try:
        with ThreadPoolExecutor(4) as pool:
            responses = list(pool.map(lambda _: harbor.post({"task": "race"}), range(24)))
    finally:
        stop.set()
        thread.join(timeout=10)
    statuses = [r.status_code for r in responses]
    assert all(s == 200 or 400 <= s < 500 for s in statuses), statuses
    ran = [r.json() for r in responses if r.status_code == 200]
    assert all(result["reward"] in (0.0, None) for result in ran), [r["reward"] for r in ran]
    for result in ran:
        trial = harbor.trials / result["trial_name"]
        for path in trial.rglob("*"):
            if path.is_file() and not path.is_symlink():
                assert HOST_CANARY not in path.read_text(errors="replace"), path
    print(
        f"race: statuses {sorted(set(statuses))}, {len(ran)} trials ran, counts "
        f"{ {s: statuses.count(s) for s in set(statuses)} }"
    )
    assert ran, statuses  # the race did let real loads through
