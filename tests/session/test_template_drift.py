"""Drift caught at run time: a merged trajectory's tokens vs one canonical render of its messages."""

from __future__ import annotations

from pathlib import Path

import pytest

from rl360_ext.session.core import SessionCore, SessionCoreConfig
from rl360_ext.session.tito import TitoRenderer
from rl360_ext.templates.drift import DRIFT_KEY
from rl360_ext.templates.render import ChatRenderer

from .conftest import ScriptedBackend, Step

USER = {"role": "user", "content": "Run the tests."}
# Serializes the arguments string the agent echoes with tojson: the held tokens drift from the render,
# though every suffix is still appended (the session cannot see it before the merge).
RESERIALIZES = (
    Path(__file__).parents[1] / "templates" / "fixtures" / "reserializes_arguments.jinja"
).read_text()
CALL = '<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call><|im_end|>'
TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]


async def _two_turns(core: SessionCore) -> dict:
    sid = core.create().id
    reply = await core.chat(sid, {"messages": [USER]})
    history = [USER, reply.message(), {"role": "user", "content": "again"}]
    await core.chat(sid, {"messages": history})
    return (await core.merged(sid)).metadata


async def test_append_only_template_merges_without_drift(make_core) -> None:
    core, backend = make_core()
    backend.push(Step("ok<|im_end|>"), Step("done<|im_end|>"))
    record = (await _two_turns(core))[DRIFT_KEY]
    assert record["checked"] and not record["mismatch"] and record["position"] is None
    assert b"rl360_session_template_drift_checked_total 1.0" in core.metrics.render()


async def test_drift_is_recorded_with_position_and_kind_and_counted(renderer) -> None:
    drifting = ChatRenderer(renderer.tokenizer, RESERIALIZES)
    backend = ScriptedBackend(drifting)
    core = SessionCore(TitoRenderer(drifting), backend, SessionCoreConfig())
    backend.push(Step(CALL), Step("done<|im_end|>"))
    sid = core.create().id
    reply = await core.chat(sid, {"messages": [USER], "tools": TOOLS})
    call_id = reply.parsed.tool_calls[0]["id"]
    tool = {"role": "tool", "tool_call_id": call_id, "content": "a.py"}
    await core.chat(sid, {"messages": [USER, reply.message(), tool], "tools": TOOLS})
    sample = await core.merged(sid)
    record = sample.metadata[DRIFT_KEY]
    assert record["mismatch"] and record["kind"] == "tool-call-reserialization", record["evidence"]
    prompt = drifting.prompt_ids([USER], TOOLS)
    head = len(drifting.encode('<tool_call>{"name": "bash", "arguments": '))
    assert len(prompt) < record["position"] <= len(prompt) + head  # where the arguments start
    assert (
        b'rl360_session_template_drift_total{kind="tool-call-reserialization"} 1.0' in core.metrics.render()
    )


async def test_a_cut_last_turn_is_compared_up_to_its_output(make_core) -> None:
    """A cut last turn renders differently, so only the tokens before its output are compared."""
    core, backend = make_core()
    backend.push(Step("ok<|im_end|>"), Step("trunc", finish={"type": "length"}))
    record = (await _two_turns(core))[DRIFT_KEY]
    assert record["checked"] and record["cut_last_turn"] and not record["mismatch"]
    assert record["held_tokens"] < record["rendered_tokens"]


async def test_a_cut_last_turn_still_shows_drift_before_it(renderer) -> None:
    drifting = ChatRenderer(renderer.tokenizer, RESERIALIZES)
    backend = ScriptedBackend(drifting)
    core = SessionCore(TitoRenderer(drifting), backend, SessionCoreConfig())
    backend.push(Step(CALL), Step("trunc", finish={"type": "length"}))
    sid = core.create().id
    reply = await core.chat(sid, {"messages": [USER], "tools": TOOLS})
    tool = {"role": "tool", "tool_call_id": reply.parsed.tool_calls[0]["id"], "content": "a.py"}
    await core.chat(sid, {"messages": [USER, reply.message(), tool], "tools": TOOLS})
    record = (await core.merged(sid)).metadata[DRIFT_KEY]
    assert record["cut_last_turn"] and record["mismatch"] and record["kind"] == "tool-call-reserialization"


async def test_drift_check_costs_one_render_per_merged_sample(make_core, monkeypatch) -> None:
    """The drift check's share of a merge is one full render and one tokenization, whatever the
    conversation's length (counted, not timed); the merge records how long the render took."""
    core, backend = make_core()
    backend.push(Step("ok<|im_end|>"), Step("done<|im_end|>"))
    sid = core.create().id
    reply = await core.chat(sid, {"messages": [USER]})
    await core.chat(sid, {"messages": [USER, reply.message(), {"role": "user", "content": "again"}]})
    session = core.get(sid)
    renderer = core.tito.renderer
    calls = {"render_text": 0, "encode": 0}
    for name in calls:
        original = getattr(renderer, name)

        def counted(*args, _name=name, _original=original, **kwargs):
            calls[_name] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(renderer, name, counted)
    sample = core.merge_session(session)
    assert calls == {"render_text": 1, "encode": 1}
    assert sample.metadata[DRIFT_KEY]["render_s"] > 0


async def test_glm_turn_ends_at_the_role_token_it_sampled_and_holds_it_once() -> None:
    """GLM has no end token: the model stops at `<|user|>` / `<|observation|>`, which the session
    asks the engine to stop at and holds once (the next suffix starts after it); no drift."""
    from rl360_ext.templates.select import fixed_template
    from tests.templates.real import real_tokenizer

    glm = ChatRenderer(real_tokenizer("glm-4.6"), fixed_template("glm4"))
    backend = ScriptedBackend(glm)
    core = SessionCore(TitoRenderer(glm), backend, SessionCoreConfig())
    vocab = glm.tokenizer.get_vocab()
    assert {vocab["<|user|>"], vocab["<|observation|>"]} <= set(core.tito.stop_token_ids)
    call = (
        "\n<think>look</think>\n<tool_call>bash\n<arg_key>command</arg_key>\n"
        "<arg_value>ls</arg_value>\n</tool_call>"
    )
    backend.push(
        Step(call + "<|observation|>", finish={"type": "stop", "matched": vocab["<|observation|>"]}),
        Step("\n<think></think>done<|user|>", finish={"type": "stop", "matched": vocab["<|user|>"]}),
    )
    sid = core.create().id
    reply = await core.chat(sid, {"messages": [USER], "tools": TOOLS})
    assert reply.parsed.tool_calls[0]["function"] == {"name": "bash", "arguments": '{"command": "ls"}'}
    assert reply.parsed.reasoning == "look"
    tool = {"role": "tool", "tool_call_id": reply.parsed.tool_calls[0]["id"], "content": "a.py"}
    second = await core.chat(sid, {"messages": [USER, reply.message(), tool], "tools": TOOLS})
    assert second.parsed.content == "done"
    sample = await core.merged(sid)
    final = [USER, reply.message(), tool, second.message()]
    rendered = glm.encode(glm.render_text([*final, {"role": "user", "content": "x"}], TOOLS))
    assert sample.tokens.tolist() == rendered[: len(sample.tokens)]
    assert sample.tokens.tolist().count(vocab["<|observation|>"]) == 1
    assert not sample.metadata[DRIFT_KEY]["mismatch"]


NUMBERED = (Path(__file__).parents[1] / "templates" / "fixtures" / "numbered_users.jinja").read_text()


async def _three_turns(core: SessionCore) -> dict:
    sid = core.create().id
    history = [USER]
    for text in ("again", "once more"):
        reply = await core.chat(sid, {"messages": history})
        history = [*history, reply.message(), {"role": "user", "content": text}]
    await core.chat(sid, {"messages": history})
    return (await core.merged(sid)).metadata[DRIFT_KEY]


@pytest.mark.parametrize("pinned", [True, None])
async def test_a_mis_rendered_incremental_suffix_is_caught_at_merge(renderer, pinned) -> None:
    """The correctness net of the incremental suffix: forced on a template whose render depends on
    the history (it numbers user messages), the anchored suffix says "[2]" where the render says
    "[3]", and the merge-time drift check names the position; the probe (not pinned) refuses that
    template, renders the whole history, and merges without drift."""
    numbered = ChatRenderer(renderer.tokenizer, NUMBERED, incremental=pinned)
    assert numbered.incremental is bool(pinned)
    backend = ScriptedBackend(numbered)
    core = SessionCore(TitoRenderer(numbered), backend, SessionCoreConfig())
    backend.push(Step("a<|im_end|>"), Step("b<|im_end|>"), Step("c<|im_end|>"))
    record = await _three_turns(core)
    if pinned:
        assert record["mismatch"] and record["position"] is not None, record
        assert "[2]" in record["evidence"] and "[3]" in record["evidence"], record["evidence"]
    else:
        assert record["checked"] and not record["mismatch"], record


async def test_a_merge_cut_at_an_earlier_turn_is_compared_up_to_that_turn(make_core) -> None:
    """Miles' merge keeps the turns up to the first cut one; the tokens before its output still
    must render as the canonical render of every message does."""
    core, backend = make_core()
    backend.push(Step("trunc", finish={"type": "length"}), Step("done<|im_end|>"))
    sid = core.create().id
    reply = await core.chat(sid, {"messages": [USER]})
    await core.chat(sid, {"messages": [USER, reply.message(), {"role": "user", "content": "again"}]})
    sample = await core.merged(sid)
    record = sample.metadata[DRIFT_KEY]
    assert len(sample.turns) == 1 and record["checked"] and record["cut_last_turn"] and not record["mismatch"]
