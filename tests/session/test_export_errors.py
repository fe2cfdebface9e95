"""An export the server cannot build (a merge or wire bug) answers its tree's 500 with its code."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from rl360_ext.session.app import create_app
from rl360_ext.session.samples.merge import MergeError
from rl360_ext.session.samples.wire import WireFormatError


@pytest.mark.parametrize(
    ("method", "error", "code"),
    [
        ("merged", MergeError("turn 1 starts at position 3, expected 2"), "merge_failed"),
        ("merged_wire", WireFormatError("routing_source has 2 entries for 3 rows"), "wire_format"),
    ],
)
async def test_a_failed_export_is_a_500_with_its_code(
    make_core: Callable[..., Any], monkeypatch: pytest.MonkeyPatch, method: str, error: Exception, code: str
) -> None:
    core, _ = make_core(r3=False)

    async def broken(session_id: str) -> Any:
        raise error

    monkeypatch.setattr(core, method, broken)
    transport = httpx.ASGITransport(app=create_app(core))
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        fmt = "json" if method == "merged" else "binary"
        response = await client.get(f"/sessions/s/merged?format={fmt}")
    assert response.status_code == 500
    assert response.json() == {"error": str(error), "code": code, "param": None}
