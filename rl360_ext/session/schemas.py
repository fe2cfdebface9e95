"""Request bodies of the session server's routes as pydantic models, for `/openapi.json` only.

Owns the documented shape of each body (`POST /sessions`, chat completions, `POST .../samples`),
so a schema-driven client or fuzzer can reach every route. The server does not validate with
them: `chat_api.parse_chat_request`, `core.SessionCore.create` and `miles_wire.parse_samples_request`
do, with 4xx errors that name the field; these models describe what those accept.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Role = Literal["system", "user", "assistant", "tool"]


class CreateSessionRequest(BaseModel):
    """`POST /sessions` (the body may be empty)."""

    model_config = ConfigDict(extra="forbid")
    metadata: dict[str, Any] | None = Field(None, description="Copied into the merged sample's metadata.")
    routing_key: str | None = Field(
        None,
        min_length=1,
        max_length=256,
        pattern=r"^[\x21-\x7e]+$",
        description="X-SMG-Routing-Key of every turn (visible ASCII); default: the session id.",
    )


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str
    arguments: str | dict[str, Any]


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: str | None = None
    type: str | None = None
    function: FunctionCall


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Role
    content: str | list[ContentPart] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    reasoning_content: str | None = None


class ToolFunction(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Tool(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str | None = "function"
    function: ToolFunction


class ChatCompletionRequest(BaseModel):
    """`POST /sessions/{id}/v1/chat/completions`: OpenAI's body; the fields rl360 reads are listed."""

    model_config = ConfigDict(extra="allow")
    messages: list[ChatMessage] = Field(min_length=1)
    model: str | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    n: Literal[1] | None = None
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    stream: bool = False


class SamplesRequest(BaseModel):
    """`POST /sessions/{id}/samples` (the body may be empty)."""

    model_config = ConfigDict(extra="forbid")
    max_seq_len: int | None = Field(None, ge=1, description="Cut the trajectory at this many tokens.")
    metadata: dict[str, Any] | None = None


REQUEST_MODELS: tuple[type[BaseModel], ...] = (CreateSessionRequest, ChatCompletionRequest, SamplesRequest)


def request_body(model: type[BaseModel], required: bool = True) -> dict[str, Any]:
    """A route's `openapi_extra` naming `model` (in components/schemas) as its JSON body."""
    schema = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": required, "content": {"application/json": {"schema": schema}}}}


def add_request_schemas(openapi: dict[str, Any]) -> dict[str, Any]:
    """Put every request model (and the models it nests) into `openapi`'s components/schemas."""
    schemas = openapi.setdefault("components", {}).setdefault("schemas", {})
    for model in REQUEST_MODELS:
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
    return openapi
