"""The checker on real model templates (tests/templates/fixtures/real): each family's real defect,
read off what the model emits, named from evidence."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from rl360_ext.cli.templates import app
from rl360_ext.templates.check import (
    AFTER_END,
    CONTENT_REWRITTEN,
    END_TOKEN_REWRITTEN,
    GENERATION_PROMPT,
    LOOP_POSITION,
    PREFIX,
    REASONING_DROPPED,
    RENDER_ERROR,
    TOOL_CALL_RESERIALIZED,
    TOOL_CALLS_NOT_PARSED,
    UNCLASSIFIED,
    check_template,
)
from rl360_ext.templates.render import ChatRenderer
from tests.templates.real import FAMILIES, real_tokenizer, write_tokenizer_dir

CASES = 40
# Template variables that make the model reason as it does in deployment.
KWARGS = {"deepseek-r1": {"enable_thinking": True}, "deepseek-v3.1": {"thinking": True}}
# family -> (reasoning, end tokens, tool-call format) the checker must detect
EMISSION = {
    "qwen3": ("think", ("<|im_end|>",), "hermes"),
    "qwen3-miles-fixed": ("think", ("<|im_end|>",), "hermes"),
    "qwen2.5": ("none", ("<|im_end|>",), "hermes"),
    "llama3.1": ("none", ("<|eot_id|>",), "llama3-json"),
    "deepseek-r1": ("think", ("<｜end▁of▁sentence｜>",), "deepseek"),
    "deepseek-v3.1": ("think", ("<｜end▁of▁sentence｜>",), "deepseek"),
    "glm-4.6": ("think", (), "glm-xml"),
    "kimi-k2": ("none", ("<|im_end|>",), "kimi"),
    "gpt-oss": ("harmony", ("<|return|>", "<|call|>", "<|end|>"), "harmony"),
    "mistral-nemo": ("none", ("</s>",), "mistral"),
    "gemma-4": ("none", ("<turn|>",), "gemma"),
}
# family -> kinds it must show (prefix or generation property)
DEFECTS = {
    "qwen3": {REASONING_DROPPED, AFTER_END, RENDER_ERROR},
    "qwen3-miles-fixed": {REASONING_DROPPED, AFTER_END},
    "qwen2.5": {AFTER_END, TOOL_CALL_RESERIALIZED},
    "llama3.1": {TOOL_CALL_RESERIALIZED, CONTENT_REWRITTEN},
    "deepseek-r1": {REASONING_DROPPED, TOOL_CALLS_NOT_PARSED},
    "deepseek-v3.1": {REASONING_DROPPED, TOOL_CALL_RESERIALIZED},
    "glm-4.6": {REASONING_DROPPED, CONTENT_REWRITTEN},
    "kimi-k2": {TOOL_CALLS_NOT_PARSED},
    "gpt-oss": {REASONING_DROPPED, END_TOKEN_REWRITTEN, TOOL_CALL_RESERIALIZED},
    "mistral-nemo": {GENERATION_PROMPT, RENDER_ERROR},
    "gemma-4": {GENERATION_PROMPT, TOOL_CALLS_NOT_PARSED},
}


def _report(family: str):
    return check_template(real_tokenizer(family), cases=CASES, template_kwargs=KWARGS.get(family))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_real_family_loads_and_renders(family: str) -> None:
    tokenizer = real_tokenizer(family)
    for token in FAMILIES[family]["special_tokens"]:
        assert len(tokenizer.encode(token, add_special_tokens=False)) == 1, token
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert "hi" in text


@pytest.mark.parametrize("family", sorted(EMISSION))
def test_emission_is_detected_from_the_template_and_special_tokens(family: str) -> None:
    emission = ChatRenderer(real_tokenizer(family)).emission
    assert (emission.reasoning, emission.end_tokens, emission.tool_format) == EMISSION[family]


@pytest.mark.parametrize("family", sorted(DEFECTS))
def test_each_real_family_shows_its_real_defect(family: str) -> None:
    report = _report(family)
    assert not report.ok
    found = {v.kind for v in report.violations}
    assert DEFECTS[family] <= found, report.summary()
    assert report.split_points > 0
    for violation in report.violations:
        assert violation.evidence, violation.kind  # every kind comes with its evidence


def test_deepseek_reasoning_the_template_never_renders_is_caught() -> None:
    """R1's template renders no reasoning; the model emits it after the prompt's `<think>\\n`."""
    report = _report("deepseek-r1")
    dropped = [v for v in report.violations if v.kind == REASONING_DROPPED and v.property == PREFIX]
    assert dropped and "</think>" in dropped[0].evidence


def test_glm_turn_ends_at_the_next_role_token_not_twice() -> None:
    """GLM has no end-of-turn token: no turn shows `<|user|>` twice; its defect is dropped reasoning."""
    report = _report("glm-4.6")
    assert report.end_token == "none"
    for violation in report.violations:
        assert "<|user|><|user|>" not in "".join(
            t for _, t in violation.server.before + violation.server.after
        )
    assert REASONING_DROPPED in {v.kind for v in report.violations}


def test_gpt_oss_turns_end_with_the_token_the_model_sampled() -> None:
    """harmony: a final turn ends with <|return|>, a tool call with <|call|>; the checker never
    appends <|end|> to either, and names the <|return|> -> <|end|> rewrite."""
    report = _report("gpt-oss")
    rewritten = [v for v in report.violations if v.kind == END_TOKEN_REWRITTEN]
    assert rewritten and "<|return|>" in rewritten[0].evidence and "<|end|>" in rewritten[0].evidence
    assert RENDER_ERROR not in {v.kind for v in report.violations if "<|return|>" in v.detail}


def test_qwen25_generation_prompt_matches_the_real_template() -> None:
    """The real Qwen2.5 template renders an empty-content tool call after the same header as the
    generation prompt: no generation-prompt mismatch (the docs' old example was wrong)."""
    assert GENERATION_PROMPT not in {v.kind for v in _report("qwen2.5").violations}


def test_reserialization_is_reported_alongside_other_failures() -> None:
    """All failing kinds are reported, even when another check fails first on the same conversation."""
    kinds = {v.kind for v in _report("qwen2.5").violations}
    assert {AFTER_END, TOOL_CALL_RESERIALIZED} <= kinds


def test_miles_fixed_qwen3_labels_come_from_the_template_not_the_parser() -> None:
    """With clear_thinking=false, no loop-position label: the echo is what the session's parser
    returns, and the template renders it back (only its real whitespace/end defects remain)."""
    report = check_template(
        real_tokenizer("qwen3-miles-fixed"), cases=CASES, template_kwargs={"clear_thinking": False}
    )
    kinds = {v.kind for v in report.violations}
    assert LOOP_POSITION not in kinds, report.summary()
    assert AFTER_END in kinds


runner = CliRunner()


@pytest.fixture(scope="module")
def glm_dir(tmp_path_factory) -> str:
    return str(write_tokenizer_dir("glm-4.6", tmp_path_factory.mktemp("glm")))


def test_cli_end_token_that_is_no_token_is_a_usage_error(glm_dir: str) -> None:
    result = runner.invoke(app, ["check", glm_dir, "--cases", "5", "--end-token", "NOPE"])
    assert result.exit_code == 2, result.output
    assert "--end-token 'NOPE'" in result.output


def test_cli_overrides_emission(glm_dir: str) -> None:
    result = runner.invoke(
        app,
        [
            "check",
            glm_dir,
            "--cases",
            "10",
            "--json",
            "--end-token",
            "none",
            "--reasoning",
            "none",
            "--tool-format",
            "none",
        ],
    )
    assert result.exit_code == 1, result.output
    data = json.loads(result.output)
    assert data["emission"] == {
        "reasoning": "none",
        "end_tokens": [],
        "tool_format": "none",
        "detected": False,
    }
    bad = runner.invoke(app, ["check", glm_dir, "--cases", "5", "--reasoning", "sometimes"])
    assert bad.exit_code == 2 and "--reasoning" in bad.output


def test_cli_no_empty_text_lines_and_zero_split_points_is_loud(tmp_path) -> None:
    directory = write_tokenizer_dir("qwen3", tmp_path / "raising")
    config = json.loads((directory / "tokenizer_config.json").read_text())
    config["chat_template"] = "{{ raise_exception('no') }}"
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    result = runner.invoke(app, ["check", str(directory), "--cases", "5"])
    assert result.exit_code == 1, result.output
    assert "WARNING: 0 split points checked" in result.output
    assert "text: session '' ▏ ''" not in result.output
    assert UNCLASSIFIED not in result.output


# ---- fixed templates for more families, proven on each family's tokenizer fixture --------------

FIXED = {
    "deepseek-r1": ("deepseek", None),
    "deepseek-v3.1": ("deepseek", {"thinking": False}),
    "glm-4.6": ("glm4", None),
    "gpt-oss": ("harmony", None),
    "llama3.1": ("llama3", None),
    "qwen3": ("qwen3", None),
    "qwen2.5": ("qwen3", None),
}


@pytest.mark.parametrize("family", sorted(FIXED))
def test_fixed_template_is_picked_and_append_only_on_the_family_tokenizer(family: str) -> None:
    from rl360_ext.templates.select import choose_fixed_template, fixed_template_for

    name, kwargs = FIXED[family]
    tokenizer = real_tokenizer(family)
    choice = choose_fixed_template(tokenizer)
    assert choice.name == name, choice.reason
    report = check_template(tokenizer, fixed_template_for(tokenizer), cases=120, template_kwargs=kwargs)
    assert report.ok, report.summary()
    assert report.split_points > 200


def test_families_without_a_fixed_template_say_why() -> None:
    from rl360_ext.templates.select import choose_fixed_template

    for family in ("kimi-k2", "mistral-nemo", "gemma-4"):
        choice = choose_fixed_template(real_tokenizer(family))
        assert choice.name is None and "no fixed template" in choice.reason
