"""`--chat-template`: the tokenizer's own, rl360's fixed one, or a file; bad choices refuse to start."""

from __future__ import annotations

import pytest

from rl360_ext.reference.engine.tokenizer import chat_template, load_tiny_tokenizer
from rl360_ext.session.service import ServiceStartupError, resolve_chat_template

BROKEN = (
    "{%- for m in messages -%}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_start|>assistant\n{%- endif -%}"
)


def test_default_is_the_tokenizers_own() -> None:
    assert resolve_chat_template(load_tiny_tokenizer(), None) is None


def test_a_file_is_read(tmp_path) -> None:
    path = tmp_path / "t.jinja"
    path.write_text(BROKEN)
    assert resolve_chat_template(load_tiny_tokenizer(), str(path)) == BROKEN


def test_missing_file_is_named(tmp_path) -> None:
    with pytest.raises(ServiceStartupError, match=r"nope\.jinja is not a file"):
        resolve_chat_template(load_tiny_tokenizer(), str(tmp_path / "nope.jinja"))


def test_fixed_refuses_when_the_template_is_already_ours() -> None:
    tokenizer = load_tiny_tokenizer()
    assert tokenizer.chat_template == chat_template()
    with pytest.raises(ServiceStartupError, match="no fixed template"):
        resolve_chat_template(tokenizer, "fixed")
