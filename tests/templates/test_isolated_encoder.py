"""The isolated encoder gives the in-process encoder's ids from a worker at the lowest priority.

Property: for any text (hypothesis' full text strategy, surrogates included) and any budget, an
`IsolatedEncoder` that sends every text to its worker returns the ids the tokenizer's own encoder
returns, or raises TokenBudgetExceeded with the same count, or (a lone surrogate) the same error;
for the tiny engine's tokenizer and a real family's, each saved to a directory as a server loads
it. The worker runs in a session of its own at nice 19; a worker that dies is replaced, and the
text it held is encoded in the caller's process; `close` leaves no process behind.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl360_ext.reference.engine.tokenizer import default_tokenizer_dir
from rl360_ext.templates.isolated_encoder import IsolatedEncoder
from rl360_ext.templates.tokenizer import TokenBudgetExceeded, fast_encoder, load_hf_tokenizer
from rl360_ext.util.background import LOWEST_PRIORITY
from tests.templates.real import FAMILIES, real_tokenizer

CODE = st.sampled_from(" \n\tdef x():return 1+2 é中🙂<|>")
TEXT = st.text(max_size=400) | st.text(alphabet=CODE, max_size=400)


def _outcome(encode: Any, text: str, budget: int | None) -> tuple[str, Any]:
    try:
        return "ids", encode(text, budget)
    except TokenBudgetExceeded as exc:
        return "over", exc.tokens
    except Exception as exc:  # what the tokenizer raises for a text it cannot take
        return "error", type(exc).__name__


@pytest.fixture(scope="module", params=["tiny", next(iter(FAMILIES))])
def encoders(request, tmp_path_factory) -> Iterator[tuple[IsolatedEncoder, Any]]:
    if request.param == "tiny":
        directory = str(default_tokenizer_dir())
    else:
        directory = str(tmp_path_factory.mktemp(request.param))
        real_tokenizer(request.param).save_pretrained(directory)
    local = fast_encoder(load_hf_tokenizer(directory))
    isolated = IsolatedEncoder(directory, local, min_chars=1)
    yield isolated, local
    isolated.close()


@settings(max_examples=60, deadline=None)
@given(text=TEXT, budget=st.none() | st.integers(0, 300))
def test_the_worker_gives_the_local_encoders_answer(encoders, text, budget) -> None:
    isolated, local = encoders
    assert _outcome(isolated, text, budget) == _outcome(local, text, budget)


def test_the_worker_runs_alone_at_the_lowest_priority_and_a_dead_one_is_replaced(encoders) -> None:
    isolated, local = encoders
    text = "def f(x):\n    return x + 1\n" * 50
    assert isolated(text) == local(text)
    worker = isolated._worker
    assert worker is not None and worker.poll() is None
    assert os.getpriority(os.PRIO_PROCESS, worker.pid) == LOWEST_PRIORITY
    assert os.getsid(worker.pid) == worker.pid != os.getsid(0)
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait()
    assert isolated(text) == local(text)  # encoded here, or by a new worker
    assert isolated(text) == local(text)
    assert isolated._worker is not None and isolated._worker.pid != worker.pid


def test_short_texts_stay_in_process_and_close_stops_the_worker() -> None:
    directory = str(default_tokenizer_dir())
    local = fast_encoder(load_hf_tokenizer(directory))
    isolated = IsolatedEncoder(directory, local, min_chars=100)
    assert isolated("short") == local("short") and isolated._worker is None
    long = "word " * 40
    assert isolated(long) == local(long)
    worker = isolated._worker
    assert worker is not None
    isolated.close()
    assert worker.poll() is not None and isolated._worker is None


def test_min_chars_must_be_positive() -> None:
    with pytest.raises(ValueError, match="min_chars"):
        IsolatedEncoder(str(default_tokenizer_dir()), lambda text, max_tokens=None: [], min_chars=0)
