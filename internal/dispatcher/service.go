package dispatcher

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/base32"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/policy"
	"github.com/toolpool/toolpool/internal/queue"
	"github.com/toolpool/toolpool/internal/tools"
	"github.com/toolpool/toolpool/internal/tracing"
)

// This file is the call service, the dispatcher's core: it turns a request into a call (admit, limits),
// records and queues it (accept), waits for it, cancels it and presents its result. It knows no
// transport: every refusal is a *call.Rejection whose Kind the HTTP API (httperr.go) and internal/mcp map
// to their own codes.

// invalid is the Rejection of a malformed request.
func invalid(format string, a ...any) *call.Rejection {
	return call.Reject(call.KindInvalid, call.ErrInvalidRequest, fmt.Sprintf(format, a...))
}

// submit admits req and accepts the call, for POST /v1/calls and Submit. A local tool's call that policy
// allows (read_output) is answered at once and never queued nor recorded: it returns a nil call with the
// final result. Otherwise it returns the call and accept's answer (errNotRecorded included).
func (s *Server) submit(ctx context.Context, p principal, req *call.Request) (*call.Call, *call.Result, error) {
	c, dec, err := s.admit(ctx, p, req)
	if err != nil {
		return nil, nil, err
	}
	if tool, _ := s.tools.Lookup(c.Tool); tool.Local && dec.Action == policy.Allow {
		res, err := s.readOutput(ctx, c)
		return nil, res, err
	}
	res, err := s.accept(ctx, c, dec, req.IdempotencyKey != "" || req.ID != "")
	return c, res, err
}

// admit turns a request into a call: names, tool, schema, policy and limits. It publishes nothing.
func (s *Server) admit(ctx context.Context, p principal, req *call.Request) (*call.Call, policy.Decision, error) {
	var none policy.Decision
	if req.Tool == "" {
		return nil, none, invalid(`"tool" is missing: name one of %s`, strings.Join(s.tools.Names(), ", "))
	}
	if req.Workspace == "" {
		req.Workspace = cmp.Or(p.workspace, "default")
	}
	if err := call.ValidateName("workspace", req.Workspace); err != nil {
		return nil, none, invalid("%v", err)
	}
	requestTools, err := policy.ParseRequestTools(req.Tools)
	if err != nil {
		return nil, none, invalid("%v", err)
	}
	tool, ok := s.tools.Lookup(req.Tool)
	if !ok || !s.policy.ToolEnabled(p.tenant, req.Tool, requestTools) {
		var names []string
		for _, t := range s.enabledTools(p.tenant, requestTools) {
			names = append(names, t.Name)
		}
		return nil, none, &call.Rejection{Kind: call.KindInvalidParams, Type: call.ErrInvalidParams,
			Message: fmt.Sprintf("unknown tool %q: the tools you can call are %s", req.Tool, strings.Join(names, ", "))}
	}
	if len(req.Args) == 0 || string(req.Args) == "null" {
		req.Args = json.RawMessage("{}")
	}
	if err := tool.Validate(req.Args); err != nil {
		return nil, none, &call.Rejection{Kind: call.KindInvalidParams, Type: call.ErrInvalidParams, Message: err.Error()}
	}
	if req.TimeoutMS != nil && *req.TimeoutMS <= 0 {
		return nil, none, invalid("timeout_ms must be a positive number of milliseconds, got %d", *req.TimeoutMS)
	}
	if req.DeadlineMS != nil && *req.DeadlineMS <= 0 {
		return nil, none, invalid("deadline_ms must be a positive number of milliseconds, got %d", *req.DeadlineMS)
	}
	if req.OutputBytes < 0 || req.MemoryBytes < 0 || req.CPUMillis < 0 || req.PIDs < 0 || req.TmpBytes < 0 {
		return nil, none, invalid("output_bytes, memory_bytes, cpu_millis, pids and tmp_bytes must not be negative")
	}
	if err := s.cfg.Ceilings.check(req); err != nil {
		return nil, none, err
	}
	facts := tool.Facts(req.Args)
	dec := s.policy.Decide(ctx, policy.Request{
		Tenant: p.tenant, Tool: tool.Name, Kind: string(tool.Kind), RequestTools: requestTools, Posture: s.postures[p.tenant],
		Facts: policy.Facts{Paths: facts.Paths, Command: facts.Command, Env: facts.Env, Cwd: facts.Cwd, URL: facts.URL},
	})
	c := &call.Call{
		ID: call.NewID(), Tenant: p.tenant, Workspace: req.Workspace, Tool: tool.Name, Args: req.Args,
		CreatedAt:   s.now().UTC(),
		Decision:    &call.Decision{Action: string(dec.Action), Rule: dec.Rule, Reason: dec.Reason},
		TraceParent: tracing.Inject(ctx),
	}
	c.ArgsDigest = call.ArgsDigest(req.Args)
	switch {
	case req.ID != "":
		c.ID = req.ID
	case req.IdempotencyKey != "":
		c.ID = idempotentID(p.tenant, req.IdempotencyKey)
	}
	queueTimeout := s.cfg.QueueTimeout
	if req.DeadlineMS != nil {
		queueTimeout = min(queueTimeout, time.Duration(*req.DeadlineMS)*time.Millisecond)
	}
	c.Deadline = c.CreatedAt.Add(queueTimeout)
	if err = s.checkImage(p.tenant, tool.Name, `"image"`, req.Image); err != nil {
		return nil, none, err
	}
	c.Image, c.TenantImage = req.Image, p.image
	c.Limits, c.Decision.Clamped = s.limits(p.tenant, req, tool, dec.Limits)
	c.Limits.Runtime = p.runtime
	c.Limits.ReadOnlyWorkspace = dec.Limits.ReadOnlyWorkspace
	c.Limits.WriteGitControl = dec.Limits.WriteGitControl
	// The file tools' runner applies them to each path it opens; the worker hides what they match from
	// every other tool's container (run_shell, custom tools).
	c.Limits.DeniedGlobs = dec.Limits.DeniedGlobs
	return c, dec, nil
}

// limits clamps what the request asked for to what policy and config allow, and says what it lowered.
// Resources above a ceiling never get here (Ceilings.check refuses them).
func (s *Server) limits(tenant string, req *call.Request, tool *tools.Tool, pl policy.Limits) (call.Limits, []string) {
	var clamped []string
	timeout := s.cfg.DefaultTimeout
	if tool.DefaultTimeout > 0 {
		timeout = tool.DefaultTimeout
	}
	if req.TimeoutMS != nil {
		timeout = time.Duration(*req.TimeoutMS) * time.Millisecond
	}
	if timeout > s.cfg.MaxTimeout {
		timeout = s.cfg.MaxTimeout
		clamped = append(clamped, fmt.Sprintf("timeout_ms lowered to %d, this server's most", timeout.Milliseconds()))
	}
	if pl.TimeoutMS > 0 && timeout > time.Duration(pl.TimeoutMS)*time.Millisecond {
		timeout = time.Duration(pl.TimeoutMS) * time.Millisecond
		clamped = append(clamped, fmt.Sprintf("timeout_ms lowered to %d, the policy's most for %s", pl.TimeoutMS, tool.Name))
	}
	output := s.cfg.DefaultOutputBytes
	if t := s.tenants[tenant]; t.OutputBytes > 0 {
		output = t.OutputBytes
	}
	if tool.Custom && tool.DefaultOutputBytes > 0 {
		output = tool.DefaultOutputBytes
	}
	if req.OutputBytes > 0 {
		if req.OutputBytes > s.cfg.MaxOutputBytes {
			clamped = append(clamped, fmt.Sprintf("output_bytes lowered to %d, this server's most", s.cfg.MaxOutputBytes))
		}
		output = req.OutputBytes
	}
	output = min(output, s.cfg.MaxOutputBytes)
	if pl.OutputBytes > 0 && output > pl.OutputBytes {
		if req.OutputBytes > pl.OutputBytes {
			clamped = append(clamped, fmt.Sprintf("output_bytes lowered to %d, the policy's most for %s", pl.OutputBytes, tool.Name))
		}
		output = pl.OutputBytes
	}
	return call.Limits{TimeoutMS: timeout.Milliseconds(), OutputBytes: output, MemoryBytes: req.MemoryBytes,
		CPUMillis: req.CPUMillis, PIDs: req.PIDs, TmpBytes: req.TmpBytes,
		Network: pl.Network, AllowedDomains: pl.AllowedDomains, AllowedPorts: pl.AllowedPorts}, clamped
}

// idempotentID derives a call id from the tenant and its idempotency key, so a retried POST finds the call
// the first one created.
func idempotentID(tenant, key string) string {
	sum := sha256.Sum256([]byte(tenant + "\x00" + key))
	return "c_" + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(sum[:16]))
}

// accept records the call with its decision and, when allowed, queues it. An allowed call is queued
// first and recorded second, so that a failed publish leaves nothing behind (a retry with the same
// idempotency key runs the call) and a dispatcher that stops in between leaves a queued call whose
// worker records it; when only the record fails, the queued call is accepted all the same and returned
// with errNotRecorded (accepted, nothing to wait on yet). A call with an idempotency key whose id exists
// already returns the existing call, or a conflict when the key was used for another call.
func (s *Server) accept(ctx context.Context, c *call.Call, dec policy.Decision, keyed bool) (*call.Result, error) {
	if keyed {
		rec, err := s.store.Get(ctx, c.ID)
		if err == nil {
			return sameCall(rec.Result, c)
		}
		if !errors.Is(err, queue.ErrNotFound) {
			s.log.ErrorContext(ctx, "read call", "call_id", c.ID, "error", err)
			return nil, call.StateUnknown(c.ID, "toolpool could not read the call's idempotency key; retry with the same idempotency_key")
		}
	}
	var res *call.Result
	switch dec.Action {
	case policy.Deny:
		res = call.NewResult(c, call.StatusDenied)
		res.Fail(call.StatusDenied, call.ErrPolicyDenied, dec.Reason)
		res.FinishedAt = c.CreatedAt
	case policy.Ask:
		c.Deadline = c.CreatedAt.Add(s.cfg.ApprovalTTL)
		res = call.NewResult(c, call.StatusPendingApproval)
		res.Output = "the call waits for a person's approval: " + dec.Reason
		// Parked before it is recorded: an approval without a record is dropped by the reconciler.
		if err := s.approvals.PutPending(ctx, &call.Pending{Call: c, ExpiresAt: c.Deadline}); err != nil {
			s.log.ErrorContext(ctx, "park call for approval", "call_id", c.ID, "error", err)
			return nil, &call.Rejection{Kind: call.KindUnavailable, Type: call.ErrInternal, RetryAfter: time.Second, Message: "toolpool could not park the call for approval; retry with the same idempotency_key"}
		}
	default:
		res = call.NewResult(c, call.StatusQueued)
		if err := s.pub.Publish(ctx, c); err != nil {
			switch {
			case errors.Is(err, queue.ErrTenantFull):
				return nil, &call.Rejection{Kind: call.KindTenantFull, Type: call.ErrQuota, RetryAfter: 5 * time.Second,
					Message: fmt.Sprintf("tenant %s has as many calls queued and running as it may; wait for some to finish and retry", c.Tenant)}
			case errors.Is(err, queue.ErrTooLarge):
				return nil, &call.Rejection{Kind: call.KindTooLarge, Type: call.ErrTooLarge,
					Message: "the call's arguments are too large to queue: send less (write large files in parts)"}
			}
			// The publish may have been stored with its acknowledgement lost: then the call is queued and its
			// worker records it. The answer says so rather than "not accepted".
			s.log.ErrorContext(ctx, "publish call", "call_id", c.ID, "error", err)
			return nil, call.StateUnknown(c.ID, "toolpool could not tell whether the call was queued: read GET /v1/calls/"+c.ID+
				" in a moment, or retry with the same idempotency_key (a call runs at most once per key)")
		}
	}
	if _, err := s.store.Create(ctx, res); err != nil {
		if errors.Is(err, queue.ErrExists) {
			if rec, gerr := s.store.Get(ctx, c.ID); gerr == nil {
				return sameCall(rec.Result, c)
			}
		}
		s.log.ErrorContext(ctx, "record call", "call_id", c.ID, "error", err)
		if res.Status == call.StatusQueued {
			// Queued, so accepted: its worker records it (worker.WithCreator). Nothing to wait on yet.
			res.Output = "the call is queued; toolpool could not record it yet: poll GET /v1/calls/" + c.ID
			return res, errNotRecorded
		}
		return nil, call.StateUnknown(c.ID, "toolpool could not record the call; retry with the same idempotency_key")
	}
	return res, nil
}

// errNotRecorded is accept's answer, with the call's first result, for a call that was queued but not
// recorded: not a failure (the call is accepted), but there is nothing to wait on yet.
var errNotRecorded = errors.New("the call is queued but not recorded yet")

// sameCall returns existing, the call that an idempotency key names already, when the request c asks for
// the same call (tool, workspace and arguments); a conflict when it asks for another.
func sameCall(existing *call.Result, c *call.Call) (*call.Result, error) {
	if existing.Tenant == c.Tenant && existing.Tool == c.Tool && existing.Workspace == c.Workspace && existing.ArgsDigest == c.ArgsDigest {
		return existing, nil
	}
	return nil, &call.Rejection{Kind: call.KindConflict, Type: call.ErrIdempotencyKeyReused,
		Message: fmt.Sprintf("this idempotency_key was used for call %s (%s in workspace %s, arguments %s) within its window: a key names one call; send a new key for a new call, or the same request to get that call",
			existing.ID, existing.Tool, existing.Workspace, existing.ArgsDigest)}
}

// expireIfDue ends a call that is still queued past its deadline: no worker started it in time. It
// returns the record as it stands after the attempt.
func (s *Server) expireIfDue(ctx context.Context, rec queue.Record) *call.Result {
	r := rec.Result
	if (r.Status != call.StatusQueued && r.Status != call.StatusPendingApproval) || r.Deadline.IsZero() || s.now().Before(r.Deadline) {
		return r
	}
	if r.Status == call.StatusPendingApproval {
		_ = s.approvals.DeletePending(ctx, r.Tenant, r.ID)
	}
	expire(r, s.now())
	if _, err := s.store.Update(ctx, r, rec.Revision); err != nil {
		if cur, gerr := s.store.Get(ctx, r.ID); gerr == nil {
			return cur.Result // a worker got to it first
		}
	}
	return r
}

// expire ends a queued or pending call that passed its deadline unrun.
func expire(r *call.Result, now time.Time) {
	if r.Status == call.StatusPendingApproval {
		r.Fail(call.StatusExpired, call.ErrExpired, "no one approved the call before its approval expired; it did not run")
	} else {
		r.Fail(call.StatusExpired, call.ErrExpired, "no worker started the call before its deadline; it did not run. Check that workers are up, or give a longer deadline_ms.")
	}
	r.FinishedAt = now.UTC()
}

// enabledTools is the tools tenant may use (and a request's tools map leaves on), in the registry's order.
func (s *Server) enabledTools(tenant string, requestTools map[string]bool) []*tools.Tool {
	var enabled []*tools.Tool
	for _, t := range s.tools.List() {
		if s.policy.ToolEnabled(tenant, t.Name, requestTools) {
			enabled = append(enabled, t)
		}
	}
	return enabled
}

// awaitResult waits for the call's record to be final, past its deadline in the queue (it then ends
// expired), or to satisfy until; a nil until stops at pending approval. When ctx ends first it returns
// the latest record with ctx's error.
func (s *Server) awaitResult(ctx context.Context, id string, until func(*call.Result) bool) (*call.Result, error) {
	if until == nil {
		until = func(r *call.Result) bool { return r.Status == call.StatusPendingApproval }
	}
	res, err := s.store.Wait(ctx, id, func(r *call.Result) bool {
		return r.Status.Terminal() || until(r) ||
			(r.Status == call.StatusQueued && !r.Deadline.IsZero() && s.now().After(r.Deadline))
	})
	if res != nil && res.Status == call.StatusQueued {
		if rec, gerr := s.store.Get(context.WithoutCancel(ctx), id); gerr == nil {
			res = s.expireIfDue(context.WithoutCancel(ctx), rec)
		}
	}
	return res, err
}

// await waits up to wait for call id's record to be final, pending approval or expired (awaitResult), and
// returns the latest record; it fails only when there is none to return.
func (s *Server) await(ctx context.Context, id string, wait time.Duration) (*call.Result, error) {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	res, err := s.awaitResult(ctx, id, nil)
	if res == nil {
		if errors.Is(err, queue.ErrNotFound) {
			return nil, call.Reject(call.KindNotFound, call.ErrNotFound, fmt.Sprintf("no call %s", id))
		}
		s.log.Error("wait for call", "call_id", id, "error", err)
		return nil, call.StateUnknown(id, "toolpool could not read the call's state; poll GET /v1/calls/"+id)
	}
	return res, nil
}

// lookup reads the record of tenant's call id; another tenant's call is one that does not exist.
func (s *Server) lookup(ctx context.Context, tenant, id string) (queue.Record, error) {
	rec, err := s.store.Get(ctx, id)
	if errors.Is(err, queue.ErrNotFound) || (err == nil && rec.Result.Tenant != tenant) {
		return queue.Record{}, &call.Rejection{Kind: call.KindNotFound, Type: call.ErrNotFound, Message: fmt.Sprintf("no call %s for tenant %s", id, tenant)}
	}
	if err != nil {
		s.log.ErrorContext(ctx, "read call", "call_id", id, "error", err)
		return queue.Record{}, call.StateUnknown(id, "toolpool could not read the call; retry")
	}
	return rec, nil
}

// cancel ends a queued or pending call at once, or asks the worker running it to kill its container (the
// record stays running, with CancelRequested, until the worker records the end). It returns the record
// as it stands after the request; a final call is returned unchanged.
func (s *Server) cancel(ctx context.Context, p principal, id string) (*call.Result, error) {
	for range 5 {
		rec, err := s.lookup(ctx, p.tenant, id)
		if err != nil {
			return nil, err
		}
		res := rec.Result
		if res.Status.Terminal() {
			return res, nil
		}
		parked := res.Status == call.StatusPendingApproval
		if res.Status == call.StatusRunning {
			// The worker that runs it watches for this request and kills the container.
			res.CancelRequested = true
		} else {
			res.Fail(call.StatusCancelled, call.ErrCancelled, "the call was cancelled before it ran")
			res.FinishedAt = s.now().UTC()
		}
		if _, err := s.store.Update(ctx, res, rec.Revision); errors.Is(err, queue.ErrConflict) {
			continue // it moved on: look again
		} else if err != nil {
			return nil, call.StateUnknown(id, "toolpool could not cancel the call; retry")
		}
		if parked {
			_ = s.approvals.DeletePending(ctx, p.tenant, id)
		}
		return res, nil
	}
	return nil, &call.Rejection{Kind: call.KindConflict, Type: call.ErrConflict, Message: "the call kept changing while it was being cancelled; retry"}
}

// present returns r as clients see it: the output fields a worker stored outside the record read back
// in, and no object names.
func (s *Server) present(ctx context.Context, r *call.Result) (*call.Result, error) {
	if len(r.Stored) > 0 {
		full, err := s.fillStored(ctx, r)
		if err != nil {
			return nil, err
		}
		r = full
	}
	if len(r.Streams) > 0 {
		shown := *r
		shown.Streams = make(map[string]*call.Stream, len(r.Streams))
		for name, st := range r.Streams {
			shown.Streams[name] = &call.Stream{Bytes: st.Bytes, Kept: st.Kept}
		}
		r = &shown
	}
	return r, nil
}

// fillStored returns a copy of r with each stored output field read back in, and without Stored.
func (s *Server) fillStored(ctx context.Context, r *call.Result) (*call.Result, error) {
	if s.outputs == nil {
		return nil, errors.New("this dispatcher has no output store")
	}
	full := *r
	full.Stored = nil
	for field, name := range r.Stored {
		b, err := s.outputs.ReadOutput(ctx, name, 0, -1)
		if err != nil {
			return nil, err
		}
		switch field {
		case "output":
			full.Output = string(b)
		case "stdout":
			full.Stdout = string(b)
		case "stderr":
			full.Stderr = string(b)
		default:
			return nil, fmt.Errorf("record names stored field %q that this dispatcher does not know", field)
		}
	}
	return &full, nil
}

// networkGranted reports, for a tool of tenant, whether its policy gives the tool's containers network
// (the limits of a call that names nothing more than the tool).
func (s *Server) networkGranted(ctx context.Context, tenant string) func(tool string) bool {
	return func(name string) bool {
		t, ok := s.tools.Lookup(name)
		return ok && s.policy.Decide(ctx, policy.Request{Tenant: tenant, Tool: name, Kind: string(t.Kind)}).Limits.Network
	}
}
