"""SessionCore without HTTP: token-in/token-out, forced flags, delta R3, history checks, limits."""

from __future__ import annotations

import asyncio
import re

import numpy as np
import pytest

from rl360_ext.session.core import SessionCore, SessionCoreConfig
from rl360_ext.session.errors import EngineHTTPError, RequestError, SessionServerError
from rl360_ext.session.tito import TitoRenderer
from rl360_ext.sglang.client import EngineError
from rl360_ext.sglang.versions import RoutingSource
from rl360_ext.templates.render import ChatRenderer

from .conftest import SHAPE, ScriptedBackend, Step, expert_ids

SYSTEM = {"role": "system", "content": "You are a helpful coding agent."}
USER = {"role": "user", "content": "Run the tests and fix the bug."}
TOOL_CALL_TEXT = '<tool_call>{"name": "bash", "arguments": {"command": "ls -la"}}</tool_call><|im_end|>'
TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]


async def _turn(core, sid, messages, **body):
    reply = await core.chat(sid, {"messages": messages, **body})
    return reply, [*messages, reply.message()]


async def test_tokens_are_the_sampled_ones_and_requests_only_append(make_core, renderer) -> None:
    core, backend = make_core()
    sid = core.create({"task": "t1"}).id
    backend.push(Step("first<|im_end|>"), Step(TOOL_CALL_TEXT), Step("done<|im_end|>"))
    _, history = await _turn(core, sid, [SYSTEM, USER], tools=TOOLS)
    reply, history = await _turn(core, sid, [*history, {"role": "user", "content": "go on"}], tools=TOOLS)
    assert reply.openai_finish_reason == "tool_calls"
    assert reply.parsed.tool_calls[0]["function"] == {"name": "bash", "arguments": '{"command": "ls -la"}'}
    tool_reply = {"role": "tool", "tool_call_id": reply.parsed.tool_calls[0]["id"], "content": "a.py b.py"}
    await _turn(core, sid, [*history, tool_reply], tools=TOOLS)

    # Every engine request extends the previous one; the R3 delta starts where the held rows end.
    for before, after in zip(backend.calls, backend.calls[1:], strict=False):
        assert after["input_ids"][: len(before["input_ids"])] == before["input_ids"]
    outputs = ["first<|im_end|>", TOOL_CALL_TEXT, "done<|im_end|>"]
    starts = [c["routed_experts_start_len"] for c in backend.calls]
    held_rows = [
        len(c["input_ids"]) + len(renderer.encode(out)) - 1
        for c, out in zip(backend.calls, outputs, strict=True)
    ]
    assert starts == [0, *held_rows[:-1]]

    sample = await core.merged(sid)
    full = [SYSTEM, USER, *history[2:], tool_reply, {"role": "assistant", "content": "done"}]
    assert sample.tokens.tolist() == renderer.encode(renderer.render_text(full, TOOLS))
    assert sample.status == "COMPLETED" and sample.metadata["task"] == "t1"
    assert int(sample.loss_mask.sum()) == sum(len(renderer.encode(t)) for t in outputs)
    assert np.all(sample.rollout_log_probs[sample.loss_mask == 0] == 0)
    assert np.all(sample.rollout_log_probs[sample.loss_mask == 1] < 0)
    assert sample.routed_experts.dtype == np.uint16  # 300 experts do not fit a byte
    assert np.array_equal(sample.routed_experts, expert_ids(np.arange(len(sample.tokens) - 1)))
    assert sample.weight_versions == ["v1", "v1", "v1"]


async def test_forced_flags_cannot_be_switched_off_by_the_agent(make_core) -> None:
    core, backend = make_core()
    sid = core.create(routing_key="sticky-1").id
    body = {
        "messages": [USER],
        "return_logprob": False,
        "no_stop_trim": True,
        "return_routed_experts": False,
        "sampling_params": {"no_stop_trim": True},
        "max_tokens": 7,
        "temperature": 0.5,
        "seed": 3,
        "stop": "END",
    }
    await core.chat(sid, body)
    call = backend.calls[0]
    assert call["return_logprob"] is True and call["return_prompt_token_ids"] is True
    assert call["return_routed_experts"] is True and call["routed_experts_start_len"] == 0
    assert call["routing_key"] == "sticky-1"
    params = call["sampling_params"]
    assert params["no_stop_trim"] is False and params["stop_token_ids"] == [2]
    assert params["max_new_tokens"] == 7 and params["temperature"] == 0.5 and params["sampling_seed"] == 3
    assert params["stop"] == ["END"]


async def test_routing_key_defaults_to_the_session_id(make_core) -> None:
    core, backend = make_core()
    sid = core.create().id
    await core.chat(sid, {"messages": [USER]})
    assert backend.calls[0]["routing_key"] == sid


async def test_row_sources_mark_the_last_sampled_token_of_a_turn_as_later_prefill(
    make_core, renderer
) -> None:
    core, backend = make_core()
    sid = core.create().id
    backend.push(Step("abc<|im_end|>"), Step("de<|im_end|>"))
    _, history = await _turn(core, sid, [USER])
    await _turn(core, sid, [*history, {"role": "user", "content": "more"}])
    sample = await core.merged(sid)
    sources = sample.routing_source  # row p is the routing of token p; rows cover tokens[:-1]
    first_out_end = len(backend.calls[0]["input_ids"]) + len(renderer.encode("abc<|im_end|>"))
    assert sources[first_out_end - 1] == RoutingSource.REPREFILL
    assert int(np.count_nonzero(sources == RoutingSource.REPREFILL)) == 1
    sampled_rows = np.nonzero(sample.loss_mask[:-1])[0]
    assert set(sources[sampled_rows].tolist()) <= {RoutingSource.DECODE, RoutingSource.REPREFILL}
    prompt_rows = np.nonzero(sample.loss_mask[:-1] == 0)[0]
    assert set(sources[prompt_rows].tolist()) == {RoutingSource.PREFILL}
    sampled = len(sampled_rows)
    assert sample.r3_rows_from_prefill_fraction == pytest.approx(1 / sampled)
    assert "rl360_session_r3_rows_from_prefill_fraction" in core.metrics.render().decode()


async def test_length_turn_ends_the_sample_and_later_turns_are_dropped(make_core, renderer) -> None:
    core, backend = make_core()
    sid = core.create().id
    backend.push(Step("cut", finish={"type": "length", "length": 1}), Step("later<|im_end|>"))
    reply, history = await _turn(core, sid, [USER])
    assert reply.openai_finish_reason == "length"
    await _turn(core, sid, [*history, {"role": "user", "content": "continue"}])
    # The engine context stays well formed: the template's closing token follows the cut output.
    second = backend.calls[1]["input_ids"]
    first_end = len(backend.calls[0]["input_ids"]) + len(renderer.encode("cut"))
    assert second[first_end] == 2  # <|im_end|>, not sampled
    sample = await core.merged(sid)
    assert sample.status == "TRUNCATED"
    assert len(sample.turns) == 1 and sample.metadata["merge"]["turns_dropped_after_truncation"] == 1
    assert len(sample.tokens) == first_end and len(sample.routed_experts) == first_end - 1


async def test_stop_string_is_trimmed_from_the_reply_but_kept_in_tokens(make_core, renderer) -> None:
    core, backend = make_core()
    sid = core.create().id
    backend.push(Step("answer END", finish={"type": "stop", "matched": "END"}))
    reply = await core.chat(sid, {"messages": [USER], "stop": ["END"]})
    assert reply.parsed.content == "answer "
    sample = await core.merged(sid)
    assert renderer.tokenizer.decode(sample.tokens[sample.loss_mask == 1].tolist()) == "answer END"


async def test_tool_choice_none_leaves_tool_call_text_in_content(make_core) -> None:
    core, backend = make_core()
    sid = core.create().id
    backend.push(Step(TOOL_CALL_TEXT))
    reply = await core.chat(sid, {"messages": [USER], "tools": TOOLS, "tool_choice": "none"})
    assert reply.parsed.tool_calls == [] and "<tool_call>" in reply.parsed.content


async def test_fork_mode_starts_a_new_segment_and_records_it(make_core, renderer) -> None:
    core, backend = make_core(history_mismatch="fork")
    sid = core.create().id
    _, history = await _turn(core, sid, [SYSTEM, USER])
    edited = [
        SYSTEM,
        {"role": "user", "content": "something else"},
        *history[2:],
        {"role": "user", "content": "x"},
    ]
    await core.chat(sid, {"messages": edited})
    assert backend.calls[1]["routed_experts_start_len"] == 0
    assert backend.calls[1]["input_ids"] == renderer.prompt_ids(edited)
    sample = await core.merged(sid)
    forks = sample.metadata["session"]["forks"]
    assert forks[0]["message_index"] == 1 and "messages[1]" in forks[0]["reason"]
    assert sample.metadata["merge"]["segments"] == 2
    assert sample.metadata["merge"]["turns_in_earlier_segments"] == 1
    assert sample.tokens.tolist()[: sample.prompt_length] == renderer.prompt_ids(edited)


async def test_reject_mode_answers_409_naming_the_first_differing_message(make_core) -> None:
    core, backend = make_core(history_mismatch="reject")
    sid = core.create().id
    _, history = await _turn(core, sid, [SYSTEM, USER])
    history[2] = {"role": "assistant", "content": "I said something else"}
    with pytest.raises(SessionServerError) as err:
        await core.chat(sid, {"messages": [*history, {"role": "user", "content": "x"}]})
    assert err.value.status == 409 and "messages[2]" in err.value.message
    assert len(backend.calls) == 1 and len(core.get(sid).turns) == 1


async def test_changed_tools_are_a_history_mismatch(make_core) -> None:
    core, _ = make_core(history_mismatch="reject")
    sid = core.create().id
    _, history = await _turn(core, sid, [USER], tools=TOOLS)
    with pytest.raises(SessionServerError, match="tools differ"):
        await core.chat(sid, {"messages": [*history, {"role": "user", "content": "x"}]})


async def test_engine_failure_passes_through_and_the_turn_is_not_recorded(make_core) -> None:
    core, backend = make_core()
    sid = core.create().id
    body = '{"error": "overloaded"}'
    backend.push(Step(error=EngineError("POST /generate returned HTTP 503", status=503, body=body)))
    with pytest.raises(EngineHTTPError) as err:
        await core.chat(sid, {"messages": [USER]})
    assert (err.value.status, err.value.body) == (503, body) and core.get(sid).turns == []
    backend.push(Step(error=EngineError("POST /generate failed: ConnectError")))
    with pytest.raises(SessionServerError, match="not recorded") as transport:
        await core.chat(sid, {"messages": [USER]})
    assert transport.value.status == 502 and core.get(sid).turn_errors[-1]["status"] == 502
    await core.chat(sid, {"messages": [USER]})  # the agent's retry is not a history mismatch
    assert len(core.get(sid).turns) == 1 and core.get(sid).forks == []


async def test_wrong_routing_row_count_is_502_and_not_recorded(make_core) -> None:
    core, backend = make_core()
    sid = core.create().id
    backend.push(Step(extra_rows=1))
    with pytest.raises(SessionServerError, match=r"routed_experts has \d+ rows, expected") as err:
        await core.chat(sid, {"messages": [USER]})
    assert err.value.status == 502 and core.get(sid).turns == []


async def test_concurrent_requests_on_one_session_are_serialized(make_core) -> None:
    core, backend = make_core()
    backend.delay_s = 0.05
    one, two = core.create().id, core.create().id
    await asyncio.gather(core.chat(one, {"messages": [USER]}), core.chat(one, {"messages": [USER]}))
    assert backend.max_in_flight == 1
    await asyncio.gather(core.chat(one, {"messages": [SYSTEM, USER]}), core.chat(two, {"messages": [USER]}))
    assert backend.max_in_flight == 2  # serialization is per session, not global


async def test_without_r3_there_is_no_routing(make_core) -> None:
    core, backend = make_core(r3=False)
    sid = core.create().id
    await core.chat(sid, {"messages": [USER]})
    assert backend.calls[0]["return_routed_experts"] is False
    sample = await core.merged(sid)
    assert sample.routed_experts is None and sample.r3_rows_from_prefill_fraction is None


async def test_a_session_without_turns_merges_to_an_empty_failed_sample(make_core) -> None:
    core, _ = make_core()
    sample = await core.merged(core.create().id)
    assert sample.status == "FAILED" and len(sample.tokens) == 0
    assert sample.routed_experts.shape == (0, SHAPE.layers, SHAPE.top_k)


def test_limits_and_lifecycle_errors_are_clear(make_core) -> None:
    core, _ = make_core(max_sessions=2, idle_ttl_s=60)
    first, second = core.create().id, core.create().id
    with pytest.raises(SessionServerError, match="max_sessions=2") as full:
        core.create()
    assert full.value.status == 429
    core.delete(first)
    with pytest.raises(SessionServerError, match="was deleted") as deleted:
        core.get(first)
    assert deleted.value.status == 404
    assert core.evict_idle(now=core.get(second).last_used + 61) == [second]
    with pytest.raises(SessionServerError, match="expired after 60 s idle") as expired:
        core.get(second)
    assert expired.value.status == 410
    with pytest.raises(SessionServerError, match="session not found: session_id=nope") as unknown:
        core.get("nope")
    assert unknown.value.status == 404
    assert re.fullmatch(r"[0-9a-f]{32}", core.create().id)  # room again; ids are 32 hex, as Miles'


def test_bad_session_creation_input_names_the_field(make_core) -> None:
    core, _ = make_core()
    with pytest.raises(RequestError, match="reserved"):
        core.create({"session": 1})
    with pytest.raises(RequestError, match="metadata"):
        core.create(["not", "a", "dict"])  # type: ignore[arg-type]
    with pytest.raises(RequestError, match="routing_key"):
        core.create(routing_key="")


async def test_a_template_that_cannot_render_the_messages_is_a_400(renderer) -> None:
    strict = ChatRenderer(renderer.tokenizer, "{{ raise_exception('this template refuses tool messages') }}")
    core = SessionCore(TitoRenderer(strict), ScriptedBackend(strict), SessionCoreConfig())
    with pytest.raises(RequestError, match=r"cannot render them: .*refuses tool messages") as err:
        await core.chat(core.create().id, {"messages": [USER]})
    assert err.value.status == 400
