"""Top-k log-probs per generated token: SGLang's protocol names and rl360's arrays of them.

Owns the field names, checked against the SGLang 0.5.23 wheel: the request's `top_logprobs_num`
(`srt/managers/io_struct.py` `GenerateReqInput`: "the number of top logprobs to return at each
position", default 0 meaning none) and the response's `meta_info["output_top_logprobs"]`
(`srt/managers/tokenizer_manager.py` `add_logprob_to_meta_info` /
`detokenize_top_logprobs_tokens`: one entry per output token, a list of `[logprob, token_id,
text or null]` best first, or null where the engine had none); `parse_output_top_logprobs`, which
turns that into two arrays, `ids` int32 [tokens, k] (-1 where there is no entry) and `logprobs`
float32 [tokens, k] (0 there), naming the entry it rejects; and `TOP_LOGPROBS_KEY`, the Miles
`Sample.metadata` key they travel under to the trainer (response positions only, as lists). It
does not ask the engine (`client.py`) or merge turns (`rl360_ext.session.samples.merge`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rl360_ext.errors import Rl360Error

TOP_LOGPROBS_NUM = "top_logprobs_num"  # GenerateReqInput field (int; 0: none)
OUTPUT_TOP_LOGPROBS = "output_top_logprobs"  # meta_info field, one entry per output token
TOP_LOGPROBS_KEY = "rl360_top_logprobs"  # Sample.metadata: {"ids": [[...]], "logprobs": [[...]]}
NO_TOKEN = -1  # an id slot with no entry (a non-generated position, or an engine's null entry)


class TopLogprobsError(Rl360Error, ValueError):
    """An `output_top_logprobs` value that breaks the protocol (the message names the entry)."""


def empty_top_logprobs(rows: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids, logprobs) with no entry on any of `rows` rows."""
    return np.full((rows, k), NO_TOKEN, np.int32), np.zeros((rows, k), np.float32)


def parse_output_top_logprobs(entries: Any, output_tokens: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids int32 [output_tokens, k], logprobs float32 [output_tokens, k]) of a response's
    `output_top_logprobs` asked with `top_logprobs_num=k`; TopLogprobsError names a bad entry."""
    if not isinstance(entries, list) or len(entries) != output_tokens:
        got = len(entries) if isinstance(entries, list) else type(entries).__name__
        raise TopLogprobsError(
            f"meta_info.{OUTPUT_TOP_LOGPROBS} has {got} entries for {output_tokens} output tokens"
        )
    ids, logprobs = empty_top_logprobs(output_tokens, k)
    for row, entry in enumerate(entries):
        if entry is None:
            continue
        if not isinstance(entry, list) or len(entry) > k:
            raise TopLogprobsError(
                f"meta_info.{OUTPUT_TOP_LOGPROBS}[{row}] must be a list of at most {k} entries"
            )
        for slot, item in enumerate(entry):
            try:
                value, token = float(item[0]), item[1]
            except (TypeError, ValueError, IndexError):
                raise TopLogprobsError(
                    f"meta_info.{OUTPUT_TOP_LOGPROBS}[{row}][{slot}] must be [logprob, token_id, text]"
                ) from None
            if isinstance(token, bool) or not isinstance(token, int) or token < 0 or not value <= 0.0:
                where = f"meta_info.{OUTPUT_TOP_LOGPROBS}[{row}][{slot}]"
                raise TopLogprobsError(f"{where} has token {token!r} and logprob {value!r}")
            ids[row, slot], logprobs[row, slot] = token, value
    return ids, logprobs
