// Exceptions: one class per kind of refusal, each carrying the server's error type and message.

import type { Result } from "./types.js";

/** The fields of an error answer ({"error": {"type", "message"}}, and "id" when it names a call). */
export interface ErrorBody {
  error?: { type?: string; message?: string };
  id?: string;
  status?: string;
}

/**
 * A refusal of toolpool's API, or a failure to reach it. `status` is the HTTP status (0 when the server
 * could not be reached), `type` the error body's machine-readable type (invalid_request, invalid_params,
 * idempotency_key_reused, ...), `message` the server's message, which says what to fix; `callId` names
 * the call when toolpool could not read its state just then; `retryAfter` is Retry-After in seconds.
 */
export class ToolpoolError extends Error {
  readonly status: number;
  readonly type: string;
  readonly callId?: string;
  readonly retryAfter?: number;
  readonly body?: ErrorBody;

  constructor(message: string, opts: { status?: number; type?: string; callId?: string; retryAfter?: number; body?: ErrorBody } = {}) {
    super(message);
    this.name = new.target.name;
    this.status = opts.status ?? 0;
    this.type = opts.type ?? "";
    this.callId = opts.callId;
    this.retryAfter = opts.retryAfter;
    this.body = opts.body;
  }
}

/** 400: the request is malformed (a body, a name, a query parameter). */
export class InvalidRequest extends ToolpoolError {}
/** 401: no token, or a token the dispatcher does not know. */
export class Unauthenticated extends ToolpoolError {}
/** 403 with an error body: the token may not do this (approvals need an approver token). */
export class Forbidden extends ToolpoolError {}
/** 404: no such call, workspace, snapshot or file for this tenant. */
export class NotFound extends ToolpoolError {}
/** 409: an idempotency key reused, a name taken, a stale digest. */
export class Conflict extends ToolpoolError {}
/** 411: the upload must say its length. */
export class LengthRequired extends ToolpoolError {}
/** 413: the request, or what it would write, is over a size limit. */
export class TooLarge extends ToolpoolError {}
/** 415: the body is of a kind the operation does not take. */
export class UnsupportedMedia extends ToolpoolError {}
/** 416: the byte range lies outside the file. */
export class RangeNotSatisfiable extends ToolpoolError {}
/** 422: an unknown tool, arguments that fail its schema, or an ask above a ceiling. */
export class InvalidParams extends ToolpoolError {}
/** 429: the tenant has as many calls in flight as it may; retry after retryAfter seconds. */
export class TenantFull extends ToolpoolError {}
/** 500: toolpool itself failed. */
export class InternalError extends ToolpoolError {}
/** 503: toolpool could not do it just then (a NATS failover); retry. callId names the call. */
export class Unavailable extends ToolpoolError {}
/** 504: the operation did not end in time. */
export class GatewayTimeout extends ToolpoolError {}
/** The dispatcher could not be reached, or the connection dropped and could not be resumed. */
export class ConnectionFailed extends ToolpoolError {}

const byStatus: Record<number, typeof ToolpoolError> = {
  400: InvalidRequest, 401: Unauthenticated, 403: Forbidden, 404: NotFound, 409: Conflict, 411: LengthRequired,
  413: TooLarge, 415: UnsupportedMedia, 416: RangeNotSatisfiable, 422: InvalidParams, 429: TenantFull,
  500: InternalError, 503: Unavailable, 504: GatewayTimeout,
};

/** The exception for an error answer: its class by status, the server's type and message. */
export function errorFrom(status: number, body: unknown, retryAfter?: string | null): ToolpoolError {
  const b = (body && typeof body === "object" ? body : {}) as ErrorBody;
  const message = b.error?.message ?? `HTTP ${status} with no error body: ${String(body).slice(0, 200)}`;
  const cls = byStatus[status] ?? (status >= 500 ? InternalError : ToolpoolError);
  const ra = retryAfter ? Number(retryAfter) : undefined;
  return new cls(message, { status, type: b.error?.type ?? "", callId: b.id, retryAfter: Number.isFinite(ra) ? ra : undefined, body: b });
}

/**
 * An operation that runs as a call (a workspace operation) has not ended: it waits for a person's
 * approval (result.status is pending_approval) or still runs. Approve it, then wait for the call.
 */
export class CallNotFinished extends ToolpoolError {
  readonly result: Result;
  constructor(result: Result) {
    super(`call ${result.id} is ${result.status}: wait for it (or approve it) and ask again`, { status: 202, type: result.status, callId: result.id });
    this.result = result;
  }
}

/** An operation that runs as a call was denied by policy or a person; result.decision says why. */
export class CallDenied extends ToolpoolError {
  readonly result: Result;
  constructor(result: Result) {
    const d = result.decision;
    super(`call ${result.id} was denied${d?.rule ? ` by rule ${d.rule}: ${d.reason ?? ""}` : ""}`, { status: 403, type: "policy_denied", callId: result.id });
    this.result = result;
  }
}
