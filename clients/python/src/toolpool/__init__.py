"""toolpool: run AI agents' tool calls in sandboxes, under policy, with approvals.

    from toolpool import Client
    tp = Client()                      # $TOOLPOOL_URL (http://127.0.0.1:8080), $TOOLPOOL_TOKEN (dev)
    res = tp.call("run_shell", {"command": "echo hi"}, workspace="ws1")
    print(res.status, res.stdout)

:class:`Client` is synchronous; :class:`AsyncClient` has the same methods as coroutines (and ``events``
and ``stream`` as async iterators). Only the standard library is needed.
"""

from .aio import AsyncClient
from .agents import anthropic_tool_result, openai_tool_message, run_anthropic_tool_use, run_openai_tool_call
from .client import Client, tar_directory
from .errors import (CallDenied, CallNotFinished, Conflict, ConnectionFailed, Forbidden, GatewayTimeout,
                     InternalError, InvalidParams, InvalidRequest, LengthRequired, NotFound,
                     RangeNotSatisfiable, TenantFull, ToolpoolError, TooLarge, Unauthenticated, Unavailable,
                     UnsupportedMedia)
from .models import (Approval, AuditEvent, Decision, EgressConn, ErrorInfo, Event, PolicyCheck, Result,
                     Snapshot, StreamInfo, Timing, Usage, Workspace)

__version__ = "0.1.0"

__all__ = [
    "Client", "AsyncClient", "tar_directory",
    "anthropic_tool_result", "openai_tool_message", "run_anthropic_tool_use", "run_openai_tool_call",
    "ToolpoolError", "InvalidRequest", "Unauthenticated", "Forbidden", "NotFound", "Conflict", "LengthRequired",
    "TooLarge", "UnsupportedMedia", "RangeNotSatisfiable", "InvalidParams", "TenantFull", "InternalError",
    "Unavailable", "GatewayTimeout", "ConnectionFailed", "CallNotFinished", "CallDenied",
    "Approval", "AuditEvent", "Decision", "EgressConn", "ErrorInfo", "Event", "PolicyCheck", "Result",
    "Snapshot", "StreamInfo", "Timing", "Usage", "Workspace",
]
