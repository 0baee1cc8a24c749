import type { Approval, AuditEvent, CallOptions, Event, PolicyCheck, Result, Workspace } from "./types.js";
export declare const DEFAULT_URL = "http://127.0.0.1:8080";
export interface ClientOptions {
    /** The dispatcher's URL; default $TOOLPOOL_URL (where there is a process.env), else http://127.0.0.1:8080. */
    url?: string;
    /** The bearer token; default $TOOLPOOL_TOKEN, else "dev" (what make run configures). */
    token?: string;
    /** The workspace of calls that name none (the token's default otherwise). */
    workspace?: string;
    /** How many times in a row a dropped connection is retried, with backoff (default 5). */
    retries?: number;
    /** Milliseconds one request may take beyond what the server is asked to wait (default 60 000). */
    timeoutMs?: number;
    /** The fetch to use (default globalThis.fetch). */
    fetch?: typeof fetch;
}
/**
 * A client of one toolpool dispatcher for one token. Refusals reject with a ToolpoolError subclass by
 * kind (InvalidParams, Conflict, ...) carrying the server's type and message. A call's answer is always
 * its Result, whatever its status: a call that policy denied is a Result with status "denied".
 */
export declare class Client {
    readonly url: string;
    readonly token: string;
    readonly workspace?: string;
    readonly retries: number;
    readonly timeoutMs: number;
    private readonly fetch;
    constructor(opts?: ClientOptions);
    /** One request, no retry; a network failure rejects with the fetch error. */
    private send;
    /** A request, repeated after a dropped connection (or a 503 with Retry-After) unless r.retry is false. */
    private request;
    private json;
    /** A request answered with a call's envelope (200, 202, or 403 for a denied call). */
    private envelope;
    private callBody;
    /**
     * Run a tool and resolve to its Result once the call ends or waits for a person (status
     * pending_approval: approve it, then wait()); at most opts.timeoutMs when given (then the Result says
     * queued or running). Every call carries an idempotency key, so a submission whose connection drops is
     * repeated without running twice, and the wait resumes after a dropped connection.
     */
    call(tool: string, args?: Record<string, unknown>, opts?: CallOptions & {
        wait?: boolean;
        timeoutMs?: number;
    }): Promise<Result>;
    /** Queue a call and resolve at once (status queued, pending_approval, or denied). */
    submit(tool: string, args?: Record<string, unknown>, opts?: CallOptions): Promise<Result>;
    /** A call's envelope now, or after waiting up to opts.wait seconds for it to end. */
    get(id: string, opts?: {
        wait?: number;
    }): Promise<Result>;
    /** Wait for a call to end (a call waiting for approval too), long polling; at most opts.timeoutMs. */
    wait(id: string, opts?: {
        timeoutMs?: number;
    }): Promise<Result>;
    /** Cancel a queued or parked call, or kill a running call's container; its envelope after. */
    cancel(id: string): Promise<Result>;
    /**
     * The call's Server-Sent Events until its result event: status changes, stdout and stderr as printed,
     * lag notes. A dropped connection is resumed from the last event received (Last-Event-ID), so no output
     * byte is lost or repeated. With stopAtApproval the iteration ends at a pending_approval status event.
     */
    events(id: string, opts?: {
        lastEventId?: string;
        stopAtApproval?: boolean;
    }): AsyncGenerator<Event>;
    /**
     * Run a tool and iterate over its events as it runs, ending with its result event; a call that waits
     * for approval ends the iteration at its pending_approval status event (unless stopAtApproval is
     * false); a denied call yields its status and result at once. Resumes like events().
     */
    stream(tool: string, args?: Record<string, unknown>, opts?: CallOptions & {
        stopAtApproval?: boolean;
    }): AsyncGenerator<Event>;
    private follow;
    /** Bytes of a finished command's full stdout or stderr from offset (at most limit, server default 1 MiB), and where to read on. */
    readOutput(id: string, stream?: "stdout" | "stderr", opts?: {
        offset?: number;
        limit?: number;
    }): Promise<{
        data: Uint8Array;
        next: number;
    }>;
    /** The tools this token may use, in toolpool's own shape or openai, anthropic or mcp. */
    tools(format?: "native" | "openai" | "anthropic" | "mcp"): Promise<any[]>;
    /** The tools as OpenAI function tools ({type: "function", function: {name, description, parameters}}). */
    openaiTools(): Promise<any[]>;
    /** The tools as Anthropic Messages tools ({name, description, input_schema}). */
    anthropicTools(): Promise<any[]>;
    /** What policy would decide for a call, without running it. */
    checkPolicy(tool: string, args?: Record<string, unknown>, opts?: CallOptions): Promise<PolicyCheck>;
    /** The calls waiting for approval (approver tokens only). */
    approvals(): Promise<Approval[]>;
    /** Approve a waiting call; with argsDigest only if its arguments are still those; always also allows the tool with argvPrefix from now on. */
    approve(id: string, opts?: {
        argsDigest?: string;
        always?: boolean;
        argvPrefix?: string[];
    }): Promise<Result>;
    /** Deny a waiting call; its envelope, status denied. reason (one line, at most 500 bytes) is told to the caller in the denied call's error. */
    deny(id: string, opts?: {
        reason?: string;
    }): Promise<Result>;
    /** The tenant's audit events since a duration ago (1h) or an RFC 3339 time. */
    audit(opts?: {
        since?: string;
        limit?: number;
    }): Promise<AuditEvent[]>;
    /** A workspace operation: its answer, or CallNotFinished (202), CallDenied (403 envelope) or the error. */
    private workspaceOp;
    private workspaceAnswer;
    /**
     * Create a workspace: empty, from an archive (tar, tar.gz or zip bytes; tarDirectory from
     * "toolpool/node" makes one of a local directory), or from a git URL and ref (cloned through egress,
     * under policy); image is the OCI image its calls run on when they ask for none (checked by policy).
     * Rejects with Conflict when it exists, CallNotFinished when it waits for approval.
     */
    createWorkspace(name: string, from?: {
        archive?: Uint8Array;
        git?: string;
        ref?: string;
        image?: string;
    }): Promise<Workspace>;
    /**
     * Change an existing workspace's default image ("" removes it; its calls then run on the tenant's or
     * worker's default). A new image must pass policy's images.allow (Forbidden; InvalidParams for a
     * reference that does not parse); the change waits for calls running in the workspace to end. Rejects
     * with NotFound when the workspace does not exist.
     */
    setWorkspaceImage(name: string, image: string): Promise<Workspace>;
    workspaces(): Promise<Workspace[]>;
    workspaceInfo(name: string): Promise<Workspace>;
    deleteWorkspace(name: string): Promise<void>;
    /** Write one file of the workspace (its directories are made). */
    uploadFile(name: string, path: string, data: Uint8Array | string): Promise<Workspace>;
    /** Unpack an archive (tar, tar.gz or zip) into the workspace, under opts.path. */
    uploadArchive(name: string, archive: Uint8Array, opts?: {
        path?: string;
    }): Promise<Workspace>;
    /** A file's bytes, or length of them from offset. */
    downloadFile(name: string, path: string, opts?: {
        offset?: number;
        length?: number;
    }): Promise<Uint8Array>;
    /** The workspace's tree (or opts.path) as tar.gz bytes. */
    downloadArchive(name: string, opts?: {
        path?: string;
    }): Promise<Uint8Array>;
    /** Save a snapshot (named snap-DATE-TIME unless given); the workspace after, with its snapshots. */
    snapshot(name: string, snapshot?: string): Promise<Workspace>;
    /** Copy the workspace, or one of its snapshots, to a new workspace; the new one. */
    fork(name: string, to: string, opts?: {
        snapshot?: string;
    }): Promise<Workspace>;
    /** Replace the workspace's tree with a snapshot's. */
    restore(name: string, snapshot: string): Promise<Workspace>;
    /** The server's OpenAPI 3.1 document. */
    openapi(): Promise<Record<string, unknown>>;
}
