"""The audit's `/run` client: one Harbor `/run` server over HTTP, as a `RunAttempt`.

Owns turning a `/run` exchange into what the audit reads: an answer (HTTP 200), `TaskRejected`
(a 4xx about the task: not found, invalid, path rejected) or `RunFailed` (no answer: connection,
5xx, a body that is not JSON). Also reads the server's agent list (`GET /health`). Nothing is
decided here about the attempt itself: that is the answer's `attempt_class`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx

from rl360_ext.tasks.audit import RunFailed, TaskRejected


def _detail(response: httpx.Response) -> tuple[str, str]:
    try:
        detail = response.json().get("detail")
    except ValueError:
        return "error", response.text[:500]
    if isinstance(detail, list) and detail and isinstance(detail[0], Mapping):
        return str(detail[0].get("type", "error")), str(detail[0].get("msg", ""))
    return "error", str(detail)[:500]


class HarborClient:
    """POST /run for the audit; the client waits `deadline_s` plus `margin_s` for each answer."""

    def __init__(self, url: str, token: str | None = None, margin_s: float = 30.0) -> None:
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.AsyncClient(base_url=url.rstrip("/"), headers=headers, timeout=30.0)
        self._margin_s = margin_s

    async def agents(self) -> list[str]:
        """The agent names the server runs (its /health)."""
        try:
            response = await self._http.get("/health")
            response.raise_for_status()
            return list(response.json()["agents"])
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            raise RunFailed(f"GET /health on the Harbor server failed: {exc}") from exc

    async def __call__(
        self, task: str, agent: str, agent_kwargs: Mapping[str, Any], deadline_s: float
    ) -> Mapping[str, Any]:
        body: dict[str, Any] = {"task": task, "agent": agent, "deadline_s": deadline_s}
        if agent_kwargs:
            body["agent_kwargs"] = dict(agent_kwargs)
        try:
            response = await self._http.post("/run", json=body, timeout=deadline_s + self._margin_s)
        except httpx.HTTPError as exc:
            raise RunFailed(f"{type(exc).__name__}: {exc}") from exc
        if response.status_code == 200:
            try:
                return dict(response.json())
            except ValueError as exc:
                raise RunFailed(f"/run answered 200 without JSON: {response.text[:200]!r}") from exc
        if 400 <= response.status_code < 500 and response.status_code not in (401, 408, 413):
            kind, message = _detail(response)
            raise TaskRejected(response.status_code, kind, message)
        raise RunFailed(f"/run answered HTTP {response.status_code}: {response.text[:200]}")

    async def aclose(self) -> None:
        await self._http.aclose()
