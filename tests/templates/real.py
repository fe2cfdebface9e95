"""Real chat templates with tokenizers rebuilt from packaged vocabularies (tests/templates/fixtures/real).

`real_tokenizer(family)` returns a transformers tokenizer: a compact byte-level BPE body taken
from a real vocabulary (bpe/*.json), the family's real special tokens, eos/bos, and the family's
real chat template. `write_tokenizer_dir` writes the same as a directory the CLI loads. See
fixtures/real/SOURCES.md for where each piece came from.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

REAL = Path(__file__).parent / "fixtures" / "real"
FAMILIES: dict[str, dict[str, Any]] = json.loads((REAL / "families.json").read_text())


def real_template(family: str) -> str:
    return (REAL / "templates" / FAMILIES[family]["template"]).read_text()


@cache
def _tokenizer_json(family: str) -> str:
    spec = FAMILIES[family]
    body = json.loads((REAL / "bpe" / f"{spec['bpe']}.json").read_text())
    vocab = body["model"]["vocab"]
    added = [
        {
            "id": len(vocab) + i,
            "content": token,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for i, token in enumerate(spec["special_tokens"])
    ]
    return json.dumps(
        {
            "version": "1.0",
            "truncation": None,
            "padding": None,
            "added_tokens": added,
            "normalizer": None,
            "pre_tokenizer": {
                "type": "Sequence",
                "pretokenizers": [
                    {
                        "type": "Split",
                        "pattern": {"Regex": body["split"]},
                        "behavior": "Isolated",
                        "invert": False,
                    },
                    {
                        "type": "ByteLevel",
                        "add_prefix_space": False,
                        "trim_offsets": False,
                        "use_regex": False,
                    },
                ],
            },
            "post_processor": None,
            "decoder": {
                "type": "ByteLevel",
                "add_prefix_space": False,
                "trim_offsets": False,
                "use_regex": False,
            },
            "model": {
                "type": "BPE",
                "dropout": None,
                "unk_token": None,
                "continuing_subword_prefix": None,
                "end_of_word_suffix": None,
                "fuse_unk": False,
                "byte_fallback": False,
                "ignore_merges": body["model"]["ignore_merges"],
                "vocab": vocab,
                "merges": body["model"]["merges"],
            },
        },
        ensure_ascii=False,
    )


def _config(family: str) -> dict[str, Any]:
    spec = FAMILIES[family]
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": spec["eos"],
        "chat_template": real_template(family),
        "model_max_length": 1 << 20,
    }
    if spec.get("bos"):
        config["bos_token"] = spec["bos"]
    return config


def write_tokenizer_dir(family: str, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tokenizer.json").write_text(_tokenizer_json(family))
    (directory / "tokenizer_config.json").write_text(json.dumps(_config(family), ensure_ascii=False))
    return directory


@cache
def real_tokenizer(family: str) -> Any:
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    config = _config(family)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_tokenizer_json(family)),
        eos_token=config["eos_token"],
        bos_token=config.get("bos_token"),
    )
    tokenizer.chat_template = config["chat_template"]
    return tokenizer
