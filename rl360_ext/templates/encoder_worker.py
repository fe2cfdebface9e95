"""The tokenizer worker behind `IsolatedEncoder` (`python -m rl360_ext.templates.encoder_worker DIR`).

Owns the worker's side of the pipe protocol. It leaves its parent's session for one of its own at
the lowest CPU priority, loads DIR's tokenizer, then answers requests from stdin until EOF (its
server is gone) on what was its stdout (anything printed goes to stderr). A request: REQUEST (the
text's UTF-8 length, the token budget or -1) and the text; an answer: ANSWER (IDS and the count,
then that many int32 ids; or OVER and the token count).
"""

from __future__ import annotations

import struct
import sys
from array import array
from typing import BinaryIO

REQUEST = struct.Struct("<Qq")
ANSWER = struct.Struct("<Bq")
IDS, OVER = 0, 1


def read_exactly(stream: BinaryIO, size: int) -> bytes:
    """`size` bytes from `stream`; EOFError where it ends first."""
    chunks: list[bytes] = []
    left = size
    while left:
        chunk = stream.read(left)
        if not chunk:
            raise EOFError(f"the pipe ended {left} bytes short")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def serve(directory: str, requests: BinaryIO, answers: BinaryIO) -> None:
    """Encode each request with `directory`'s tokenizer until `requests` ends."""
    from rl360_ext.templates.tokenizer import TokenBudgetExceeded, fast_encoder, load_hf_tokenizer

    encode = fast_encoder(load_hf_tokenizer(directory))
    while True:
        try:
            size, budget = REQUEST.unpack(read_exactly(requests, REQUEST.size))
            text = read_exactly(requests, size).decode()
        except EOFError:
            return
        try:
            ids = encode(text, None if budget < 0 else budget)
        except TokenBudgetExceeded as exc:
            answers.write(ANSWER.pack(OVER, exc.tokens))
        else:
            answers.write(ANSWER.pack(IDS, len(ids)) + array("i", ids).tobytes())
        answers.flush()


def main() -> None:
    import os

    from rl360_ext.util.background import become_background_process

    become_background_process()
    answers = os.fdopen(os.dup(1), "wb")  # the pipe: only answers go there
    os.dup2(2, 1)  # anything a library prints goes to stderr, never into the answers
    serve(sys.argv[1], sys.stdin.buffer, answers)


if __name__ == "__main__":
    main()
