"""The tiny engine's tokenizer: deterministic, byte-level round trip, loads offline with transformers."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rl360_ext.reference.engine.tokenizer import build_tokenizer, write_tokenizer_dir
from rl360_ext.templates.markup import SPECIAL_TOKENS, TURN_END
from rl360_ext.templates.tokenizer import load_hf_tokenizer

TOKENIZER = build_tokenizer()


def test_training_is_deterministic() -> None:
    assert build_tokenizer().to_str() == TOKENIZER.to_str()


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_any_text_round_trips(text: str) -> None:
    ids = TOKENIZER.encode(text, add_special_tokens=False).ids
    assert TOKENIZER.decode(ids, skip_special_tokens=False) == text


def test_special_tokens_are_single_ids() -> None:
    for token in SPECIAL_TOKENS:
        assert TOKENIZER.encode(token, add_special_tokens=False).ids == [TOKENIZER.token_to_id(token)]


def test_directory_loads_offline_with_transformers(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    write_tokenizer_dir(tmp_path)
    tokenizer = load_hf_tokenizer(str(tmp_path))
    assert tokenizer.eos_token == TURN_END
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert rendered == "<|im_start|>user\nhi<|im_end|><|im_start|>assistant\n"
    assert tokenizer.decode(tokenizer.encode(rendered, add_special_tokens=False)) == rendered
