"""The tiny engine's request logic (HTTP-agnostic): prefill with the prefix cache, decode, respond.

Owns running one validated `/generate` request to an SGLang-shaped response (text, output_ids,
meta_info with finish_reason, cached_tokens, weight_version(s), logprobs, routed_experts), the
scheduling between concurrent requests (one model step at a time under a FIFO lock, so requests
interleave token by token, and a long prompt is prefilled in chunks of `chunked_prefill_size`
tokens with the lock handed on between chunks: a short request waits at most one chunk per step,
never a whole long prefill), pause/continue (abort | retract | in_place), abort by rid, weight
updates and versions, cache flushes and fault injection. Blocking: the server calls it from
worker threads. It does not parse HTTP (`server.py`), define the model (`model.py`) or shape the
response body (`response.py`).

A model step is one forward followed by sampling from its last logits, under one turn of the model
lock, as in SGLang's scheduler: the prefill samples the first output token, each decode step
forwards the token sampled last and samples the next one. So a sampled token's KV is written by
the next step, and a weight update lands between steps: every output token was sampled from
logits of the weights its `weight_versions` span names (docs/engine.md, "In-flight updates").

Logprobs are the log-softmax of the raw logits (before temperature, penalties, top-k/top-p), so
they equal `TinyMoEModel.sequence_logprobs` over the final sequence.
"""

from __future__ import annotations

import functools
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from rl360_ext.reference.engine.cache import RadixKVCache
from rl360_ext.reference.engine.config import EngineConfig
from rl360_ext.reference.engine.errors import ServiceUnavailable
from rl360_ext.reference.engine.fair_lock import FairLock
from rl360_ext.reference.engine.faults import FaultConfig, FaultInjector
from rl360_ext.reference.engine.model import KVState, ModelConfig, TinyMoEModel, load_weights, log_softmax
from rl360_ext.reference.engine.protocol import GenerateRequest, RequestError
from rl360_ext.reference.engine.response import Aborted, Run, logprob_text, response_body, top_entries
from rl360_ext.reference.engine.sampling import StopChecker, adjusted_logits, sample_token
from rl360_ext.reference.engine.threads import limit_blas_threads
from rl360_ext.reference.engine.tokenizer import build_tokenizer
from rl360_ext.templates.markup import TURN_END
from rl360_ext.templates.tokenizer import GIL_FREE_CHARS

ENGINE_VERSION = "0.5.23-rl360tiny"
PAUSE_MODES = ("abort", "retract", "in_place")
DEFAULT_WEIGHT_VERSION = "default"
SEED_MODULUS = 2**64  # a negative sampling_seed is its two's complement, as in SGLang
__all__ = ["ENGINE_VERSION", "EngineConfig", "FairLock", "TinyEngine"]


class TinyEngine:
    """A tiny SGLang-compatible engine. Thread-safe; `generate` blocks (run it off the event loop)."""

    def __init__(self, config: EngineConfig | None = None) -> None:
        self.config = config or EngineConfig()
        limit_blas_threads(1)
        self.tokenizer = self._load_tokenizer(self.config.tokenizer_dir)
        vocab = self.tokenizer.get_vocab_size()
        self.model_config = ModelConfig(
            vocab_size=vocab, layers=self.config.layers, experts=self.config.experts, top_k=self.config.top_k
        )
        self.model = TinyMoEModel.from_seed(self.model_config, self.config.seed, self.config.dtype)
        if self.config.weights_path:
            self.model.weights = load_weights(self.config.weights_path, self.model_config)
        self.model_path = self.config.weights_path or f"{self.config.model_name}-seed{self.config.seed}"
        eos = self.tokenizer.token_to_id(TURN_END)
        if eos is None:
            raise ValueError(f"the tokenizer has no {TURN_END} token (the engine's eos)")
        self.eos_token_id: int = eos
        self.cache = RadixKVCache(self.config.kv_capacity)
        self.faults = FaultInjector(self.config.faults)
        self.weight_version = DEFAULT_WEIGHT_VERSION
        self._model_lock = FairLock()  # model steps (forward passes, weight swaps)
        self._cache_lock = threading.Lock()  # the prefix cache and its epoch (taken after the model lock)
        self._rng_lock = threading.Lock()  # the engine's own sampling generator
        self._state = threading.Condition()
        self._paused_mode: str | None = None
        self._updates_waiting = 0  # unpaused weight updates waiting for in-flight requests (writers)
        self._inflight: dict[str, Run] = {}
        self._cache_epoch = 0
        self._sampling_rng = np.random.default_rng(self.config.seed + 7919)
        self.counters = {
            "requests": 0,
            "prompt_tokens": 0,
            "cached_tokens": 0,
            "completion_tokens": 0,
            "prefill_chunks": 0,
        }

    @staticmethod
    def _load_tokenizer(directory: str | None) -> Tokenizer:
        if directory is None:
            return build_tokenizer()
        path = Path(directory) / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(
                f"no tokenizer.json in {directory} (write one with `rl360 engine tokenizer DIR`)"
            )
        return Tokenizer.from_file(str(path))

    # ---- text helpers -------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return self.model_config.vocab_size

    def encode(self, text: str) -> list[int]:
        """`text`'s ids; a long text through `encode_batch`, which releases the GIL (`encode` holds it)."""
        if len(text) > GIL_FREE_CHARS:
            return self.tokenizer.encode_batch([text], add_special_tokens=False)[0].ids
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    @functools.cached_property
    def max_text_chars(self) -> int:
        """The longest `text` that can fit the context: its length times the longest token."""
        longest = max((len(token) for token in self.tokenizer.get_vocab()), default=1)
        return self.config.context_length * longest

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    # ---- generate -----------------------------------------------------------------------------

    def check_limits(self, request: GenerateRequest) -> None:
        """Engine-specific validation (context length); raises RequestError.

        A prompt must leave room for one output token; `max_new_tokens` may not exceed the context
        length (a larger value cannot be honoured by any prompt). Within that bound, output is cut
        at the context length and finishes with `length`."""
        context = self.config.context_length
        if len(request.input_ids) >= context:
            raise RequestError(
                "input_ids", f"prompt has {len(request.input_ids)} tokens; context length is {context}"
            )
        if request.sampling.max_new_tokens > context:
            raise RequestError(
                "sampling_params.max_new_tokens",
                f"must be <= the context length {context}, got {request.sampling.max_new_tokens}",
            )

    def generate(self, request: GenerateRequest) -> dict[str, Any]:
        """Run one request to completion (or abort) and return SGLang's `/generate` response body."""
        started = time.perf_counter()
        self.check_limits(request)
        fault = self.faults.draw(request.sampling.max_new_tokens, request.sampling.sampling_seed)
        if fault.latency_s:
            time.sleep(fault.latency_s)
        if fault.unavailable:
            raise ServiceUnavailable("injected fault: engine unavailable")
        run = Run(rid=request.rid or uuid.uuid4().hex, request=request, tokens=list(request.input_ids))
        with self._state:
            while self._updates_waiting:  # SGLang's model_update_lock: a waiting update goes first
                self._state.wait()
            if run.rid in self._inflight:
                raise RequestError("rid", f"a request with rid {run.rid!r} is already in flight")
            self._inflight[run.rid] = run
        try:
            finish = self._run(run, fault.abort_after)
        finally:
            with self._state:
                self._inflight.pop(run.rid, None)
                self._state.notify_all()
        return self._response(run, finish, time.perf_counter() - started)

    def _run(self, run: Run, abort_after: int | None) -> dict[str, Any]:
        params = run.request.sampling
        checker = StopChecker(params, self.eos_token_id, self.decode)
        seed = params.sampling_seed
        rng = np.random.default_rng(seed % SEED_MODULUS) if seed is not None else None
        max_new = min(params.max_new_tokens, self.config.context_length - len(run.request.input_ids))
        finish: dict[str, Any]

        def sample(logits: np.ndarray) -> None:
            self._sample(run, checker, rng, logits)

        try:
            self._wait_while_paused(run)
            if max_new == 0:
                self._prefill(run, None)
            while len(run.output_ids) < max_new:
                if abort_after is not None and len(run.output_ids) >= abort_after:
                    raise Aborted("injected fault: request aborted")
                self._checkpoint(run)
                self._step(run, sample)
                if run.stop is not None:
                    finish = {"type": "stop", "matched": run.stop}
                    break
            else:
                finish = {"type": "length", "length": len(run.output_ids)}
        except Aborted as aborted:
            finish = {"type": "abort", "message": aborted.message}
        self._cache_partial(run)
        return finish

    def _checkpoint(self, run: Run) -> None:
        """Between steps: honour aborts and pauses (in_place waits with its KV; retract drops it,
        into the prefix cache as SGLang's retract releases it to the radix tree, and the next step
        re-prefills the whole sequence)."""
        with self._state:
            if run.abort_message is not None:
                raise Aborted(run.abort_message)
            mode = self._paused_mode
        if mode is None:
            return
        if mode == "retract" and run.kv is not None:
            self._cache_partial(run)
            run.kv, run.routing = None, []
            run.retractions += 1
        self._wait_while_paused(run)

    def _step(self, run: Run, sample: Any) -> None:
        """One model step: prefill (first step, or after a retract) or decode, then sample."""
        if run.kv is None:
            self._prefill(run, sample)
        else:
            self._decode_step(run, sample)

    def _wait_while_paused(self, run: Run) -> None:
        with self._state:
            while self._paused_mode is not None and run.abort_message is None:
                run.waiting = True
                self._state.wait()
            run.waiting = False
            if run.abort_message is not None:
                raise Aborted(run.abort_message)

    def _prefill(self, run: Run, sample: Any) -> None:
        """Forward every position not in the cache; `sample` draws the next token from the last
        position's logits in the last chunk's turn of the model lock (None: no token, max_new 0).

        The positions go through the model `chunked_prefill_size` at a time, each chunk one turn
        of the model lock; between chunks other requests step and an abort is honoured. Chunking
        changes no result: each chunk attends to the KV the previous ones wrote."""
        request = run.request
        want_input_logprobs = (
            request.return_logprob and request.logprob_start_len >= 0 and run.input_logprobs is None
        )
        limit = len(run.tokens) - 1
        if want_input_logprobs:
            limit = min(limit, max(request.logprob_start_len - 1, 0))
        tokens = np.asarray(run.tokens, np.int64)
        chunk = self.config.prefill_chunk or len(tokens)
        logits_for = "all" if want_input_logprobs else "last"
        logits: list[np.ndarray] = []
        with self._model_lock:  # the cache lookup and the first chunk: one turn of the lock
            with self._cache_lock:
                match = self.cache.match(tokens, limit)
                run.cache_epoch = self._cache_epoch
            spare = len(run.tokens) - match.length + min(request.sampling.max_new_tokens, 2048) + 1
            kv = match.kv_state(spare) or KVState.empty(self.model_config, spare)
            routing = [match.routing] if match.routing is not None else []
            starts = list(range(match.length, len(tokens), chunk))
            out = self.model.forward(tokens[match.length : match.length + chunk], kv, logits_for=logits_for)
            self.counters["prefill_chunks"] += 1
            if len(starts) == 1 and sample is not None:
                sample(out.logits[-1])
        routing.append(out.routing)
        logits.append(out.logits)
        for index, start in enumerate(starts[1:], start=2):
            self._raise_if_aborted(run)
            with self._model_lock:
                out = self.model.forward(tokens[start : start + chunk], kv, logits_for=logits_for)
                self.counters["prefill_chunks"] += 1
                if index == len(starts) and sample is not None:
                    sample(out.logits[-1])
            routing.append(out.routing)
            logits.append(out.logits)
        run.kv, run.routing = kv, routing
        run.cached_tokens += match.length
        if want_input_logprobs:
            self._record_input_logprobs(run, match.length, np.concatenate(logits, axis=0))

    def _raise_if_aborted(self, run: Run) -> None:
        with self._state:
            if run.abort_message is not None:
                raise Aborted(run.abort_message)

    def _record_input_logprobs(self, run: Run, first_computed: int, logits: np.ndarray) -> None:
        """input_token_logprobs for prompt positions >= logprob_start_len (position 0 has none)."""
        request = run.request
        logprobs = log_softmax(logits)  # row i predicts token first_computed + i + 1
        with_text = request.return_text_in_logprobs
        entries, tops = [], []
        for pos in range(request.logprob_start_len, len(request.input_ids)):
            token = request.input_ids[pos]
            if pos == 0:
                entries.append([None, token, logprob_text(self.decode, token, with_text)])
                tops.append(None)
                continue
            row = logprobs[pos - 1 - first_computed]
            entries.append([float(row[token]), token, logprob_text(self.decode, token, with_text)])
            tops.append(top_entries(self.decode, row, request.top_logprobs_num, with_text))
        run.input_logprobs, run.input_top = entries, tops

    def _decode_step(self, run: Run, sample: Any) -> None:
        """Forward the token sampled last (writing its KV and routing row), sample the next one."""
        assert run.kv is not None and run.kv.length == len(run.tokens) - 1
        with self._model_lock:
            out = self.model.forward(np.asarray(run.tokens[-1:]), run.kv)
            run.routing.append(out.routing)
            sample(out.logits[-1])

    def _sample(
        self, run: Run, checker: StopChecker, rng: np.random.Generator | None, logits: np.ndarray
    ) -> None:
        """Draw one token from `logits` (called under the model lock, so `weight_version` is the
        version of the forward that computed them) and record it, its logprob and version."""
        params = run.request.sampling
        logprobs = log_softmax(logits)
        scores = adjusted_logits(logits, params, run.output_ids)
        banned = checker.banned_tokens(len(run.output_ids))
        if rng is None:
            with self._rng_lock:
                token = sample_token(scores, params, self._sampling_rng, banned)
        else:
            token = sample_token(scores, params, rng, banned)
        run.output_ids.append(token)
        run.tokens.append(token)
        run.output_logprobs.append(float(logprobs[token]))
        run.output_versions.append(self.weight_version)
        if run.request.top_logprobs_num:
            request = run.request
            run.output_top.append(
                top_entries(self.decode, logprobs, request.top_logprobs_num, request.return_text_in_logprobs)
            )
        stop = checker.check(run.output_ids)
        run.stop = None if stop is None else stop.matched

    def _cache_partial(self, run: Run) -> None:
        """Insert this request's KV (with the routing written alongside it) unless the cache was flushed."""
        if run.kv is None:
            return
        with self._cache_lock:
            if run.cache_epoch == self._cache_epoch:
                routing = np.concatenate(run.routing, axis=0)
                self.cache.insert(np.asarray(run.tokens[: run.kv.length], np.int64), run.kv, routing)

    def _response(self, run: Run, finish: dict[str, Any], elapsed: float) -> dict[str, Any]:
        body = response_body(run, finish, elapsed, self.decode, self.weight_version)
        with self._state:
            self.counters["requests"] += 1
            self.counters["prompt_tokens"] += len(run.request.input_ids)
            self.counters["cached_tokens"] += run.cached_tokens
            self.counters["completion_tokens"] += len(run.output_ids)
        return body

    # ---- control ------------------------------------------------------------------------------

    def abort(
        self, rid: str | None = None, abort_all: bool = False, message: str = "aborted by abort_request"
    ) -> int:
        """Abort in-flight (and waiting) requests by rid, or all of them. Returns how many."""
        with self._state:
            targets = (
                list(self._inflight.values())
                if abort_all
                else [r for r in self._inflight.values() if r.rid == rid]
            )
            for run in targets:
                run.abort_message = message
            self._state.notify_all()
            return len(targets)

    def pause(self, mode: str, timeout_s: float = 60.0) -> int:
        """Stop generating: `abort` aborts in-flight requests; `retract`/`in_place` hold them.

        `in_place` returns at once (the step in progress finishes; requests keep their KV).
        `retract` returns once every in-flight request has given its KV back (SGLang retracts the
        running batch before the pause call answers), so a following update can flush the cache."""
        if mode not in PAUSE_MODES:
            raise RequestError("mode", f"must be one of {', '.join(PAUSE_MODES)}, got {mode!r}")
        with self._state:
            self._paused_mode = mode
            running = len(self._inflight)
        if mode == "abort":
            self.abort(abort_all=True, message="aborted by pause_generation(mode=abort)")
        if mode == "retract":
            deadline = time.monotonic() + timeout_s
            with self._state:
                while self._paused_mode == "retract" and not all(
                    r.waiting or r.abort_message is not None for r in self._inflight.values()
                ):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise ServiceUnavailable("pause_generation(retract): requests did not retract")
                    self._state.wait(min(left, 0.05))
        return running

    def resume(self) -> None:
        with self._state:
            self._paused_mode = None
            self._state.notify_all()

    def _holding_kv(self) -> int:
        """Requests that would lose KV to a flush: SGLang's `is_fully_idle` (running or, unless
        paused, queued requests). Under a pause, requests waiting without KV (retracted, or not
        yet admitted) do not count."""
        with self._state:
            if self._paused_mode is None:
                return len(self._inflight)
            return sum(1 for r in self._inflight.values() if r.kv is not None and r.abort_message is None)

    def flush_cache(self) -> bool:
        """Drop the prefix cache; refused (False) while requests hold KV, as SGLang refuses."""
        if self._holding_kv():
            return False
        with self._cache_lock:
            self.cache.flush()
            self._cache_epoch += 1
        return True

    def update_weights_from_disk(
        self, model_path: str, weight_version: str | None, flush_cache: bool = True
    ) -> tuple[bool, str]:
        """Load weights saved by `rl360 engine save-weights` between two model steps.

        As SGLang: unpaused, the update waits for the in-flight requests to finish (the writer
        side of `model_update_lock`) and holds new ones back; paused, it lands between steps at
        once. Returns (success, message): a flush refused because requests still hold KV (an
        `in_place` pause) fails the call after the weights and version changed."""
        try:
            weights = load_weights(model_path, self.model_config)
        except FileNotFoundError as err:
            raise RequestError("model_path", str(err)) from err
        except Exception as err:  # any file that is not our .npz (empty, not a zip, ...) is the client's
            raise RequestError("model_path", f"cannot load weights: {type(err).__name__}: {err}") from err
        with self._state:
            writer = self._paused_mode is None
            if writer:
                self._updates_waiting += 1
                while self._inflight:
                    self._state.wait()
        try:
            with self._model_lock:
                self.model.weights = weights
                self.model_path = str(model_path)
                if weight_version is not None:
                    self.weight_version = weight_version
                flushed = not flush_cache or self.flush_cache()
        finally:
            if writer:
                with self._state:
                    self._updates_waiting -= 1
                    self._state.notify_all()
        message = "Succeeded to update model weights."
        if not flushed:
            return False, (
                "Weights were updated, but the cache was not flushed because requests are still "
                "running or queued. Retract or finish them, then call /flush_cache."
            )
        if weight_version is not None:
            message += f" Weight version updated to {weight_version}."
        return True, message

    def update_weight_version(self, weight_version: str) -> None:
        with self._model_lock:
            self.weight_version = weight_version

    def set_faults(self, config: FaultConfig) -> None:
        self.faults.configure(config)

    # ---- info ---------------------------------------------------------------------------------

    def inflight(self) -> list[dict[str, Any]]:
        """In-flight requests: rid, output tokens so far, and whether each is waiting on a pause."""
        with self._state:
            return [
                {"rid": run.rid, "output_tokens": len(run.output_ids), "waiting": run.waiting}
                for run in self._inflight.values()
            ]

    def model_info(self) -> dict[str, Any]:
        return {
            "model_path": self.model_path,
            "tokenizer_path": self.config.tokenizer_dir,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": self.weight_version,
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": "rl360_tiny_moe",
            "architectures": ["TinyMoEForCausalLM"],
            "num_layers": self.model_config.layers,
            "num_experts": self.model_config.experts,
            "num_experts_per_tok": self.model_config.top_k,
            "vocab_size": self.model_config.vocab_size,
            "eos_token_id": self.eos_token_id,
        }

    def server_info(self) -> dict[str, Any]:
        stats = self.cache.stats
        with self._state:
            counters = dict(self.counters)
        inflight = self.inflight()
        return {
            "model_path": self.model_path,
            "served_model_name": self.config.model_name,
            "tokenizer_path": self.config.tokenizer_dir,
            "context_length": self.config.context_length,
            "random_seed": self.config.seed,
            "enable_return_routed_experts": True,
            "disable_radix_cache": self.config.kv_capacity == 0,
            "kv_capacity_tokens": self.config.kv_capacity,
            "version": ENGINE_VERSION,
            "weight_version": self.weight_version,
            "paused": self._paused_mode,
            "faults": self.faults.config.to_dict(),
            "internal_states": [
                {
                    "num_running_reqs": sum(not r["waiting"] for r in inflight),
                    "num_waiting_reqs": sum(r["waiting"] for r in inflight),
                    "cache_tokens": self.cache.size_tokens,
                    "cache_hit_tokens": stats.hit_tokens,
                    "cache_lookup_tokens": stats.lookup_tokens,
                    "cache_evicted_tokens": stats.evicted_tokens,
                    "cache_flushes": stats.flushes,
                    "model_busy_s": self._model_lock.busy_s,  # rl360: time spent in model steps
                    **counters,
                }
            ],
        }
