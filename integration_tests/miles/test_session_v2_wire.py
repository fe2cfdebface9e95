"""Miles' `--use-session-server v2` with rl360's session server: branches as samples, Miles' decoder.

Runs Miles' unmodified `agentic_tool_call.generate` with `use_session_server="v2"` against a real
`rl360 session serve --samples-wire v2` in front of Miles' mock backend (`mock_backend.py`). The
agent, defined here, retries a turn (a fork) and goes on: rl360 answers one sample per branch, the
first branch without the abandoned attempt (Miles' drop_retries rule), and Miles' v2 decode
(`COMPUTED_FIELDS_V2`, with `reward`) builds valid `Sample`s from them. The agent also fetches the
payload itself (Miles deletes the session after collecting) so the test can run Miles' own v2
pick and post-process hooks on the tree tables rl360 sends: they keep every branch and change no
loss mask (rl360 already picked), and apply the agent's reward.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import openai
import pytest

from integration_tests.miles.mock_backend import sglang_like_mock
from rl360_ext.reference.engine.tokenizer import default_tokenizer_dir
from rl360_ext.session.samples import wire
from rl360_ext.util.procs import Service, free_port, rl360_argv, start_service

AGENT_METADATA = {"reward": 0.5, "note": "retried once"}
SEEN: dict[str, dict[str, Any]] = {}  # session id -> what the agent fetched before returning


async def retry_agent(
    base_url: str, prompt: Any, request_kwargs: dict[str, Any], metadata: dict[str, Any], **_: Any
) -> dict[str, Any]:
    """Four chat calls: a turn, a turn the agent then retries with another message, the retry, one more."""
    client = openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0)

    async def say(messages: list[dict[str, Any]]) -> dict[str, Any]:
        reply = await client.chat.completions.create(model="policy", messages=messages, **request_kwargs)
        return {"role": "assistant", "content": reply.choices[0].message.content or ""}

    user = {"role": "user", "content": prompt}
    first = await say([user])
    await say([user, first, {"role": "user", "content": "Run the tests."}])  # abandoned below
    retry = [user, first, {"role": "user", "content": "Run the tests, then fix the bug."}]
    second = await say(retry)
    await say([*retry, second, {"role": "user", "content": "Done?"}])
    await client.close()
    async with httpx.AsyncClient(timeout=30) as http:
        samples = await http.post(base_url + "/samples", json={"metadata": AGENT_METADATA})
        merged = await http.get(base_url + "/merged")
    samples.raise_for_status()
    merged.raise_for_status()
    SEEN[base_url.rsplit("/", 1)[1]] = {
        "payload": samples.content,
        "last_branch": wire.decode(merged.content),
    }
    return dict(AGENT_METADATA)


@pytest.fixture(scope="module")
def v2_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    from miles.utils.test_utils.mock_sglang_server import ProcessResult

    logs: Path = tmp_path_factory.mktemp("miles-v2-wire")
    tokenizer = str(default_tokenizer_dir())
    backend = sglang_like_mock(tokenizer, lambda prompt: ProcessResult(text=f"step {len(prompt) % 97}"))
    backend.start()
    try:
        port = free_port()
        argv = rl360_argv(
            "session", "serve", "--backend", backend.url, "--tokenizer", tokenizer,
            "--host", "127.0.0.1", "--port", str(port), "--samples-wire", "v2",
        )  # fmt: skip
        server = start_service("session-v2", argv, port, logs)
        try:
            yield server
        finally:
            server.stop()
    finally:
        backend.stop()


def test_stock_agentic_generate_v2_gets_every_branch(
    v2_server: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    from miles.rollout.base_types import GenerateFnInput
    from miles.rollout.generate_hub.agentic_tool_call import generate
    from miles.rollout.session.samples.codec import COMPUTED_FIELDS_V2, decode_samples_and_merge_input_sample
    from miles.rollout.session.v2.picker_hub import drop_retries
    from miles.rollout.session.v2.postprocessor_hub import default_postprocess
    from miles.utils import http_utils
    from miles.utils.types import Sample

    host, port = v2_server.url.removeprefix("http://").rsplit(":", 1)
    instance_id = httpx.get(f"{v2_server.url}/health", timeout=10).json()["session_server_instance_id"]
    args = SimpleNamespace(
        session_server_ip=host,
        session_server_ports=[int(port)],
        session_server_instance_ids={int(port): instance_id},
        custom_agent_function_path=f"{__name__}.retry_agent",
        max_seq_len=None,
        use_session_server="v2",
        rollout_num_gpus=1,
        rollout_num_gpus_per_engine=1,
        sglang_server_concurrency=4,
        eval_num_gpus=0,
        use_distributed_post=False,
    )
    monkeypatch.setattr(http_utils, "_http_client", None)

    def input_sample() -> Any:
        return Sample(prompt="Fix the failing test.", index=0, group_index=0, metadata={"task": "t1"})

    async def run() -> Any:
        http_utils.init_http_client(args)
        try:
            params = {"max_new_tokens": 12, "temperature": 1.0}
            return await generate(
                GenerateFnInput(
                    state=SimpleNamespace(args=args),
                    sample=input_sample(),
                    sampling_params=params,
                    evaluation=False,
                )
            )
        finally:
            await http_utils._http_client.aclose()

    samples = asyncio.run(run()).samples
    assert isinstance(samples, list) and len(samples) == 2
    for sample in samples:
        sample.validate()
        assert sample.reward == 0.5 and sample.metadata["note"] == "retried once"
        assert sample.metadata["task"] == "t1"
    first, last = samples
    assert first.metadata["leaf"]["path_node_ids"] == [0, 1] and first.metadata["merge"]["turns_kept"] == 1
    assert last.metadata["leaf"]["path_node_ids"] == [2, 3] and last.metadata["leaf"]["parent"] == 2
    ((session_id, seen),) = SEEN.items()
    merged = seen["last_branch"]
    assert last.tokens == merged.tokens.tolist()
    assert last.loss_mask == merged.loss_mask[merged.prompt_length :].tolist()
    assert sum(first.loss_mask) == first.metadata["merge"]["turns"][0]["output_tokens"]

    reply = decode_samples_and_merge_input_sample(seen["payload"], input_sample(), fields=COMPUTED_FIELDS_V2)
    picked = drop_retries(reply.samples, reply.session_metadata)
    assert [s.metadata["leaf"]["node_id"] for s in picked] == [3, 1]  # both kept (Miles orders by depth)
    masks = [list(s.loss_mask) for s in picked]
    finished = default_postprocess(picked, reply.session_metadata)
    assert [s.loss_mask for s in finished] == masks and [s.reward for s in finished] == [0.5, 0.5]
    assert (
        httpx.get(f"{v2_server.url}/sessions/{session_id}", timeout=10).status_code == 404
    )  # Miles deleted it
