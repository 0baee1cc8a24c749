// The TypeScript client against a real toolpool stack: test/clients (go test ./test/clients -run
// TestTypeScriptClient) starts one and runs node --test with TOOLPOOL_URL, TOOLPOOL_TOKEN (a caller whose
// default workspace is botspace) and TOOLPOOL_APPROVER_TOKEN; the policy asks for mkdir and denies sudo.
import { test, after } from "node:test";
import assert from "node:assert/strict";
import net from "node:net";
import { mkdtempSync, mkdirSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { gunzipSync } from "node:zlib";
import { randomUUID } from "node:crypto";

import {
  Client, CallDenied, Conflict, Forbidden, InvalidParams, InvalidRequest, NotFound, ToolpoolError, Unauthenticated,
  anthropicToolResult, openaiToolMessage, runAnthropicToolUse, runOpenAIToolCall,
} from "toolpool";
import { tarDirectory } from "toolpool/node";

function env(name) {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set: run this suite with go test ./test/clients -run TestTypeScriptClient, which starts the stack and sets TOOLPOOL_URL, TOOLPOOL_TOKEN and TOOLPOOL_APPROVER_TOKEN`);
  return v;
}
const url = env("TOOLPOOL_URL");
const tp = new Client({ url, token: env("TOOLPOOL_TOKEN") });
const approver = new Client({ url, token: env("TOOLPOOL_APPROVER_TOKEN") });
const sh = (command) => ({ command });
const dec = new TextDecoder();
const concat = (evs, name) => Buffer.concat(evs.filter((e) => e.event === name).map((e) => e.bytes)).toString();
const collect = async (it) => { const out = []; for await (const e of it) out.push(e); return out; };
const rejects = async (p, cls, check = () => {}) => {
  try { await p; } catch (e) { assert.ok(e instanceof cls, `${e} is not a ${cls.name}`); check(e); return e; }
  assert.fail(`no ${cls.name}`);
};

// The tenant's audit events that match, polled until there is one (an event may be written just after
// the answer that it concerns).
async function audited(match, timeoutMs = 30_000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const found = (await tp.audit({ since: "10m" })).filter(match);
    if (found.length) return found;
    assert.ok(Date.now() < deadline, `no matching audit event in ${timeoutMs} ms`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

// The ids of the calls accepted into a workspace, by the audit log.
const acceptedCalls = async (ws) => (await audited((e) => e.workspace === ws && e.event === "accepted")).map((e) => e.call_id);

// A TCP proxy to the dispatcher that drops connection i (from 0) after cuts[i] bytes of the server's
// answer (0: as soon as it starts to answer), or, with stall, goes silent there and stays open (a peer
// gone without closing); later connections pass through whole.
function droppingProxy(cuts, { stall = false } = {}) {
  const u = new URL(url);
  const p = { connections: 0, dropped: 0 };
  const held = [];
  const server = net.createServer((client) => {
    const limit = cuts[p.connections++];
    const upstream = net.connect(Number(u.port), u.hostname);
    client.pipe(upstream);
    let sent = 0;
    upstream.on("data", (b) => {
      if (limit !== undefined && sent + b.length > limit) {
        client.write(b.subarray(0, limit - sent));
        p.dropped++;
        if (stall) {
          upstream.pause();
          upstream.removeAllListeners("data");
          upstream.removeAllListeners("end");
          held.push(client, upstream);
        } else {
          client.destroy(); upstream.destroy();
        }
        return;
      }
      sent += b.length;
      client.write(b);
    });
    upstream.on("end", () => client.end());
    upstream.on("error", () => client.destroy());
    client.on("error", () => upstream.destroy());
  });
  return new Promise((resolve) => server.listen(0, "127.0.0.1", () => {
    p.url = `http://127.0.0.1:${server.address().port}`;
    p.close = () => { server.close(); held.forEach((s) => s.destroy()); };
    after(() => p.close());
    resolve(p);
  }));
}

test("a call resolves to its typed Result", async () => {
  const res = await tp.call("run_shell", sh("printf 'hi\\n'; printf 'oops\\n' >&2"), { workspace: "ts1" });
  assert.equal(res.status, "ok");
  assert.equal(res.exit_code, 0);
  assert.equal(res.stdout, "hi\n");
  assert.equal(res.stderr, "oops\n");
  assert.equal(res.workspace, "ts1");
  assert.equal(res.decision.action, "allow");
  assert.equal(res.streams.stdout.bytes, 3);
});

test("a tool's failure is a Result; the token's workspace is the default", async () => {
  const res = await tp.call("run_shell", sh("exit 3"));
  assert.equal(res.status, "error");
  assert.equal(res.error.type, "exit_code");
  assert.equal(res.workspace, "botspace");
});

test("refusals reject with errors by kind carrying the server's message", async () => {
  await rejects(tp.call("no_such_tool", {}), InvalidParams, (e) => {
    assert.equal(e.status, 422); assert.equal(e.type, "invalid_params"); assert.match(e.message, /no_such_tool/);
  });
  await rejects(new Client({ url, token: "not-a-token" }).call("run_shell", sh("true")), Unauthenticated, (e) => assert.match(e.message, /token/));
  await rejects(tp.get("c_aaaaaaaaaaaaaaaaaaaaaaaaaa"), NotFound);
  await rejects(tp.approvals(), Forbidden, (e) => assert.equal(e.type, "permission_denied"));
  const key = "ts-" + randomUUID();
  await tp.call("run_shell", sh("echo one"), { idempotency_key: key });
  await rejects(tp.call("run_shell", sh("echo two"), { idempotency_key: key }), Conflict, (e) => assert.equal(e.type, "idempotency_key_reused"));
  const e = await rejects(tp.tools("yaml"), InvalidRequest);
  assert.ok(e instanceof ToolpoolError && e instanceof Error);
});

test("a denied call is a Result with the rule", async () => {
  const res = await tp.call("run_shell", sh("sudo ls"));
  assert.equal(res.status, "denied");
  assert.equal(res.decision.rule, "forbidden-commands");
});

test("submit, get, wait; the same key finds the same call", async () => {
  const key = "ts-" + randomUUID();
  const sub = await tp.submit("run_shell", sh("sleep 1; echo late"), { idempotency_key: key });
  assert.ok(["queued", "running"].includes(sub.status));
  assert.equal((await tp.submit("run_shell", sh("sleep 1; echo late"), { idempotency_key: key })).id, sub.id);
  const res = await tp.wait(sub.id, { timeoutMs: 60_000 });
  assert.equal(res.status, "ok");
  assert.equal(res.stdout, "late\n");
});

test("cancel a parked call", async () => {
  const parked = await tp.call("run_shell", sh("mkdir -p never"));
  assert.equal(parked.status, "pending_approval");
  assert.equal((await tp.cancel(parked.id)).status, "cancelled");
});

test("read output by range", async () => {
  const res = await tp.call("run_shell", sh("seq 1 1000"));
  const { data, next } = await tp.readOutput(res.id, "stdout", { offset: 4, limit: 6 });
  assert.equal(dec.decode(data), "3\n4\n5\n");
  assert.equal(next, 10);
});

test("stream yields output as printed, then the result", async () => {
  const evs = await collect(tp.stream("run_shell", sh("for i in 1 2 3; do echo line $i; done; echo err >&2")));
  assert.equal(evs[0].event, "status");
  assert.equal(evs.at(-1).event, "result");
  assert.equal(concat(evs, "stdout"), "line 1\nline 2\nline 3\n");
  assert.equal(concat(evs, "stderr"), "err\n");
  assert.equal(evs.at(-1).data.status, "ok");
});

// assertWhole checks that a stream's stdout events carry want exactly once, each starting where the
// last ended, and that its result says the same.
function assertWhole(evs, want) {
  let got = 0;
  for (const e of evs.filter((e) => e.event === "stdout")) {
    assert.equal(e.data.offset, got, "an event repeated or skipped bytes");
    got += e.bytes.length;
  }
  assert.equal(concat(evs, "stdout"), want);
  assert.equal(evs.at(-1).data.stdout, want);
}

test("stream resumes after dropped connections without losing or repeating output", async () => {
  const p = await droppingProxy([700, 300]);
  const c = new Client({ url: p.url, token: tp.token });
  let want = "";
  for (let i = 1; i <= 60; i++) want += `line ${String(i).padStart(3, "0")} of the output\n`;
  const evs = await collect(c.stream("run_shell", sh("for i in $(seq -f %03g 1 60); do echo \"line $i of the output\"; sleep 0.02; done")));
  assert.ok(p.dropped >= 2 && p.connections >= 3, `dropped ${p.dropped} of ${p.connections}`);
  assertWhole(evs, want);
});

test("a stream resumes after its connection goes silent", async () => {
  const p = await droppingProxy([700], { stall: true });
  // Longer than a loaded machine's container start, the one other silence of the stream (keep-alives
  // come every 15 s): only the proxy's stall may end the first connection.
  const c = new Client({ url: p.url, token: tp.token, timeoutMs: 5000 });
  let want = "";
  for (let i = 1; i <= 40; i++) want += `line ${String(i).padStart(3, "0")}\n`;
  const evs = await collect(c.stream("run_shell", sh("for i in $(seq -f %03g 1 40); do echo \"line $i\"; sleep 0.02; done")));
  assert.equal(p.dropped, 1);
  assert.equal(p.connections, 2);
  assertWhole(evs, want);
});

test("a stream dropped before its first event submits again, and the call runs once", async () => {
  const p = await droppingProxy([20]);
  const c = new Client({ url: p.url, token: tp.token });
  const ws = "again-" + randomUUID().slice(0, 8);
  const evs = await collect(c.stream("run_shell", sh("echo once"), { workspace: ws }));
  assert.equal(p.dropped, 1);
  assert.equal(p.connections, 2);
  assert.equal(concat(evs, "stdout"), "once\n");
  assert.deepEqual(await acceptedCalls(ws), [evs.at(-1).data.id]);
});

test("events of a finished call resume from an id", async () => {
  const res = await tp.call("run_shell", sh("echo 0123456789"));
  assert.equal(concat(await collect(tp.events(res.id, { lastEventId: "4.0" })), "stdout"), "456789\n");
});

test("a wait resumes after dropped connections and the call runs once", async () => {
  const p = await droppingProxy([0, 0]);
  const c = new Client({ url: p.url, token: tp.token });
  const ws = "once-" + randomUUID().slice(0, 8);
  const res = await c.call("run_shell", sh("sleep 1; echo ran"), { workspace: ws });
  assert.equal(p.dropped, 2);
  assert.equal(res.status, "ok");
  assert.equal(res.stdout, "ran\n");
  assert.deepEqual(await acceptedCalls(ws), [res.id]);
});

test("approvals: stream stops at the approval; approve, deny", async () => {
  const evs = await collect(tp.stream("run_shell", sh("mkdir -p approved-dir && echo made")));
  assert.equal(evs.at(-1).event, "status");
  assert.equal(evs.at(-1).data.status, "pending_approval");
  const id = evs.at(-1).data.id;
  const waiting = (await approver.approvals()).find((a) => a.id === id);
  assert.equal(waiting.rule, "mutating-commands");
  assert.deepEqual(waiting.args, { command: "mkdir -p approved-dir && echo made" });
  await approver.approve(id, { argsDigest: waiting.args_digest });
  const res = await tp.wait(id, { timeoutMs: 60_000 });
  assert.equal(res.stdout, "made\n");
  const other = await tp.call("run_shell", sh("mkdir -p refused-dir"));
  const denied = await approver.deny(other.id, { reason: "make it under build/" });
  assert.equal(denied.status, "denied");
  assert.match(denied.error.message, /: make it under build\/;/);
  await rejects(approver.approve(other.id), NotFound);
});

test("tools in model shapes, policy check, audit", async () => {
  const native = await tp.tools();
  assert.ok(native.some((t) => t.name === "run_shell" && t.schema.type === "object"));
  assert.ok((await tp.openaiTools()).every((t) => t.type === "function" && t.function.parameters));
  assert.ok((await tp.anthropicTools()).every((t) => t.name && t.input_schema));
  const chk = await tp.checkPolicy("run_shell", sh("mkdir x"));
  assert.equal(chk.would_run, false);
  assert.equal(chk.decision.rule, "mutating-commands");
  const res = await tp.call("run_shell", sh("echo audited"));
  // The worker writes the finished event after it records the result, which may already have reached us.
  await audited((e) => e.call_id === res.id && e.event === "finished");
});

test("workspaces: a default image goes to policy, which here admits none", async () => {
  await rejects(tp.createWorkspace(`img-${randomUUID().slice(0, 6)}`, { image: "registry.test/tools/python:3.12" }), Forbidden);
  await rejects(tp.createWorkspace(`img-${randomUUID().slice(0, 6)}`, { archive: new Uint8Array(), image: "Not A Reference!" }), InvalidParams);
});

test("workspaces: changing the default image goes to policy; \"\" removes it", async () => {
  const name = `setimg-${randomUUID().slice(0, 6)}`;
  await tp.createWorkspace(name);
  await rejects(tp.setWorkspaceImage(name, "registry.test/tools/python:3.12"), Forbidden);
  await rejects(tp.setWorkspaceImage(name, "Not A Reference!"), InvalidParams);
  const ws = await tp.setWorkspaceImage(name, "");
  assert.equal(ws.name, name);
  assert.ok(!ws.image && ws.call_id);
  await rejects(tp.setWorkspaceImage(`none-${randomUUID().slice(0, 6)}`, ""), NotFound);
});

test("workspaces: from a directory, files, ranges, archive, snapshot, fork, restore, delete", async () => {
  const dir = mkdtempSync(join(tmpdir(), "tp-ts-"));
  mkdirSync(join(dir, "src"));
  writeFileSync(join(dir, "src", "main.js"), "console.log('hi')\n");
  writeFileSync(join(dir, "README.md"), "# seeded\n");
  const name = "tsws-" + randomUUID().slice(0, 8);
  const ws = await tp.createWorkspace(name, { archive: tarDirectory(dir) });
  assert.equal(ws.name, name);
  assert.ok(ws.files >= 2 && ws.call_id.startsWith("c_"));
  await rejects(tp.createWorkspace(name), Conflict);
  assert.equal((await tp.call("run_shell", sh("cat src/main.js"), { workspace: name })).stdout, "console.log('hi')\n");
  await tp.uploadFile(name, "notes/a.txt", "0123456789");
  assert.equal(dec.decode(await tp.downloadFile(name, "notes/a.txt")), "0123456789");
  assert.equal(dec.decode(await tp.downloadFile(name, "notes/a.txt", { offset: 2, length: 3 })), "234");
  await rejects(tp.downloadFile(name, "notes/none.txt"), NotFound);
  await tp.uploadArchive(name, tarDirectory(join(dir, "src")), { path: "copy" });
  assert.equal(dec.decode(await tp.downloadFile(name, "copy/main.js")), "console.log('hi')\n");
  const tar = gunzipSync(await tp.downloadArchive(name)).toString("latin1");
  assert.ok(tar.includes("notes/a.txt") && tar.includes("README.md"));
  assert.deepEqual((await tp.snapshot(name, "before")).snapshots.map((s) => s.name), ["before"]);
  await tp.uploadFile(name, "notes/a.txt", "changed");
  assert.equal((await tp.fork(name, name + "-fork", { snapshot: "before" })).name, name + "-fork");
  assert.equal(dec.decode(await tp.downloadFile(name + "-fork", "notes/a.txt")), "0123456789");
  await tp.restore(name, "before");
  assert.equal(dec.decode(await tp.downloadFile(name, "notes/a.txt")), "0123456789");
  const names = (await tp.workspaces()).map((w) => w.name);
  assert.ok(names.includes(name) && names.includes(name + "-fork"));
  await tp.deleteWorkspace(name + "-fork");
  await rejects(tp.workspaceInfo(name + "-fork"), NotFound);
  await rejects(tp.createWorkspace("-bad"), InvalidRequest);
});

test("a workspace clone policy denies rejects with CallDenied", async () => {
  await rejects(tp.createWorkspace("cloned-" + randomUUID().slice(0, 6), { git: "https://github.com/toolpool/none.git" }), CallDenied,
    (e) => { assert.equal(e.result.status, "denied"); assert.ok(e.result.decision.rule); });
});

test("model shapes run through toolpool", async () => {
  const block = { type: "tool_use", id: "toolu_1", name: "run_shell", input: { command: "echo from-claude" } };
  const res = await runAnthropicToolUse(tp, block);
  assert.deepEqual(anthropicToolResult(res, "toolu_1"), { type: "tool_result", tool_use_id: "toolu_1", content: res.output, is_error: false });
  const call = { id: "call_1", type: "function", function: { name: "run_shell", arguments: '{"command": "mkdir -p x"}' } };
  const parked = await runOpenAIToolCall(tp, call);
  const msg = openaiToolMessage(parked, "call_1");
  assert.equal(parked.status, "pending_approval");
  assert.equal(msg.role, "tool");
  assert.ok(msg.content.includes(parked.id));
  await tp.cancel(parked.id);
  await rejects(runOpenAIToolCall(tp, { id: "c", function: { name: "nope", arguments: "{}" } }), InvalidParams);
});

// The examples run as a user runs them (a child process, the client from the environment), with the
// model's turns scripted, and stop at the approval their script reaches.
async function runExample(name) {
  const { execFile } = await import("node:child_process");
  const { fileURLToPath } = await import("node:url");
  const env = { ...process.env, TOOLPOOL_EXAMPLE_WORKSPACE: "ex-" + randomUUID().slice(0, 8) };
  delete env.ANTHROPIC_API_KEY; // scripted turns: no API key, no outside service
  delete env.OPENAI_API_KEY;
  const file = fileURLToPath(new URL(`../examples/${name}`, import.meta.url));
  return new Promise((resolve, reject) => execFile(process.execPath, [file], { env, timeout: 120_000 }, (err, stdout, stderr) =>
    err ? reject(new Error(`${name}: ${err.message}\n${stderr}`)) : resolve({ out: JSON.parse(stdout.trim().split("\n").at(-1)), stderr })));
}

for (const example of ["anthropic-loop.mjs", "openai-agents.mjs"]) {
  test(`example ${example} runs tools and stops at the approval`, async () => {
    const { out, stderr } = await runExample(example);
    assert.equal(out.done, false);
    assert.ok(out.ran.length >= 2 && out.ran.every((r) => r.status === "ok"), JSON.stringify(out));
    assert.ok(stderr.includes(`toolpool approvals approve ${out.pending}`));
    assert.equal((await tp.get(out.pending)).status, "pending_approval");
    await approver.approve(out.pending);
    assert.equal((await tp.wait(out.pending, { timeoutMs: 60_000 })).status, "ok");
    if (example === "anthropic-loop.mjs") assert.ok(out.ran[0].output.startsWith("/workspace\n"));
    else assert.ok(out.ran[0].tool === "read_file" && out.ran[0].output.includes("build into out/"));
  });
}
