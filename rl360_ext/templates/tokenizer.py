"""Loading a Hugging Face tokenizer directory offline, and its backend's encode where it is the same.

Owns `load_hf_tokenizer`, the one place production code turns a tokenizer directory into a
transformers tokenizer (no torch, no hub), and `backend_encoder`: the `tokenizers.Tokenizer`
encode the transformers wrapper ends in, called directly (the wrapper's Python around it costs
about half a suffix's tokenization). It is used only where the wrapper's `encode(text,
add_special_tokens=False)` provably reduces to it: transformers' own fast-tokenizer `encode` path
(no subclass override), and, checked on every call, a backend with no truncation or padding set
and the wrapper's `split_special_tokens` (the state the wrapper would set before encoding);
otherwise the wrapper encodes. A text over GIL_FREE_CHARS goes through the backend's `encode_batch`
(the same ids), which releases the GIL while it works, where `encode` holds it (a 1 MB text held
a session server's event loop for 2.8 s). It does not build tokenizers: the tiny engine's comes from
`rl360_ext.reference.engine.tokenizer`.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import Any

Encoder = Callable[[str], list[int]]
GIL_FREE_CHARS = 4096  # a longer text is encoded with `encode_batch`, which releases the GIL


@lru_cache(maxsize=8)
def load_hf_tokenizer(directory: str) -> Any:  # -> transformers.PreTrainedTokenizerFast
    """Load the tokenizer in `directory` with transformers, offline."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(directory, local_files_only=True)


def wrapper_encoder(tokenizer: Any) -> Encoder:
    """`tokenizer.encode(text, add_special_tokens=False)` as a list (the reference encoding)."""

    def encode(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False))

    return encode


def backend_encoder(tokenizer: Any) -> Encoder | None:
    """The backend's encode of `text` without special tokens, for a tokenizer whose `encode`
    is transformers' fast-tokenizer path unchanged; None for any other tokenizer.

    The returned encoder falls back to the wrapper on a call where the backend's state differs
    from what the wrapper would set (truncation or padding on, `encode_special_tokens` not the
    tokenizer's `split_special_tokens`), so it returns the wrapper's ids on every call."""
    try:
        from tokenizers import Tokenizer
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:  # another transformers layout: keep the wrapper
        return None
    kind = type(tokenizer)
    backend = getattr(tokenizer, "_tokenizer", None)
    standard = (
        isinstance(tokenizer, TokenizersBackend)
        and isinstance(backend, Tokenizer)
        and kind.encode is PreTrainedTokenizerBase.encode
        and kind._get_padding_truncation_strategies
        is PreTrainedTokenizerBase._get_padding_truncation_strategies
        and kind._encode_plus is TokenizersBackend._encode_plus
        and kind.set_truncation_and_padding is TokenizersBackend.set_truncation_and_padding
    )
    if not standard:
        return None
    assert backend is not None
    slow = wrapper_encoder(tokenizer)
    raw, batch = backend.encode, backend.encode_batch

    def encode(text: str) -> list[int]:
        if (
            backend.truncation is not None
            or backend.padding is not None
            or backend.encode_special_tokens != bool(tokenizer.split_special_tokens)
        ):
            return slow(text)
        if len(text) > GIL_FREE_CHARS:  # `encode` holds the GIL throughout: every other thread waits
            return batch([text], add_special_tokens=False)[0].ids
        return raw(text, add_special_tokens=False).ids

    return encode


def fast_encoder(tokenizer: Any) -> Encoder:
    """`backend_encoder` where it applies, else the wrapper's encode."""
    return backend_encoder(tokenizer) or wrapper_encoder(tokenizer)
