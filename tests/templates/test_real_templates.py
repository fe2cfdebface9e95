"""The checker on real model templates (tests/templates/fixtures/real): each family's real defect."""

from __future__ import annotations

import pytest

from rl360_ext.templates.check import check_template
from tests.templates.real import FAMILIES, real_tokenizer


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_real_family_loads_and_renders(family: str) -> None:
    tokenizer = real_tokenizer(family)
    for token in FAMILIES[family]["special_tokens"]:
        assert len(tokenizer.encode(token, add_special_tokens=False)) == 1, token
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert "hi" in text


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_no_real_family_is_falsely_append_only(family: str) -> None:
    report = check_template(real_tokenizer(family), cases=30)
    assert not report.ok, report.summary()
