"""The six sandbox escapes of issue 13, each run as an attack through a real `rl360 harbor serve`
and real Harbor trials in bubblewrap: host canaries live in pytest's tmp dir, the server is on
loopback, every attempt is bounded by its deadline. Each test fails if its attack works."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from rl360_ext.local.fixtures import tasks_root as example_tasks_root
from rl360_ext.util.procs import free_port, rl360_argv

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOKEN = "file-token-secret-6b1e"
ENV_TOKEN = "env-token-secret-93fa"
CLOUD_SECRET = "aws-canary-secret-41d7"
BUDGET_FLAGS = ("--env-setup-s", "20", "--agent-setup-s", "5", "--margin-s", "2", "--min-agent-s", "1")
CANARY_MODULE = "rl360_attack_canary"


class Harbor:
    """A real `rl360 harbor serve` on loopback, with a bearer token read from a file."""

    def __init__(self, log_dir: Path, args: list[str], env: dict[str, str], port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.trials = log_dir / "trials"
        argv = rl360_argv(
            "harbor", "serve", "--port", str(self.port), "--trials-dir", str(self.trials), *args
        )
        log_dir.mkdir(parents=True, exist_ok=True)
        with (log_dir / "harbor.log").open("wb") as log:
            self.process = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ, **env}
            )
        self.headers = {"authorization": f"Bearer {TOKEN}"}
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            assert self.process.poll() is None, (log_dir / "harbor.log").read_text()[-3000:]
            try:
                if httpx.get(self.url + "/health", headers=self.headers, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise AssertionError("harbor did not become ready")

    def run(self, body: dict[str, Any], status: int = 200) -> dict[str, Any]:
        response = httpx.post(
            self.url + "/run", json={"deadline_s": 90, **body}, headers=self.headers, timeout=120
        )
        assert response.status_code == status, response.text
        return response.json()

    def trial_dir(self, result: dict[str, Any]) -> Path:
        return self.trials / result["trial_name"]

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, 15)
            self.process.wait(timeout=60)


# The attacks' test scripts grade by this check's exit code (fix-mean's own check is nonce-based).
EXIT_CODE_CHECK = (
    "import sys\nsys.path.insert(0, '/app')\nfrom stats import mean\n\n"
    "assert mean([1, 2, 3]) == 2\nassert mean([5]) == 5\n"
)


def make_task(root: Path, name: str, solve: str, test: str, setup: str | None = None) -> Path:
    task = root / name
    shutil.copytree(example_tasks_root() / "fix-mean", task)
    (task / "tests" / "check.py").write_text(EXIT_CODE_CHECK)
    (task / "solution" / "solve.sh").write_text("#!/bin/bash\n" + solve)
    (task / "tests" / "test.sh").write_text("#!/bin/bash\n" + test)
    if setup is not None:
        (task / "environment" / "setup.sh").write_text(setup)
    return task


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Host-only canaries the attacks aim at."""
    host = tmp_path_factory.mktemp("host")
    (host / "victim.txt").write_text("untouched")
    (host / "reward.json").write_text('{"reward": 1.0}')
    (host / "reward.txt").write_text("1")
    (host / "dir").mkdir()
    (host / "dir" / "keep.txt").write_text("untouched")
    return host


@pytest.fixture(scope="module")
def listener_socket() -> Iterator[socket.socket]:
    """A host loopback canary the sandbox must not reach: never accepted, so a connection that
    got through would wait in its backlog."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    sock.setblocking(False)
    yield sock
    sock.close()


@pytest.fixture(scope="module")
def listener(listener_socket: socket.socket) -> int:
    return listener_socket.getsockname()[1]


PROBE = r"""
import json, os, socket, sys
result = {"uid": os.getuid(), "uid_map": open("/proc/self/uid_map").read().split()}
result["cap_eff"] = next(l.split()[1] for l in open("/proc/self/status") if l.startswith("CapEff"))
opened = []
for name in ("kernel/core_pattern", "vm/overcommit_memory", "fs/file-max", "kernel/hostname"):
    try:
        os.close(os.open("/proc/sys/" + name, os.O_WRONLY))
        opened.append(name)
    except OSError:
        pass
result["sysctls_opened_for_writing"] = opened
mounts = [line.split() for line in open("/proc/self/mountinfo")]
result["proc_sys_mount"] = next(fields[5] for fields in mounts if fields[4] == "/proc/sys")
result["interfaces"] = [name for _, name in socket.if_nameindex()]
try:
    socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=2).close()
    result["host_loopback"] = "reached"
except OSError:
    result["host_loopback"] = "unreachable"
try:
    os.setuid(0)
    result["setuid0"] = "worked"
except OSError:
    result["setuid0"] = "refused"
json.dump(result, open("/app/probe.json", "w"))
"""


@pytest.fixture(scope="module")
def harbor(tmp_path_factory: pytest.TempPathFactory, host: Path, listener: int) -> Iterator[Harbor]:
    root = tmp_path_factory.mktemp("tasks")
    # 1. host-side writes through links planted under /logs
    make_task(
        root,
        "plant-links",
        f"ln -sf {host}/victim.txt /logs/agent/exit-code.txt\n"
        f"ln -sf {host}/victim.txt /logs/agent/oracle.txt\n"
        f"ln -sfn {host}/dir /logs/agent/sessions\n"
        f"mkdir -p /logs/artifacts && ln -sfn {host}/dir /logs/artifacts/out\n"
        f"ln -sf {host}/victim.txt /logs/verifier/extra.txt\n"
        "exit 3\n",
        "echo 0 > /logs/verifier/reward.txt\n",
    )
    # 2. the server's environment read from inside (agent and verifier)
    dump = "cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' '\\n' > /tmp/dump\n"
    dump += "env >> /tmp/dump\n"
    make_task(
        root,
        "read-environ",
        dump.replace("/tmp/dump", "/app/agent-dump"),
        dump.replace("/tmp/dump", "/app/verifier-dump")
        + f"if grep -q -e {TOKEN} -e {ENV_TOKEN} -e {CLOUD_SECRET} /app/agent-dump /app/verifier-dump; "
        "then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n",
    )
    # 3. privilege: uid, capabilities, /proc/sys, network
    probe = make_task(
        root,
        "probe-privilege",
        f"python3 /solution/probe.py {listener}\n",
        "cat /app/probe.json; echo 0 > /logs/verifier/reward.txt\n",
    )
    (probe / "solution" / "probe.py").write_text(PROBE)
    # 4a. the verifier's reward file made a link to a host file
    make_task(
        root,
        "reward-link",
        "true\n",
        f"ln -sf {host}/reward.json /logs/verifier/reward.json\n",
    )
    # 4b. an agent process left running swaps reward.txt while test.sh runs
    make_task(
        root,
        "reward-swapper",
        "nohup setsid sh -c 'while :; do rm -f /logs/verifier/reward.txt; "
        f"ln -sf {host}/reward.txt /logs/verifier/reward.txt; echo 1 > /app/beat; sleep 0.005; done' "
        ">/dev/null 2>&1 &\nsleep 0.3\n",
        "sleep 1; echo 0 > /logs/verifier/reward.txt; sleep 0.5\n"
        "echo swappers=$(ps -eo args | grep -c '[w]hile :')\n",
    )
    # 4c. the agent leaves rewards (and a directory in reward.json's way) for the verifier
    make_task(
        root,
        "reward-preplant",
        "mkdir -p /logs/verifier/reward.json/x; echo 1 > /logs/verifier/reward.txt\n",
        "echo 0 > /logs/verifier/reward.txt\n",
    )
    # 5. task links that leave the task directory
    escape_app = make_task(root, "link-app", "true\n", "echo 0 > /logs/verifier/reward.txt\n")
    shutil.rmtree(escape_app / "environment" / "app")
    (escape_app / "environment" / "app").symlink_to(host / "dir")
    escape_setup = make_task(root, "link-setup", "true\n", "echo 0 > /logs/verifier/reward.txt\n")
    (escape_setup / "environment" / "setup.sh").symlink_to(host / "victim.txt")
    # 8. (issue 26) the agent hands the verifier code: a .pth in its HOME's user site that makes
    # every python exit 0, and an extra test module that `unittest discover` imports
    make_task(
        root,
        "plant-user-site",
        "site=$(python3 -m site --user-site) && mkdir -p $site\n"
        "echo 'import os; os._exit(0)' > $site/zz-pass.pth\n",
        "if python3 /tests/check.py; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n",
    )
    planted_test = make_task(
        root,
        "plant-tests",
        'printf \'import os\\nopen("/logs/verifier/reward.txt", "w").write("1")\\nos._exit(0)\\n\' '
        "> /tests/test_aaa.py\n",
        "cd /tests && if python3 -m unittest discover -s /tests -p 'test_*.py'; then echo 1; else echo 0; fi "
        "> /logs/verifier/reward.txt\n",
    )
    (planted_test / "tests" / "test_mean.py").write_text(
        "import sys, unittest\nsys.path.insert(0, '/app')\nfrom stats import mean\n\n"
        "class Mean(unittest.TestCase):\n"
        "    def test_mean(self):\n        self.assertEqual(mean([1, 2, 3]), 2)\n"
    )
    # 9. (issue 26) a public task probes the host's loopback: the server itself and a canary
    harbor_port = free_port()
    public = make_task(
        root,
        "public-probe",
        f"for port in {harbor_port} {listener}; do\n"
        '  if timeout 3 bash -c "echo > /dev/tcp/127.0.0.1/$port" 2>/dev/null; then echo reached $port; '
        "else echo unreachable $port; fi\ndone > /app/net.txt\n"
        "readlink /proc/self/ns/net >> /app/net.txt\n",
        "cat /app/net.txt; echo 0 > /logs/verifier/reward.txt\n",
    )
    toml = public / "task.toml"
    toml.write_text(toml.read_text().replace('network_mode = "no-network"', 'network_mode = "public"'))
    # 10. (issue 34) the agent locks the verifier out of its directories and leaves 3,000-deep
    # trees where the host walks (the work dir, /tmp, artifacts)
    chain = "cd {0} && python3 -c \"import os\nfor _ in range(3000):\n    os.mkdir('d'); os.chdir('d')\n\"\n"
    make_task(
        root,
        "lock-out",
        "".join(chain.format(where) for where in ("/app", "/tmp", "/logs/artifacts"))
        + "chmod 000 /app/stats.py /tests /logs/verifier /tmp /app /logs\n",
        "cat /app/stats.py > /dev/null && echo 1 > /logs/verifier/reward.txt\n",
    )
    # 11. (issue 34) the work product leaves a daemon in the verifier phase that writes 1.0 the
    # moment test.sh's descriptors close
    make_task(
        root,
        "reward-daemon",
        "cat > /app/conftest.sh <<'EOF'\nmkfifo /tmp/gone\nsetsid bash -c '(cat /tmp/gone > /dev/null; "
        'while :; do echo {\\"reward\\": 1.0} > /logs/verifier/reward.json; done) '
        "</dev/null >/dev/null 2>&1 &' &\nexec 3>/tmp/gone\nEOF\n",
        "source /app/conftest.sh\necho '{\"reward\": 0.0}' > /logs/verifier/reward.json\n",
    )
    # 6. a module that must never be imported because a client named it
    modules = tmp_path_factory.mktemp("modules")
    (modules / f"{CANARY_MODULE}.py").write_text(
        f"open({str(host / 'imported')!r}, 'w').write('imported')\nclass Agent: pass\n"
    )
    (root.parent / "token").write_text(TOKEN + "\n")
    sandboxes = Path("/tmp") / f"rl360-escape-sandboxes-{os.getpid()}"
    server = Harbor(
        tmp_path_factory.mktemp("harbor-logs"),
        [
            *("--tasks-root", str(root), "--keep-trials", "all", "--max-concurrent", "4"),
            *(
                "--token-file",
                str(root.parent / "token"),
                "--agent",
                "quiet=nop",
                "--default-agent",
                "oracle",
            ),
            *("--env-kwarg", f"sandbox_root={sandboxes}", "--env-kwarg", "allow_network=true", *BUDGET_FLAGS),
        ],
        env={
            "RL360_HARBOR_TOKEN": ENV_TOKEN,
            "AWS_SECRET_ACCESS_KEY": CLOUD_SECRET,
            "PYTHONPATH": os.pathsep.join([str(modules), *sys.path]),
        },
        port=harbor_port,
    )
    yield server
    server.stop()
    shutil.rmtree(sandboxes, ignore_errors=True)


def _tree(path: Path) -> dict[str, str]:
    return {
        p.relative_to(path).as_posix(): "link" if p.is_symlink() else p.read_text()
        for p in path.rglob("*")
        if p.is_symlink() or p.is_file()
    }


def test_1_links_planted_under_logs_are_never_followed(harbor: Harbor, host: Path) -> None:
    before = _tree(host)
    result = harbor.run({"task": "plant-links"})
    assert _tree(host) == before  # nothing written, nothing added
    trial = harbor.trial_dir(result)
    assert not [p for p in trial.rglob("*") if p.is_symlink()]
    assert (trial / "agent" / "exit-code.txt").read_text() == "3"  # Harbor's own write went to the host copy
    assert result["reward"] == 0.0 and result["reward_source"] == "verifier"


def test_2_the_server_environment_is_not_readable_inside(harbor: Harbor) -> None:
    result = harbor.run({"task": "read-environ"})
    assert (result["reward"], result["reward_source"]) == (0.0, "verifier"), result
    unauthenticated = httpx.get(harbor.url + "/health", timeout=10)
    assert unauthenticated.status_code == 401  # the token from the file is required


def test_3_the_sandbox_is_unprivileged_and_offline(harbor: Harbor) -> None:
    result = harbor.run({"task": "probe-privilege"})
    assert result["reward"] == 0.0, result
    probe = json.loads((harbor.trial_dir(result) / "verifier" / "test-stdout.txt").read_text())
    assert probe["uid"] == 1000 and probe["uid_map"][0] == "1000" and probe["cap_eff"] == "0000000000000000"
    assert probe["sysctls_opened_for_writing"] == []
    assert probe["proc_sys_mount"].startswith("ro")
    assert probe["interfaces"] == ["lo"] and probe["host_loopback"] == "unreachable"
    assert probe["setuid0"] == "refused"


def test_4a_a_reward_file_linked_to_a_host_file_is_no_reward(harbor: Harbor, host: Path) -> None:
    result = harbor.run({"task": "reward-link"})
    assert (result["reward"], result["reward_source"]) == (None, None), result
    assert result["failure_cause"] in ("reward_file_missing", "reward_file_empty", "reward_file_invalid")
    assert (host / "reward.json").read_text() == '{"reward": 1.0}'


def test_4b_no_agent_process_outlives_the_agent_phase(harbor: Harbor) -> None:
    result = harbor.run({"task": "reward-swapper"})
    assert (result["reward"], result["reward_source"]) == (0.0, "verifier"), result
    stdout = (harbor.trial_dir(result) / "verifier" / "test-stdout.txt").read_text()
    assert "swappers=0" in stdout


def test_4c_what_the_agent_left_in_the_verifier_dir_is_gone_before_grading(harbor: Harbor) -> None:
    result = harbor.run({"task": "reward-preplant"})
    assert (result["reward"], result["reward_source"]) == (0.0, "verifier"), result


@pytest.mark.parametrize(
    ("task", "path"), [("link-app", "environment/app"), ("link-setup", "environment/setup.sh")]
)
def test_5_task_links_that_leave_the_task_are_refused(
    harbor: Harbor, host: Path, task: str, path: str
) -> None:
    detail = harbor.run({"task": task}, status=422)["detail"][0]
    assert detail["loc"] == ["body", "task"] and path in detail["msg"]
    assert not (harbor.trials.exists() and any(task in p.name for p in harbor.trials.iterdir()))


def test_6_agents_come_only_from_the_server_s_list(harbor: Harbor, host: Path) -> None:
    detail = harbor.run({"task": "reward-link", "agent": f"{CANARY_MODULE}:Agent"}, status=422)["detail"][0]
    assert detail["loc"] == ["body", "agent"] and "quiet" in detail["msg"]
    assert not (host / "imported").exists()
    assert (
        harbor.run({"task": "plant-links", "agent": "quiet"})["agent"] == "quiet"
    )  # the operator's own agent
    health = httpx.get(harbor.url + "/health", headers=harbor.headers, timeout=10).json()
    assert health["agents"] == ["nop", "oracle", "quiet", "terminus-2"] and health["agent"] == "oracle"


@pytest.mark.parametrize("task", ["plant-user-site", "plant-tests"])
def test_8_what_the_agent_plants_outside_its_work_product_never_runs_in_the_verifier(
    harbor: Harbor, task: str
) -> None:
    result = harbor.run({"task": task})  # the agent left /app/stats.py wrong: the answer is 0
    assert (result["reward"], result["reward_source"]) == (0.0, "verifier"), result


def test_9_a_public_task_gets_egress_only_and_never_the_host_loopback(
    harbor: Harbor, listener: int, listener_socket: socket.socket
) -> None:
    if shutil.which("slirp4netns") is None:
        pytest.skip("slirp4netns is not installed")
    result = harbor.run({"task": "public-probe"})
    assert result["reward"] == 0.0, result
    stdout = (harbor.trial_dir(result) / "verifier" / "test-stdout.txt").read_text().split("\n")
    assert stdout[:2] == [f"unreachable {harbor.port}", f"unreachable {listener}"], stdout
    assert stdout[2] != os.readlink("/proc/self/ns/net")  # its own network namespace
    with pytest.raises(BlockingIOError):
        listener_socket.accept()  # nothing ever connected to the canary


def test_10_an_agent_s_chmod_000_and_deep_trees_leave_the_verifier_its_directories(harbor: Harbor) -> None:
    result = harbor.run({"task": "lock-out"})
    assert (result["reward"], result["reward_source"]) == (1.0, "verifier"), result


def test_11_no_verifier_phase_process_outlives_test_sh_or_changes_its_reward(harbor: Harbor) -> None:
    result = harbor.run({"task": "reward-daemon"})
    assert (result["reward"], result["reward_source"]) == (0.0, "verifier"), result
