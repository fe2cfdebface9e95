"""An async client for SGLang's native HTTP protocol (`/generate` and the weight/pause endpoints).

Owns the request shape (input_ids, sampling_params, the RL flags, the `X-SMG-Routing-Key`
header) and typed results: finish reason, usage, weight versions (and spans when weights changed
mid-request), output logprobs, and `routed_experts` decoded from base64 of little-endian int32.
It talks to one base URL, which may be an engine or the SMG gateway in front of engines. It does
not own retries (beyond re-sending what a stale pooled connection dropped unanswered, below),
session state or what a caller does with the results.

The transport is one aiohttp session per event loop (its connection pool hands out an idle
keep-alive connection in O(1); httpx's scans every pooled connection per request, which cost a
session server at 256 concurrent sessions more CPU than everything else it did). A request the
server drops unanswered on a pooled connection (its keep-alive closed it) is sent again, at most
STALE_RETRIES times: no answer means the engine did not run it to an answer. A caller may pass
its own `httpx.AsyncClient` instead (tests with a mock transport). Either way the whole
`timeout_s` covers connecting and waiting for a pooled connection: no shorter connect limit.
"""

from __future__ import annotations

import asyncio
import binascii
import errno
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import httpx
import numpy as np
import orjson
import pybase64

from rl360_ext.errors import Rl360Error
from rl360_ext.sglang.top_logprobs import (
    OUTPUT_TOP_LOGPROBS,
    TOP_LOGPROBS_NUM,
    TopLogprobsError,
    parse_output_top_logprobs,
)

ROUTING_KEY_HEADER = "X-SMG-Routing-Key"
ROUTED_WORKER_HEADER = "x-smg-routed-worker-id"
KEEPALIVE_S = 4.0  # idle pooled connections close before uvicorn's (SGLang's server) 5 s keep-alive does
# A pooled connection the server closed (its keep-alive ran out while this side's loop lagged under
# load) fails the request before any answer: send it again, on another connection, this often.
STALE_RETRIES = 2


class EngineError(Rl360Error, RuntimeError):
    """The engine (or gateway) failed: `status` is the HTTP status, None for a transport error."""

    def __init__(self, message: str, status: int | None = None, body: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.body = body

    @property
    def is_client_error(self) -> bool:
        """The engine rejected the request itself (4xx); retrying the same body will not help."""
        return self.status is not None and 400 <= self.status < 500

    @property
    def is_overloaded(self) -> bool:
        """The engine answered 429 (too many requests): the same body may succeed later."""
        return self.status == 429


class EngineResponseError(EngineError):
    """The engine answered 200 with a body that does not follow the protocol."""


class EngineTimeoutError(EngineError):
    """No answer (or no connection) within the client's timeout."""


@dataclass(frozen=True)
class FinishReason:
    """`meta_info.finish_reason`: type is "stop", "length" or "abort"."""

    type: str
    matched: int | str | None = None
    length: int | None = None
    message: str | None = None

    @classmethod
    def from_json(cls, value: Any) -> FinishReason:
        if value is None:
            raise EngineResponseError("meta_info.finish_reason is missing")
        if isinstance(value, str):
            return cls(type=value)
        if not isinstance(value, dict) or not isinstance(value.get("type"), str):
            raise EngineResponseError(f"meta_info.finish_reason has an unexpected shape: {value!r}")
        return cls(
            type=value["type"],
            matched=value.get("matched"),
            length=value.get("length"),
            message=value.get("message"),
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type}
        for name in ("matched", "length", "message"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out


@dataclass(frozen=True)
class WeightSpan:
    """Output positions [start, end) generated with weight `version`."""

    version: str
    start: int
    end: int


def decode_routed_experts(encoded: str) -> np.ndarray:
    """Base64 of raw little-endian int32 -> a flat int32 array (a view on the decoded bytes).

    pybase64's validating SIMD decoder: about 40x the stdlib's on a turn's rows (its
    non-validating mode takes a slow path). A character outside the base64 alphabet is refused."""
    try:
        raw = pybase64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise EngineResponseError(f"routed_experts is not valid base64: {exc}") from exc
    if len(raw) % 4:
        raise EngineResponseError(f"routed_experts decodes to {len(raw)} bytes, not a multiple of 4 (int32)")
    return np.frombuffer(raw, dtype="<i4")


@dataclass
class GenerateResult:
    """One `/generate` response, typed."""

    text: str
    output_ids: list[int]
    finish_reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    weight_version: str | None
    weight_versions: list[WeightSpan]
    output_logprobs: np.ndarray | None  # float64 [completion_tokens], None if not asked for
    prompt_token_ids: list[int] | None
    routed_experts: np.ndarray | None  # flat int32, None if not asked for / not returned
    routed_experts_start_len: int
    routed_experts_wire_bytes: int  # length of the base64 text the engine sent
    request_id: str | None
    latency_s: float | None
    routed_worker: str | None = None
    meta_info: dict[str, Any] = field(default_factory=dict, repr=False)
    num_retractions: int = 0  # times the engine retracted the request (SGLang meta_info.num_retractions)
    output_top_ids: np.ndarray | None = None  # int32 [completion_tokens, k] (`top_logprobs_num` asked)
    output_top_logprobs: np.ndarray | None = None  # float32 [completion_tokens, k]

    @property
    def expected_routing_rows(self) -> int:
        """Rows the protocol promises: prompt + output - 1 - routed_experts_start_len."""
        return max(self.prompt_tokens + self.completion_tokens - 1 - self.routed_experts_start_len, 0)

    def routing_rows(self, num_layers: int, top_k: int) -> np.ndarray:
        """routed_experts as [rows, num_layers, top_k] int32; raises if the size does not fit."""
        if self.routed_experts is None:
            raise EngineResponseError(
                "the engine returned no routed_experts (was it started with R3 enabled?)"
            )
        per_row = num_layers * top_k
        if per_row <= 0 or self.routed_experts.size % per_row:
            raise EngineResponseError(
                f"routed_experts has {self.routed_experts.size} int32 values, "
                f"not a multiple of layers*top_k = {num_layers}*{top_k}"
            )
        return self.routed_experts.reshape(-1, num_layers, top_k)

    @classmethod
    def from_json(
        cls,
        body: Any,
        routed_experts_start_len: int = 0,
        routed_worker: str | None = None,
        top_logprobs_num: int = 0,
    ) -> GenerateResult:
        if not isinstance(body, dict):
            raise EngineResponseError(f"/generate returned {type(body).__name__}, expected one JSON object")
        meta = body.get("meta_info")
        if not isinstance(meta, dict):
            raise EngineResponseError("/generate response has no meta_info object")
        output_ids = body.get("output_ids")
        if not isinstance(output_ids, list):
            raise EngineResponseError("/generate response has no output_ids list")
        logprobs = _output_logprobs(meta.get("output_token_logprobs"), output_ids)
        encoded = meta.get("routed_experts", body.get("routed_experts"))
        routed = decode_routed_experts(encoded) if isinstance(encoded, str) else None
        spans = [
            WeightSpan(str(s["version"]), int(s["start"]), int(s["end"]))
            for s in meta.get("weight_versions") or []
            if isinstance(s, dict)
        ]
        version = meta.get("weight_version")
        top_ids = top_values = None
        if top_logprobs_num and meta.get(OUTPUT_TOP_LOGPROBS) is not None:
            try:
                top_ids, top_values = parse_output_top_logprobs(
                    meta[OUTPUT_TOP_LOGPROBS], len(output_ids), top_logprobs_num
                )
            except TopLogprobsError as exc:
                raise EngineResponseError(str(exc)) from exc
        return cls(
            text=body.get("text") or "",
            output_ids=[int(t) for t in output_ids],
            finish_reason=FinishReason.from_json(meta.get("finish_reason")),
            prompt_tokens=int(meta.get("prompt_tokens", 0)),
            completion_tokens=int(meta.get("completion_tokens", len(output_ids))),
            cached_tokens=int(meta.get("cached_tokens", 0) or 0),
            weight_version=None if version is None else str(version),
            weight_versions=spans,
            output_logprobs=logprobs,
            prompt_token_ids=body.get("prompt_token_ids"),
            routed_experts=routed,
            routed_experts_start_len=routed_experts_start_len,
            routed_experts_wire_bytes=len(encoded) if isinstance(encoded, str) else 0,
            request_id=meta.get("id"),
            latency_s=meta.get("e2e_latency"),
            routed_worker=routed_worker,
            meta_info=meta,
            num_retractions=int(meta.get("num_retractions", 0) or 0),
            output_top_ids=top_ids,
            output_top_logprobs=top_values,
        )


def _output_logprobs(entries: Any, output_ids: list[int]) -> np.ndarray | None:
    if entries is None:
        return None
    if not isinstance(entries, list) or len(entries) != len(output_ids):
        got = len(entries) if isinstance(entries, list) else type(entries).__name__
        raise EngineResponseError(
            f"meta_info.output_token_logprobs has {got} entries for {len(output_ids)} output tokens"
        )
    values = np.empty(len(entries), dtype=np.float64)
    for i, (entry, token) in enumerate(zip(entries, output_ids, strict=True)):
        if entry[1] != token:
            raise EngineResponseError(
                f"output_token_logprobs[{i}] is for token {entry[1]}, but output_ids[{i}] is {token}"
            )
        values[i] = entry[0]
    return values


@dataclass(frozen=True)
class EngineReply:
    """One HTTP answer from the engine: status, headers (case-insensitive lookup) and raw body."""

    status_code: int
    headers: Mapping[str, str]
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def json(self) -> Any:
        """The body parsed as JSON; ValueError if it is not JSON."""
        return orjson.loads(self.content)


class EngineClient:
    """Async client for one SGLang-protocol base URL (an engine or the SMG gateway)."""

    def __init__(
        self,
        base_url: str,
        timeout_s: float = 3600.0,
        max_connections: int = 1024,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.max_connections = max_connections
        # total covers connecting and waiting for a pooled connection: no shorter connect limit
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._httpx = client  # the caller's: used as given and never closed here
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def __aenter__(self) -> EngineClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        session, self._session, self._loop = self._session, None, None
        if session is not None and not session.closed:
            await session.close()

    def _http(self) -> aiohttp.ClientSession:
        """This loop's session (created on first use; a session is bound to the loop it was made in)."""
        loop = asyncio.get_running_loop()
        if self._session is None or self._session.closed or self._loop is not loop:
            connector = aiohttp.TCPConnector(
                limit=self.max_connections, keepalive_timeout=KEEPALIVE_S, ttl_dns_cache=None
            )
            self._session = aiohttp.ClientSession(
                connector=connector, timeout=self.timeout, cookie_jar=aiohttp.DummyCookieJar()
            )
            self._loop = loop
        return self._session

    async def _post(self, path: str, payload: Any, headers: dict[str, str] | None = None) -> EngineReply:
        headers = {"Content-Type": "application/json", **(headers or {})}
        return await self._request("POST", path, content=orjson.dumps(payload), headers=headers)

    async def _get(self, path: str) -> EngineReply:
        return await self._request("GET", path)

    async def _request(
        self, method: str, path: str, content: bytes | None = None, headers: dict[str, str] | None = None
    ) -> EngineReply:
        """The answer, or an EngineError naming the request for a transport failure or HTTP >= 400."""
        url = self.base_url + path
        if self._httpx is not None:
            reply = await self._send_httpx(method, url, content, headers)
        else:
            reply = await self._send(method, url, content, headers)
        if reply.status_code >= 400:
            raise EngineError(
                f"{method} {url} returned HTTP {reply.status_code}: {reply.text[:500]}",
                status=reply.status_code,
                body=reply.text,
            )
        return reply

    async def _send(
        self, method: str, url: str, content: bytes | None, headers: dict[str, str] | None
    ) -> EngineReply:
        try:
            for attempt in range(STALE_RETRIES + 1):
                try:
                    async with self._http().request(method, url, data=content, headers=headers) as response:
                        body = await response.read()
                        return EngineReply(response.status, response.headers, body)
                except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
                    if attempt == STALE_RETRIES or not _closed_before_answering(exc):
                        raise
            raise AssertionError("unreachable: the last attempt returns or raises")
        except TimeoutError as exc:
            raise EngineTimeoutError(f"{method} {url} timed out: {type(exc).__name__}: {exc}") from exc
        except aiohttp.ClientError as exc:
            raise EngineError(f"{method} {url} failed: {type(exc).__name__}: {exc}") from exc

    async def _send_httpx(
        self, method: str, url: str, content: bytes | None, headers: dict[str, str] | None
    ) -> EngineReply:
        assert self._httpx is not None
        try:
            response = await self._httpx.request(method, url, content=content, headers=headers)
        except httpx.TimeoutException as exc:
            raise EngineTimeoutError(f"{method} {url} timed out: {type(exc).__name__}: {exc}") from exc
        except httpx.HTTPError as exc:
            raise EngineError(f"{method} {url} failed: {type(exc).__name__}: {exc}") from exc
        return EngineReply(response.status_code, response.headers, response.content)

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
        top_logprobs_num: int = 0,
    ) -> GenerateResult:
        """POST /generate with token IDs in; `routing_key` goes in the X-SMG-Routing-Key header;
        `top_logprobs_num` > 0 asks SGLang's top-k log-probs per output token."""
        payload: dict[str, Any] = {
            "input_ids": list(input_ids),
            "sampling_params": dict(sampling_params or {}),
            "return_logprob": return_logprob,
            "logprob_start_len": -1,
            "return_prompt_token_ids": return_prompt_token_ids,
        }
        if return_routed_experts:
            payload["return_routed_experts"] = True
            payload["routed_experts_start_len"] = int(routed_experts_start_len)
        if rid is not None:
            payload["rid"] = rid
        if top_logprobs_num:
            payload[TOP_LOGPROBS_NUM] = int(top_logprobs_num)
        headers = {ROUTING_KEY_HEADER: routing_key} if routing_key else None
        response = await self._post("/generate", payload, headers)
        try:
            body = orjson.loads(response.content)
        except orjson.JSONDecodeError as exc:
            raise EngineResponseError(
                f"/generate returned a body that is not JSON: {response.text[:200]}"
            ) from exc
        return GenerateResult.from_json(
            body,
            routed_experts_start_len=routed_experts_start_len if return_routed_experts else 0,
            routed_worker=response.headers.get(ROUTED_WORKER_HEADER),
            top_logprobs_num=top_logprobs_num if return_logprob else 0,
        )

    async def update_weights_from_disk(
        self, model_path: str, weight_version: str | None = None, flush_cache: bool = True
    ) -> dict[str, Any]:
        payload: dict[str, Any] = {"model_path": model_path, "flush_cache": flush_cache}
        if weight_version is not None:
            payload["weight_version"] = weight_version
        return (await self._post("/update_weights_from_disk", payload)).json()

    async def pause_generation(self, mode: str = "abort") -> dict[str, Any]:
        if mode not in ("abort", "retract", "in_place"):
            raise ValueError(f"pause mode must be abort, retract or in_place, got {mode!r}")
        return _json_or_text(await self._post("/pause_generation", {"mode": mode}))

    async def continue_generation(self) -> dict[str, Any]:
        return _json_or_text(await self._post("/continue_generation", {}))

    async def update_weight_version(
        self, new_version: str, abort_all_requests: bool = False
    ) -> dict[str, Any]:
        payload = {"new_version": new_version, "abort_all_requests": abort_all_requests}
        return _json_or_text(await self._post("/update_weight_version", payload))

    async def _get_either(self, path: str, legacy: str) -> dict[str, Any]:
        """GET `path`, or the legacy path on a 404 (the SMG gateway serves only the legacy one)."""
        try:
            return (await self._get(path)).json()
        except EngineError as exc:
            if exc.status != 404:
                raise
        return (await self._get(legacy)).json()

    async def model_info(self) -> dict[str, Any]:
        return await self._get_either("/model_info", "/get_model_info")

    async def server_info(self) -> dict[str, Any]:
        return await self._get_either("/server_info", "/get_server_info")

    async def health(self) -> bool:
        try:
            await self._get("/health")
        except EngineError:
            return False
        return True


def _closed_before_answering(exc: aiohttp.ClientError) -> bool:
    """The server closed or reset the connection before it sent any answer (a stale pooled one)."""
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return True
    return isinstance(exc, aiohttp.ClientOSError) and exc.errno in (errno.ECONNRESET, errno.EPIPE)


def _json_or_text(response: EngineReply) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        return {"text": response.text}
    return body if isinstance(body, dict) else {"value": body}
