"""Tokenizing long texts in a worker process at the lowest CPU priority.

Owns `IsolatedEncoder`, the `Encoder` a server uses for texts of any size a client may send: a text
of ISOLATE_CHARS or more is encoded by one worker process (`encoder_worker`, started on the first
such text with the same tokenizer directory, so the same ids) that has a session and scheduling group
of its own at nice 19 (`rl360_ext.util.background.become_background_process`); shorter texts are
encoded in this process. A thread at nice 19 yields only to the threads of its own process's group;
the worker yields to every process on the machine, so the largest request the caps allow takes only
idle CPU from the server's event loop, the engine and every other client. One worker: long texts
are encoded one at a time. A worker that dies is replaced; the text it held is encoded here.
"""

from __future__ import annotations

import contextlib
import logging
import subprocess
import sys
import threading
from array import array

from rl360_ext.templates.encoder_worker import ANSWER, IDS, REQUEST, read_exactly
from rl360_ext.templates.tokenizer import Encoder, TokenBudgetExceeded

ISOLATE_CHARS = 65_536  # a text this long or longer is encoded in the worker process
STOP_TIMEOUT_S = 5.0
log = logging.getLogger("rl360.templates")


class IsolatedEncoder:
    """`local` for short texts; for long ones, the worker process with `tokenizer_dir`'s tokenizer."""

    def __init__(self, tokenizer_dir: str, local: Encoder, min_chars: int = ISOLATE_CHARS) -> None:
        if min_chars < 1:
            raise ValueError(f"min_chars: must be >= 1, got {min_chars}")
        self.tokenizer_dir = tokenizer_dir
        self.min_chars = min_chars
        self._local = local
        self._worker: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    def __call__(self, text: str, max_tokens: int | None = None) -> list[int]:
        if len(text) < self.min_chars:
            return self._local(text, max_tokens)
        try:
            data = text.encode()
        except UnicodeEncodeError:  # a lone surrogate: the local encoder refuses it as it always has
            return self._local(text, max_tokens)
        with self._lock:
            try:
                kind, count, ids = self._exchange(data, max_tokens)
            except (OSError, EOFError) as exc:  # the worker died: the next long text starts a new one
                log.warning("the tokenizer worker process failed (%s); this text is encoded here", exc)
                self._stop()
                return self._local(text, max_tokens)
        if kind != IDS:
            assert max_tokens is not None  # the worker counts only past a budget
            raise TokenBudgetExceeded(count, max_tokens)
        return ids

    def _exchange(self, data: bytes, max_tokens: int | None) -> tuple[int, int, list[int]]:
        worker = self._started()
        assert worker.stdin is not None and worker.stdout is not None
        worker.stdin.write(REQUEST.pack(len(data), -1 if max_tokens is None else max_tokens) + data)
        worker.stdin.flush()
        kind, count = ANSWER.unpack(read_exactly(worker.stdout, ANSWER.size))
        if kind != IDS:
            return kind, count, []
        ids = array("i")
        ids.frombytes(read_exactly(worker.stdout, 4 * count))
        return kind, count, ids.tolist()

    def _started(self) -> subprocess.Popen[bytes]:
        if self._worker is None or self._worker.poll() is not None:
            self._worker = subprocess.Popen(
                [sys.executable, "-m", "rl360_ext.templates.encoder_worker", self.tokenizer_dir],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
            )
        return self._worker

    def _stop(self) -> None:
        worker, self._worker = self._worker, None
        if worker is None:
            return
        for pipe in (worker.stdin, worker.stdout):
            with contextlib.suppress(OSError):
                if pipe is not None:
                    pipe.close()
        try:
            worker.wait(STOP_TIMEOUT_S)  # it exits at the end of its requests
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()

    def close(self) -> None:
        """Stop the worker process (if one was started)."""
        with self._lock:
            self._stop()
