"""rl360's session server as Miles' session server: Miles' own decoder and its stock agentic generate.

The decoder tests feed `rl360_ext.session.samples.miles_wire.encode` payloads to Miles'
`decode_samples_and_merge_input_sample` and check the real Miles `Sample` it builds
(`Sample.validate()`), and `encode_v2` payloads to the same decoder with Miles' v2 field set
(`COMPUTED_FIELDS_V2`: one sample per branch, with `reward`). The stock test runs Miles'
unmodified `agentic_tool_call.generate` (v1 wire) against a real `rl360 session serve --r3` in
front of the tiny engine, with an agent function defined here that makes two chat calls through
the official openai client, and compares the returned Miles `Sample` with the session's merged
sample (fetched by the agent before it returns, since Miles deletes the session after collecting).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import numpy as np
import openai
import pytest

from rl360_ext.local.services import start_engine
from rl360_ext.reference.engine.tokenizer import default_tokenizer_dir
from rl360_ext.session.samples import miles_wire, wire
from rl360_ext.session.samples.merge import MergedSample, TurnRecord, merge
from rl360_ext.util.procs import Service, free_port, rl360_argv, start_service

LAYERS, TOP_K = 2, 3
MERGED_BY_SESSION: dict[str, MergedSample] = {}  # filled by the agent below


def _text(ids: Any) -> str:
    return "".join(f"<{i}>" for i in ids)


def _merged(r3: bool) -> MergedSample:
    turns, start = [], 0
    for index, (n_in, n_out) in enumerate([(6, 4), (3, 5)]):
        end = start + n_in + n_out
        rows = end - 1 - max(start - 1, 0)
        turns.append(
            TurnRecord(
                index=index,
                segment=0,
                input_start=start,
                input_ids=np.arange(start, start + n_in, dtype=np.int32),
                output_ids=np.arange(start + n_in, end, dtype=np.int32),
                output_logprobs=-np.linspace(0.1, 0.9, n_out, dtype=np.float32),
                finish_reason="stop",
                weight_version="3",
                prompt_tokens=start + n_in,
                cached_tokens=start,
                routing=np.full((rows, LAYERS, TOP_K), index + 1, np.uint8) if r3 else None,
                routing_start=max(start - 1, 0),
                routing_source=np.zeros(rows, np.uint8) if r3 else None,
            )
        )
        start = end
    return merge(turns, "s-1", {"session": {"id": "s-1"}}, routing_tail_shape=(LAYERS, TOP_K) if r3 else None)


@pytest.mark.parametrize(("r3", "max_seq_len"), [(True, None), (False, None), (True, 15)])
def test_miles_decodes_our_samples_wire_into_a_valid_sample(r3: bool, max_seq_len: int | None) -> None:
    from miles.rollout.session.samples.codec import decode_samples_and_merge_input_sample
    from miles.utils.types import Sample

    merged = _merged(r3)
    payload = miles_wire.encode(merged, _text, max_seq_len=max_seq_len, metadata={"agent": "a"})
    reply = decode_samples_and_merge_input_sample(payload, Sample(prompt="p", metadata={"task": "t"}))
    (sample,) = reply.samples
    sample.validate()
    n = len(merged.tokens) if max_seq_len is None else max_seq_len
    p = merged.prompt_length
    assert sample.tokens == merged.tokens[:n].tolist()
    assert sample.response_length == n - p and sample.response == _text(range(p, n))
    assert sample.loss_mask == merged.loss_mask[p:n].tolist()
    assert sample.rollout_log_probs == merged.rollout_log_probs[p:n].astype(np.float64).tolist()
    assert sample.status == (Sample.Status.TRUNCATED if max_seq_len else Sample.Status.COMPLETED)
    assert sample.weight_versions == ["3", "3"]
    assert sample.prefix_cache_info.to_dict() == {"cached_tokens": 10, "total_prompt_tokens": 6 + 13}
    assert sample.metadata["task"] == "t" and sample.metadata["agent"] == "a"
    assert sample.metadata["merge"]["turns_kept"] == 2
    assert sample.rollout_indexer_topk is None
    if r3:
        assert sample.rollout_routed_experts.dtype == np.int32
        assert np.array_equal(sample.rollout_routed_experts, merged.routed_experts[: n - 1])
    else:
        assert sample.rollout_routed_experts is None
    assert reply.session_metadata == {"session": {"id": "s-1"}} and reply.empty_reason is None


def test_miles_decodes_our_wire_of_an_empty_session() -> None:
    from miles.rollout.session.samples.codec import decode_samples_and_merge_input_sample
    from miles.utils.types import Sample

    reply = decode_samples_and_merge_input_sample(miles_wire.encode(merge([]), _text), Sample(prompt="p"))
    assert reply.samples == [] and reply.empty_reason == "no_records"


async def two_turn_agent(
    base_url: str, prompt: Any, request_kwargs: dict[str, Any], metadata: dict[str, Any], **_: Any
) -> dict[str, Any]:
    """Miles' agent contract: two chat calls on `base_url + "/v1"` with the official openai client."""
    client = openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0)
    messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
    for follow_up in ("Now check the tests.", None):
        reply = await client.chat.completions.create(model="policy", messages=messages, **request_kwargs)
        messages.append({"role": "assistant", "content": reply.choices[0].message.content or ""})
        if follow_up is not None:
            messages.append({"role": "user", "content": follow_up})
    await client.close()
    async with httpx.AsyncClient() as http:
        response = await http.get(base_url + "/merged", timeout=30)
    response.raise_for_status()
    MERGED_BY_SESSION[base_url.rsplit("/", 1)[1]] = wire.decode(response.content)
    return {}


@pytest.fixture(scope="module")
def session_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    logs: Path = tmp_path_factory.mktemp("miles-session-wire")
    engine = start_engine(logs)
    try:
        port = free_port()
        argv = rl360_argv(
            "session", "serve", "--backend", engine.url, "--tokenizer", str(default_tokenizer_dir()),
            "--host", "127.0.0.1", "--port", str(port), "--r3",
        )  # fmt: skip
        server = start_service("session", argv, port, logs)
        try:
            yield server
        finally:
            server.stop()
    finally:
        engine.stop()


@pytest.mark.slow
def test_miles_stock_agentic_generate_collects_our_session(
    session_server: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    from miles.rollout.base_types import GenerateFnInput
    from miles.rollout.generate_hub.agentic_tool_call import generate
    from miles.utils import http_utils
    from miles.utils.types import Sample

    host, port = session_server.url.removeprefix("http://").rsplit(":", 1)
    args = SimpleNamespace(
        session_server_ip=host,
        session_server_ports=[int(port)],
        custom_agent_function_path=f"{__name__}.two_turn_agent",
        max_seq_len=None,
        use_session_server="v1",
        rollout_num_gpus=1,
        rollout_num_gpus_per_engine=1,
        sglang_server_concurrency=4,
        eval_num_gpus=0,
        use_distributed_post=False,
    )
    monkeypatch.setattr(http_utils, "_http_client", None)

    async def run() -> Any:
        http_utils.init_http_client(args)
        try:
            state = SimpleNamespace(args=args)
            sample = Sample(prompt="Fix the failing test.", index=0, group_index=0, metadata={"task": "t1"})
            return await generate(
                GenerateFnInput(
                    state=state,
                    sample=sample,
                    sampling_params={"max_new_tokens": 12, "temperature": 1.0},
                    evaluation=False,
                )
            )
        finally:
            await http_utils._http_client.aclose()

    output = asyncio.run(run())
    sample = output.samples
    assert isinstance(sample, Sample)
    sample.validate()
    session_id = sample.metadata["session"]["id"]
    merged = MERGED_BY_SESSION[session_id]
    p = merged.prompt_length
    assert merged.metadata["merge"]["turns_total"] == 2
    assert sample.tokens == merged.tokens.tolist()
    assert sample.response_length == len(merged.tokens) - p
    assert sample.loss_mask == merged.loss_mask[p:].tolist()
    assert sample.rollout_log_probs == merged.rollout_log_probs[p:].astype(np.float64).tolist()
    assert np.array_equal(sample.rollout_routed_experts, merged.routed_experts.astype(np.int32))
    assert sample.status.name == merged.status
    assert sample.metadata["task"] == "t1"
    assert sample.metadata["merge"]["turns_kept"] == merged.metadata["merge"]["turns_kept"]
    gone = httpx.get(f"{session_server.url}/sessions/{session_id}/merged", timeout=10)
    assert gone.status_code == 404  # Miles deleted the session after collecting


def _branch(segment: int, n_in: int, n_out: int, session_id: str = "s-1") -> MergedSample:
    turn = TurnRecord(
        index=segment,
        segment=segment,
        input_start=0,
        input_ids=np.arange(n_in, dtype=np.int32),
        output_ids=np.arange(n_in, n_in + n_out, dtype=np.int32),
        output_logprobs=np.full(n_out, -0.25, np.float32),
        finish_reason="stop",
        weight_version="7",
    )
    leaf = {"node_id": segment, "parent": None, "path_node_ids": [segment], "response_id": f"r{segment}"}
    return merge([turn], session_id, {"session": {"id": session_id}, "leaf": leaf})


@pytest.mark.parametrize("max_seq_len", [None, 9])
def test_miles_v2_decoder_reads_one_sample_per_branch(max_seq_len: int | None) -> None:
    from miles.rollout.session.samples.codec import COMPUTED_FIELDS_V2, decode_samples_and_merge_input_sample
    from miles.utils.types import Sample

    branches = [_branch(0, 6, 2), _branch(1, 9, 3)]  # with max_seq_len 9, the second has no output left
    tree = {"nodes": [], "leaves": []}
    payload = miles_wire.encode_v2(
        branches, {"session": {"id": "s-1"}, "tree": tree}, _text, max_seq_len, {"reward": 2.0, "leaf": "x"}
    )
    reply = decode_samples_and_merge_input_sample(
        payload, Sample(prompt="p", index=0), fields=COMPUTED_FIELDS_V2
    )
    expected = branches if max_seq_len is None else branches[:1]
    assert len(reply.samples) == len(expected)
    for sample, branch in zip(reply.samples, expected, strict=True):
        sample.validate()
        assert sample.tokens == branch.tokens.tolist() and sample.reward == 2.0
        assert sample.metadata["leaf"] == branch.metadata["leaf"]  # the agent cannot overwrite it
    assert reply.session_metadata["agent"] == {"reward": 2.0, "leaf": "x"} and reply.empty_reason is None
    none_fit = miles_wire.encode_v2(branches, {"session": {}, "tree": {"nodes": [0], "leaves": []}}, _text, 3)
    empty = decode_samples_and_merge_input_sample(none_fit, Sample(prompt="p"), fields=COMPUTED_FIELDS_V2)
    assert empty.samples == [] and empty.empty_reason == "all_truncated"
