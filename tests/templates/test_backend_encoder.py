"""The backend tokenizer's encode gives the transformers wrapper's ids (`templates.tokenizer`).

Property: for the tokenizers the tests use (the tiny engine's, and every real family's vocabulary
with its special tokens and chat template), `backend_encoder(tok)(text)` equals
`tok.encode(text, add_special_tokens=False)` on rendered chat text (hypothesis conversations
through the family's template, generation prompt included), on suffixes, and on text that mixes
special tokens with arbitrary characters. A tokenizer outside transformers' standard fast path,
or a backend in a state the wrapper would change, uses the wrapper.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl360_ext.templates import tokenizer as tokenizer_module
from rl360_ext.templates.conversations import build_conversation
from rl360_ext.templates.markup import SPECIAL_TOKENS
from rl360_ext.templates.render import ChatRenderer
from rl360_ext.templates.tokenizer import TokenBudgetExceeded, backend_encoder, fast_encoder, wrapper_encoder
from tests.templates.real import FAMILIES, real_tokenizer
from tests.templates.test_properties import DataChooser

TOKENIZERS = ["tiny", *FAMILIES]


def _tokenizer(name: str, tiny: Any) -> Any:
    return tiny if name == "tiny" else real_tokenizer(name)


def _wrapper(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def _specials(tokenizer: Any) -> list[str]:
    added = [text for text in tokenizer.get_added_vocab() if text]
    return sorted({*added, *SPECIAL_TOKENS})


@pytest.mark.parametrize("name", TOKENIZERS)
def test_every_tokenizer_the_tests_use_has_the_backend_path(tokenizer, name) -> None:
    assert backend_encoder(_tokenizer(name, tokenizer)) is not None


@pytest.mark.parametrize("name", TOKENIZERS)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_backend_encode_equals_wrapper_on_rendered_chats(tokenizer, name, data) -> None:
    tok = _tokenizer(name, tokenizer)
    renderer = ChatRenderer(tok)
    conversation = build_conversation(DataChooser(data))
    messages = list(conversation.prompt)
    for turn in conversation.turns:
        messages = [*messages, turn.assistant, *turn.new_messages]
    encode = backend_encoder(tok)
    assert encode is not None
    try:
        texts = [
            renderer.render_text(messages, conversation.tools, add_generation_prompt=True),
            renderer.render_text(conversation.prompt, conversation.tools, add_generation_prompt=True),
        ]
    except Exception:  # the template refuses this conversation: nothing rendered to compare
        return
    cut = data.draw(st.integers(0, len(texts[0])))
    texts += [texts[0][cut:], texts[0][:cut]]  # suffixes and prefixes, cut anywhere
    for text in texts:
        assert encode(text) == _wrapper(tok, text)
        assert renderer.encode(text) == _wrapper(tok, text)


@pytest.mark.parametrize("name", TOKENIZERS)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_backend_encode_equals_wrapper_on_special_token_soup(tokenizer, name, data) -> None:
    tok = _tokenizer(name, tokenizer)
    pieces = (
        st.sampled_from(_specials(tok)) | st.text(max_size=12) | st.sampled_from([" ", "\n", "\n\n", "\t"])
    )
    text = "".join(data.draw(st.lists(pieces, max_size=12)))
    encode = backend_encoder(tok)
    assert encode is not None
    assert encode(text) == _wrapper(tok, text)


def test_a_backend_set_to_truncate_falls_back_to_the_wrapper(tokenizer) -> None:
    tok = real_tokenizer("qwen3")
    encode = backend_encoder(tok)
    assert encode is not None
    text = "<|im_start|>user\nhello there, a longer message<|im_end|>\n"
    full = _wrapper(tok, text)
    tok.backend_tokenizer.enable_truncation(max_length=3)
    try:
        assert encode(text) == full  # the wrapper switches truncation off before encoding
    finally:
        tok.backend_tokenizer.no_truncation()
    assert encode(text) == full


def test_a_tokenizer_that_overrides_encode_keeps_the_wrapper(tokenizer) -> None:
    base = type(real_tokenizer("qwen3"))

    class Custom(base):  # type: ignore[misc, valid-type]
        def encode(self, text: Any, *args: Any, **kwargs: Any) -> list[int]:
            return [7, *super().encode(text, *args, **kwargs)]

    custom = Custom(tokenizer_object=real_tokenizer("qwen3").backend_tokenizer)
    assert backend_encoder(custom) is None
    assert fast_encoder(custom)("hi") == [7, *_wrapper(real_tokenizer("qwen3"), "hi")]


def test_a_tokenizer_outside_transformers_keeps_its_own_encode() -> None:
    class Plain:
        def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
            return [ord(c) for c in text]

    assert backend_encoder(Plain()) is None
    assert fast_encoder(Plain())("ab") == [97, 98]


@pytest.mark.parametrize("name", TOKENIZERS)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_a_budget_refuses_exactly_the_texts_over_it_on_both_paths(tokenizer, name, data) -> None:
    """Short texts (`encode`) and long ones (`encode_batch_fast`, here any text over 8 characters):
    the same ids, and with `max_tokens` a TokenBudgetExceeded exactly when the ids are more."""
    tok = _tokenizer(name, tokenizer)
    pieces = st.sampled_from(_specials(tok)) | st.text(max_size=40) | st.sampled_from([" ", "\n", "def f():"])
    text = "".join(data.draw(st.lists(pieces, max_size=20)))
    expected = _wrapper(tok, text)
    for gil_free_chars in (10**9, 8):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(tokenizer_module, "GIL_FREE_CHARS", gil_free_chars)
            _check_budget(tok, text, expected, data)


def _check_budget(tok: Any, text: str, expected: list[int], data: Any) -> None:
    for encode in (backend_encoder(tok), wrapper_encoder(tok)):
        assert encode is not None
        assert encode(text) == expected
        budget = data.draw(st.integers(0, len(expected) + 2))
        if len(expected) > budget:
            with pytest.raises(TokenBudgetExceeded) as caught:
                encode(text, budget)
            assert (caught.value.tokens, caught.value.max_tokens) == (len(expected), budget)
        else:
            assert encode(text, budget) == expected
