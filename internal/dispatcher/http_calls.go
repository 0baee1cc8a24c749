package dispatcher

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/policy"
	"github.com/toolpool/toolpool/internal/tools"
)

// The handlers of the calls API (POST /v1/calls, GET and DELETE /v1/calls/{id}, GET /v1/tools, POST
// /v1/policy/check) and of /readyz, over the call service of service.go.

// callRequest is the body of POST /v1/calls and POST /v1/policy/check: the call service's call.Request,
// and whether to wait for the result.
type callRequest struct {
	Tool           string          `json:"tool"`
	Args           json.RawMessage `json:"args"`
	Workspace      string          `json:"workspace"`
	TimeoutMS      *int64          `json:"timeout_ms"`
	DeadlineMS     *int64          `json:"deadline_ms"`
	OutputBytes    int64           `json:"output_bytes"`
	MemoryBytes    int64           `json:"memory_bytes"`
	CPUMillis      int64           `json:"cpu_millis"`
	PIDs           int64           `json:"pids"`
	TmpBytes       int64           `json:"tmp_bytes"`
	Wait           *bool           `json:"wait"`
	IdempotencyKey string          `json:"idempotency_key"`
	Tools          json.RawMessage `json:"tools"`
	Image          string          `json:"image"`
}

// request is the call service's request that the body asks for.
func (b *callRequest) request() *call.Request {
	return &call.Request{Tool: b.Tool, Args: b.Args, Workspace: b.Workspace, IdempotencyKey: b.IdempotencyKey, Tools: b.Tools,
		TimeoutMS: b.TimeoutMS, DeadlineMS: b.DeadlineMS, OutputBytes: b.OutputBytes, MemoryBytes: b.MemoryBytes,
		CPUMillis: b.CPUMillis, PIDs: b.PIDs, TmpBytes: b.TmpBytes, Image: b.Image}
}

func (s *api) postCall(w http.ResponseWriter, r *http.Request) {
	p := principalFrom(r.Context())
	var req callRequest
	if err := s.decodeBody(w, r, &req); err != nil {
		writeErr(w, err)
		return
	}
	if key := r.Header.Get("Idempotency-Key"); key != "" && req.IdempotencyKey == "" {
		req.IdempotencyKey = key
	}
	c, res, err := s.submit(r.Context(), p, req.request())
	if errors.Is(err, errNotRecorded) || (err == nil && c == nil) {
		writeResult(w, res) // queued but not recorded, or answered at once (read_output)
		return
	}
	if err != nil {
		writeErr(w, err)
		return
	}
	if wantsEvents(r) {
		s.follow(w, r, p.tenant, res.ID, position{})
		return
	}
	if res.Status.Terminal() || (req.Wait != nil && !*req.Wait) || res.Status == call.StatusPendingApproval {
		s.writeCall(r.Context(), w, res)
		return
	}
	wait := min(time.Duration(c.Limits.TimeoutMS)*time.Millisecond+30*time.Second, s.cfg.MaxWait)
	s.waitAndWrite(w, r, c.ID, wait)
}

func (s *api) waitAndWrite(w http.ResponseWriter, r *http.Request, id string, wait time.Duration) {
	res, err := s.await(r.Context(), id, wait)
	if err != nil {
		writeErr(w, err)
		return
	}
	s.writeCall(r.Context(), w, res)
}

func (s *api) getCall(w http.ResponseWriter, r *http.Request) {
	p := principalFrom(r.Context())
	id := r.PathValue("id")
	rec, err := s.lookup(r.Context(), p.tenant, id)
	if err != nil {
		writeErr(w, err)
		return
	}
	res := s.expireIfDue(r.Context(), rec)
	waitParam := r.URL.Query().Get("wait")
	if waitParam == "" || res.Status.Terminal() {
		s.writeCall(r.Context(), w, res)
		return
	}
	wait, err := time.ParseDuration(waitParam)
	if err != nil || wait < 0 {
		writeErr(w, invalid("wait=%q is not a duration: use e.g. wait=30s", waitParam))
		return
	}
	s.waitAndWrite(w, r, id, min(wait, s.cfg.MaxWait))
}

func (s *api) deleteCall(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	res, err := s.cancel(r.Context(), principalFrom(r.Context()), id)
	switch {
	case err != nil:
		writeErr(w, err)
	case res.Status == call.StatusRunning:
		s.waitAndWrite(w, r, id, 10*time.Second)
	default:
		s.writeCall(r.Context(), w, res)
	}
}

func (s *api) listTools(w http.ResponseWriter, r *http.Request) {
	p := principalFrom(r.Context())
	format := r.URL.Query().Get("format")
	list, err := tools.Render(format, s.enabledTools(p.tenant, nil), tools.WithNetwork(s.networkGranted(r.Context(), p.tenant)))
	if err != nil {
		writeErr(w, invalid("%v", err))
		return
	}
	body := map[string]any{"tools": list}
	if format == tools.FormatMCP {
		// MCP's ListToolsResult, whole as 2026-07-28 requires it; a tenant's list is its own (private).
		body["resultType"], body["ttlMs"], body["cacheScope"] = "complete", 0, "private"
	}
	writeJSON(w, http.StatusOK, body)
}

// checkPolicy answers what policy would decide for a call, without running it.
func (s *api) checkPolicy(w http.ResponseWriter, r *http.Request) {
	p := principalFrom(r.Context())
	var req callRequest
	if err := s.decodeBody(w, r, &req); err != nil {
		writeErr(w, err)
		return
	}
	c, dec, err := s.admit(r.Context(), p, req.request())
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"tool": c.Tool, "decision": c.Decision, "limits": c.Limits, "would_run": dec.Action == policy.Allow})
}

func (s *api) readyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
	defer cancel()
	for _, check := range s.ready {
		if err := check(ctx); err != nil {
			writeJSON(w, httpStatus(call.KindUnavailable), map[string]string{"status": "not ready", "error": err.Error()})
			return
		}
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
}
