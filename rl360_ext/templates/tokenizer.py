"""Loading a Hugging Face tokenizer directory offline (tokenizer.json + tokenizer_config.json).

Owns `load_hf_tokenizer`, the one place production code turns a tokenizer directory into a
transformers tokenizer (no torch, no hub). It does not build tokenizers: the tiny engine's comes
from `rl360_ext.tiny_engine.tokenizer`.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any


@lru_cache(maxsize=8)
def load_hf_tokenizer(directory: str) -> Any:  # -> transformers.PreTrainedTokenizerFast
    """Load the tokenizer in `directory` with transformers, offline."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(directory, local_files_only=True)
