package dispatcher

import (
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/toolpool/toolpool/internal/call"
)

// httpStatus is the HTTP API's status code for a refusal of kind k: the one place where the API chooses
// an error status (docs/contracts-internal.md). A kind it does not know is toolpool's failure.
func httpStatus(k call.Kind) int {
	switch k {
	case call.KindInvalid:
		return http.StatusBadRequest
	case call.KindInvalidParams:
		return http.StatusUnprocessableEntity
	case call.KindUnauthenticated:
		return http.StatusUnauthorized
	case call.KindForbidden, call.KindDenied:
		return http.StatusForbidden
	case call.KindNotFound:
		return http.StatusNotFound
	case call.KindConflict:
		return http.StatusConflict
	case call.KindTooLarge:
		return http.StatusRequestEntityTooLarge
	case call.KindLengthRequired:
		return http.StatusLengthRequired
	case call.KindUnsupportedMedia:
		return http.StatusUnsupportedMediaType
	case call.KindRangeNotSatisfiable:
		return http.StatusRequestedRangeNotSatisfiable
	case call.KindTenantFull:
		return http.StatusTooManyRequests
	case call.KindUnavailable:
		return http.StatusServiceUnavailable
	case call.KindTimeout:
		return http.StatusGatewayTimeout
	}
	return http.StatusInternalServerError
}

// statusCode is the status code of an answer with a call's envelope: a call that policy or a person
// denied is refused as denied; one that has not ended is accepted; any other is OK, whatever its end.
func statusCode(s call.Status) int {
	switch s {
	case call.StatusDenied:
		return httpStatus(call.KindDenied)
	case call.StatusQueued, call.StatusRunning, call.StatusPendingApproval:
		return http.StatusAccepted
	}
	return http.StatusOK
}

// writeErr answers with err's error body, {"error": {"type": ..., "message": ...}}, under the status of
// its Kind, and Retry-After when it says when to retry. An answer about a call whose state could not be
// read names it: {"id": ..., "status": "unknown", "error": ...}. An error that is not a *call.Rejection is
// toolpool's failure.
func writeErr(w http.ResponseWriter, err error) {
	var rej *call.Rejection
	if !errors.As(err, &rej) {
		rej = call.Reject(call.KindInternal, call.ErrInternal, "toolpool failed: "+err.Error())
	}
	if rej.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int(rej.RetryAfter/time.Second)))
	}
	body := map[string]any{"error": call.ErrorInfo{Type: rej.Type, Message: rej.Message}}
	if rej.Call != "" {
		body["id"], body["status"] = rej.Call, call.StatusUnknown
	}
	writeJSON(w, httpStatus(rej.Kind), body)
}
