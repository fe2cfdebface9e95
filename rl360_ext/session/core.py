"""The session server's logic, without HTTP: sessions, turns, forced engine flags, delta R3, limits.

Owns the session table (unguessable ids, max sessions, idle TTL), one turn end to end (validate
the request, check the history is an append, build the engine request with the flags no agent
can switch off, call the backend, check what came back, record the turn, build the reply),
per-session serialization, and merging on request. A failed engine call (5xx, transport error,
a response that breaks the protocol) raises `RequestError(502)` and records nothing. It does not
own HTTP (`app.py`), tokenization (`tito.py`), the merge rules (`merge.py`) or the wire bytes
(`wire.py`).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np

from rl360_ext.session import wire
from rl360_ext.session.chat_api import ChatRequest, Reply, RequestError, parse_chat_request
from rl360_ext.session.history import Mismatch, find_mismatch
from rl360_ext.session.merge import MERGE_KEY, MergedSample, TurnRecord, merge
from rl360_ext.session.metrics import SessionMetrics
from rl360_ext.session.routing import RoutingShape, compact_rows, row_sources
from rl360_ext.session.tito import TitoRenderer
from rl360_ext.sglang.client import EngineError, GenerateResult
from rl360_ext.templates.drift import DRIFT_KEY, not_checked
from rl360_ext.templates.parse import ParsedAssistant
from rl360_ext.templates.render import TemplateNotAppendOnlyError

log = logging.getLogger("rl360.session")
SESSION_KEY = "session"  # metadata key of the session's own facts
RESERVED_METADATA_KEYS = (SESSION_KEY, MERGE_KEY)
_FORGOTTEN_MAX = 65536
Message = dict[str, Any]


class Backend(Protocol):
    """What the session calls to generate: `rl360_ext.sglang.client.EngineClient` satisfies it."""

    async def generate(
        self,
        input_ids: list[int],
        sampling_params: dict[str, Any] | None = None,
        *,
        return_logprob: bool = True,
        return_prompt_token_ids: bool = False,
        return_routed_experts: bool = False,
        routed_experts_start_len: int = 0,
        rid: str | None = None,
        routing_key: str | None = None,
    ) -> GenerateResult: ...


@dataclass
class ServerConfig:
    r3: bool = False
    routing_shape: RoutingShape | None = None
    history_mismatch: Literal["fork", "reject"] = "fork"
    max_sessions: int = 4096
    idle_ttl_s: float = 7200.0
    model_name: str = "rl360-policy"
    template_facts: dict[str, Any] = field(default_factory=dict)
    template_append_only: bool = True  # False only when started with --allow-non-append-only

    def __post_init__(self) -> None:
        if self.history_mismatch not in ("fork", "reject"):
            raise ValueError(f"history_mismatch must be fork or reject, got {self.history_mismatch!r}")
        if self.r3 and self.routing_shape is None:
            raise ValueError("R3 needs the routing shape (layers, top_k, num_experts)")
        if self.max_sessions < 1 or self.idle_ttl_s <= 0:
            raise ValueError("max_sessions must be >= 1 and idle_ttl_s > 0")


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


@dataclass
class _Plan:
    segment: Segment
    appended: list[int]
    prompt: list[int]
    fork: Mismatch | None
    new_messages: int


class SessionCore:
    """All sessions of one server. Async methods run on one event loop."""

    def __init__(self, tito: TitoRenderer, backend: Backend, config: ServerConfig | None = None) -> None:
        self.tito = tito
        self.backend = backend
        self.config = config or ServerConfig()
        self.metrics = SessionMetrics()
        self.sessions: dict[str, Session] = {}
        self._forgotten: OrderedDict[str, str] = OrderedDict()

    # ---- session table -------------------------------------------------------------------

    def create(
        self,
        metadata: dict[str, Any] | None = None,
        routing_key: str | None = None,
        session_id: str | None = None,
    ) -> Session:
        if metadata is not None and not isinstance(metadata, dict):
            raise RequestError(400, "metadata: must be a JSON object", param="metadata")
        reserved = [k for k in RESERVED_METADATA_KEYS if k in (metadata or {})]
        if reserved:
            raise RequestError(
                400, f"metadata: keys {reserved} are reserved for the server", param="metadata"
            )
        if routing_key is not None and (not isinstance(routing_key, str) or not routing_key):
            raise RequestError(400, "routing_key: must be a non-empty string", param="routing_key")
        if session_id is not None and (session_id in self.sessions or len(session_id) < 16):
            raise RequestError(
                400, "session_id: must be unused and at least 16 characters", param="session_id"
            )
        self.evict_idle()
        if len(self.sessions) >= self.config.max_sessions:
            raise RequestError(
                429,
                f"session server is full: {len(self.sessions)} sessions open (max_sessions="
                f"{self.config.max_sessions}); delete finished sessions or raise --max-sessions",
                code="too_many_sessions",
            )
        now = time.monotonic()
        sid = session_id or secrets.token_urlsafe(18)
        session = Session(sid, routing_key or sid, dict(metadata or {}), time.time(), now)
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
            raise RequestError(410 if why.startswith("expired") else 404, f"session {session_id} {why}")
        raise RequestError(404, f"unknown session {session_id}", code="unknown_session")

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
        """One chat-completions call: validate, generate, record, reply."""
        request = parse_chat_request(body)
        session = self.get(session_id)
        async with session.lock:
            session.last_used = time.monotonic()
            plan = self._plan(session, request)
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
            session.last_used = time.monotonic()
        return reply

    def _plan(self, session: Session, request: ChatRequest) -> _Plan:
        try:
            return self._plan_tokens(session, request)
        except RequestError:
            raise
        except Exception as exc:  # a chat template raises anything (TemplateError, TypeError, ...)
            raise RequestError(
                400,
                f"messages: the chat template cannot render them: {type(exc).__name__}: {exc}",
                param="messages",
            ) from exc

    def _plan_tokens(self, session: Session, request: ChatRequest) -> _Plan:
        held = session.segment
        if held is not None:
            mismatch = find_mismatch(held.messages, request.messages, held.tools, request.tools)
            if mismatch is None:
                new = request.messages[len(held.messages) :]
                try:
                    suffix = self.tito.suffix(
                        request.messages[: len(held.messages)], new, request.tools, held.tokens
                    )
                except TemplateNotAppendOnlyError as exc:
                    mismatch = Mismatch(len(held.messages), f"the template is not append-only here: {exc}")
                else:
                    appended = [*held.pending, *suffix]
                    return _Plan(held, appended, [*held.tokens, *appended], None, len(new))
            if self.config.history_mismatch == "reject":
                self.metrics.rejects.inc()
                raise RequestError(
                    409, f"history mismatch: {mismatch.reason}", param="messages", code="history_mismatch"
                )
        else:
            mismatch = None
        prompt = self.tito.first_prompt(request.messages, request.tools)
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
                return_routed_experts=self.config.r3,
                routed_experts_start_len=plan.segment.rows,
                rid=f"{session.id}-{len(session.turns)}",
                routing_key=session.routing_key,
            )
        except EngineError as exc:
            cause = "engine_rejected" if exc.is_client_error else "engine_failed"
            status = 400 if exc.is_client_error else 502
            self._turn_error(session, status, cause)
            raise RequestError(
                status, f"the engine failed this turn (not recorded): {exc}", code=cause
            ) from exc
        problem = self._check_result(plan, result)
        if problem:
            self._turn_error(session, 502, "engine_protocol")
            raise RequestError(
                502,
                f"the engine's response breaks the protocol (turn not recorded): {problem}",
                code="engine_protocol",
            )
        return result

    def _turn_error(self, session: Session, status: int, cause: str) -> None:
        """Count a failed turn and keep it in the session's facts (the turn itself is not recorded)."""
        self.metrics.turn_errors.labels(cause).inc()
        session.turn_errors.append({"turn": len(session.turns), "status": status, "cause": cause})

    def _check_result(self, plan: _Plan, result: GenerateResult) -> str | None:
        sent = len(plan.prompt)
        if result.prompt_tokens != sent:
            return f"meta_info.prompt_tokens is {result.prompt_tokens}, but {sent} input_ids were sent"
        echoed = result.prompt_token_ids
        if echoed is not None and (len(echoed) != sent or not np.array_equal(echoed, plan.prompt)):
            return "prompt_token_ids differ from the input_ids sent"
        if result.output_logprobs is None:
            return "no output_token_logprobs although return_logprob was set"
        if result.finish_reason.type not in ("stop", "length", "abort"):
            return f"unknown finish_reason type {result.finish_reason.type!r}"
        if not self.config.r3:
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
        if self.config.r3:
            shape = self.config.routing_shape
            assert shape is not None
            raw = result.routing_rows(shape.layers, shape.top_k)
            try:
                routing = compact_rows(raw, shape)
            except ValueError as exc:
                self._turn_error(session, 502, "engine_protocol")
                raise RequestError(
                    502, f"the engine's routing is unusable (turn not recorded): {exc}"
                ) from exc
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
            finish_reason=result.finish_reason.type,
            finish_detail=result.finish_reason.to_json(),
            weight_version=result.weight_version,
            weight_versions=[vars(span) for span in result.weight_versions],
            prompt_tokens=result.prompt_tokens,
            cached_tokens=result.cached_tokens,
            routing=routing,
            routing_start=segment.rows,
            routing_sources=sources,
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
            "r3": self.config.r3,
            "routing_shape": None if shape is None else vars(shape),
            "history_mismatch": self.config.history_mismatch,
            "forks": list(session.forks),
            "turn_errors": list(session.turn_errors),
            "template": dict(self.config.template_facts),
            "template_append_only": self.config.template_append_only,
        }

    def merge_session(self, session: Session) -> MergedSample:
        shape = self.config.routing_shape if self.config.r3 else None
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
        """One canonical render of the final messages vs the merged tokens, into the metadata."""
        segment = session.segment
        merged = [t for t in session.turns if segment is not None and t.segment == segment.index]
        if segment is None or len(sample.turns) != len(merged):
            record = not_checked("the merge kept only part of the last segment")
        else:
            finishes = [t.finish_reason for t in merged]
            record = self.tito.drift(segment.messages, segment.tools, sample.tokens.tolist(), finishes)
        sample.metadata[DRIFT_KEY] = record
        self.metrics.record_drift(record)

    async def merged(self, session_id: str) -> MergedSample:
        """The merged sample (waits for a turn in flight on this session to finish)."""
        session = self.get(session_id)
        async with session.lock:
            session.last_used = time.monotonic()
            return self.merge_session(session)

    async def merged_wire(self, session_id: str) -> bytes:
        """The merged sample in the binary wire format (what `/merged` and the pool send)."""
        encoded = wire.encode(await self.merged(session_id))
        self.metrics.merged_bytes.inc(len(encoded))
        return encoded
