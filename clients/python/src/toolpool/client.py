"""The synchronous client. Standard library only: http.client, json, tarfile."""

from __future__ import annotations

import http.client
import io
import json
import os
import socket
import tarfile
import time
import uuid
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union
from urllib.parse import quote, urlencode, urlsplit

from .errors import CallDenied, CallNotFinished, ConnectionFailed, ToolpoolError, error_from
from .models import Approval, AuditEvent, Decision, EgressConn, Event, PolicyCheck, Result, Workspace, build

DEFAULT_URL = "http://127.0.0.1:8080"

# The errors of a connection that dropped or could not be made: a request that is safe to repeat is
# repeated, and a stream resumes from the last event received.
_DROPPED = (ConnectionError, socket.timeout, TimeoutError, http.client.HTTPException, OSError)


class _Response:
    """An answer: status, headers (lower-case names) and body, or the open response of a stream."""

    def __init__(self, status: int, headers: Dict[str, str], body: bytes, raw: Any = None, conn: Any = None):
        self.status, self.headers, self.body, self.raw, self.conn = status, headers, body, raw, conn

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


class Client:
    """A client of one toolpool dispatcher for one token.

    ``url`` defaults to $TOOLPOOL_URL, else http://127.0.0.1:8080; ``token`` to $TOOLPOOL_TOKEN, else
    "dev" (what ``make run`` configures). ``retries`` bounds how many times in a row a dropped connection
    is retried (with backoff) before :class:`ConnectionFailed` is raised; ``timeout`` is the socket
    timeout of one request, beyond the time the server is asked to wait.

    Refusals raise a :class:`ToolpoolError` subclass by kind (``InvalidParams`` for an unknown tool or
    bad arguments, ``Conflict``, ...), carrying the server's type and message. A call's answer is always
    its :class:`Result`, whatever its status: a call policy denied is a Result with status ``denied``.
    """

    def __init__(self, url: Optional[str] = None, token: Optional[str] = None, *, timeout: float = 60.0,
                 retries: int = 5, workspace: Optional[str] = None) -> None:
        self.url = (url or os.environ.get("TOOLPOOL_URL") or DEFAULT_URL).rstrip("/")
        self.token = token if token is not None else os.environ.get("TOOLPOOL_TOKEN", "dev")
        self.timeout = timeout
        self.retries = retries
        self.workspace = workspace
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"url {self.url!r} is not an http:// or https:// URL: give e.g. {DEFAULT_URL}")
        self._scheme, self._host, self._port = parts.scheme, parts.hostname, parts.port
        self._base = parts.path.rstrip("/")

    # -- transport ---------------------------------------------------------------------------------

    def _connect(self, timeout: float) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self._scheme == "https" else http.client.HTTPConnection
        return cls(self._host, self._port, timeout=timeout)

    def _send(self, method: str, path: str, *, query: Optional[Dict[str, Any]] = None, body: Any = None,
              headers: Optional[Dict[str, str]] = None, wait: float = 0.0, stream: bool = False) -> _Response:
        """One request, no retry. A stream's answer is left open (``raw``) when it is 200."""
        q = {k: v for k, v in (query or {}).items() if v is not None}
        target = self._base + path + ("?" + urlencode(q) if q else "")
        h = {"Authorization": f"Bearer {self.token}", "User-Agent": "toolpool-python/0.1"}
        data: Optional[bytes] = None
        if isinstance(body, (bytes, bytearray)):
            data = bytes(body)
            h.setdefault("Content-Type", "application/octet-stream")
        elif body is not None:
            data = json.dumps(body).encode()
            h["Content-Type"] = "application/json"
        h.update(headers or {})
        conn = self._connect(self.timeout + wait)
        try:
            conn.request(method, target, body=data, headers=h)
            resp = conn.getresponse()
            hdrs = {k.lower(): v for k, v in resp.getheaders()}
            if stream and resp.status == 200:
                return _Response(resp.status, hdrs, b"", raw=resp, conn=conn)
            payload = resp.read()
        except BaseException:
            conn.close()
            raise
        conn.close()
        return _Response(resp.status, hdrs, payload)

    def _request(self, method: str, path: str, *, retry: bool = True, ok: Tuple[int, ...] = (200,),
                 **kw: Any) -> _Response:
        """A request, repeated after a dropped connection (or a 503 with Retry-After) when retry is true;
        an answer whose status is not in ok (and is not a call's envelope) raises its error."""
        attempt = 0
        while True:
            try:
                r = self._send(method, path, **kw)
            except _DROPPED as e:
                attempt += 1
                if not retry or attempt > self.retries:
                    raise ConnectionFailed(f"{method} {path}: {e}") from e
                time.sleep(min(0.2 * 2 ** attempt, 5.0))
                continue
            if r.status == 503 and retry and attempt < self.retries and "retry-after" in r.headers:
                attempt += 1
                time.sleep(min(float(r.headers.get("retry-after", "1") or 1), 5.0))
                continue
            if r.status in ok:
                return r
            raise error_from(r.status, _json_or_text(r.body), r.headers.get("retry-after"))

    def _envelope(self, method: str, path: str, **kw: Any) -> Result:
        """A request answered with a call's envelope (200, 202, or 403 for a denied call)."""
        r = self._request(method, path, ok=(200, 202, 403), **kw)
        body = r.json()
        if r.status == 403 and not _is_envelope(body):
            raise error_from(r.status, body, r.headers.get("retry-after"))
        return Result.from_dict(body)

    # -- calls -------------------------------------------------------------------------------------

    def call(self, tool: str, args: Optional[Dict[str, Any]] = None, *, workspace: Optional[str] = None,
             wait: bool = True, timeout: Optional[float] = None, idempotency_key: Optional[str] = None,
             **limits: Any) -> Result:
        """Run a tool and return its Result.

        With ``wait`` (the default) it waits until the call ends or waits for a person (status
        ``pending_approval``: approve it, then :meth:`wait`), at most ``timeout`` seconds when given (then
        the Result says queued or running). ``limits`` are the request's other fields: timeout_ms,
        deadline_ms, output_bytes, memory_bytes, cpu_millis, pids, tmp_bytes, image, tools. Every call
        carries an idempotency key (a fresh one unless given), so a connection dropped while it is
        submitted is retried without running it twice.
        """
        body = self._call_body(tool, args, workspace, idempotency_key, limits)
        body["wait"] = False
        deadline = None if timeout is None else time.monotonic() + timeout
        res = self._envelope("POST", "/v1/calls", body=body)
        if not wait:
            return res
        while not res.done and not res.pending_approval:
            left = 30.0 if deadline is None else min(_wait_bound(deadline), 30.0)
            if left <= 0:
                break
            res = self.get(res.id, wait=left)
        return res

    def submit(self, tool: str, args: Optional[Dict[str, Any]] = None, **kw: Any) -> Result:
        """Queue a call and return at once (status queued, pending_approval, or denied)."""
        return self.call(tool, args, wait=False, **kw)

    def _call_body(self, tool: str, args: Optional[Dict[str, Any]], workspace: Optional[str],
                   key: Optional[str], limits: Dict[str, Any]) -> Dict[str, Any]:
        body: Dict[str, Any] = {"tool": tool, "args": args if args is not None else {},
                                "idempotency_key": key or "py-" + uuid.uuid4().hex}
        ws = workspace or self.workspace
        if ws:
            body["workspace"] = ws
        body.update({k: v for k, v in limits.items() if v is not None})
        return body

    def get(self, call_id: str, *, wait: Optional[float] = None) -> Result:
        """A call's envelope now, or after waiting up to ``wait`` seconds for it to end."""
        q = {"wait": f"{int(wait * 1000)}ms"} if wait else None
        return self._envelope("GET", f"/v1/calls/{_seg(call_id)}", query=q, wait=wait or 0.0)

    def wait(self, call_id: str, timeout: Optional[float] = None) -> Result:
        """Wait for a call to end (long polls, resumed after a dropped connection); at most ``timeout``
        seconds when given. A call waiting for approval is waited for too: until a person decides."""
        deadline = None if timeout is None else time.monotonic() + timeout
        res = self.get(call_id)
        while not res.done:
            left = 30.0 if deadline is None else min(_wait_bound(deadline), 30.0)
            if left <= 0:
                break
            res = self.get(call_id, wait=left)
        return res

    def cancel(self, call_id: str) -> Result:
        """Cancel a queued or parked call, or kill a running call's container; its envelope after."""
        return self._envelope("DELETE", f"/v1/calls/{_seg(call_id)}")

    # -- output ------------------------------------------------------------------------------------

    def events(self, call_id: str, *, last_event_id: Optional[str] = None,
               stop_at_approval: bool = False) -> Iterator[Event]:
        """The call's Server-Sent Events until its ``result`` event: status changes, stdout and stderr as
        printed, lag notes. A dropped connection is resumed from the last event received (Last-Event-ID),
        so no output byte is lost or repeated. With ``stop_at_approval`` the iteration ends at a
        ``status`` event that says pending_approval instead of waiting for a person's decision."""
        yield from self._follow(call_id, last_event_id, None, stop_at_approval)

    def stream(self, tool: str, args: Optional[Dict[str, Any]] = None, *, workspace: Optional[str] = None,
               idempotency_key: Optional[str] = None, stop_at_approval: bool = True,
               **limits: Any) -> Iterator[Event]:
        """Run a tool and iterate over its events as it runs, ending with its ``result`` event. A call
        that waits for approval ends the iteration at its pending_approval ``status`` event (unless
        ``stop_at_approval`` is false); a denied call yields its status and result at once. Resumes
        after a dropped connection like :meth:`events`, without running the call twice."""
        body = self._call_body(tool, args, workspace, idempotency_key, limits)

        def first() -> _Response:
            return self._send("POST", "/v1/calls", body=body, headers={"Accept": "text/event-stream"}, stream=True)

        yield from self._follow(None, None, first, stop_at_approval)

    def _follow(self, call_id: Optional[str], last: Optional[str], first: Any, stop_at_approval: bool) -> Iterator[Event]:
        failures = 0
        while True:
            try:
                if first is not None:
                    r = first()
                else:
                    hdrs = {"Accept": "text/event-stream"}
                    if last:
                        hdrs["Last-Event-ID"] = last
                    r = self._send("GET", f"/v1/calls/{_seg(call_id or '')}/events", headers=hdrs, stream=True)
                if r.status != 200:
                    body = _json_or_text(r.body)
                    if first is not None and r.status in (202, 403) and _is_envelope(body):
                        res = Result.from_dict(body)  # denied, or answered at once
                        yield Event("status", "0.0", {"id": res.id, "status": res.status})
                        if res.done:
                            yield Event("result", "0.0", body)
                        return
                    raise error_from(r.status, body, r.headers.get("retry-after"))
                try:
                    for ev in _parse_sse(r.raw):
                        failures = 0
                        if ev.event == "status" and call_id is None:
                            # Named: from here on, resume by following it. Until then, a dropped
                            # submission is sent again: its idempotency key finds the same call.
                            call_id, first = ev.data.get("id"), None
                        last = ev.id or last
                        yield ev
                        if ev.event in ("result", "error"):
                            return
                        if stop_at_approval and ev.event == "status" and ev.data.get("status") == "pending_approval":
                            return
                finally:
                    r.conn.close()
                raise ConnectionError("the event stream ended before its result event")
            except _DROPPED as e:
                failures += 1
                if (call_id is None and first is None) or failures > self.retries:
                    raise ConnectionFailed(f"follow call {call_id or '(not yet named)'}: {e}") from e
                time.sleep(min(0.2 * 2 ** failures, 5.0))

    def read_output(self, call_id: str, stream: str = "stdout", *, offset: int = 0,
                    limit: Optional[int] = None) -> Tuple[bytes, int]:
        """Bytes of a finished command's full stdout or stderr from ``offset`` (at most ``limit``, server
        default 1 MiB), and the offset to read on from."""
        r = self._request("GET", f"/v1/calls/{_seg(call_id)}/{_seg(stream)}", query={"offset": offset, "limit": limit})
        return r.body, int(r.headers.get("x-toolpool-next-offset", offset + len(r.body)))

    # -- tools and policy --------------------------------------------------------------------------

    def tools(self, format: str = "native") -> List[Dict[str, Any]]:
        """The tools this token may use, in toolpool's own shape or ``openai``, ``anthropic`` or ``mcp``."""
        return self._request("GET", "/v1/tools", query={"format": format}).json()["tools"]

    def openai_tools(self) -> List[Dict[str, Any]]:
        """The tools as OpenAI function tools ({"type": "function", "function": {...}})."""
        return self.tools("openai")

    def anthropic_tools(self) -> List[Dict[str, Any]]:
        """The tools as Anthropic Messages tools ({"name", "description", "input_schema"})."""
        return self.tools("anthropic")

    def check_policy(self, tool: str, args: Optional[Dict[str, Any]] = None, *,
                     workspace: Optional[str] = None, **limits: Any) -> PolicyCheck:
        """What policy would decide for a call, without running it."""
        body = {"tool": tool, "args": args if args is not None else {}}
        if workspace or self.workspace:
            body["workspace"] = workspace or self.workspace
        body.update({k: v for k, v in limits.items() if v is not None})
        d = self._request("POST", "/v1/policy/check", body=body).json()
        return build(PolicyCheck, d, decision=Decision.from_dict)

    # -- approvals ---------------------------------------------------------------------------------

    def approvals(self) -> List[Approval]:
        """The calls waiting for approval (approver tokens only)."""
        return [Approval.from_dict(a) for a in self._request("GET", "/v1/approvals").json()["approvals"]]

    def approve(self, call_id: str, *, args_digest: Optional[str] = None, always: bool = False,
                argv_prefix: Optional[List[str]] = None) -> Result:
        """Approve a waiting call; with ``args_digest`` only if its arguments are still those. ``always``
        also allows this tool with ``argv_prefix`` for the tenant from now on."""
        body: Dict[str, Any] = {"decision": "approve"}
        if args_digest:
            body["args_digest"] = args_digest
        if always:
            body["always"] = True
            if argv_prefix:
                body["argv_prefix"] = argv_prefix
        return self._envelope("POST", f"/v1/approvals/{_seg(call_id)}", body=body, retry=False)

    def deny(self, call_id: str, *, reason: Optional[str] = None) -> Result:
        """Deny a waiting call; its envelope, status denied. ``reason`` (one line, at most 500 bytes) is
        told to the caller in the denied call's error."""
        body: Dict[str, Any] = {"decision": "deny"}
        if reason:
            body["reason"] = reason
        return self._envelope("POST", f"/v1/approvals/{_seg(call_id)}", body=body, retry=False)

    def audit(self, since: str = "1h", limit: Optional[int] = None) -> List[AuditEvent]:
        """The tenant's audit events since a duration ago (1h) or an RFC 3339 time."""
        evs = self._request("GET", "/v1/audit", query={"since": since, "limit": limit}).json()["events"]
        return [build(AuditEvent, e, egress=lambda v: [build(EgressConn, x) for x in v or []]) for e in evs]

    # -- workspaces --------------------------------------------------------------------------------

    def _workspace(self, method: str, path: str, ok: Tuple[int, ...], **kw: Any) -> Dict[str, Any]:
        r = self._request(method, path, ok=ok + (202, 403), **kw)
        if r.status in (202, 403):
            self._workspace_refusal(r)
        return r.json()

    def create_workspace(self, name: str, *, archive: Optional[bytes] = None, directory: Optional[str] = None,
                         git: Optional[str] = None, ref: Optional[str] = None, image: Optional[str] = None) -> Workspace:
        """Create a workspace: empty, or seeded from ``archive`` (tar, tar.gz or zip bytes), a local
        ``directory`` (sent as tar.gz), or a ``git`` URL and ``ref`` (cloned through egress, under policy);
        ``image``, the OCI image its calls run on when they ask for none (checked by policy).
        Raises ``Conflict`` when it exists, ``CallNotFinished`` when it waits for approval."""
        if sum(x is not None for x in (archive, directory, git)) > 1:
            raise ValueError("give at most one of archive, directory and git")
        body: Any = None
        path = f"/v1/workspaces/{_seg(name)}"
        if directory is not None:
            body = tar_directory(directory)
        elif archive is not None:
            body = archive
        elif git is not None:
            body = {"git": {"url": git, **({"ref": ref} if ref else {})}}
        if image is not None and isinstance(body, dict):
            body["image"] = image
        elif image is not None and body is None:
            body = {"image": image}
        elif image is not None:
            path += "?" + urlencode({"image": image})
        d = self._workspace("PUT", path, (201,), body=body, retry=False)
        return Workspace.from_dict(d["workspace"], d.get("call_id", ""))

    def set_workspace_image(self, name: str, image: str) -> Workspace:
        """Change an existing workspace's default image (``""`` removes it; its calls then run on the
        tenant's or worker's default). A new image must pass policy's ``images.allow`` (``Forbidden``;
        ``InvalidParams`` for a reference that does not parse); the change waits for calls running in the
        workspace to end. Raises ``NotFound`` when the workspace does not exist."""
        d = self._workspace("PATCH", f"/v1/workspaces/{_seg(name)}", (200,), body={"image": image}, retry=False)
        return Workspace.from_dict(d["workspace"], d.get("call_id", ""))

    def workspaces(self) -> List[Workspace]:
        d = self._workspace("GET", "/v1/workspaces", (200,))
        return [Workspace.from_dict(w) for w in d["workspaces"]]

    def workspace_info(self, name: str) -> Workspace:
        d = self._workspace("GET", f"/v1/workspaces/{_seg(name)}", (200,))
        return Workspace.from_dict(d["workspace"], d.get("call_id", ""))

    def delete_workspace(self, name: str) -> None:
        self._workspace("DELETE", f"/v1/workspaces/{_seg(name)}", (200,), retry=False)

    def upload_file(self, name: str, path: str, data: Union[bytes, str]) -> Workspace:
        """Write one file of the workspace (its directories are made)."""
        raw = data.encode() if isinstance(data, str) else data
        d = self._workspace("PUT", f"/v1/workspaces/{_seg(name)}/files/{_path(path)}", (200,), body=raw, retry=False)
        return Workspace.from_dict(d["workspace"], d.get("call_id", ""))

    def upload_archive(self, name: str, archive: bytes, *, path: Optional[str] = None) -> Workspace:
        """Unpack an archive (tar, tar.gz or zip) into the workspace, under ``path``."""
        d = self._workspace("POST", f"/v1/workspaces/{_seg(name)}/files", (200,), query={"path": path}, body=archive, retry=False)
        return Workspace.from_dict(d["workspace"], d.get("call_id", ""))

    def upload_directory(self, name: str, directory: str, *, path: Optional[str] = None) -> Workspace:
        """Upload a local directory's tree into the workspace, under ``path``."""
        return self.upload_archive(name, tar_directory(directory), path=path)

    def download_file(self, name: str, path: str, *, offset: int = 0, length: Optional[int] = None) -> bytes:
        """A file's bytes, or ``length`` of them from ``offset``."""
        headers = {}
        if offset or length is not None:
            headers["Range"] = f"bytes={offset}-" + ("" if length is None else str(offset + length - 1))
        r = self._request("GET", f"/v1/workspaces/{_seg(name)}/files/{_path(path)}", ok=(200, 206, 202, 403), headers=headers)
        if r.status in (202, 403):
            self._workspace_refusal(r)
        return r.body

    def download_archive(self, name: str, *, path: Optional[str] = None) -> bytes:
        """The workspace's tree (or ``path``) as tar.gz bytes."""
        r = self._request("GET", f"/v1/workspaces/{_seg(name)}/archive", ok=(200, 202, 403), query={"path": path})
        if r.status in (202, 403):
            self._workspace_refusal(r)
        return r.body

    def _workspace_refusal(self, r: _Response) -> None:
        """Raises for a workspace operation that did not run: CallNotFinished (202, waits for approval),
        CallDenied (403 with the call's envelope), or the error of an error body."""
        body = _json_or_text(r.body)
        if _is_envelope(body):
            res = Result.from_dict(body)
            raise CallDenied(res) if res.denied else CallNotFinished(res)
        raise error_from(r.status, body, r.headers.get("retry-after"))

    def snapshot(self, name: str, snapshot: Optional[str] = None) -> Workspace:
        """Save a snapshot (named snap-DATE-TIME unless given); the workspace after, with its snapshots."""
        d = self._workspace("POST", f"/v1/workspaces/{_seg(name)}/snapshot", (201,),
                            body={"snapshot": snapshot} if snapshot else {}, retry=False)
        return Workspace.from_dict(d["workspace"], d.get("call_id", ""))

    def fork(self, name: str, to: str, *, snapshot: Optional[str] = None) -> Workspace:
        """Copy the workspace, or one of its snapshots, to a new workspace ``to``; the new one."""
        body = {"to": to, **({"snapshot": snapshot} if snapshot else {})}
        d = self._workspace("POST", f"/v1/workspaces/{_seg(name)}/fork", (201,), body=body, retry=False)
        return Workspace.from_dict(d["workspace"], d.get("call_id", ""))

    def restore(self, name: str, snapshot: str) -> Workspace:
        """Replace the workspace's tree with a snapshot's."""
        d = self._workspace("POST", f"/v1/workspaces/{_seg(name)}/restore", (200,), body={"snapshot": snapshot}, retry=False)
        return Workspace.from_dict(d["workspace"], d.get("call_id", ""))

    def openapi(self) -> Dict[str, Any]:
        """The server's OpenAPI 3.1 document."""
        return self._request("GET", "/v1/openapi.json").json()


def tar_directory(directory: str) -> bytes:
    """A tar.gz of a directory's contents (paths relative to it)."""
    if not os.path.isdir(directory):
        raise ValueError(f"{directory!r} is not a directory")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for entry in sorted(os.listdir(directory)):
            tf.add(os.path.join(directory, entry), arcname=entry)
    return buf.getvalue()


def _parse_sse(resp: Any) -> Iterator[Event]:
    """Events from an open text/event-stream answer; an event counts only once its blank line arrived."""
    event, eid, data = "", "", []
    while True:
        line = resp.readline()
        if not line:
            return
        text = line.decode().rstrip("\r\n")
        if text == "":
            if event or data:
                yield Event.parse(event or "message", eid, "\n".join(data))
            event, eid, data = "", "", []
        elif text.startswith(":"):
            continue
        else:
            name, _, value = text.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "event":
                event = value
            elif name == "id":
                eid = value
            elif name == "data":
                data.append(value)


def _is_envelope(body: Any) -> bool:
    """Whether an answer's body is a call's envelope (a 202 or a denied 403), not an error body."""
    return isinstance(body, dict) and "tool" in body and "status" in body and "id" in body


def _json_or_text(body: bytes) -> Any:
    try:
        return json.loads(body) if body else None
    except ValueError:
        return body.decode(errors="replace")


def _wait_bound(deadline: Optional[float]) -> float:
    return 0.0 if deadline is None else max(0.0, deadline - time.monotonic())


def _seg(s: str) -> str:
    return quote(s, safe="")


def _path(p: str) -> str:
    return quote(p.lstrip("/"), safe="/")
