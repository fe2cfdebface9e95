"""Real processes for session-server tests: the tiny engine, session servers, and a little agent.

Also what the tests' agents share: the opening messages, a `bash` tool call, an official openai
client on a session's URL, and the merged sample read back over HTTP.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from rl360_ext.local.services import start_engine
from rl360_ext.reference.engine.tokenizer import default_tokenizer_dir, write_tokenizer_dir
from rl360_ext.session.samples import wire
from rl360_ext.util.procs import Service, free_port, rl360_argv, start_service

SYSTEM = {"role": "system", "content": "You are a helpful coding agent."}
USER = {"role": "user", "content": "Run the tests and fix the bug."}
LS_CALL = {"id": "call_0", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}
END_OF_TURN_BIAS = {"2": 4.0}  # nudges the random tiny model to end turns after a few dozen tokens
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command.",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]


def start_session_server(
    log_dir: Path, backend_url: str, *flags: str, name: str = "session", tokenizer_dir: str | None = None
) -> Service:
    port = free_port()
    tokenizer = tokenizer_dir or str(default_tokenizer_dir())
    argv = rl360_argv(
        "session", "serve", "--backend", backend_url, "--tokenizer", tokenizer,
        "--host", "127.0.0.1", "--port", str(port), *flags,
    )  # fmt: skip
    return start_service(name, argv, port, log_dir)


def newline_after_end_token(directory: Path) -> Path:
    """The tiny tokenizer with a template that renders "\\n" after <|im_end|> (not append-only)."""
    write_tokenizer_dir(directory)
    config = json.loads((directory / "tokenizer_config.json").read_text())
    end_of_message = "<|im_end|>\n{%- endif -%}\n{%- endfor -%}"
    assert end_of_message in config["chat_template"]
    config["chat_template"] = config["chat_template"].replace(
        end_of_message, "<|im_end|>{{ '\\n' }}\n{%- endif -%}\n{%- endfor -%}"
    )
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


def new_session(server: Service, **body: Any) -> tuple[str, str]:
    response = httpx.post(server.url + "/sessions", json=body, timeout=10)
    response.raise_for_status()
    created = response.json()
    return created["session_id"], created["base_url"]


def session_client(base_url: str) -> openai.OpenAI:
    """The official openai client on a session's URL, without retries (a retry would be a new turn)."""
    return openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)


def merged(server: Service, session_id: str) -> Any:
    """The session's merged sample, decoded from the binary wire format."""
    response = httpx.get(f"{server.url}/sessions/{session_id}/merged", timeout=30)
    response.raise_for_status()
    return wire.decode(response.content)


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("session-logs")


@pytest.fixture(scope="module")
def engine(log_dir: Path) -> Iterator[Service]:
    service = start_engine(log_dir)
    yield service
    service.stop()


@pytest.fixture(scope="module")
def session_server(log_dir: Path, engine: Service) -> Iterator[Service]:
    service = start_session_server(log_dir, engine.url, "--r3")
    yield service
    service.stop()
