package dispatcher

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/tracing"
)

// This file is the HTTP API's frame: routes, authentication, strict JSON bodies, and writing answers.
// Handlers are in http_*.go; the one mapping of an error's Kind to a status code is in httperr.go.

// api is the HTTP adapter over the call service (the Server): its handlers authenticate the caller, decode
// the request, call the service and write the answer, and every error through writeErr. It holds nothing
// of its own.
type api struct{ *Server }

// routes is the API's route table.
func (s *api) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", s.readyz)
	mux.HandleFunc("GET /v1/openapi.json", serveOpenAPI)
	mux.Handle("POST /v1/calls", s.auth(s.postCall))
	mux.Handle("GET /v1/calls/{id}", s.auth(s.getCall))
	mux.Handle("DELETE /v1/calls/{id}", s.auth(s.deleteCall))
	mux.Handle("GET /v1/calls/{id}/events", s.auth(s.getEvents))
	mux.Handle("GET /v1/calls/{id}/{stream}", s.auth(s.getStream))
	mux.Handle("GET /v1/tools", s.auth(s.listTools))
	mux.Handle("POST /v1/policy/check", s.auth(s.checkPolicy))
	mux.Handle("GET /v1/approvals", s.auth(s.approver(s.listApprovals)))
	mux.Handle("POST /v1/approvals/{id}", s.auth(s.approver(s.decideApproval)))
	mux.Handle("GET /v1/audit", s.auth(s.readAudit))
	s.routeWorkspaces(mux)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeErr(w, call.Reject(call.KindNotFound, call.ErrNotFound, fmt.Sprintf("no endpoint %s %s: see GET /v1/tools, POST /v1/calls, GET /v1/calls/{id}", r.Method, r.URL.Path)))
	})
	return mux
}

// Handler returns the API's root handler.
func (s *Server) Handler() http.Handler { return s.handler }

// Authenticate returns next behind the API's bearer-token authentication: a request without a known token
// gets 401; next's requests carry the caller in their context, for the call service's methods (calls.go).
func (s *Server) Authenticate(next http.Handler) http.Handler { return (&api{s}).auth(next.ServeHTTP) }

func principalFrom(ctx context.Context) principal { return ctx.Value(ctxKey{}).(principal) }

// auth resolves the bearer token to a tenant, comparing digests in constant time.
func (s *api) auth(next http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := r.Header.Get("Authorization")
		token, ok := strings.CutPrefix(h, "Bearer ")
		if !ok || token == "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="toolpool"`)
			writeErr(w, call.Reject(call.KindUnauthenticated, call.ErrUnauthorized, "send your token as 'Authorization: Bearer TOKEN'"))
			return
		}
		_, span := tracing.Start(r.Context(), "authenticate")
		defer tracing.End(span, nil)
		// Tokens are looked up by their SHA-256: timing can only reveal bits of a digest, which do not help
		// guess a token.
		found, ok := s.tokens[sha256.Sum256([]byte(token))]
		if !ok {
			w.Header().Set("WWW-Authenticate", `Bearer realm="toolpool", error="invalid_token"`)
			writeErr(w, call.Reject(call.KindUnauthenticated, call.ErrUnauthorized, "the bearer token is not known: check TOOLPOOL_TOKEN or the dispatcher's tenants config"))
			return
		}
		span.End() // the decision, record and publish spans are its siblings, not its children
		next(w, r.WithContext(context.WithValue(r.Context(), ctxKey{}, found)))
	})
}

// decodeBody reads a JSON object body strictly: bounded size, valid UTF-8, no unknown fields, one value.
func (s *api) decodeBody(w http.ResponseWriter, r *http.Request, v any) error {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		return &call.Rejection{Kind: call.KindTooLarge, Type: call.ErrTooLarge,
			Message: fmt.Sprintf("the request body is over the %d-byte limit: send less (write large files in parts)", s.cfg.MaxBodyBytes)}
	}
	if err != nil {
		return invalid("read request body: %v", err)
	}
	if !utf8.Valid(body) {
		return invalid("the request body is not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return invalid("the request body is not the expected JSON object: %s", describeJSONError(err))
	}
	if dec.More() {
		return invalid("the request body has data after the JSON object: send exactly one object")
	}
	return nil
}

func describeJSONError(err error) string {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		return fmt.Sprintf("syntax error at byte %d: %v", syn.Offset, syn)
	case errors.As(err, &typ):
		return fmt.Sprintf("field %q must be %s, got JSON %s", typ.Field, typ.Type, typ.Value)
	case errors.Is(err, io.EOF):
		return "the body is empty"
	case strings.HasPrefix(err.Error(), "json: unknown field"):
		return strings.TrimPrefix(err.Error(), "json: ") + " (known: tool, args, workspace, timeout_ms, deadline_ms, output_bytes, memory_bytes, cpu_millis, pids, tmp_bytes, wait, idempotency_key, tools)"
	}
	return err.Error()
}

// writeCall answers with a call's envelope, with the output fields a worker stored outside the record
// read back in.
func (s *api) writeCall(ctx context.Context, w http.ResponseWriter, r *call.Result) {
	full, err := s.present(ctx, r)
	if err != nil {
		s.log.ErrorContext(ctx, "read stored output", "call_id", r.ID, "error", err)
		writeErr(w, call.StateUnknown(r.ID, "toolpool could not read the call's stored output; retry GET /v1/calls/"+r.ID))
		return
	}
	writeResult(w, full)
}

func writeResult(w http.ResponseWriter, r *call.Result) {
	w.Header().Set("Location", "/v1/calls/"+r.ID)
	writeJSON(w, statusCode(r.Status), r)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}
