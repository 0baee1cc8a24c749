"""Exceptions: one class per kind of refusal, each carrying the server's error type and message."""

from __future__ import annotations

from typing import Any, Dict, Optional, Type


class ToolpoolError(Exception):
    """A refusal of toolpool's API (an ``{"error": {"type", "message"}}`` body), or a failure to reach it.

    ``status`` is the HTTP status (0 when the server could not be reached), ``type`` the error body's
    machine-readable type (``invalid_request``, ``invalid_params``, ``idempotency_key_reused``, ...),
    ``message`` the server's message, which says what to fix. ``call_id`` names the call an answer was
    about when toolpool could not read its state just then (ask again about that id), ``retry_after``
    is the server's Retry-After in seconds, if any.
    """

    def __init__(self, message: str, *, status: int = 0, type: str = "", call_id: Optional[str] = None,
                 retry_after: Optional[float] = None, body: Optional[Dict[str, Any]] = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.type = type
        self.call_id = call_id
        self.retry_after = retry_after
        self.body = body or {}

    def __str__(self) -> str:
        where = f"HTTP {self.status} " if self.status else ""
        return f"{where}{self.type or 'error'}: {self.message}"


class InvalidRequest(ToolpoolError):
    """400: the request is malformed (a body, a name, a query parameter)."""


class Unauthenticated(ToolpoolError):
    """401: no token, or a token the dispatcher does not know."""


class Forbidden(ToolpoolError):
    """403 with an error body: the token may not do this (approvals need an approver token)."""


class NotFound(ToolpoolError):
    """404: no such call, workspace, snapshot or file for this tenant."""


class Conflict(ToolpoolError):
    """409: the request contradicts what it found (an idempotency key reused, a name taken, a stale digest)."""


class LengthRequired(ToolpoolError):
    """411: the upload must say its length."""


class TooLarge(ToolpoolError):
    """413: the request, or what it would write, is over a size limit."""


class UnsupportedMedia(ToolpoolError):
    """415: the body is of a kind the operation does not take."""


class RangeNotSatisfiable(ToolpoolError):
    """416: the byte range lies outside the file."""


class InvalidParams(ToolpoolError):
    """422: an unknown tool, arguments that fail its schema, or an ask above a ceiling."""


class TenantFull(ToolpoolError):
    """429: the tenant has as many calls in flight as it may; retry after ``retry_after`` seconds."""


class InternalError(ToolpoolError):
    """500: toolpool itself failed."""


class Unavailable(ToolpoolError):
    """503: toolpool could not do it just then (a NATS failover); retry. ``call_id`` names the call."""


class GatewayTimeout(ToolpoolError):
    """504: the operation did not end in time."""


class ConnectionFailed(ToolpoolError):
    """The dispatcher could not be reached, or the connection dropped and could not be resumed."""


class CallNotFinished(ToolpoolError):
    """An operation that runs as a call has not ended: it waits for a person's approval (``result.status``
    is ``pending_approval``) or still runs. ``result`` is the call's envelope; approve it, then wait for it."""

    def __init__(self, result: Any) -> None:
        super().__init__(f"call {result.id} is {result.status}: wait for it (or approve it) and ask again",
                         status=202, type=str(result.status), call_id=result.id)
        self.result = result


class CallDenied(ToolpoolError):
    """An operation that runs as a call was denied by policy or by a person. ``result`` is its envelope,
    whose ``decision`` says which rule and why."""

    def __init__(self, result: Any) -> None:
        d = result.decision
        why = f" by rule {d.rule}: {d.reason}" if d is not None and d.rule else ""
        super().__init__(f"call {result.id} was denied{why}", status=403, type="policy_denied", call_id=result.id)
        self.result = result


_BY_STATUS: Dict[int, Type[ToolpoolError]] = {
    400: InvalidRequest, 401: Unauthenticated, 403: Forbidden, 404: NotFound, 409: Conflict,
    411: LengthRequired, 413: TooLarge, 415: UnsupportedMedia, 416: RangeNotSatisfiable, 422: InvalidParams,
    429: TenantFull, 500: InternalError, 503: Unavailable, 504: GatewayTimeout,
}


def error_from(status: int, body: Any, retry_after: Optional[str] = None) -> ToolpoolError:
    """The exception for an error answer: its class by status, the server's type and message."""
    info = body.get("error") if isinstance(body, dict) else None
    if isinstance(info, dict):
        message, typ = str(info.get("message", "")), str(info.get("type", ""))
    else:
        message, typ = f"HTTP {status} with no error body: {str(body)[:200]}", ""
    cls = _BY_STATUS.get(status, InternalError if status >= 500 else ToolpoolError)
    ra: Optional[float] = None
    if retry_after:
        try:
            ra = float(retry_after)
        except ValueError:
            ra = None
    call_id = body.get("id") if isinstance(body, dict) else None
    return cls(message, status=status, type=typ, call_id=call_id, retry_after=ra,
               body=body if isinstance(body, dict) else None)
