package dispatcher

import (
	"context"
	"encoding/json"
	"io"
	"path"
	"time"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/policy"
	"github.com/toolpool/toolpool/internal/tracing"
	"github.com/toolpool/toolpool/internal/workspace"
)

// The workspace API turns each request into a call of a workspace operation (workspace.Ops): policy
// decides it by its own kind, it is recorded, audited and counted like any call, and a worker runs it on
// the shared workspaces directory. Archives and files travel through the output store: an upload is
// stored before its call is queued, a download is stored by the worker and streamed from the store. This
// file is the core of it; the HTTP handlers are in http_workspaces.go.

// Transfers moves archives and files between the dispatcher and the workers.
type Transfers interface { // queue.Outputs without ReadOutput
	PutOutput(ctx context.Context, name string, r io.Reader) (int64, error)
	OpenOutput(ctx context.Context, name string, offset int64) (io.ReadCloser, error)
	DeleteOutput(ctx context.Context, name string) error
}

// WithTransfers serves the workspace API's uploads and downloads through t; without it they answer 503.
func WithTransfers(t Transfers) Option { return func(s *Server) { s.transfers = t } }

// runWorkspaceOp decides, records and queues operation op on workspace ws for p, and waits for its
// result. It returns the operation's output when the operation ran and succeeded. Otherwise the output is
// nil and the error says why: errNotRecorded with the call's first result (queued, but not recorded yet);
// a *call.Rejection, with the call's result when the call exists (an operation that failed); or no error,
// with the result of a call that did not end ok (pending approval, denied, still running, cancelled,
// expired), whose envelope is the answer.
func (s *Server) runWorkspaceOp(ctx context.Context, p principal, op, ws string, args workspace.Args) (*call.Result, *workspace.Output, error) {
	rawArgs, _ := json.Marshal(args)
	var facts policy.Facts
	if args.Path != "" {
		facts.Paths = []string{path.Join("/workspace", args.Path)}
	}
	if args.Git != nil {
		// Judged like a command granted network: the tool must have it, and the host must be allowed.
		facts.URL, facts.Network = args.Git.URL, true
	}
	dec := s.policy.Decide(ctx, policy.Request{Tenant: p.tenant, Tool: op, Kind: op, Facts: facts})
	timeout := min(s.cfg.MaxTimeout, 10*time.Minute)
	c := &call.Call{
		ID: call.NewID(), Tenant: p.tenant, Workspace: ws, Tool: op, Args: rawArgs, CreatedAt: s.now().UTC(),
		Decision:    &call.Decision{Action: string(dec.Action), Rule: dec.Rule, Reason: dec.Reason},
		TraceParent: tracing.Inject(ctx), ArgsDigest: call.ArgsDigest(rawArgs),
		Limits: call.Limits{TimeoutMS: timeout.Milliseconds(), OutputBytes: s.cfg.MaxOutputBytes},
	}
	if facts.Network {
		// The worker runs the clone in a container of the tenant's runtime, with egress under these.
		c.Limits.Network, c.Limits.AllowedDomains, c.Limits.AllowedPorts = dec.Limits.Network, dec.Limits.AllowedDomains, dec.Limits.AllowedPorts
		c.Limits.Runtime = p.runtime
	}
	c.Deadline = c.CreatedAt.Add(s.cfg.QueueTimeout)
	res, err := s.accept(ctx, c, dec, false)
	if err != nil {
		return res, nil, err
	}
	if !res.Status.Terminal() && res.Status != call.StatusPendingApproval {
		wctx, cancel := context.WithTimeout(ctx, min(timeout+30*time.Second, s.cfg.MaxWait))
		waited, err := s.awaitResult(wctx, c.ID, nil) // ends it expired when no worker takes it in time
		cancel()
		if waited != nil {
			res = waited
		} else if err != nil {
			s.log.ErrorContext(ctx, "wait for workspace operation", "call_id", c.ID, "error", err)
		}
	}
	if res.Status != call.StatusOK {
		if res.Status == call.StatusError && res.Error != nil {
			return res, nil, call.Reject(workspaceKind(res.Error.Type), res.Error.Type, res.Error.Message+" (call "+res.ID+")")
		}
		return res, nil, nil // pending approval, denied, still running, cancelled, expired
	}
	if len(res.Stored) > 0 {
		full, err := s.fillStored(ctx, res)
		if err != nil {
			return res, nil, call.Reject(call.KindUnavailable, call.ErrInternal, "toolpool could not read the operation's stored result; GET /v1/calls/"+res.ID)
		}
		res = full
	}
	var out workspace.Output
	if err := json.Unmarshal([]byte(res.Output), &out); err != nil {
		return res, nil, call.Reject(call.KindInternal, call.ErrInternal, "the worker's answer to the workspace operation does not decode: "+err.Error())
	}
	return res, &out, nil
}

// workspaceKind classes the error type of a failed workspace operation (a workspace.Error's Type, or a
// call error the worker recorded for it): the boundary where the dispatcher receives it.
func workspaceKind(typ string) call.Kind {
	switch typ {
	case call.ErrInvalidParams:
		return call.KindInvalidParams
	case call.ErrNotFound:
		return call.KindNotFound
	case workspace.TypeExists, call.ErrQuota:
		return call.KindConflict
	case workspace.TypeTooLarge:
		return call.KindTooLarge
	case call.ErrTimeout:
		return call.KindTimeout
	case call.ErrPolicyDenied:
		return call.KindDenied
	case call.ErrCheckpoint:
		return call.KindUnavailable
	}
	return call.KindInternal
}
