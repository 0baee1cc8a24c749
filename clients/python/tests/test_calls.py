import asyncio
import io
import tarfile
import time
import uuid

import pytest

import toolpool
from toolpool import (AsyncClient, Client, Conflict, Forbidden, InvalidParams, InvalidRequest,
                      NotFound, Unauthenticated)


def sh(command):
    return {"command": command}


def audited(tp, match, timeout=30.0):
    """The tenant's audit events that match, polled until there is one (an event may be written just
    after the answer that it concerns)."""
    deadline = time.monotonic() + timeout
    while True:
        found = [e for e in tp.audit(since="10m") if match(e)]
        if found:
            return found
        assert time.monotonic() < deadline, f"no matching audit event in {timeout} s"
        time.sleep(0.1)


def assert_whole(events, want):
    """A stream's stdout events carry want exactly once, each starting where the last ended, and its
    result event says the same."""
    got = b""
    for e in events:
        if e.event == "stdout":
            assert e.data["offset"] == len(got), "an event repeated or skipped bytes"
            got += e.bytes
    assert got.decode() == want
    assert events[-1].event == "result" and events[-1].result.stdout == want


def accepted_calls(tp, workspace):
    """The ids of the calls accepted into a workspace, by the audit log."""
    return [e.call_id for e in audited(tp, lambda e: e.workspace == workspace and e.event == "accepted")]


def test_call_returns_typed_result(tp):
    res = tp.call("run_shell", sh("printf 'hi\\n'; printf 'oops\\n' >&2"), workspace="py1")
    assert isinstance(res, toolpool.Result)
    assert res.ok and res.done and res.exit_code == 0
    assert (res.stdout, res.stderr) == ("hi\n", "oops\n")
    assert res.workspace == "py1" and res.tool == "run_shell"
    assert res.decision.action == "allow"
    assert isinstance(res.timing, toolpool.Timing) and res.timing.total_ms >= res.timing.run_ms
    assert res.streams["stdout"].bytes == 3 and res.streams["stderr"].kept == 5


def test_a_tool_failure_is_a_result(tp):
    res = tp.call("run_shell", sh("exit 3"))
    assert res.status == "error" and res.exit_code == 3 and res.error.type == "exit_code"
    assert res.workspace == "botspace"  # the token's default


def test_refusals_are_exceptions_by_kind_with_the_servers_message(tp, url):
    with pytest.raises(InvalidParams) as e:
        tp.call("no_such_tool", {})
    assert e.value.status == 422 and e.value.type == "invalid_params" and "no_such_tool" in e.value.message
    with pytest.raises(InvalidParams) as e:
        tp.call("run_shell", {"command": 3})
    assert "command" in e.value.message
    with pytest.raises(Unauthenticated) as e:
        Client(url, "not-a-token").call("run_shell", sh("true"))
    assert e.value.status == 401 and "token" in e.value.message
    with pytest.raises(NotFound):
        tp.get("c_aaaaaaaaaaaaaaaaaaaaaaaaaa")
    with pytest.raises(Forbidden) as e:
        tp.approvals()
    assert e.value.type == "permission_denied"
    key = "py-" + uuid.uuid4().hex
    tp.call("run_shell", sh("echo one"), idempotency_key=key)
    with pytest.raises(Conflict) as e:
        tp.call("run_shell", sh("echo two"), idempotency_key=key)
    assert e.value.type == "idempotency_key_reused"
    with pytest.raises(InvalidRequest) as e:
        tp.read_output("c_aaaaaaaaaaaaaaaaaaaaaaaaaa", "stdout", limit=0)
    assert "limit" in e.value.message
    assert isinstance(e.value, toolpool.ToolpoolError)


def test_denied_call_is_a_result_with_the_rule(tp):
    res = tp.call("run_shell", sh("sudo ls"))
    assert res.denied and res.done and res.decision.rule == "forbidden-commands"
    assert "never allowed here" in res.decision.reason


def test_submit_poll_wait_and_the_same_key_finds_the_same_call(tp):
    key = "py-" + uuid.uuid4().hex
    sub = tp.submit("run_shell", sh("sleep 1; echo late"), idempotency_key=key)
    assert sub.status in ("queued", "running")
    again = tp.submit("run_shell", sh("sleep 1; echo late"), idempotency_key=key)
    assert again.id == sub.id
    assert tp.get(sub.id).id == sub.id
    res = tp.wait(sub.id, timeout=60)
    assert res.ok and res.stdout == "late\n"


def test_cancel(tp):
    parked = tp.call("run_shell", sh("mkdir -p never"))
    assert parked.pending_approval and not parked.done
    res = tp.cancel(parked.id)
    assert res.status == "cancelled"


def test_read_output_by_range(tp):
    res = tp.call("run_shell", sh("seq 1 1000"))
    data, nxt = tp.read_output(res.id, "stdout", offset=4, limit=6)
    assert data == b"3\n4\n5\n" and nxt == 10
    assert res.streams["stdout"].bytes == len("".join(f"{i}\n" for i in range(1, 1001)))


def test_stream_yields_output_then_the_result(tp):
    events = list(tp.stream("run_shell", sh("for i in 1 2 3; do echo line $i; done; echo err >&2")))
    assert events[0].event == "status" and events[-1].event == "result"
    out = b"".join(e.bytes for e in events if e.event == "stdout")
    assert out == b"line 1\nline 2\nline 3\n"
    assert b"".join(e.bytes for e in events if e.event == "stderr") == b"err\n"
    assert events[-1].result.ok


def test_stream_resumes_after_dropped_connections_without_loss_or_repeat(tp, url, proxy):
    # The first answer (the POST's stream) is cut after 700 bytes, the first resumption after 300 more.
    p = proxy(700, 300)
    c = Client(p.url, tp.token)
    want = "".join(f"line {i:03d} of the output\n" for i in range(1, 61))
    events = list(c.stream("run_shell", sh("for i in $(seq -f %03g 1 60); do echo \"line $i of the output\"; sleep 0.02; done")))
    assert p.dropped >= 2 and p.connections >= 3, (p.dropped, p.connections)
    assert_whole(events, want)


def test_stream_resumes_after_the_connection_goes_silent(tp, proxy):
    # The first answer stops after 700 bytes without closing: the client's read times out (timeout=5)
    # and it resumes on a new connection from the last event it received. The timeout is longer than a
    # loaded machine's container start, the one other silence of the stream (keep-alives come every 15s).
    p = proxy(700, stall=True)
    c = Client(p.url, tp.token, timeout=5)
    want = "".join(f"line {i:03d}\n" for i in range(1, 41))
    events = list(c.stream("run_shell", sh("for i in $(seq -f %03g 1 40); do echo \"line $i\"; sleep 0.02; done")))
    assert p.dropped == 1 and p.connections == 2, (p.dropped, p.connections)
    assert_whole(events, want)


def test_stream_dropped_before_its_first_event_submits_again_and_runs_once(tp, proxy):
    # The POST's answer is cut inside its headers: the client has no call id yet, so it sends the same
    # request again, whose idempotency key finds the call the first one made.
    p = proxy(20)
    c = Client(p.url, tp.token)
    ws = "again-" + uuid.uuid4().hex[:8]
    events = list(c.stream("run_shell", sh("echo once"), workspace=ws))
    assert p.dropped == 1 and p.connections == 2
    assert b"".join(e.bytes for e in events if e.event == "stdout") == b"once\n"
    assert accepted_calls(tp, ws) == [events[-1].result.id]


def test_events_of_a_finished_call_resume_from_an_id(tp):
    res = tp.call("run_shell", sh("echo 0123456789"))
    evs = list(tp.events(res.id, last_event_id="4.0"))
    assert b"".join(e.bytes for e in evs if e.event == "stdout") == b"456789\n"


def test_wait_resumes_after_dropped_connections_and_runs_the_call_once(tp, proxy):
    # The submission's connection is dropped as the server answers (so the client does not know the id),
    # then a long poll's: the call runs once, and its result arrives.
    p = proxy(0, 0)
    c = Client(p.url, tp.token)
    ws = "once-" + uuid.uuid4().hex[:8]
    res = c.call("run_shell", sh("sleep 1; echo ran"), workspace=ws)
    assert p.dropped == 2
    assert res.ok and res.stdout == "ran\n"
    assert accepted_calls(tp, ws) == [res.id]


def test_approval_flow(tp, approver):
    events = list(tp.stream("run_shell", sh("mkdir -p approved-dir && echo made")))
    assert events[-1].event == "status" and events[-1].data["status"] == "pending_approval"
    call_id = events[-1].data["id"]
    waiting = {a.id: a for a in approver.approvals()}
    assert call_id in waiting and waiting[call_id].rule == "mutating-commands"
    assert waiting[call_id].args == {"command": "mkdir -p approved-dir && echo made"}
    approver.approve(call_id, args_digest=waiting[call_id].args_digest)
    res = tp.wait(call_id, timeout=60)
    assert res.ok and res.stdout == "made\n"
    other = tp.call("run_shell", sh("mkdir -p refused-dir"))
    denied = approver.deny(other.id, reason="make it under build/")
    assert denied.denied and ": make it under build/;" in denied.error.message
    with pytest.raises(NotFound):
        approver.approve(other.id)


def test_tools_in_model_shapes(tp):
    native = {t["name"]: t for t in tp.tools()}
    assert "run_shell" in native and native["run_shell"]["schema"]["type"] == "object"
    openai = tp.openai_tools()
    assert all(t["type"] == "function" and "parameters" in t["function"] for t in openai)
    anthropic = tp.anthropic_tools()
    assert {t["name"] for t in anthropic} == set(native)
    assert all("input_schema" in t for t in anthropic)
    with pytest.raises(InvalidRequest):
        tp.tools("yaml")


def test_policy_check_and_audit(tp):
    chk = tp.check_policy("run_shell", sh("mkdir x"))
    assert not chk.would_run and chk.decision.action == "ask" and chk.decision.rule == "mutating-commands"
    res = tp.call("run_shell", sh("echo audited"))
    # The worker writes the finished event after it records the result, which may already have reached us.
    audited(tp, lambda e: e.call_id == res.id and e.event == "finished")


def test_workspaces(tp, tmp_path):
    name = "pyws-" + uuid.uuid4().hex[:8]
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "main.py").write_text("print('hi')\n")
    (tmp_path / "README.md").write_text("# seeded\n")
    ws = tp.create_workspace(name, directory=str(tmp_path))
    assert ws.name == name and ws.files >= 2 and ws.call_id.startswith("c_")
    with pytest.raises(Conflict):
        tp.create_workspace(name)
    assert tp.call("run_shell", sh("cat src/main.py"), workspace=name).stdout == "print('hi')\n"
    tp.upload_file(name, "notes/a.txt", "0123456789")
    assert tp.download_file(name, "notes/a.txt") == b"0123456789"
    assert tp.download_file(name, "notes/a.txt", offset=2, length=3) == b"234"
    with pytest.raises(NotFound):
        tp.download_file(name, "notes/none.txt")
    tp.upload_archive(name, toolpool.tar_directory(str(tmp_path / "src")), path="copy")
    assert tp.download_file(name, "copy/main.py") == b"print('hi')\n"
    with tarfile.open(fileobj=io.BytesIO(tp.download_archive(name)), mode="r:gz") as tf:
        assert {"README.md", "notes/a.txt", "copy/main.py"} <= set(tf.getnames())
    snap = tp.snapshot(name, "before")
    assert [s.name for s in snap.snapshots] == ["before"]
    tp.upload_file(name, "notes/a.txt", "changed")
    forked = tp.fork(name, name + "-fork", snapshot="before")
    assert forked.name == name + "-fork"
    assert tp.download_file(name + "-fork", "notes/a.txt") == b"0123456789"
    tp.restore(name, "before")
    assert tp.download_file(name, "notes/a.txt") == b"0123456789"
    assert {name, name + "-fork"} <= {w.name for w in tp.workspaces()}
    assert tp.workspace_info(name).snapshots[0].name == "before"
    tp.delete_workspace(name + "-fork")
    with pytest.raises(NotFound):
        tp.workspace_info(name + "-fork")
    with pytest.raises(InvalidRequest):
        tp.create_workspace("-bad")


def test_workspace_clone_denied_by_policy_raises_call_denied(tp):
    # The test policy grants workspace_clone no network, so policy denies it.
    with pytest.raises(toolpool.CallDenied) as e:
        tp.create_workspace("cloned-" + uuid.uuid4().hex[:6], git="https://github.com/toolpool/none.git")
    assert e.value.result.denied and e.value.result.decision.rule


def test_workspace_image_reaches_policy(tp):
    # The test policy has no images section: it admits no image, and says so; a reference that does not
    # parse is refused before policy.
    with pytest.raises(Forbidden) as e:
        tp.create_workspace("img-" + uuid.uuid4().hex[:6], image="registry.test/tools/python:3.12")
    assert "image" in str(e.value)
    with pytest.raises(InvalidParams):
        tp.create_workspace("img-" + uuid.uuid4().hex[:6], archive=b"", image="Not A Reference!")


def test_set_workspace_image(tp):
    # Changing an existing workspace's image goes to policy like a create's (which here admits none);
    # "" removes it; a workspace that does not exist is NotFound.
    name = "setimg-" + uuid.uuid4().hex[:6]
    tp.create_workspace(name)
    with pytest.raises(Forbidden) as e:
        tp.set_workspace_image(name, "registry.test/tools/python:3.12")
    assert "image" in str(e.value)
    with pytest.raises(InvalidParams):
        tp.set_workspace_image(name, "Not A Reference!")
    ws = tp.set_workspace_image(name, "")
    assert ws.name == name and not ws.image and ws.call_id
    with pytest.raises(NotFound):
        tp.set_workspace_image("none-" + uuid.uuid4().hex[:6], "")


def test_async_client(url, tp):
    async def main():
        a = AsyncClient(url, tp.token)
        res = await a.call("run_shell", sh("echo async"))
        assert res.ok and res.stdout == "async\n"
        out = b""
        async for ev in a.stream("run_shell", sh("echo one; echo two")):
            if ev.event == "stdout":
                out += ev.bytes
        assert out == b"one\ntwo\n"
        with pytest.raises(InvalidParams):
            await a.call("no_such_tool", {})
        parked = await a.call("run_shell", sh("mkdir -p nope"))
        assert parked.pending_approval
        assert (await a.cancel(parked.id)).status == "cancelled"
        results = await asyncio.gather(*(a.call("run_shell", sh(f"echo {i}")) for i in range(4)))
        assert [r.stdout for r in results] == [f"{i}\n" for i in range(4)]

    asyncio.run(main())


def test_model_shapes_run_through_toolpool(tp):
    block = {"type": "tool_use", "id": "toolu_1", "name": "run_shell", "input": {"command": "echo from-claude"}}
    res = toolpool.run_anthropic_tool_use(tp, block)
    assert toolpool.anthropic_tool_result(res, "toolu_1") == {
        "type": "tool_result", "tool_use_id": "toolu_1", "content": res.output, "is_error": False}
    assert res.stdout == "from-claude\n"
    call = {"id": "call_1", "type": "function", "function": {"name": "run_shell", "arguments": '{"command": "mkdir -p x"}'}}
    res = toolpool.run_openai_tool_call(tp, call)
    msg = toolpool.openai_tool_message(res, "call_1")
    assert res.pending_approval and msg["role"] == "tool" and res.id in msg["content"]
    tp.cancel(res.id)
    with pytest.raises(InvalidParams):
        toolpool.run_openai_tool_call(tp, {"id": "c", "function": {"name": "nope", "arguments": "{}"}})
