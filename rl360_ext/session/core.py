"""The session server's logic, without HTTP: sessions, turns, forced engine flags, delta R3, limits.

Owns the session table (unguessable ids, max sessions, idle TTL), one turn end to end (validate
the request, check the history is an append, build the engine request with the flags no agent
can switch off, call the backend, check what came back, record the turn, build the reply),
per-session serialization, replaying the recorded turn to a retried request (idempotent
retries; ids and fingerprints are `identity.py`'s), and merging on request. A failed engine
call (5xx, 429, timeout, transport error, a response that breaks the protocol) raises an
`EngineFaultError` and records nothing. Every refusal is a class of `errors.py`. It does not own
HTTP (`app.py`), tokenization (`tito.py`), the merge rules (`merge.py`) or the wire bytes (`wire.py`).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rl360_ext.session.chat_api import ChatRequest, Reply, parse_chat_request
from rl360_ext.session.config import SessionCoreConfig
from rl360_ext.session.errors import (
    EngineFaultError,
    EngineHTTPError,
    EngineProtocolError,
    EngineTimeoutError,
    HistoryMismatchError,
    RequestError,
    SessionGoneError,
    SessionLostError,
    SessionNotFoundError,
    SessionServerError,
    TooManySessionsError,
)
from rl360_ext.session.history import Mismatch, find_mismatch
from rl360_ext.session.identity import mint_session_id, minted_by, request_fingerprint
from rl360_ext.session.metrics import SessionMetrics
from rl360_ext.session.samples import wire
from rl360_ext.session.samples.merge import MERGE_KEY, MergedSample, TurnRecord, branches, merge
from rl360_ext.session.samples.records import Exchange, session_view, tree_metadata
from rl360_ext.session.samples.routing import compact_rows, row_sources
from rl360_ext.session.tito import TitoRenderer
from rl360_ext.sglang import client as engine_client
from rl360_ext.sglang.client import EngineClient, EngineError, GenerateResult
from rl360_ext.templates.drift import DRIFT_KEY, not_checked
from rl360_ext.templates.parse import ParsedAssistant
from rl360_ext.templates.render import TemplateNotAppendOnlyError
from rl360_ext.templates.tokenizer import TokenBudgetExceeded
from rl360_ext.util.background import background_executor
from rl360_ext.util.text import unencodable

log = logging.getLogger("rl360.session")
SESSION_KEY = "session"  # metadata key of the session's own facts
LEAF_KEY = "leaf"  # metadata key of a branch sample's place in the tree (Miles' v2 leaf descriptor)
RESERVED_METADATA_KEYS = (SESSION_KEY, MERGE_KEY, LEAF_KEY)
_FORGOTTEN_MAX = 65536
ROUTING_KEY_MAX = 256
_ROUTING_KEY = re.compile(rf"[\x21-\x7e]{{1,{ROUTING_KEY_MAX}}}")  # visible ASCII: a valid header value
INLINE_CHARS = 4096  # an append with at most this much new text is planned on the event loop
Message = dict[str, Any]


_BACKGROUND = background_executor("rl360-session-plan")  # large turns: planned at low CPU priority


@dataclass
class Segment:
    """One append-only token sequence; a fork starts a new one."""

    index: int
    tokens: list[int] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    rows: int = 0  # routing rows held (positions [0, rows))
    pending: list[int] = field(default_factory=list)  # closing tokens to append before the next input
    last_output: range = range(0)


@dataclass
class Session:
    id: str
    routing_key: str
    metadata: dict[str, Any]
    created_at: float
    last_used: float
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    turns: list[TurnRecord] = field(default_factory=list)
    segment: Segment | None = None
    forks: list[dict[str, Any]] = field(default_factory=list)
    turn_errors: list[dict[str, Any]] = field(default_factory=list)  # failed turns: {turn, status, cause}
    replies: dict[bytes, Reply] = field(default_factory=dict)  # request fingerprint -> its recorded reply
    exchanges: dict[int, Exchange] = field(default_factory=dict)  # the agent's side of each turn, by index
    r3: bool = False  # record routing replay for this session's turns (the server's --r3, unless opted out)


@dataclass
class _Plan:
    segment: Segment
    appended: list[int]
    prompt: list[int]
    fork: Mismatch | None
    new_messages: int


def _append(held: Segment, suffix: list[int], new_messages: int) -> _Plan:
    """The plan of a turn that appends `suffix` (after the held segment's pending closing tokens)."""
    appended = [*held.pending, *suffix]
    return _Plan(held, appended, [*held.tokens, *appended], None, new_messages)


class SessionCore:
    """All sessions of one server. Async methods run on one event loop."""

    def __init__(
        self, tito: TitoRenderer, backend: EngineClient, config: SessionCoreConfig | None = None
    ) -> None:
        self.tito = tito
        self.backend = backend
        self.config = config or SessionCoreConfig()
        self.metrics = SessionMetrics()
        self.sessions: dict[str, Session] = {}
        self._forgotten: OrderedDict[str, str] = OrderedDict()
        self.instance_id = self.config.instance_id
        # the 8 hex digits every session id this process mints starts with (any --instance-id works)
        self.instance_tag = hashlib.blake2b(self.instance_id.encode(), digest_size=4).hexdigest()
        self.vocab_size = self.config.vocab_size or len(tito.tokenizer)

    # ---- session table -------------------------------------------------------------------

    def create(
        self,
        metadata: dict[str, Any] | None = None,
        routing_key: str | None = None,
        session_id: str | None = None,
        r3: bool | None = None,
    ) -> Session:
        """A new session. `r3=False` opts it out of the server's routing replay (an eval attempt,
        whose routing no trainer replays: its turns then ask the engine for no routed experts and
        its merged sample carries none); None: the server's `--r3`. `r3=True` on a server without
        `--r3` is refused (the routing shape is unknown there)."""
        if r3 is not None and not isinstance(r3, bool):
            raise RequestError(f"r3: must be true, false or omitted, got {r3!r}", param="r3")
        if r3 and not self.config.r3:
            raise RequestError("r3: this session server runs without --r3", param="r3")
        if metadata is not None and not isinstance(metadata, dict):
            raise RequestError("metadata: must be a JSON object", param="metadata")
        where = unencodable(metadata, "metadata")
        if where is not None:
            raise RequestError(f"{where}: holds a lone surrogate, not UTF-8 text", param="metadata")
        reserved = [k for k in RESERVED_METADATA_KEYS if k in (metadata or {})]
        if reserved:
            raise RequestError(f"metadata: keys {reserved} are reserved for the server", param="metadata")
        if routing_key is not None and not (
            isinstance(routing_key, str) and _ROUTING_KEY.fullmatch(routing_key)
        ):
            raise RequestError(
                f"routing_key: must be 1-{ROUTING_KEY_MAX} visible ASCII characters (no spaces, CR, LF "
                f"or NUL: it travels as the {engine_client.ROUTING_KEY_HEADER} header), "
                f"got {routing_key!r:.80}",
                param="routing_key",
            )
        if session_id is not None and (session_id in self.sessions or len(session_id) < 16):
            raise RequestError("session_id: must be unused and at least 16 characters", param="session_id")
        self.evict_idle()
        if len(self.sessions) >= self.config.max_sessions:
            raise TooManySessionsError(
                f"session server is full: {len(self.sessions)} sessions open (max_sessions="
                f"{self.config.max_sessions}); delete finished sessions or raise --max-sessions"
            )
        now = time.monotonic()
        sid = session_id or mint_session_id(self.instance_tag)
        session = Session(
            sid,
            routing_key or sid,
            dict(metadata or {}),
            time.time(),
            now,
            r3=self.config.r3 if r3 is None else r3,
        )
        self.sessions[sid] = session
        self.metrics.sessions_created.inc()
        self.metrics.sessions_open.set(len(self.sessions))
        if not self.config.template_append_only:
            log.warning("session %s: the chat template is not append-only (--allow-non-append-only)", sid)
        return session

    def get(self, session_id: str) -> Session:
        session = self.sessions.get(session_id)
        if session is not None:
            return session
        why = self._forgotten.get(session_id)
        if why is not None:
            gone = SessionGoneError if why.startswith("expired") else SessionNotFoundError
            raise gone(f"session {session_id} {why}")
        tag = minted_by(session_id)
        if tag is not None and tag != self.instance_tag:
            raise SessionLostError(
                f"session {session_id} was made by another process of this session server (instance "
                f"{tag}..., this one is {self.instance_tag}...): the server restarted and its turns "
                "are lost; open a new session"
            )
        raise SessionNotFoundError(f"session not found: session_id={session_id}")

    def _forget(self, session_id: str, why: str) -> None:
        self.sessions.pop(session_id, None)
        self._forgotten[session_id] = why
        while len(self._forgotten) > _FORGOTTEN_MAX:
            self._forgotten.popitem(last=False)
        self.metrics.sessions_open.set(len(self.sessions))

    def delete(self, session_id: str) -> None:
        self.get(session_id)
        self._forget(session_id, "was deleted")

    def evict_idle(self, now: float | None = None) -> list[str]:
        """Drop sessions idle for longer than the TTL (never one with a turn in flight)."""
        now = time.monotonic() if now is None else now
        ttl = self.config.idle_ttl_s
        idle = [s.id for s in self.sessions.values() if now - s.last_used > ttl and not s.lock.locked()]
        for sid in idle:
            self._forget(sid, f"expired after {ttl:g} s idle (idle TTL); its turns were dropped")
            self.metrics.sessions_expired.inc()
        return idle

    # ---- one turn --------------------------------------------------------------------------

    async def chat(self, session_id: str, body: Any) -> Reply:
        """One chat-completions call: validate, generate, record, reply.

        A request identical to one that produced a recorded turn of this session (a client's retry
        after a timeout or a dropped connection, even one delayed past later turns) gets that
        turn's reply again; nothing is generated, recorded or forked. A call cancelled before its
        turn is recorded leaves the session as it was. New text past `SessionCoreConfig.max_text_chars`
        is refused before anything is rendered; a request with more than INLINE_CHARS of new text is
        hashed, rendered and tokenized on worker threads, so it does not stall the event loop, as are
        a first prompt, a fork and a full render; a small append whose suffix renders after an anchor
        is planned in place. A prompt over the engine's context is refused unsent.
        """
        known = self.sessions.get(session_id)
        held = () if known is None or known.segment is None else known.segment.messages
        request = parse_chat_request(body, held, self.config.max_text_chars)
        large = request.new_chars > INLINE_CHARS
        if large:  # hashed and planned off the loop
            fingerprint = await asyncio.to_thread(request_fingerprint, body)
        else:
            fingerprint = request_fingerprint(body)
        session = self.get(session_id)
        requested_at = time.time()
        async with session.lock:
            session.last_used = time.monotonic()
            recorded = session.replies.get(fingerprint)
            if recorded is not None:
                self.metrics.replays.inc()
                return recorded
            plan = None if large else self._plan_appended(session, request)
            if plan is None:
                plan = await asyncio.get_running_loop().run_in_executor(
                    _BACKGROUND, self._plan, session, request
                )
            self._check_context(plan)
            started = time.monotonic()
            result = await self._generate(session, plan, request)
            turn = self._record(session, plan, result, time.monotonic() - started)
            reply = Reply(
                completion_id=f"chatcmpl-{session.id[:12]}-{turn.index}",
                model=request.model or self.config.model_name,
                parsed=self._parse(turn, result, request),
                finish_reason=turn.finish_reason,
                prompt_tokens=turn.prompt_tokens,
                completion_tokens=len(turn.output_ids),
                cached_tokens=turn.cached_tokens,
            )
            plan.segment.messages = [*request.messages, reply.message()]
            session.replies[fingerprint] = reply
            session.exchanges[turn.index] = Exchange(
                request_timestamp=requested_at,
                timestamp=time.time(),
                new_messages=request.messages[len(request.messages) - plan.new_messages :],
                tools=request.tools,
                sampling_params=self._sampling_params(request),
                completion=reply.completion(),
            )
            session.last_used = time.monotonic()
        return reply

    def _plan_appended(self, session: Session, request: ChatRequest) -> _Plan | None:
        """The plan of an append whose suffix renders after an anchor (the anchor and the new
        messages: about a millisecond), made on the event loop without a thread hand-off; None for
        everything else (first prompts, mismatches, full renders, template errors), which `_plan`
        makes on a worker thread."""
        held = session.segment
        if held is None or not self.tito.renderer.incremental:
            return None
        if find_mismatch(held.messages, request.messages, held.tools, request.tools) is not None:
            return None
        new = request.messages[len(held.messages) :]
        history = request.messages[: len(held.messages)]
        try:
            suffix = self.tito.anchored_suffix(history, new, request.tools, held.tokens)
        except Exception:  # a template error: `_plan` turns it into the request's 400
            return None
        return None if suffix is None else _append(held, suffix, len(new))

    def _check_context(self, plan: _Plan) -> None:
        """A prompt longer than the engine's context is refused here, unsent (the engine would refuse it)."""
        limit = self.config.max_context_tokens
        if limit is not None and len(plan.prompt) > limit:
            raise _over_context(f"{len(plan.prompt)} tokens", limit)

    def _plan(self, session: Session, request: ChatRequest) -> _Plan:
        try:
            return self._plan_tokens(session, request)
        except SessionServerError:
            raise
        except TokenBudgetExceeded as exc:  # over the context: refused before its ids were built
            held = 0 if session.segment is None else len(session.segment.tokens)
            limit = self.config.max_context_tokens or 0  # a budget was set: the context is known
            raise _over_context(f"at least {held + exc.tokens} tokens", limit) from exc
        except Exception as exc:  # a chat template raises anything (TemplateError, TypeError, ...)
            raise RequestError(
                f"messages: the chat template cannot render them: {type(exc).__name__}: {exc}",
                param="messages",
            ) from exc

    def _plan_tokens(self, session: Session, request: ChatRequest) -> _Plan:
        """The turn's plan; a prompt over the context raises TokenBudgetExceeded before its ids
        exist (a 1 MB message's 687K ids cost the event loop tens of milliseconds of GIL)."""
        held = session.segment
        limit = self.config.max_context_tokens
        if held is not None:
            mismatch = find_mismatch(held.messages, request.messages, held.tools, request.tools)
            if mismatch is None:
                new = request.messages[len(held.messages) :]
                room = None if limit is None else max(limit - len(held.tokens), 0)
                try:
                    suffix = self.tito.suffix(
                        request.messages[: len(held.messages)], new, request.tools, held.tokens, room
                    )
                except TemplateNotAppendOnlyError as exc:
                    mismatch = Mismatch(len(held.messages), f"the template is not append-only here: {exc}")
                else:
                    return _append(held, suffix, len(new))
            if self.config.history_mismatch == "reject":
                self.metrics.rejects.inc()
                raise HistoryMismatchError(f"history mismatch: {mismatch.reason}", param="messages")
        else:
            mismatch = None
        try:
            prompt = self.tito.first_prompt(request.messages, request.tools, limit)
        except TokenBudgetExceeded as exc:  # counted from nothing held: a fork's prompt stands alone
            raise _over_context(f"at least {exc.tokens} tokens", exc.max_tokens) from exc
        index = 0 if held is None else held.index + 1
        segment = Segment(index=index, tools=request.tools)
        return _Plan(segment, prompt, list(prompt), mismatch, len(request.messages))

    def _sampling_params(self, request: ChatRequest) -> dict[str, Any]:
        params = request.sampling_params()
        params["no_stop_trim"] = False
        params["stop_token_ids"] = self.tito.stop_token_ids
        return params

    async def _generate(self, session: Session, plan: _Plan, request: ChatRequest) -> GenerateResult:
        try:
            result = await self.backend.generate(
                plan.prompt,
                self._sampling_params(request),
                return_logprob=True,
                return_prompt_token_ids=True,
                return_routed_experts=session.r3,
                routed_experts_start_len=plan.segment.rows,
                rid=f"{session.id}-{len(session.turns)}",
                routing_key=session.routing_key,
                top_logprobs_num=self.config.top_logprobs_num,
            )
        except EngineError as exc:
            raise self._turn_error(session, _engine_fault(exc)) from exc
        problem = self._check_result(plan, result, request, session.r3)
        if problem:
            raise self._turn_error(
                session,
                EngineProtocolError(
                    f"the engine's response breaks the protocol (turn not recorded): {problem}"
                ),
            )
        return result

    def _turn_error(self, session: Session, error: SessionServerError) -> SessionServerError:
        """Count a failed turn and keep it in the session's facts (the turn itself is not recorded)."""
        self.metrics.turn_errors.labels(error.code).inc()
        session.turn_errors.append({"turn": len(session.turns), "status": error.status, "cause": error.code})
        return error

    def _check_result(
        self, plan: _Plan, result: GenerateResult, request: ChatRequest, r3: bool
    ) -> str | None:
        outside = [t for t in result.output_ids if not 0 <= t < self.vocab_size]
        if outside:
            return f"output_ids holds token id {outside[0]}, outside the vocabulary [0, {self.vocab_size})"
        asked = request.max_tokens
        if asked is not None and len(result.output_ids) > asked:
            return f"{len(result.output_ids)} output tokens for max_tokens={asked}"
        sent = len(plan.prompt)
        if result.prompt_tokens != sent:
            return f"meta_info.prompt_tokens is {result.prompt_tokens}, but {sent} input_ids were sent"
        echoed = result.prompt_token_ids
        if echoed is not None and (len(echoed) != sent or echoed != plan.prompt):  # list ==: no arrays
            return "prompt_token_ids differ from the input_ids sent"
        if result.output_logprobs is None:
            return "no output_token_logprobs although return_logprob was set"
        if self.config.top_logprobs_num and result.output_top_ids is None:
            return f"no output_top_logprobs although top_logprobs_num={self.config.top_logprobs_num} was set"
        if result.finish_reason.type not in ("stop", "length", "abort"):
            return f"unknown finish_reason type {result.finish_reason.type!r}"
        if not r3:
            return None
        shape = self.config.routing_shape
        assert shape is not None
        expected = sent + len(result.output_ids) - 1 - plan.segment.rows
        try:
            rows = result.routing_rows(shape.layers, shape.top_k)
        except EngineError as exc:
            return str(exc)
        if len(rows) != expected:
            return (
                f"routed_experts has {len(rows)} rows, expected {expected} "
                f"(prompt {sent} + output {len(result.output_ids)} - 1 "
                f"- routed_experts_start_len {plan.segment.rows})"
            )
        return None

    def _record(self, session: Session, plan: _Plan, result: GenerateResult, latency_s: float) -> TurnRecord:
        segment = plan.segment
        routing = sources = None
        if session.r3:
            shape = self.config.routing_shape
            assert shape is not None
            raw = result.routing_rows(shape.layers, shape.top_k)
            try:
                routing = compact_rows(raw, shape)
            except ValueError as exc:
                why = f"the engine's routing is unusable (turn not recorded): {exc}"
                raise self._turn_error(session, EngineProtocolError(why)) from exc
            sources = row_sources(segment.rows, len(raw), len(plan.prompt), segment.last_output)
        input_start = len(segment.tokens)
        output = result.output_ids
        turn = TurnRecord(
            index=len(session.turns),
            segment=segment.index,
            input_start=input_start,
            input_ids=np.asarray(plan.appended, dtype=np.int32),
            output_ids=np.asarray(output, dtype=np.int32),
            output_logprobs=np.asarray(result.output_logprobs, dtype=np.float32),
            output_top_ids=result.output_top_ids,
            output_top_logprobs=result.output_top_logprobs,
            finish_reason=result.finish_reason.type,
            finish_detail=result.finish_reason.to_json(),
            weight_version=result.weight_version,
            weight_versions=[vars(span) for span in result.weight_versions],
            num_retractions=result.num_retractions,
            prompt_tokens=result.prompt_tokens,
            cached_tokens=result.cached_tokens,
            routing=routing,
            routing_start=segment.rows,
            routing_source=sources,
            routing_wire_bytes=result.routed_experts_wire_bytes,
            latency_s=latency_s,
            routed_worker=result.routed_worker,
            new_messages=plan.new_messages,
        )
        if plan.fork is not None:
            session.forks.append({"turn": turn.index, "segment": segment.index, **plan.fork.to_json()})
            self.metrics.forks.inc()
            log.info("session %s forked at turn %d: %s", session.id, turn.index, plan.fork.reason)
        segment.tokens.extend(plan.appended)
        segment.tokens.extend(output)
        segment.rows += 0 if routing is None else len(routing)
        segment.last_output = range(len(segment.tokens) - len(output), len(segment.tokens))
        segment.pending = self.tito.closing_ids(output)
        session.segment = segment
        session.turns.append(turn)
        self.metrics.record_turn(turn)
        return turn

    def _parse(self, turn: TurnRecord, result: GenerateResult, request: ChatRequest) -> ParsedAssistant:
        text = self.tito.reply_text(result.output_ids, turn.finish_reason, result.finish_reason.matched)
        if request.tool_choice == "none":
            return ParsedAssistant(content=text)
        return self.tito.parse(text)

    # ---- merged samples ------------------------------------------------------------------

    def session_facts(self, session: Session) -> dict[str, Any]:
        shape = self.config.routing_shape
        return {
            "id": session.id,
            "routing_key": session.routing_key,
            "created_at": session.created_at,
            "r3": session.r3,
            "routing_shape": None if shape is None else vars(shape),
            "history_mismatch": self.config.history_mismatch,
            "forks": list(session.forks),
            "turn_errors": list(session.turn_errors),
            "template": dict(self.config.template_facts),
            "template_append_only": self.config.template_append_only,
        }

    def merge_session(self, session: Session) -> MergedSample:
        shape = self.config.routing_shape if session.r3 else None
        sample = merge(
            session.turns,
            session_id=session.id,
            metadata={**session.metadata, SESSION_KEY: self.session_facts(session)},
            routing_tail_shape=None if shape is None else (shape.layers, shape.top_k),
            routing_dtype=None if shape is None else shape.dtype,
        )
        self._check_drift(session, sample)
        return sample

    def _check_drift(self, session: Session, sample: MergedSample) -> None:
        """One canonical render of the final messages vs the merged tokens, into the metadata. When the
        merge kept the segment's turns only up to a cut one (`merge.kept_turns`), the tokens before
        that turn's output are compared (the rest of the messages render after them)."""
        segment = session.segment
        turns = [t for t in session.turns if segment is not None and t.segment == segment.index]
        merged = turns[: len(sample.turns)]
        if segment is None or not merged or len(sample.turns) > len(turns):
            record = not_checked("the merge kept only part of the last segment")
        else:
            finishes = [t.finish_reason for t in merged]
            last, tokens = merged[-1], sample.tokens.tolist()
            output_start = last.input_start + len(last.input_ids) if len(tokens) == last.end else None
            if len(merged) < len(turns) and finishes[-1] == "stop":
                record = not_checked("the merge kept only part of the last segment")
            else:
                record = self.tito.drift(segment.messages, segment.tools, tokens, finishes, output_start)
        sample.metadata[DRIFT_KEY] = record
        self.metrics.record_drift(record)

    def merge_branches(self, session: Session) -> tuple[list[MergedSample], dict[str, Any]]:
        """One merged sample per branch (`merge.branches`) and the session's v2 metadata.

        Each sample's metadata has Miles' `leaf` descriptor (its segment's last turn, that turn's
        parent, the segment's turn ids as `path_node_ids`, the last reply's id); the session
        metadata is `{"session": facts, "tree": Miles' v2 {"nodes", "leaves"}}`
        (`records.tree_metadata`).
        """
        shape = self.config.routing_shape if session.r3 else None
        tree = tree_metadata(session.turns, session.exchanges)
        leaves = {leaf["node_id"]: leaf for leaf in tree["leaves"]}
        nodes = {node["id"]: node for node in tree["nodes"]}
        facts = self.session_facts(session)
        samples = []
        for turns in branches(session.turns, session.forks):
            path = next(leaf for leaf in leaves.values() if turns[0].index in leaf["path_node_ids"])
            leaf = nodes[path["node_id"]]
            descriptor = {
                "node_id": leaf["id"],
                "parent": leaf["parent"],
                "path_node_ids": path["path_node_ids"],
                "response_id": leaf["response_id"],
            }
            samples.append(
                merge(
                    turns,
                    session_id=session.id,
                    metadata={**session.metadata, SESSION_KEY: facts, LEAF_KEY: descriptor},
                    routing_tail_shape=None if shape is None else (shape.layers, shape.top_k),
                    routing_dtype=None if shape is None else shape.dtype,
                )
            )
        return samples, {SESSION_KEY: facts, "tree": tree}

    async def merged_branches(self, session_id: str) -> tuple[list[MergedSample], dict[str, Any]]:
        """`merge_branches` of the session (waits for a turn in flight on it to finish)."""
        session = self.get(session_id)
        async with session.lock:
            session.last_used = time.monotonic()
            return self.merge_branches(session)

    def view(self, session_id: str) -> dict[str, Any]:
        """Miles' `GET /sessions/{id}` body: the active segment's records and metadata (no lock:
        a turn's state changes in one synchronous step, so a read never sees half a turn)."""
        session = self.get(session_id)
        tokens = [] if session.segment is None else session.segment.tokens
        return session_view(
            session.id, session.turns, session.exchanges, session.r3, self.session_facts(session), tokens
        )

    async def merged(self, session_id: str) -> MergedSample:
        """The merged sample (waits for a turn in flight on this session to finish). The merge and
        its drift check (one render of the whole trajectory) run on a worker thread, so the event
        loop keeps serving other sessions' turns meanwhile."""
        session = self.get(session_id)
        async with session.lock:
            session.last_used = time.monotonic()
            return await asyncio.to_thread(self.merge_session, session)

    async def merged_wire(self, session_id: str) -> bytes:
        """The merged sample in the binary wire format (what `/merged` and the pool send)."""
        encoded = wire.encode(await self.merged(session_id))
        self.metrics.merged_bytes.inc(len(encoded))
        return encoded


def _over_context(size: str, limit: int) -> RequestError:
    return RequestError(
        f"messages: the prompt is {size}, over the engine's context of {limit} (--max-context-tokens)",
        param="messages",
    )


def _engine_fault(exc: EngineError) -> SessionServerError:
    """The error an agent gets for a failed engine call. An HTTP error from the engine passes through
    with its status and body (as Miles' session server passes it): a 429 or 5xx stays retryable, a
    4xx says the request fails again. A timeout is 504, a broken answer or a transport failure 502."""
    message = f"the engine failed this turn (not recorded): {exc}"
    if isinstance(exc, engine_client.EngineResponseError):
        return EngineProtocolError(f"the engine's response breaks the protocol (turn not recorded): {exc}")
    if isinstance(exc, engine_client.EngineTimeoutError):
        return EngineTimeoutError(message)
    if exc.status is not None:
        return EngineHTTPError(exc.status, exc.body or "", message)
    return EngineFaultError(message)
