// Package worker is the worker service: it takes calls off the queue, claims each durably, has it run
// (internal/executor runs it in a fresh container; workspace operations run on the host with
// internal/workspace) and records its one final result. It is built only on the interfaces it declares
// (deps.go, Live, Transfers), on internal/sandbox, internal/executor and internal/workspace; cmd/worker
// picks the implementations.
package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path"
	"time"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/executor"
	"github.com/toolpool/toolpool/internal/queue"
	"github.com/toolpool/toolpool/internal/sandbox"
	"github.com/toolpool/toolpool/internal/tools"
	"github.com/toolpool/toolpool/internal/tools/egress"
	"github.com/toolpool/toolpool/internal/workspace"
)

// Config configures a Worker.
type Config struct {
	// ID names this worker in results, leases and logs.
	ID string
	// WorkspacesDir holds every tenant's workspaces, as WorkspacesDir/<tenant>/<workspace>.
	WorkspacesDir string
	// RunnerBinary is the host path of the static binary mounted read-only as the in-container tool runner.
	RunnerBinary string
	// UID and GID own the workspaces; they must be the sandbox's user.
	UID, GID int
	// Heartbeat is how often a running call's delivery is kept and its lease renewed; it must be set
	// (cmd/worker's default is DefaultHeartbeat).
	Heartbeat time.Duration
	// AckWait is the queue's ack wait: a delivery not kept for that long is handed to another worker. At
	// least three heartbeats.
	AckWait time.Duration
	// MaxDeliver is the queue's max deliveries. A call that still cannot start at delivery MaxDeliver-1 is
	// given up with an error by the worker, so that the server never drops it silently.
	MaxDeliver int
	// RetryDelay is how long a call that could not start waits before it is offered again; default
	// DefaultRetryDelay.
	RetryDelay time.Duration
	// Lease is the TTL of a running call's lease on the queue server (zero: DefaultLease, three heartbeats
	// and at least MinLease, the second the server's TTLs need): at least two heartbeats, at most the ack
	// wait, so that a redelivered call of a vanished worker finds its lease gone. A worker that has not
	// renewed the lease for Lease minus one heartbeat (its own monotonic clock) kills the call and records
	// nothing: by then others may judge the call's runner gone.
	Lease time.Duration
	// CaptureBytes is how much of each of a call's stdout and stderr the sandbox keeps in memory (head and
	// tail), from which the envelope is made; at least the call's output cap. Default DefaultCaptureBytes.
	CaptureBytes int64
	// FullOutputBytes is how much of each stream of a command (run_shell, custom tools) is kept, from its
	// first byte, in the output store for reading by range; negative keeps none. Default
	// DefaultFullOutputBytes.
	FullOutputBytes int64
	// SpoolDir holds the files in which a running command's full output is gathered before it is stored
	// (unlinked at once, so nothing is left behind). Default os.TempDir().
	SpoolDir string
	// InlineBytes is how large (JSON-encoded) an output field may be inside the record; larger ones go to
	// the output store. Default DefaultInlineBytes.
	InlineBytes int
	// Now is the queue server's clock as this worker estimates it, for deadlines and timestamps; default
	// time.Now.
	Now func() time.Time
	// Image, when set, is the OCI image (in the runtime's store) that every call runs in, instead of the
	// read-only view of the host's system directories; a custom tool's own image still wins.
	Image string
	// WorkspaceQuota is the most disk space one workspace may use; 0 means no quota.
	WorkspaceQuota int64
	// EgressDir holds the per-call egress proxy sockets; Egress makes each call's proxy from the
	// operator's base rules, which the call's limits (policy's domains and ports) narrow. A nil Egress
	// refuses every call that needs egress.
	EgressDir string
	Egress    *egress.Gateway
	// Workspaces configures the workspace operations (idle TTL, per-tenant limits, archive limits); its
	// Dir, UID and GID are the fields above.
	Workspaces workspace.Config
}

// Validate checks the configuration, and that the worker's timing fits the queue's.
func (c *Config) Validate() error {
	switch {
	case c.ID == "":
		return errors.New("worker id is empty")
	case c.WorkspacesDir == "" || !path.IsAbs(c.WorkspacesDir):
		return fmt.Errorf("workspaces dir %q must be an absolute path", c.WorkspacesDir)
	case c.Heartbeat <= 0:
		return errors.New("heartbeat interval must be positive")
	case c.AckWait < 3*c.Heartbeat:
		return fmt.Errorf("worker heartbeat %s is not well below the queue's ack wait %s: lower the worker's heartbeat to at most %s, or raise the dispatcher's queue.ack_wait to at least %s",
			c.Heartbeat, c.AckWait, c.AckWait/3, 3*c.Heartbeat)
	case c.Lease < 2*c.Heartbeat:
		return fmt.Errorf("worker lease %s must be at least two heartbeats (%s): raise the lease or lower the heartbeat", c.Lease, 2*c.Heartbeat)
	case c.Lease > c.AckWait:
		return fmt.Errorf("worker lease %s is longer than the queue's ack wait %s: a vanished worker's call would be redelivered while its lease lives; lower the lease to at most %s",
			c.Lease, c.AckWait, c.AckWait)
	case c.MaxDeliver < 3:
		return fmt.Errorf("the queue's max deliver %d is below 3: raise the dispatcher's queue.max_deliver", c.MaxDeliver)
	}
	return nil
}

// Option configures optional behaviour of a Worker.
type Option func(*Worker)

// WithLeases gives the worker its lease store (required).
func WithLeases(l Leases) Option { return func(w *Worker) { w.leases = l } }

// WithOutputs gives the worker a store for outputs too large for a record; without one such outputs are
// cut to fit, and say so.
func WithOutputs(o Outputs) Option { return func(w *Worker) { w.outputs = o } }

// WithCreator lets the worker record a call that was queued but never recorded (its dispatcher stopped
// in between); without one such a call waits for the dispatchers' reconciler.
func WithCreator(c Creator) Option { return func(w *Worker) { w.creator = c } }

// Worker runs delivered calls. Safe for concurrent use: Handle runs once per delivery, concurrently.
type Worker struct {
	cfg       Config
	store     Store
	leases    Leases
	outputs   Outputs
	live      Live
	creator   Creator
	tools     *tools.Registry
	log       *slog.Logger
	now       func() time.Time
	wsm       *workspace.Manager
	exec      *executor.Executor
	transfers Transfers
	// checkpoints keeps workspaces in object storage (checkpoints.go); nil: the workspaces directory only.
	checkpoints Checkpoints
	// homes orders the calls that change a workspace kept in object storage (homes.go); writing counts
	// this worker's calls that hold one.
	homes   Homes
	writing writers
	// residents records this worker as the resident of the workspaces it has at their latest checkpoint
	// (residents.go); nil: not recorded, and calls are not routed here.
	residents Residents
}

// New returns a Worker.
func New(cfg Config, rt sandbox.Runtime, store Store, reg *tools.Registry, log *slog.Logger, opts ...Option) (*Worker, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("validate worker config: %w", err)
	}
	if err := os.MkdirAll(cfg.SpoolDir, 0o700); err != nil {
		return nil, fmt.Errorf("create spool dir: %w", err)
	}
	wcfg := cfg.Workspaces
	wcfg.Dir, wcfg.UID, wcfg.GID, wcfg.Quota = cfg.WorkspacesDir, cfg.UID, cfg.GID, cfg.WorkspaceQuota
	wsm, err := workspace.New(wcfg)
	if err != nil {
		return nil, err
	}
	exec := executor.New(executor.Config{
		Worker: cfg.ID, RunnerBinary: cfg.RunnerBinary, Image: cfg.Image, CaptureBytes: cfg.CaptureBytes,
		EgressDir: cfg.EgressDir, Egress: cfg.Egress, Now: cfg.Now,
	}, rt, reg, wsm, log)
	w := &Worker{cfg: cfg, store: store, tools: reg, log: log, now: cfg.Now, wsm: wsm, exec: exec}
	for _, o := range opts {
		o(w)
	}
	if w.leases == nil {
		return nil, errors.New("new worker: a lease store is required (worker.WithLeases)")
	}
	if w.checkpoints != nil && w.homes == nil {
		return nil, errors.New("new worker: workspaces kept in object storage need their homes (worker.WithHomes), or calls on two workers would overwrite each other's checkpoints")
	}
	return w, nil
}

// run runs call c under claim cl: a workspace operation on the host, any other call in a fresh container
// (the executor). A command's full output is gathered while it runs and stored, named by the call and
// claim, before run returns; stored names what was stored. Its live output is of the claim's attempt.
func (w *Worker) run(ctx context.Context, c *call.Call, cl *claim) (x executor.Execution, stored []string, err error) {
	if workspace.IsOp(c.Tool) {
		out, conns, failed := w.runWorkspaceOp(ctx, c)
		return executor.OnHost(out, conns, failed), nil, nil
	}
	var capt *storedCapture
	x, err = w.exec.Run(ctx, c, func() (executor.Capture, error) {
		keep := w.cfg.FullOutputBytes
		if w.outputs == nil {
			keep = 0
		}
		cp, err := newCapture(c.ID, cl.result.Attempt, w.cfg.SpoolDir, keep, w.live)
		if err != nil {
			return nil, err
		}
		capt = &storedCapture{capture: cp, w: w, name: func(stream string) string {
			return queue.OutputName(c.ID, cl.rev, "full-"+stream)
		}}
		return capt, nil
	}, w.pullReporter(ctx, c.ID, cl.result.Attempt))
	if capt != nil {
		stored = capt.stored
	}
	return x, stored, err
}
