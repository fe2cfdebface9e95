"""The tiny engine's tokenizer: a byte-level BPE written as a Hugging Face tokenizer directory.

Owns the vocabulary (trained deterministically with the `tokenizers` library on a small embedded
corpus), the chat special tokens and the reference chat template (package data). Any text
round-trips because the pre-tokenizer is byte-level. It does not own chat rendering logic
(`rl360_ext.templates`) or the model (`rl360_ext.reference.engine.model`).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from rl360_ext.templates.markup import (
    END_OF_TEXT,
    SPECIAL_TOKENS,
    TURN_END,
)
from rl360_ext.templates.select import fixed_template
from rl360_ext.templates.tokenizer import load_hf_tokenizer

TARGET_VOCAB_SIZE = 1024

_CORPUS = (
    "system user assistant tool You are a helpful coding agent. Run the tests and fix the bug.\n",
    'def solve(xs):\n    return sorted(set(xs))\n\nif __name__ == "__main__":\n    print(solve([3, 1, 2]))\n',
    '{"name": "bash", "arguments": {"command": "ls -la /app && cat /app/README.md"}}\n',
    "import os\nimport sys\nfor line in sys.stdin:\n    print(line.strip().upper())\n",
    "The quick brown fox jumps over the lazy dog. 0123456789 +-*/=<>()[]{}:;,.'\"!?#$%&@^_|~`\\\n",
    "cd /app && python -m pytest -q tests/ && echo done; grep -rn TODO src | head -20\n",
    "Let me think step by step about the failing test, then write the patch and verify it.\n",
    "reward passed failed error timeout verifier sandbox harbor session token routing expert\n",
)


def build_tokenizer() -> Tokenizer:
    """Train the byte-level BPE (deterministic: fixed corpus, fixed order, fixed vocab size)."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TARGET_VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(list(_CORPUS) * 8, trainer=trainer)
    return tokenizer


def chat_template() -> str:
    """The reference append-only chat template (rl360's fixed template "reference")."""
    return fixed_template("reference")


def write_tokenizer_dir(directory: str | Path) -> Path:
    """Write tokenizer.json + tokenizer_config.json so `AutoTokenizer.from_pretrained` loads offline."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    tokenizer.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 131072,
        "bos_token": None,
        "eos_token": TURN_END,
        "pad_token": END_OF_TEXT,
        "unk_token": None,
        "additional_special_tokens": [t for t in SPECIAL_TOKENS if t not in (TURN_END, END_OF_TEXT)],
        "clean_up_tokenization_spaces": False,
        "chat_template": chat_template(),
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(
        json.dumps({"eos_token": TURN_END, "pad_token": END_OF_TEXT}, indent=2) + "\n"
    )
    return out


def load_tiny_tokenizer() -> Any:  # -> transformers.PreTrainedTokenizerFast
    """The tiny engine's tokenizer, loaded with transformers from its cached directory."""
    return load_hf_tokenizer(str(default_tokenizer_dir()))


def default_tokenizer_dir() -> Path:
    """A per-user cache of the tiny engine's tokenizer directory, written on first use.

    The folder name carries a digest of the corpus, vocabulary size and chat template, so a
    changed template never serves a stale copy.
    """
    fingerprint = hashlib.sha256(
        "\0".join([*_CORPUS, str(TARGET_VOCAB_SIZE), chat_template()]).encode()
    ).hexdigest()[:12]
    cache = Path.home() / ".cache" / "rl360" / f"tiny-tokenizer-{fingerprint}"
    if not (cache / "tokenizer_config.json").exists():
        write_tokenizer_dir(cache)
    return cache
