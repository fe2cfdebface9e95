"""The Harbor /run server's errors: one base class, each subclass carrying its HTTP status.

Owns how a refused request is described: which request field is at fault and which status the
HTTP adapter answers with. Everything the server refuses raises a `HarborRequestError`
subclass (the tree sits under `rl360_ext.errors.Rl360Error`); the adapter
(`rl360_ext.harbor.app`) turns it into FastAPI's validation-error shape
`{"detail": [{"loc": ["body", field], "msg": ..., "type": ...}]}` with `status`. Nothing else
in the server names a status code; `detail` builds that body (the connection guard,
`rl360_ext.harbor.guard`, answers with it too). It does not own what happens to an accepted
attempt (that is an outcome with a `failure_cause`, always HTTP 200).
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any, ClassVar

from rl360_ext.errors import Rl360Error
from rl360_ext.util.text import encodable, shown


class HarborRequestError(Rl360Error, ValueError):
    """A request the server refuses; `field` names the request field at fault."""

    status: ClassVar[HTTPStatus] = HTTPStatus.UNPROCESSABLE_ENTITY
    kind: ClassVar[str] = "value_error"
    location: ClassVar[str] = "body"  # where the field is: "body" or "header"

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def detail(error: HarborRequestError) -> dict[str, Any]:
    """The response body of a refused request, in FastAPI's validation-error shape (a message that
    echoes a string UTF-8 cannot encode is written escaped, so the body always encodes)."""
    msg = str(error) if encodable(str(error)) else shown(str(error), len(str(error)))
    return {"detail": [{"loc": [error.location, error.field], "msg": msg, "type": error.kind}]}


class FieldInvalid(HarborRequestError):
    """A field's value is out of its range or does not fit the server's rules (422)."""


class TaskPathRejected(HarborRequestError):
    """The task name is not a relative path inside the tasks root (400)."""

    status = HTTPStatus.BAD_REQUEST
    kind = "path_rejected"


class TaskNotFound(HarborRequestError):
    """No task with this name under the tasks root (404)."""

    status = HTTPStatus.NOT_FOUND
    kind = "not_found"


class TaskInvalid(HarborRequestError):
    """The task exists but cannot be run: Harbor cannot load it, or a link in it leaves its
    directory (422)."""

    kind = "task_invalid"


class AgentNotAllowed(HarborRequestError):
    """The agent is not one the server was started with (422)."""

    kind = "agent_not_allowed"


class AgentKwargReserved(HarborRequestError):
    """`agent_kwargs` sets a key Harbor or rl360 sets itself (422)."""

    kind = "agent_kwarg_reserved"


class ServerShuttingDown(HarborRequestError):
    """The server is stopping and takes no new attempts (503)."""

    status = HTTPStatus.SERVICE_UNAVAILABLE
    kind = "shutting_down"


class Unauthorized(HarborRequestError):
    """The bearer token is missing or wrong (401)."""

    status = HTTPStatus.UNAUTHORIZED
    kind = "unauthorized"
    location = "header"


class HeaderInvalid(HarborRequestError):
    """A request header the server reads is malformed (400)."""

    status = HTTPStatus.BAD_REQUEST
    location = "header"


class HeadTooLarge(HarborRequestError):
    """The request line or headers are over the server's caps (431, answered by the protocol)."""

    status = HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE
    kind = "header_too_large"
    location = "header"


class BodyInvalid(HarborRequestError):
    """The body is not UTF-8 (400)."""

    status = HTTPStatus.BAD_REQUEST


class BodyTooLarge(HarborRequestError):
    """The body (declared or counted while it streams) is over the server's cap (413)."""

    status = HTTPStatus.REQUEST_ENTITY_TOO_LARGE
    kind = "body_too_large"


class BodyTimeout(HarborRequestError):
    """The body did not arrive within the server's body timeout (408)."""

    status = HTTPStatus.REQUEST_TIMEOUT
    kind = "body_timeout"
