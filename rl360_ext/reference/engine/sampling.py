"""Token sampling and stop detection for the tiny engine (pure functions over numpy arrays).

Owns turning raw logits into the next token (penalties, logit bias, temperature, top-k, top-p,
min-p, greedy at temperature 0) and deciding when a sequence stops (eos, stop_token_ids, stop
strings, min_new_tokens). Reported logprobs are NOT computed here: the engine reports the
log-softmax of the raw logits (before temperature and penalties). It does not run the model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from rl360_ext.reference.engine.protocol import SamplingParams


def adjusted_logits(logits: np.ndarray, params: SamplingParams, output_ids: list[int]) -> np.ndarray:
    """Apply logit bias and repetition/frequency/presence penalties (over generated tokens)."""
    out = logits.copy()
    for token, bias in params.logit_bias.items():
        out[token] += bias
    if output_ids and (
        params.repetition_penalty != 1.0 or params.frequency_penalty != 0.0 or params.presence_penalty != 0.0
    ):
        counts = np.bincount(np.asarray(output_ids), minlength=out.shape[0])
        seen = counts > 0
        if params.repetition_penalty != 1.0:
            out[seen] = np.where(
                out[seen] > 0, out[seen] / params.repetition_penalty, out[seen] * params.repetition_penalty
            )
        out -= params.frequency_penalty * counts + params.presence_penalty * seen
    return out


def sample_token(
    logits: np.ndarray, params: SamplingParams, rng: np.random.Generator, banned: list[int]
) -> int:
    """The next token from (already adjusted) logits; `banned` ids are never chosen."""
    scores = logits.astype(np.float64, copy=True)
    if banned:
        scores[banned] = -np.inf
    if params.greedy:
        return int(np.argmax(scores))
    scores = scores / params.temperature
    probs = np.exp(scores - scores.max())
    probs /= probs.sum()
    order = np.argsort(-probs, kind="stable")
    sorted_probs = probs[order]
    keep = len(order)
    if params.top_k > 0:
        keep = min(keep, params.top_k)
    if params.top_p < 1.0:
        cumulative = np.cumsum(sorted_probs)
        keep = min(keep, int(np.searchsorted(cumulative, params.top_p)) + 1)
    if params.min_p > 0.0:
        keep = min(keep, max(1, int(np.sum(sorted_probs >= params.min_p * sorted_probs[0]))))
    kept = sorted_probs[:keep] / sorted_probs[:keep].sum()
    index = int(np.searchsorted(np.cumsum(kept), rng.random(), side="right"))
    return int(order[min(index, keep - 1)])


@dataclass
class StopMatch:
    """Why generation stopped: a token id (eos or stop_token_ids) or a stop string."""

    matched: int | str


class StopChecker:
    """Stop conditions for one request; decode(ids) must return raw text (special tokens kept)."""

    def __init__(self, params: SamplingParams, eos_token_id: int, decode: Callable[[list[int]], str]) -> None:
        self.params = params
        self.decode = decode
        self.stop_ids = set(params.stop_token_ids)
        if not params.ignore_eos:
            self.stop_ids.add(eos_token_id)
        longest = max((len(s) for s in params.stop), default=0)
        self._tail_tokens = longest + 4

    def banned_tokens(self, produced: int) -> list[int]:
        """Stop tokens may not be sampled before min_new_tokens."""
        return sorted(self.stop_ids) if produced < self.params.min_new_tokens else []

    def check(self, output_ids: list[int]) -> StopMatch | None:
        if len(output_ids) < max(self.params.min_new_tokens, 1):
            return None
        if output_ids[-1] in self.stop_ids:
            return StopMatch(output_ids[-1])
        if self.params.stop:
            tail = self.decode(output_ids[-self._tail_tokens :])
            for stop in self.params.stop:
                if stop in tail:
                    return StopMatch(stop)
        return None
