"""Miles' `MockSGLangServer` extended (never patched) with what real SGLang also serves.

Owns `sglang_like_mock`: the mock's `/generate` also returns `output_ids` (real SGLang does; the
mock leaves it out, and rl360's session server reads it) and it serves `/v1/models` naming
`MOCK_MODEL` (as SGLang names its served model; the session server names it in its replies).
Imports Miles lazily: without MILES_SRC nothing here runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rl360_ext.util.procs import free_port

MOCK_MODEL = "mock-model"  # the model id Miles' mock names in its chat replies


def sglang_like_mock(tokenizer: str, process_fn: Callable[[str], Any]) -> Any:
    """A started-to-be `MockSGLangServer` subclass instance on a free loopback port (call start())."""
    from fastapi.responses import JSONResponse
    from miles.utils.test_utils.mock_sglang_server import MockSGLangServer

    class SGLangLikeMock(MockSGLangServer):
        def _setup_routes(self) -> None:
            super()._setup_routes()

            @self.app.get("/v1/models")
            async def models() -> JSONResponse:
                return JSONResponse({"object": "list", "data": [{"id": MOCK_MODEL, "object": "model"}]})

        def _compute_generate_response(self, payload: dict[str, Any]) -> dict[str, Any]:
            response = super()._compute_generate_response(payload)
            response["output_ids"] = [token for _, token in response["meta_info"]["output_token_logprobs"]]
            return response

    return SGLangLikeMock(model_name=tokenizer, process_fn=process_fn, host="127.0.0.1", port=free_port())
