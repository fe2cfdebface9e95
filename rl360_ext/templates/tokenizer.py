"""Loading a Hugging Face tokenizer directory offline, and its backend's encode where it is the same.

Owns `load_hf_tokenizer`, the one place production code turns a tokenizer directory into a
transformers tokenizer (no torch, no hub), and `backend_encoder`: the `tokenizers.Tokenizer`
encode the transformers wrapper ends in, called directly (the wrapper's Python around it costs
about half a suffix's tokenization). It is used only where the wrapper's `encode(text,
add_special_tokens=False)` provably reduces to it: transformers' own fast-tokenizer `encode` path
(no subclass override), and, checked on every call, a backend with no truncation or padding set
and the wrapper's `split_special_tokens` (the state the wrapper would set before encoding);
otherwise the wrapper encodes. A text over GIL_FREE_CHARS goes through the backend's
`encode_batch_fast` (the same ids, no offsets), which releases the GIL while it works, where `encode`
holds it (a 1 MB text held a session server's event loop for 2.8 s), and whose result frees in a
millisecond (`encode_batch`'s 687K-token encoding took 110-170 ms to free, under the GIL). An
encoder called with `max_tokens` raises `TokenBudgetExceeded` for a longer text before turning its
ids into Python objects, so a request over the context costs no more Python work than one at the
context. It does not build tokenizers: the tiny engine's comes from
`rl360_ext.reference.engine.tokenizer`.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Protocol

from rl360_ext.errors import Rl360Error

GIL_FREE_CHARS = 4096  # a longer text is encoded with `encode_batch_fast`, which releases the GIL


class TokenBudgetExceeded(Rl360Error, ValueError):
    """A text encodes to more than the `max_tokens` its caller allowed (its ids were never built)."""

    def __init__(self, tokens: int, max_tokens: int) -> None:
        super().__init__(f"{tokens} tokens, over the budget of {max_tokens}")
        self.tokens = tokens
        self.max_tokens = max_tokens


class Encoder(Protocol):
    """`text`'s ids without added special tokens; with `max_tokens`, TokenBudgetExceeded past it."""

    def __call__(self, text: str, max_tokens: int | None = None) -> list[int]: ...


def within(count: int, max_tokens: int | None) -> None:
    """Raise TokenBudgetExceeded when `count` tokens are over `max_tokens` (None: no budget)."""
    if max_tokens is not None and count > max_tokens:
        raise TokenBudgetExceeded(count, max_tokens)


@lru_cache(maxsize=8)
def load_hf_tokenizer(directory: str) -> Any:  # -> transformers.PreTrainedTokenizerFast
    """Load the tokenizer in `directory` with transformers, offline."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(directory, local_files_only=True)


def wrapper_encoder(tokenizer: Any) -> Encoder:
    """`tokenizer.encode(text, add_special_tokens=False)` as a list (the reference encoding)."""

    def encode(text: str, max_tokens: int | None = None) -> list[int]:
        ids = list(tokenizer.encode(text, add_special_tokens=False))
        within(len(ids), max_tokens)
        return ids

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
    raw, batch = backend.encode, backend.encode_batch_fast

    def encode(text: str, max_tokens: int | None = None) -> list[int]:
        if (
            backend.truncation is not None
            or backend.padding is not None
            or backend.encode_special_tokens != bool(tokenizer.split_special_tokens)
        ):
            return slow(text, max_tokens)
        # `encode` holds the GIL throughout (every other thread waits); `encode_batch_fast` does not
        encoding = (
            batch([text], add_special_tokens=False)[0]
            if len(text) > GIL_FREE_CHARS
            else raw(text, add_special_tokens=False)
        )
        within(len(encoding), max_tokens)  # before the ids become Python ints
        return encoding.ids

    return encode


def fast_encoder(tokenizer: Any) -> Encoder:
    """`backend_encoder` where it applies, else the wrapper's encode."""
    return backend_encoder(tokenizer) or wrapper_encoder(tokenizer)
