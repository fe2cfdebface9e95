"""The fixed templates: the Qwen3 text format, and which tokenizer gets which template."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from rl360_ext.reference.engine.tokenizer import write_tokenizer_dir
from rl360_ext.templates.render import ChatRenderer
from rl360_ext.templates.select import choose_fixed_template, fixed_template, fixed_template_for
from rl360_ext.templates.tokenizer import load_hf_tokenizer

QWEN3_TEXT = (
    "<|im_start|>system\nYou are a coding agent.<|im_end|>\n"
    "<|im_start|>user\nFix it.<|im_end|>\n"
    "<|im_start|>assistant\n<think>\nLook first.\n</think>\n\nChecking.\n"
    '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call><|im_end|>\n'
    "<|im_start|>user\n<tool_response>\na.py\n</tool_response>\n<tool_response>\nb.py\n</tool_response><|im_end|>\n"
    "<|im_start|>assistant\n"
)


def test_fixed_qwen3_template_renders_the_qwen3_text_format(tokenizer) -> None:
    renderer = ChatRenderer(tokenizer, fixed_template("qwen3"))
    call = {"id": "1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}
    messages = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix it."},
        {
            "role": "assistant",
            "reasoning_content": "\nLook first.\n",
            "content": "\n\nChecking.",
            "tool_calls": [call],
        },
        {"role": "tool", "tool_call_id": "1", "content": "a.py"},
        {"role": "tool", "tool_call_id": "1", "content": "b.py"},
    ]
    assert renderer.render_text(messages, add_generation_prompt=True) == QWEN3_TEXT
    # An assistant turn ends with the end token: the newline belongs to the next turn.
    assert renderer.render_text(messages[:3]).endswith("</tool_call><|im_end|>")


def test_fixed_qwen3_template_tools_block(tokenizer) -> None:
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
    text = ChatRenderer(tokenizer, fixed_template("qwen3")).render_text(
        [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}], tools
    )
    assert text.startswith("<|im_start|>system\nS\n\n# Tools\n\nYou may call one or more functions")
    tool_json = '{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}'
    assert f"\n<tools>\n{tool_json}\n</tools>" in text
    assert text.endswith("</tool_call><|im_end|>\n<|im_start|>user\nU<|im_end|>")


def test_reference_is_the_engine_template(tokenizer) -> None:
    assert fixed_template("reference") == tokenizer.chat_template


def test_unknown_name_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown fixed template 'nope'"):
        fixed_template("nope")


def _with_template(tmp_path: Path, template: str):
    directory = write_tokenizer_dir(tmp_path / "tok")
    config_path = directory / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = template
    config_path.write_text(json.dumps(config))
    return load_hf_tokenizer(str(directory))


def test_tiny_tokenizer_keeps_its_own_template(tokenizer) -> None:
    choice = choose_fixed_template(tokenizer)
    assert choice.name is None and "already rl360's 'reference'" in choice.reason
    assert fixed_template_for(tokenizer) is None


def test_qwen_family_gets_the_qwen3_template(tmp_path, fixture_template) -> None:
    qwen = _with_template(tmp_path, fixture_template("qwen3_like"))
    choice = choose_fixed_template(qwen)
    assert choice.name == "qwen3" and "Qwen3 family" in choice.reason
    assert fixed_template_for(qwen) == fixed_template("qwen3")


def test_xml_tool_call_templates_get_none(tmp_path) -> None:
    coder = _with_template(tmp_path, "<|im_start|>{{ '<function=' }}{{ messages }}<|im_end|>")
    assert fixed_template_for(coder) is None
    assert "XML tool calls" in choose_fixed_template(coder).reason


def test_other_families_get_none() -> None:
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.train_from_iterator(
        ["hello world"],
        trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "</s>"], show_progress=False),
    )
    llama_like = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="</s>")
    llama_like.chat_template = "{% for m in messages %}[INST] {{ m.content }} [/INST]{% endfor %}"
    choice = choose_fixed_template(llama_like)
    assert choice.name is None and "no ChatML" in choice.reason
