package call

import "time"

// Kind is the class of a Rejection: what went wrong, whatever the transport. The dispatcher's core
// decides the Kind; each transport maps a Kind to its own answer in one place (the HTTP API to a status
// code, the MCP endpoint to a tool error or a JSON-RPC error), so that the core knows neither.
type Kind uint8

// The kinds. The zero Kind is no class: a transport treats a Rejection without one as toolpool's failure.
const (
	_ Kind = iota
	// KindInvalid: the request is malformed (a body, a name, a query parameter); fix it and send it again.
	KindInvalid
	// KindInvalidParams: the request is well formed but names no tool the caller may use, or its
	// arguments or asks do not fit the tool (schema, a ceiling).
	KindInvalidParams
	// KindUnauthenticated: the request carries no known caller.
	KindUnauthenticated
	// KindForbidden: the caller is known but may not do this (a role it lacks).
	KindForbidden
	// KindDenied: policy denied it.
	KindDenied
	// KindNotFound: what the request names does not exist for the caller (another tenant's call is one
	// that does not exist).
	KindNotFound
	// KindConflict: the request contradicts the state it found (a key reused for another call, a call
	// that moved on, a name that exists already).
	KindConflict
	// KindTooLarge: the request, or what it would write, is over a size limit.
	KindTooLarge
	// KindLengthRequired: the request must say its length up front.
	KindLengthRequired
	// KindUnsupportedMedia: the request's body is of a kind the operation does not take.
	KindUnsupportedMedia
	// KindRangeNotSatisfiable: the byte range asked for lies outside what there is.
	KindRangeNotSatisfiable
	// KindTenantFull: the tenant has as many calls queued and running as it may; retry later.
	KindTenantFull
	// KindInternal: toolpool failed, and retrying the same request will not mend it.
	KindInternal
	// KindUnavailable: toolpool could not do it now (a store or the queue failed); retry.
	KindUnavailable
	// KindTimeout: the operation did not end in time.
	KindTimeout
)

// Kinds lists every Kind, for tests of a transport's mapping.
var Kinds = []Kind{KindInvalid, KindInvalidParams, KindUnauthenticated, KindForbidden, KindDenied, KindNotFound,
	KindConflict, KindTooLarge, KindLengthRequired, KindUnsupportedMedia, KindRangeNotSatisfiable, KindTenantFull,
	KindInternal, KindUnavailable, KindTimeout}

var kindNames = map[Kind]string{
	KindInvalid: "invalid", KindInvalidParams: "invalid_params", KindUnauthenticated: "unauthenticated",
	KindForbidden: "forbidden", KindDenied: "denied", KindNotFound: "not_found", KindConflict: "conflict",
	KindTooLarge: "too_large", KindLengthRequired: "length_required", KindUnsupportedMedia: "unsupported_media",
	KindRangeNotSatisfiable: "range_not_satisfiable", KindTenantFull: "tenant_full", KindInternal: "internal",
	KindUnavailable: "unavailable", KindTimeout: "timeout",
}

func (k Kind) String() string {
	if n, ok := kindNames[k]; ok {
		return n
	}
	return "unclassed"
}

// Error types of refusals, carried in the error body's "type" (ErrorInfo.Type) besides the types of
// Result.Error above.
const (
	ErrInvalidRequest       = "invalid_request"
	ErrUnauthorized         = "unauthorized"
	ErrTooLarge             = "too_large"
	ErrConflict             = "conflict"
	ErrIdempotencyKeyReused = "idempotency_key_reused"
	ErrDigestMismatch       = "digest_mismatch"
	ErrNotPending           = "not_pending"
	ErrNotFinished          = "not_finished"
	ErrInvalidRange         = "invalid_range"
)

// Rejection is why a request did not become a call, or why an operation on a call or a workspace was
// refused or failed: the one error type of the dispatcher's call service. Find it with errors.As.
type Rejection struct {
	// Kind is its class, which a transport maps to its own code.
	Kind Kind
	// Type is the wire error type (ErrorInfo.Type: invalid_params, not_found, digest_mismatch, ...).
	Type string
	// Message is written for the model or the person who sent the request.
	Message string
	// RetryAfter, when positive, is how long to wait before retrying (quota, a transient failure).
	RetryAfter time.Duration
	// Call, when set, is the id of a call that exists or may exist, whose state toolpool could not read
	// or could not settle just then: the transports answer with the id and the state unknown
	// (StatusUnknown), so that a client knows which call to ask about again. Never set for a call that
	// does not exist.
	Call string
}

func (r *Rejection) Error() string { return r.Type + ": " + r.Message }

// StateUnknown is the answer about call id, which exists or may exist, when toolpool could not read or
// settle its state just then: unavailable, retry after a second; msg says what to do.
func StateUnknown(id, msg string) *Rejection {
	return &Rejection{Kind: KindUnavailable, Type: ErrInternal, Message: msg, RetryAfter: time.Second, Call: id}
}

// Reject returns a Rejection of kind with wire type typ and message msg.
func Reject(kind Kind, typ, msg string) *Rejection {
	return &Rejection{Kind: kind, Type: typ, Message: msg}
}
