"""Typed answers of toolpool's API, as dataclasses. Fields follow the OpenAPI document
(GET /v1/openapi.json); fields a newer server adds are kept in ``extra`` rather than refused."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field, fields
from typing import Any, Dict, List, Optional

TERMINAL = frozenset({"ok", "error", "timeout", "denied", "cancelled", "expired", "lost"})


def _build(cls: Any, d: Optional[Dict[str, Any]], **nested: Any) -> Any:
    if d is None:
        return None
    names = {f.name for f in fields(cls)}
    kw: Dict[str, Any] = {}
    extra: Dict[str, Any] = {}
    for k, v in d.items():
        if k in nested:
            kw[k] = nested[k](v)
        elif k in names and k != "extra":
            kw[k] = v
        else:
            extra[k] = v
    if "extra" in names:
        kw["extra"] = extra
    return cls(**kw)


class _Model:
    """A dataclass built from an answer's object: unknown keys go to ``extra``."""

    @classmethod
    def from_dict(cls, d: Optional[Dict[str, Any]]) -> Any:
        return _build(cls, d)


@dataclass
class ErrorInfo(_Model):
    type: str = ""
    message: str = ""
    extra: Dict[str, Any] = field(default_factory=dict)


@dataclass
class Decision(_Model):
    """Policy's verdict: ``action`` is allow, ask or deny; ``rule`` and ``reason`` say why."""
    action: str = ""
    rule: str = ""
    reason: str = ""
    clamped: List[str] = field(default_factory=list)
    extra: Dict[str, Any] = field(default_factory=dict)


@dataclass
class Timing(_Model):
    queued_ms: int = 0
    sandbox_ms: int = 0
    run_ms: int = 0
    total_ms: int = 0
    warm: bool = False
    extra: Dict[str, Any] = field(default_factory=dict)


@dataclass
class Usage(_Model):
    max_rss_bytes: int = 0
    cpu_ms: int = 0
    wall_ms: int = 0
    signal: str = ""
    workspace_bytes: int = 0
    extra: Dict[str, Any] = field(default_factory=dict)


@dataclass
class StreamInfo(_Model):
    """A command's full stdout or stderr: ``bytes`` printed, ``kept`` readable by range (read_output)."""
    bytes: int = 0
    kept: int = 0
    extra: Dict[str, Any] = field(default_factory=dict)


@dataclass
class EgressConn(_Model):
    host: str = ""
    port: int = 0
    decision: str = ""
    rule: str = ""
    reason: str = ""
    credential: str = ""
    connections: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    extra: Dict[str, Any] = field(default_factory=dict)


@dataclass
class Result:
    """The result envelope of a call, whatever its state (queued, pending_approval, running, or final)."""
    id: str
    tenant: str = ""
    workspace: str = ""
    tool: str = ""
    status: str = ""
    exit_code: Optional[int] = None
    output: str = ""
    stdout: str = ""
    stderr: str = ""
    truncated: bool = False
    output_bytes: int = 0
    error: Optional[ErrorInfo] = None
    decision: Optional[Decision] = None
    timing: Timing = field(default_factory=Timing)
    usage: Usage = field(default_factory=Usage)
    worker: str = ""
    attempt: int = 0
    image: str = ""
    egress: List[EgressConn] = field(default_factory=list)
    args_digest: str = ""
    cancel_requested: bool = False
    lease_until: str = ""
    trace_id: str = ""
    created_at: str = ""
    deadline: str = ""
    started_at: str = ""
    finished_at: str = ""
    streams: Dict[str, StreamInfo] = field(default_factory=dict)
    extra: Dict[str, Any] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        """The call has ended: its status is final."""
        return self.status in TERMINAL

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def pending_approval(self) -> bool:
        return self.status == "pending_approval"

    @property
    def denied(self) -> bool:
        return self.status == "denied"

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "Result":
        return _build(cls, d, error=ErrorInfo.from_dict, decision=Decision.from_dict,
                      timing=Timing.from_dict, usage=Usage.from_dict,
                      egress=lambda v: [EgressConn.from_dict(e) for e in v or []],
                      streams=lambda v: {k: StreamInfo.from_dict(s) for k, s in (v or {}).items()})


@dataclass
class Event:
    """One Server-Sent Event of a call: ``event`` is status, stdout, stderr, lag, restart, result or error;
    ``id`` the reader's position ("<stdout bytes>.<stderr bytes>.<attempt>"); ``data`` its decoded JSON. A
    restart (the call running again after its worker was lost) starts stdout and stderr over from byte 0."""
    event: str
    id: str
    data: Dict[str, Any]

    @property
    def bytes(self) -> bytes:
        """The output bytes of a stdout or stderr event (text or base64 on the wire), else b""."""
        if "base64" in self.data:
            return base64.b64decode(self.data["base64"])
        return str(self.data.get("text", "")).encode()

    @property
    def text(self) -> str:
        return self.bytes.decode(errors="replace")

    @property
    def result(self) -> Optional[Result]:
        """The final envelope of a result event."""
        return Result.from_dict(self.data) if self.event == "result" else None

    @classmethod
    def parse(cls, event: str, id: str, data: str) -> "Event":
        return cls(event=event, id=id, data=json.loads(data) if data else {})


@dataclass
class Approval(_Model):
    """A call waiting for a person: what it would run and why policy asks."""
    id: str
    tool: str = ""
    workspace: str = ""
    args: Any = None
    args_digest: str = ""
    rule: str = ""
    reason: str = ""
    created_at: str = ""
    expires_at: str = ""
    extra: Dict[str, Any] = field(default_factory=dict)


@dataclass
class PolicyCheck(_Model):
    tool: str
    decision: Optional[Decision] = None
    limits: Dict[str, Any] = field(default_factory=dict)
    would_run: bool = False
    extra: Dict[str, Any] = field(default_factory=dict)


@dataclass
class Snapshot(_Model):
    name: str
    created_at: str = ""
    extra: Dict[str, Any] = field(default_factory=dict)


@dataclass
class Workspace:
    name: str
    bytes: int = 0
    files: int = 0
    created_at: str = ""
    last_used_at: str = ""
    expires_at: str = ""
    snapshots: List[Snapshot] = field(default_factory=list)
    reflinked: Optional[bool] = None
    image: str = ""
    call_id: str = ""
    extra: Dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: Dict[str, Any], call_id: str = "") -> "Workspace":
        w = _build(cls, d, snapshots=lambda v: [Snapshot.from_dict(s) for s in v or []])
        w.call_id = call_id
        return w


@dataclass
class AuditEvent(_Model):
    time: str
    event: str = ""
    tenant: str = ""
    call_id: str = ""
    tool: str = ""
    workspace: str = ""
    args_digest: str = ""
    action: str = ""
    rule: str = ""
    status: str = ""
    error_type: str = ""
    duration_ms: int = 0
    worker: str = ""
    actor: str = ""
    egress: List[EgressConn] = field(default_factory=list)
    extra: Dict[str, Any] = field(default_factory=dict)


def build(cls: Any, d: Optional[Dict[str, Any]], **nested: Any) -> Any:
    """A dataclass of cls from an answer's object (unknown keys go to ``extra``)."""
    return _build(cls, d, **nested)
