// The client: fetch only, no dependencies; Node 20 and later, Deno, browsers (where CORS allows).
import { CallDenied, CallNotFinished, ConnectionFailed, ToolpoolError, errorFrom } from "./errors.js";
import { TERMINAL } from "./types.js";
export const DEFAULT_URL = "http://127.0.0.1:8080";
const env = (name) => globalThis.process?.env?.[name];
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
/** Whether an answer's body is a call's envelope (a 202 or a denied 403), not an error body. */
function isEnvelope(body) {
    return !!body && typeof body === "object" && "id" in body && "tool" in body && "status" in body;
}
async function parseBody(r) {
    const text = await r.text();
    try {
        return text ? JSON.parse(text) : undefined;
    }
    catch {
        return text;
    }
}
function makeEvent(event, id, data) {
    const parsed = data ? JSON.parse(data) : {};
    let bytes = new Uint8Array();
    if (event === "stdout" || event === "stderr") {
        bytes = typeof parsed.base64 === "string"
            ? Uint8Array.from(atob(parsed.base64), (c) => c.charCodeAt(0))
            : new TextEncoder().encode(parsed.text ?? "");
    }
    return { event, id, data: parsed, bytes, text: new TextDecoder().decode(bytes) };
}
/** Events from an event-stream body; an event counts only once its blank line arrived. onData is called
 * for every piece read (events and keep-alives alike). */
async function* parseSSE(body, onData) {
    const reader = body.getReader();
    const dec = new TextDecoder();
    let buf = "";
    let event = "", id = "", data = [];
    try {
        for (;;) {
            const { value, done } = await reader.read();
            if (done)
                return;
            onData();
            buf += dec.decode(value, { stream: true });
            let nl;
            while ((nl = buf.indexOf("\n")) >= 0) {
                const line = buf.slice(0, nl).replace(/\r$/, "");
                buf = buf.slice(nl + 1);
                if (line === "") {
                    if (event || data.length)
                        yield makeEvent(event || "message", id, data.join("\n"));
                    event = "";
                    id = "";
                    data = [];
                }
                else if (!line.startsWith(":")) {
                    const i = line.indexOf(":");
                    const name = i < 0 ? line : line.slice(0, i);
                    let value = i < 0 ? "" : line.slice(i + 1);
                    if (value.startsWith(" "))
                        value = value.slice(1);
                    if (name === "event")
                        event = value;
                    else if (name === "id")
                        id = value;
                    else if (name === "data")
                        data.push(value);
                }
            }
        }
    }
    finally {
        reader.releaseLock();
        await body.cancel().catch(() => { });
    }
}
const seg = encodeURIComponent;
const filePath = (p) => p.replace(/^\/+/, "").split("/").map(encodeURIComponent).join("/");
/**
 * A client of one toolpool dispatcher for one token. Refusals reject with a ToolpoolError subclass by
 * kind (InvalidParams, Conflict, ...) carrying the server's type and message. A call's answer is always
 * its Result, whatever its status: a call that policy denied is a Result with status "denied".
 */
export class Client {
    url;
    token;
    workspace;
    retries;
    timeoutMs;
    fetch;
    constructor(opts = {}) {
        this.url = (opts.url ?? env("TOOLPOOL_URL") ?? DEFAULT_URL).replace(/\/+$/, "");
        if (!/^https?:\/\/[^/]/.test(this.url))
            throw new TypeError(`url ${JSON.stringify(this.url)} is not an http:// or https:// URL: give e.g. ${DEFAULT_URL}`);
        this.token = opts.token ?? env("TOOLPOOL_TOKEN") ?? "dev";
        this.workspace = opts.workspace;
        this.retries = opts.retries ?? 5;
        this.timeoutMs = opts.timeoutMs ?? 60_000;
        this.fetch = opts.fetch ?? globalThis.fetch.bind(globalThis);
    }
    // -- transport ------------------------------------------------------------------------------------
    /** One request, no retry; a network failure rejects with the fetch error. */
    send(method, path, r = {}, signal) {
        const q = Object.entries(r.query ?? {}).filter(([, v]) => v !== undefined && v !== "");
        const target = this.url + path + (q.length ? "?" + new URLSearchParams(q.map(([k, v]) => [k, String(v)])).toString() : "");
        const headers = { Authorization: `Bearer ${this.token}`, ...(r.headers ?? {}) };
        let body;
        if (r.body instanceof Uint8Array) {
            body = r.body;
            headers["Content-Type"] ??= "application/octet-stream";
        }
        else if (r.body !== undefined) {
            body = JSON.stringify(r.body);
            headers["Content-Type"] = "application/json";
        }
        return this.fetch(target, { method, headers, body, signal: signal ?? AbortSignal.timeout(this.timeoutMs + (r.wait ?? 0) * 1000) });
    }
    /** A request, repeated after a dropped connection (or a 503 with Retry-After) unless r.retry is false. */
    async request(method, path, r = {}) {
        const ok = r.ok ?? [200];
        for (let attempt = 0;; attempt++) {
            let resp;
            try {
                resp = await this.send(method, path, r);
            }
            catch (e) {
                if (r.retry === false || attempt >= this.retries)
                    throw new ConnectionFailed(`${method} ${path}: ${e.message}`);
                await sleep(Math.min(200 * 2 ** attempt, 5000));
                continue;
            }
            if (resp.status === 503 && r.retry !== false && attempt < this.retries && resp.headers.has("retry-after")) {
                await resp.body?.cancel();
                await sleep(Math.min(Number(resp.headers.get("retry-after")) * 1000 || 1000, 5000));
                continue;
            }
            if (ok.includes(resp.status))
                return resp;
            throw errorFrom(resp.status, await parseBody(resp), resp.headers.get("retry-after"));
        }
    }
    async json(method, path, r = {}) {
        return (await (await this.request(method, path, r)).json());
    }
    /** A request answered with a call's envelope (200, 202, or 403 for a denied call). */
    async envelope(method, path, r = {}) {
        const resp = await this.request(method, path, { ...r, ok: [200, 202, 403] });
        const body = await parseBody(resp);
        if (resp.status === 403 && !isEnvelope(body))
            throw errorFrom(403, body, resp.headers.get("retry-after"));
        return body;
    }
    // -- calls ----------------------------------------------------------------------------------------
    callBody(tool, args, opts) {
        const body = { tool, args: args ?? {}, ...opts };
        body.idempotency_key ??= "ts-" + crypto.randomUUID();
        if (!body.workspace && this.workspace)
            body.workspace = this.workspace;
        for (const k of Object.keys(body))
            if (body[k] === undefined)
                delete body[k];
        return body;
    }
    /**
     * Run a tool and resolve to its Result once the call ends or waits for a person (status
     * pending_approval: approve it, then wait()); at most opts.timeoutMs when given (then the Result says
     * queued or running). Every call carries an idempotency key, so a submission whose connection drops is
     * repeated without running twice, and the wait resumes after a dropped connection.
     */
    async call(tool, args, opts = {}) {
        const { wait = true, timeoutMs, ...rest } = opts;
        let res = await this.envelope("POST", "/v1/calls", { body: { ...this.callBody(tool, args, rest), wait: false } });
        if (!wait)
            return res;
        const deadline = timeoutMs === undefined ? undefined : Date.now() + timeoutMs;
        while (!TERMINAL.has(res.status) && res.status !== "pending_approval") {
            const left = deadline === undefined ? 30 : Math.min((deadline - Date.now()) / 1000, 30);
            if (left <= 0)
                break;
            res = await this.get(res.id, { wait: left });
        }
        return res;
    }
    /** Queue a call and resolve at once (status queued, pending_approval, or denied). */
    submit(tool, args, opts = {}) {
        return this.call(tool, args, { ...opts, wait: false });
    }
    /** A call's envelope now, or after waiting up to opts.wait seconds for it to end. */
    get(id, opts = {}) {
        const query = opts.wait ? { wait: `${Math.ceil(opts.wait * 1000)}ms` } : undefined;
        return this.envelope("GET", `/v1/calls/${seg(id)}`, { query, wait: opts.wait });
    }
    /** Wait for a call to end (a call waiting for approval too), long polling; at most opts.timeoutMs. */
    async wait(id, opts = {}) {
        const deadline = opts.timeoutMs === undefined ? undefined : Date.now() + opts.timeoutMs;
        let res = await this.get(id);
        while (!TERMINAL.has(res.status)) {
            const left = deadline === undefined ? 30 : Math.min((deadline - Date.now()) / 1000, 30);
            if (left <= 0)
                break;
            res = await this.get(id, { wait: left });
        }
        return res;
    }
    /** Cancel a queued or parked call, or kill a running call's container; its envelope after. */
    cancel(id) {
        return this.envelope("DELETE", `/v1/calls/${seg(id)}`);
    }
    // -- output ---------------------------------------------------------------------------------------
    /**
     * The call's Server-Sent Events until its result event: status changes, stdout and stderr as printed,
     * lag notes. A dropped connection is resumed from the last event received (Last-Event-ID), so no output
     * byte is lost or repeated. With stopAtApproval the iteration ends at a pending_approval status event.
     */
    events(id, opts = {}) {
        return this.follow(id, opts.lastEventId, undefined, opts.stopAtApproval ?? false);
    }
    /**
     * Run a tool and iterate over its events as it runs, ending with its result event; a call that waits
     * for approval ends the iteration at its pending_approval status event (unless stopAtApproval is
     * false); a denied call yields its status and result at once. Resumes like events().
     */
    stream(tool, args, opts = {}) {
        const { stopAtApproval = true, ...rest } = opts;
        const body = this.callBody(tool, args, rest);
        const first = (signal) => this.send("POST", "/v1/calls", { body, headers: { Accept: "text/event-stream" } }, signal);
        return this.follow(undefined, undefined, first, stopAtApproval);
    }
    async *follow(id, last, first, stopAtApproval) {
        for (let failures = 0;;) {
            const ctl = new AbortController();
            // The server sends a keep-alive every 15 s: a stream silent for timeoutMs is dead (a peer gone
            // without closing), so it is dropped, and resumed like any dropped stream.
            let idle;
            const alive = () => {
                clearTimeout(idle);
                idle = setTimeout(() => ctl.abort(new Error(`the event stream was silent for ${this.timeoutMs} ms`)), this.timeoutMs);
            };
            alive();
            try {
                let resp;
                if (first) {
                    resp = await first(ctl.signal);
                }
                else {
                    const headers = { Accept: "text/event-stream" };
                    if (last)
                        headers["Last-Event-ID"] = last;
                    resp = await this.send("GET", `/v1/calls/${seg(id ?? "")}/events`, { headers }, ctl.signal);
                }
                if (resp.status !== 200) {
                    const body = await parseBody(resp);
                    if (first && (resp.status === 202 || resp.status === 403) && isEnvelope(body)) {
                        yield makeEvent("status", "0.0", JSON.stringify({ id: body.id, status: body.status }));
                        if (TERMINAL.has(body.status))
                            yield makeEvent("result", "0.0", JSON.stringify(body));
                        return;
                    }
                    throw errorFrom(resp.status, body, resp.headers.get("retry-after"));
                }
                for await (const ev of parseSSE(resp.body, alive)) {
                    failures = 0;
                    if (ev.event === "status" && id === undefined) {
                        // Named: from here on, resume by following it. Until then, a dropped submission is sent
                        // again: its idempotency key finds the same call.
                        id = ev.data.id;
                        first = undefined;
                    }
                    last = ev.id || last;
                    yield ev;
                    if (ev.event === "result" || ev.event === "error")
                        return;
                    if (stopAtApproval && ev.event === "status" && ev.data.status === "pending_approval")
                        return;
                }
                throw new Error("the event stream ended before its result event");
            }
            catch (e) {
                if (e instanceof ToolpoolError)
                    throw e;
                failures++;
                if ((id === undefined && !first) || failures > this.retries)
                    throw new ConnectionFailed(`follow call ${id ?? "(not yet named)"}: ${e.message}`);
                await sleep(Math.min(200 * 2 ** failures, 5000));
            }
            finally {
                clearTimeout(idle);
                ctl.abort();
            }
        }
    }
    /** Bytes of a finished command's full stdout or stderr from offset (at most limit, server default 1 MiB), and where to read on. */
    async readOutput(id, stream = "stdout", opts = {}) {
        const resp = await this.request("GET", `/v1/calls/${seg(id)}/${stream}`, { query: { offset: opts.offset, limit: opts.limit } });
        const data = new Uint8Array(await resp.arrayBuffer());
        return { data, next: Number(resp.headers.get("x-toolpool-next-offset") ?? (opts.offset ?? 0) + data.length) };
    }
    // -- tools and policy -----------------------------------------------------------------------------
    /** The tools this token may use, in toolpool's own shape or openai, anthropic or mcp. */
    async tools(format = "native") {
        return (await this.json("GET", "/v1/tools", { query: { format } })).tools;
    }
    /** The tools as OpenAI function tools ({type: "function", function: {name, description, parameters}}). */
    openaiTools() { return this.tools("openai"); }
    /** The tools as Anthropic Messages tools ({name, description, input_schema}). */
    anthropicTools() { return this.tools("anthropic"); }
    /** What policy would decide for a call, without running it. */
    checkPolicy(tool, args, opts = {}) {
        const { idempotency_key: _k, ...body } = this.callBody(tool, args, opts);
        return this.json("POST", "/v1/policy/check", { body });
    }
    // -- approvals ------------------------------------------------------------------------------------
    /** The calls waiting for approval (approver tokens only). */
    async approvals() {
        return (await this.json("GET", "/v1/approvals")).approvals;
    }
    /** Approve a waiting call; with argsDigest only if its arguments are still those; always also allows the tool with argvPrefix from now on. */
    approve(id, opts = {}) {
        const body = { decision: "approve" };
        if (opts.argsDigest)
            body.args_digest = opts.argsDigest;
        if (opts.always) {
            body.always = true;
            if (opts.argvPrefix)
                body.argv_prefix = opts.argvPrefix;
        }
        return this.envelope("POST", `/v1/approvals/${seg(id)}`, { body, retry: false });
    }
    /** Deny a waiting call; its envelope, status denied. reason (one line, at most 500 bytes) is told to the caller in the denied call's error. */
    deny(id, opts = {}) {
        const body = { decision: "deny" };
        if (opts.reason)
            body.reason = opts.reason;
        return this.envelope("POST", `/v1/approvals/${seg(id)}`, { body, retry: false });
    }
    /** The tenant's audit events since a duration ago (1h) or an RFC 3339 time. */
    async audit(opts = {}) {
        return (await this.json("GET", "/v1/audit", { query: { since: opts.since ?? "1h", limit: opts.limit } })).events;
    }
    // -- workspaces -----------------------------------------------------------------------------------
    /** A workspace operation: its answer, or CallNotFinished (202), CallDenied (403 envelope) or the error. */
    async workspaceOp(method, path, ok, r = {}) {
        const resp = await this.request(method, path, { ...r, ok: [...ok, 202, 403] });
        if (resp.status === 202 || resp.status === 403) {
            const body = await parseBody(resp);
            if (isEnvelope(body))
                throw body.status === "denied" ? new CallDenied(body) : new CallNotFinished(body);
            throw errorFrom(resp.status, body, resp.headers.get("retry-after"));
        }
        return resp;
    }
    async workspaceAnswer(method, path, ok, r = {}) {
        const d = (await (await this.workspaceOp(method, path, ok, r)).json());
        return { ...d.workspace, call_id: d.call_id };
    }
    /**
     * Create a workspace: empty, from an archive (tar, tar.gz or zip bytes; tarDirectory from
     * "toolpool/node" makes one of a local directory), or from a git URL and ref (cloned through egress,
     * under policy); image is the OCI image its calls run on when they ask for none (checked by policy).
     * Rejects with Conflict when it exists, CallNotFinished when it waits for approval.
     */
    createWorkspace(name, from = {}) {
        if (from.archive && from.git)
            throw new TypeError("give archive or git, not both");
        if (from.archive) {
            return this.workspaceAnswer("PUT", `/v1/workspaces/${seg(name)}`, [201], { body: from.archive, query: { image: from.image }, retry: false });
        }
        const json = {};
        if (from.git)
            json.git = { url: from.git, ...(from.ref ? { ref: from.ref } : {}) };
        if (from.image)
            json.image = from.image;
        const body = Object.keys(json).length ? json : undefined;
        return this.workspaceAnswer("PUT", `/v1/workspaces/${seg(name)}`, [201], { body, retry: false });
    }
    /**
     * Change an existing workspace's default image ("" removes it; its calls then run on the tenant's or
     * worker's default). A new image must pass policy's images.allow (Forbidden; InvalidParams for a
     * reference that does not parse); the change waits for calls running in the workspace to end. Rejects
     * with NotFound when the workspace does not exist.
     */
    setWorkspaceImage(name, image) {
        return this.workspaceAnswer("PATCH", `/v1/workspaces/${seg(name)}`, [200], { body: { image }, retry: false });
    }
    async workspaces() {
        return (await (await this.workspaceOp("GET", "/v1/workspaces", [200])).json()).workspaces;
    }
    workspaceInfo(name) {
        return this.workspaceAnswer("GET", `/v1/workspaces/${seg(name)}`, [200]);
    }
    async deleteWorkspace(name) {
        await (await this.workspaceOp("DELETE", `/v1/workspaces/${seg(name)}`, [200], { retry: false })).body?.cancel();
    }
    /** Write one file of the workspace (its directories are made). */
    uploadFile(name, path, data) {
        const body = typeof data === "string" ? new TextEncoder().encode(data) : data;
        return this.workspaceAnswer("PUT", `/v1/workspaces/${seg(name)}/files/${filePath(path)}`, [200], { body, retry: false });
    }
    /** Unpack an archive (tar, tar.gz or zip) into the workspace, under opts.path. */
    uploadArchive(name, archive, opts = {}) {
        return this.workspaceAnswer("POST", `/v1/workspaces/${seg(name)}/files`, [200], { body: archive, query: { path: opts.path }, retry: false });
    }
    /** A file's bytes, or length of them from offset. */
    async downloadFile(name, path, opts = {}) {
        const headers = {};
        if (opts.offset || opts.length !== undefined) {
            const from = opts.offset ?? 0;
            headers.Range = `bytes=${from}-${opts.length === undefined ? "" : from + opts.length - 1}`;
        }
        const resp = await this.workspaceOp("GET", `/v1/workspaces/${seg(name)}/files/${filePath(path)}`, [200, 206], { headers });
        return new Uint8Array(await resp.arrayBuffer());
    }
    /** The workspace's tree (or opts.path) as tar.gz bytes. */
    async downloadArchive(name, opts = {}) {
        const resp = await this.workspaceOp("GET", `/v1/workspaces/${seg(name)}/archive`, [200], { query: { path: opts.path } });
        return new Uint8Array(await resp.arrayBuffer());
    }
    /** Save a snapshot (named snap-DATE-TIME unless given); the workspace after, with its snapshots. */
    snapshot(name, snapshot) {
        return this.workspaceAnswer("POST", `/v1/workspaces/${seg(name)}/snapshot`, [201], { body: snapshot ? { snapshot } : {}, retry: false });
    }
    /** Copy the workspace, or one of its snapshots, to a new workspace; the new one. */
    fork(name, to, opts = {}) {
        return this.workspaceAnswer("POST", `/v1/workspaces/${seg(name)}/fork`, [201], { body: { to, ...(opts.snapshot ? { snapshot: opts.snapshot } : {}) }, retry: false });
    }
    /** Replace the workspace's tree with a snapshot's. */
    restore(name, snapshot) {
        return this.workspaceAnswer("POST", `/v1/workspaces/${seg(name)}/restore`, [200], { body: { snapshot }, retry: false });
    }
    /** The server's OpenAPI 3.1 document. */
    openapi() {
        return this.json("GET", "/v1/openapi.json");
    }
}
