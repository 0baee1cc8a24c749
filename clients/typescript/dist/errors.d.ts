import type { Result } from "./types.js";
/** The fields of an error answer ({"error": {"type", "message"}}, and "id" when it names a call). */
export interface ErrorBody {
    error?: {
        type?: string;
        message?: string;
    };
    id?: string;
    status?: string;
}
/**
 * A refusal of toolpool's API, or a failure to reach it. `status` is the HTTP status (0 when the server
 * could not be reached), `type` the error body's machine-readable type (invalid_request, invalid_params,
 * idempotency_key_reused, ...), `message` the server's message, which says what to fix; `callId` names
 * the call when toolpool could not read its state just then; `retryAfter` is Retry-After in seconds.
 */
export declare class ToolpoolError extends Error {
    readonly status: number;
    readonly type: string;
    readonly callId?: string;
    readonly retryAfter?: number;
    readonly body?: ErrorBody;
    constructor(message: string, opts?: {
        status?: number;
        type?: string;
        callId?: string;
        retryAfter?: number;
        body?: ErrorBody;
    });
}
/** 400: the request is malformed (a body, a name, a query parameter). */
export declare class InvalidRequest extends ToolpoolError {
}
/** 401: no token, or a token the dispatcher does not know. */
export declare class Unauthenticated extends ToolpoolError {
}
/** 403 with an error body: the token may not do this (approvals need an approver token). */
export declare class Forbidden extends ToolpoolError {
}
/** 404: no such call, workspace, snapshot or file for this tenant. */
export declare class NotFound extends ToolpoolError {
}
/** 409: an idempotency key reused, a name taken, a stale digest. */
export declare class Conflict extends ToolpoolError {
}
/** 411: the upload must say its length. */
export declare class LengthRequired extends ToolpoolError {
}
/** 413: the request, or what it would write, is over a size limit. */
export declare class TooLarge extends ToolpoolError {
}
/** 415: the body is of a kind the operation does not take. */
export declare class UnsupportedMedia extends ToolpoolError {
}
/** 416: the byte range lies outside the file. */
export declare class RangeNotSatisfiable extends ToolpoolError {
}
/** 422: an unknown tool, arguments that fail its schema, or an ask above a ceiling. */
export declare class InvalidParams extends ToolpoolError {
}
/** 429: the tenant has as many calls in flight as it may; retry after retryAfter seconds. */
export declare class TenantFull extends ToolpoolError {
}
/** 500: toolpool itself failed. */
export declare class InternalError extends ToolpoolError {
}
/** 503: toolpool could not do it just then (a NATS failover); retry. callId names the call. */
export declare class Unavailable extends ToolpoolError {
}
/** 504: the operation did not end in time. */
export declare class GatewayTimeout extends ToolpoolError {
}
/** The dispatcher could not be reached, or the connection dropped and could not be resumed. */
export declare class ConnectionFailed extends ToolpoolError {
}
/** The exception for an error answer: its class by status, the server's type and message. */
export declare function errorFrom(status: number, body: unknown, retryAfter?: string | null): ToolpoolError;
/**
 * An operation that runs as a call (a workspace operation) has not ended: it waits for a person's
 * approval (result.status is pending_approval) or still runs. Approve it, then wait for the call.
 */
export declare class CallNotFinished extends ToolpoolError {
    readonly result: Result;
    constructor(result: Result);
}
/** An operation that runs as a call was denied by policy or a person; result.decision says why. */
export declare class CallDenied extends ToolpoolError {
    readonly result: Result;
    constructor(result: Result);
}
