"""The append-only checker: passes the fixed templates, catches each way a template breaks it."""

from __future__ import annotations

import json

import pytest

from rl360_ext.templates.check import (
    AFTER_END,
    GENERATION,
    GENERATION_PROMPT,
    LOOP_POSITION,
    PREFIX,
    REASONING_DROPPED,
    RENDER_ERROR,
    TOOL_CALL_RESERIALIZED,
    TOOL_CALLS_NOT_PARSED,
    check_conversation,
    check_template,
    find_end_token,
)
from rl360_ext.templates.conversations import Conversation, Turn
from rl360_ext.templates.render import ChatRenderer
from rl360_ext.templates.select import fixed_template


def kinds(report) -> set[str]:
    return {v.kind for v in report.violations}


def test_reference_template_is_append_only(tokenizer) -> None:
    report = check_template(tokenizer)
    assert report.ok, report.summary()
    assert report.split_points > 300 and report.generated_turns > 400
    assert "OK: append-only" in report.summary()


@pytest.mark.parametrize("kwargs", [None, {"enable_thinking": False}])
def test_fixed_qwen3_template_is_append_only(tokenizer, kwargs) -> None:
    report = check_template(tokenizer, fixed_template("qwen3"), template_kwargs=kwargs)
    assert report.ok, report.summary()


@pytest.mark.parametrize(
    ("fixture", "kind"),
    [
        ("loop_last_open_turn", LOOP_POSITION),
        ("newline_after_end", AFTER_END),
        ("drops_reasoning", REASONING_DROPPED),
        ("reserializes_arguments", TOOL_CALL_RESERIALIZED),
    ],
)
def test_each_way_of_breaking_it_is_caught_and_named(tokenizer, fixture_template, fixture, kind) -> None:
    report = check_template(tokenizer, fixture_template(fixture), cases=120)
    assert not report.ok
    assert kinds(report) == {kind}, report.summary()


def test_realistic_qwen25_like_template(tokenizer, fixture_template) -> None:
    report = check_template(tokenizer, fixture_template("qwen25_like"), cases=120)
    assert {AFTER_END, TOOL_CALL_RESERIALIZED, GENERATION_PROMPT} <= kinds(report), report.summary()
    assert REASONING_DROPPED not in kinds(report)


def test_realistic_qwen3_like_template(tokenizer, fixture_template) -> None:
    report = check_template(tokenizer, fixture_template("qwen3_like"), cases=120)
    assert {AFTER_END, REASONING_DROPPED} <= kinds(report), report.summary()
    assert TOOL_CALL_RESERIALIZED not in kinds(report)


def test_violation_shows_smallest_conversation_and_first_differing_token(tokenizer, fixture_template) -> None:
    report = check_template(tokenizer, fixture_template("newline_after_end"), cases=60)
    (violation,) = report.violations
    assert violation.property == PREFIX
    messages = violation.conversation.messages()
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert violation.server.before[-1][1] == "<|im_end|>"
    assert violation.server.after[0][1] == "<|im_start|>"
    assert violation.canonical.after[0][1] == "\n"
    assert violation.canonical.before == violation.server.before
    assert violation.token_position == len(
        tokenizer.encode(
            "<|im_start|>user\n"
            + messages[0]["content"]
            + "<|im_end|>\n<|im_start|>assistant\n"
            + messages[1]["content"]
            + "<|im_end|>",
            add_special_tokens=False,
        )
    )
    summary = report.summary()
    assert "NOT APPEND-ONLY" in summary and "first differing token at position" in summary


def test_json_report_has_the_same_findings(tokenizer, fixture_template) -> None:
    report = check_template(tokenizer, fixture_template("qwen25_like"), cases=60)
    data = json.loads(report.json_text())
    assert data["ok"] is False
    assert {v["kind"] for v in data["violations"]} == kinds(report)
    first = data["violations"][0]
    assert set(first) >= {
        "property",
        "kind",
        "conversation",
        "token_position",
        "server_tokens",
        "canonical_tokens",
    }
    assert (
        first["conversation"]["messages"][first["conversation"]["first_generated_index"]]["role"]
        == "assistant"
    )


def test_same_seed_same_report(tokenizer, fixture_template) -> None:
    first = check_template(tokenizer, fixture_template("qwen3_like"), cases=40, seed=7).to_json()
    second = check_template(tokenizer, fixture_template("qwen3_like"), cases=40, seed=7).to_json()
    first.pop("elapsed_s"), second.pop("elapsed_s")
    assert first == second


def test_end_token_is_read_off_a_turn_that_is_not_last(tokenizer, fixture_template) -> None:
    assert find_end_token(ChatRenderer(tokenizer)) == "<|im_end|>"
    assert find_end_token(ChatRenderer(tokenizer, fixture_template("loop_last_open_turn"))) == "<|im_end|>"


def test_a_template_that_raises_is_reported(tokenizer) -> None:
    template = (
        "{%- for m in messages -%}{%- if m.role == 'tool' -%}"
        "{{ raise_exception('tool messages unsupported') }}{%- endif -%}"
        "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>{%- endfor -%}"
        "{%- if add_generation_prompt -%}<|im_start|>assistant\n{%- endif -%}"
    )
    report = check_template(tokenizer, template, cases=60)
    assert RENDER_ERROR in kinds(report)
    assert any("tool messages unsupported" in v.detail for v in report.violations)


def test_tool_calls_the_session_cannot_parse_are_reported(tokenizer) -> None:
    template = (
        "{%- for m in messages -%}<|im_start|>{{ m.role }}\n{{ m.content or '' }}"
        "{%- if m.tool_calls -%}[TOOL_CALLS]{{ m.tool_calls | map(attribute='function') | list | tojson }}"
        "{%- endif -%}<|im_end|>{%- endfor -%}"
        "{%- if add_generation_prompt -%}<|im_start|>assistant\n{%- endif -%}"
    )
    report = check_template(tokenizer, template, cases=60)
    assert TOOL_CALLS_NOT_PARSED in kinds(report)


def test_syntax_error_is_bad_input(tokenizer) -> None:
    with pytest.raises(ValueError, match="does not compile"):
        check_template(tokenizer, "{% if %}")


def test_checker_calls_the_session_servers_code_path(tokenizer) -> None:
    """A generation after a tool call: the held tokens plus suffix_ids equal the full render."""
    renderer = ChatRenderer(tokenizer)
    call = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"command":"ls"}'}}
    conversation = Conversation(
        prompt=[{"role": "user", "content": "list files"}],
        turns=[
            Turn(
                {"role": "assistant", "content": "", "tool_calls": [call]},
                [{"role": "tool", "tool_call_id": "c1", "content": "a.py"}],
            ),
            Turn({"role": "assistant", "content": "done"}),
        ],
        tools=[{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}],
    )
    result = check_conversation(renderer, conversation, "<|im_end|>")
    assert result.mismatches == [] and result.split_points == 1 and result.generated_turns == 2
    generated = '<tool_call>{"name": "bash", "arguments": {"command":"ls"}}</tool_call><|im_end|>'
    history = [
        *conversation.prompt,
        renderer.parse_assistant(generated.removesuffix("<|im_end|>")).to_message(),
    ]
    held = renderer.prompt_ids(conversation.prompt, conversation.tools) + renderer.encode(generated)
    new = conversation.turns[0].new_messages
    full = renderer.render_text([*history, *new], conversation.tools, add_generation_prompt=True)
    assert held + renderer.suffix_ids(history, new, conversation.tools) == renderer.encode(full)


def test_generation_property_alone_catches_a_final_turn(tokenizer, fixture_template) -> None:
    """A conversation that ends with the generated turn has no split point; the final render still counts."""
    renderer = ChatRenderer(tokenizer, fixture_template("reserializes_arguments"))
    call = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
    conversation = Conversation(
        [{"role": "user", "content": "go"}],
        [Turn({"role": "assistant", "content": "", "tool_calls": [call]})],
        [{"type": "function", "function": {"name": "bash"}}],
    )
    result = check_conversation(renderer, conversation, "<|im_end|>")
    assert [(m.property, m.kind) for m in result.mismatches] == [(GENERATION, TOOL_CALL_RESERIALIZED)]


def test_token_boundary_at_a_generated_turn_is_a_note_not_a_violation() -> None:
    """With a tokenizer that merges "\\n\\n", a reply starting with a newline after the prompt's
    newline is sampled as two tokens; the canonical tokenization has one. Reported, not failed."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from rl360_ext.reference.engine.tokenizer import chat_template
    from rl360_ext.templates.markup import SPECIAL_TOKENS, TURN_END

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(["a\n\n\nb  \n\n c\n\n"] * 20, trainer=trainer)
    merging = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token=TURN_END)
    merging.chat_template = chat_template()
    assert len(merging.encode("\n\n", add_special_tokens=False)) == 1
    report = check_template(merging, cases=200)
    assert report.ok, report.summary()
    assert {n.kind for n in report.notes} == {"token-boundary"}
    assert "not a violation" in report.summary()
    assert report.to_json()["notes"]


def test_a_given_renderer_is_checked_and_its_incremental_decision_reported(
    tokenizer, fixture_template
) -> None:
    renderer = ChatRenderer(tokenizer, fixture_template("qwen3_like"))
    report = check_template(tokenizer, fixture_template("qwen3_like"), cases=20, renderer=renderer)
    assert "incremental" in renderer.__dict__  # decided by the check, cached for the server
    assert report.incremental is renderer.incremental
    assert report.to_json()["incremental_suffix"] is renderer.incremental
    numbered = ChatRenderer(tokenizer, fixture_template("numbered_users"))
    assert check_template(tokenizer, numbered.chat_template, cases=20, renderer=numbered).incremental is False
    with pytest.raises(ValueError, match="renderer"):
        check_template(tokenizer, fixture_template("numbered_users"), cases=5, renderer=renderer)
