"""Token-in/token-out helpers on the reference template: turn end, closing tokens, reply text."""

from __future__ import annotations

import pytest

from rl360_ext.session.tito import TitoRenderer


@pytest.fixture(scope="module")
def tito(renderer) -> TitoRenderer:
    return TitoRenderer(renderer)


def test_the_reference_template_ends_a_turn_with_im_end(tito, renderer) -> None:
    assert tito.turn_end.closing_text == "<|im_end|>"
    assert tito.stop_token_ids == renderer.encode("<|im_end|>")


def test_closing_tokens_only_when_the_model_did_not_end_its_turn(tito, renderer) -> None:
    end = renderer.encode("<|im_end|>")
    assert tito.closing_ids(renderer.encode("done<|im_end|>")) == []
    assert tito.closing_ids(renderer.encode("cut off")) == end
    assert tito.closing_ids([]) == end


def test_held_tokens_plus_suffix_equal_the_full_render(tito, renderer) -> None:
    user = [{"role": "user", "content": "hi"}]
    held = tito.first_prompt(user, None) + renderer.encode("cut off")
    held += tito.closing_ids(renderer.encode("cut off"))
    history = [*user, {"role": "assistant", "content": "cut off"}]
    new = [{"role": "user", "content": "more"}]
    assert held + tito.suffix(history, new, None) == renderer.prompt_ids([*history, *new])


def test_reply_text_drops_the_end_token_or_stop_string(tito, renderer) -> None:
    ids = renderer.encode("<think>plan</think>answer<|im_end|>")
    assert tito.reply_text(ids, "stop", ids[-1]) == "<think>plan</think>answer"
    assert tito.reply_text(renderer.encode("abc STOP"), "stop", "STOP") == "abc "
    assert tito.reply_text(renderer.encode("abc"), "length", None) == "abc"
