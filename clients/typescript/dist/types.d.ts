export type Status = "queued" | "pending_approval" | "running" | "ok" | "error" | "timeout" | "denied" | "cancelled" | "expired" | "lost" | "unknown";
/** The final statuses: a call in one of them never changes again. */
export declare const TERMINAL: ReadonlySet<Status>;
export interface ErrorInfo {
    type: string;
    message: string;
}
/** Policy's verdict: action allow, ask or deny; rule and reason say why. */
export interface Decision {
    action: "allow" | "ask" | "deny";
    rule?: string;
    reason?: string;
    clamped?: string[];
}
export interface Timing {
    queued_ms: number;
    sandbox_ms: number;
    run_ms: number;
    total_ms: number;
    warm: boolean;
}
export interface Usage {
    max_rss_bytes: number;
    cpu_ms: number;
    wall_ms: number;
    signal?: string;
    workspace_bytes?: number;
}
/** A command's full stdout or stderr: bytes printed, kept readable by range (readOutput). */
export interface StreamInfo {
    bytes: number;
    kept: number;
}
export interface EgressConn {
    host: string;
    port: number;
    decision: "allowed" | "refused" | "failed";
    rule?: string;
    reason?: string;
    credential?: string;
    connections: number;
    bytes_up: number;
    bytes_down: number;
}
/** The result envelope of a call, whatever its state. */
export interface Result {
    id: string;
    tenant: string;
    workspace: string;
    tool: string;
    status: Status;
    exit_code?: number;
    output: string;
    stdout?: string;
    stderr?: string;
    truncated: boolean;
    output_bytes: number;
    error?: ErrorInfo;
    decision?: Decision;
    timing: Timing;
    usage: Usage;
    worker?: string;
    attempt?: number;
    image?: string;
    egress?: EgressConn[];
    args_digest?: string;
    cancel_requested?: boolean;
    lease_until?: string;
    trace_id?: string;
    created_at: string;
    deadline?: string;
    started_at?: string;
    finished_at?: string;
    streams?: Partial<Record<"stdout" | "stderr", StreamInfo>>;
}
/** One Server-Sent Event of a call; data is the event's JSON. */
export interface Event {
    event: "status" | "stdout" | "stderr" | "lag" | "restart" | "result" | "error" | string;
    /** The reader's position, "<stdout bytes>.<stderr bytes>.<attempt>": resume from it with Last-Event-ID.
     * A "restart" event (the call running again after its worker was lost) starts stdout and stderr over
     * from byte 0. */
    id: string;
    data: any;
    /** The output bytes of a stdout or stderr event (text or base64 on the wire), else empty. */
    bytes: Uint8Array;
    /** The output of a stdout or stderr event as text. */
    text: string;
}
export interface Approval {
    id: string;
    tool: string;
    workspace: string;
    args: unknown;
    args_digest: string;
    rule: string;
    reason: string;
    created_at: string;
    expires_at: string;
}
export interface PolicyCheck {
    tool: string;
    decision: Decision;
    limits: Record<string, unknown>;
    would_run: boolean;
}
export interface Snapshot {
    name: string;
    created_at: string;
}
export interface Workspace {
    name: string;
    bytes: number;
    files: number;
    created_at: string;
    last_used_at: string;
    expires_at?: string;
    snapshots?: Snapshot[];
    reflinked?: boolean;
    /** The workspace's default image, when it has one. */
    image?: string;
    /** The id of the call that ran the operation. */
    call_id?: string;
}
export interface AuditEvent {
    time: string;
    event: string;
    tenant: string;
    call_id: string;
    tool: string;
    workspace?: string;
    args_digest?: string;
    action?: string;
    rule?: string;
    status: Status;
    error_type?: string;
    duration_ms?: number;
    worker?: string;
    actor?: string;
    egress?: EgressConn[];
}
/** The request's other fields besides tool and args (POST /v1/calls). */
export interface CallOptions {
    workspace?: string;
    image?: string;
    timeout_ms?: number;
    deadline_ms?: number;
    output_bytes?: number;
    memory_bytes?: number;
    cpu_millis?: number;
    pids?: number;
    tmp_bytes?: number;
    tools?: Record<string, unknown>;
    /** Names the call for the tenant; a fresh one is made unless given, so a dropped submission is repeated safely. */
    idempotency_key?: string;
}
