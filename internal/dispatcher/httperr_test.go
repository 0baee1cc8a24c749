package dispatcher

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/call"
)

// TestHTTPStatus pins the one mapping of a refusal's class to its status code: the API's contract.
func TestHTTPStatus(t *testing.T) {
	want := map[call.Kind]int{
		call.KindInvalid:             http.StatusBadRequest,
		call.KindInvalidParams:       http.StatusUnprocessableEntity,
		call.KindUnauthenticated:     http.StatusUnauthorized,
		call.KindForbidden:           http.StatusForbidden,
		call.KindDenied:              http.StatusForbidden,
		call.KindNotFound:            http.StatusNotFound,
		call.KindConflict:            http.StatusConflict,
		call.KindTooLarge:            http.StatusRequestEntityTooLarge,
		call.KindLengthRequired:      http.StatusLengthRequired,
		call.KindUnsupportedMedia:    http.StatusUnsupportedMediaType,
		call.KindRangeNotSatisfiable: http.StatusRequestedRangeNotSatisfiable,
		call.KindTenantFull:          http.StatusTooManyRequests,
		call.KindInternal:            http.StatusInternalServerError,
		call.KindUnavailable:         http.StatusServiceUnavailable,
		call.KindTimeout:             http.StatusGatewayTimeout,
	}
	for _, k := range call.Kinds {
		code, ok := want[k]
		if !ok {
			t.Errorf("kind %s has no status in this test: add it", k)
			continue
		}
		if got := httpStatus(k); got != code {
			t.Errorf("kind %s: status %d, want %d", k, got, code)
		}
	}
	if got := httpStatus(0); got != http.StatusInternalServerError {
		t.Errorf("no kind: status %d, want 500", got)
	}
}

func TestWriteErr(t *testing.T) {
	for _, tt := range []struct {
		name       string
		err        error
		code       int
		typ, msg   string
		retryAfter string
	}{
		{"rejection", call.Reject(call.KindConflict, call.ErrDigestMismatch, "another digest"), 409, "digest_mismatch", "another digest", ""},
		{"wrapped, with retry", fmt.Errorf("submit: %w", &call.Rejection{Kind: call.KindTenantFull, Type: call.ErrQuota, Message: "full", RetryAfter: 5 * time.Second}),
			429, "quota_exceeded", "full", "5"},
		{"no class", errors.New("boom"), 500, "internal", "toolpool failed: boom", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			writeErr(rec, tt.err)
			var body struct{ Error call.ErrorInfo }
			if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || rec.Code != tt.code || body.Error.Type != tt.typ || body.Error.Message != tt.msg {
				t.Fatalf("HTTP %d %s (%v), want %d %s %q", rec.Code, rec.Body, err, tt.code, tt.typ, tt.msg)
			}
			if got := rec.Header().Get("Retry-After"); got != tt.retryAfter {
				t.Errorf("Retry-After %q, want %q", got, tt.retryAfter)
			}
		})
	}
}

func TestStatusCode(t *testing.T) {
	for s, code := range map[call.Status]int{
		call.StatusQueued: 202, call.StatusRunning: 202, call.StatusPendingApproval: 202, call.StatusDenied: 403,
		call.StatusOK: 200, call.StatusError: 200, call.StatusTimeout: 200, call.StatusCancelled: 200,
		call.StatusExpired: 200, call.StatusLost: 200,
	} {
		if got := statusCode(s); got != code {
			t.Errorf("status %s: HTTP %d, want %d", s, got, code)
		}
	}
}

// TestWorkspaceKind pins how a failed workspace operation's error type is classed (and so answered).
func TestWorkspaceKind(t *testing.T) {
	for typ, want := range map[string]int{
		call.ErrInvalidParams: 422, call.ErrNotFound: 404, "already_exists": 409, call.ErrQuota: 409,
		"too_large": 413, call.ErrTimeout: 504, call.ErrPolicyDenied: 403, call.ErrOOM: 500, "other": 500,
		call.ErrCheckpoint: 503,
	} {
		if got := httpStatus(workspaceKind(typ)); got != want {
			t.Errorf("type %s: HTTP %d, want %d", typ, got, want)
		}
	}
}
