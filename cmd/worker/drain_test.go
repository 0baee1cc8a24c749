package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/queue/jetstream"
	"github.com/toolpool/toolpool/internal/queue/jetstream/jstest"
	"github.com/toolpool/toolpool/internal/sandbox"
	"github.com/toolpool/toolpool/internal/tools"
	"github.com/toolpool/toolpool/internal/worker"
)

// heldRuntime runs nothing: each Run reports its call id on started, then holds until release is closed
// (the call finishes) or its context ends (the container is killed).
type heldRuntime struct {
	started chan string
	release chan struct{}
	mu      sync.Mutex
	ran     []string
}

func (r *heldRuntime) Run(ctx context.Context, spec sandbox.Spec) (sandbox.Outcome, error) {
	r.mu.Lock()
	r.ran = append(r.ran, spec.ID)
	r.mu.Unlock()
	r.started <- spec.ID
	select {
	case <-r.release:
		return sandbox.Outcome{WorkspaceBytes: -1}, nil
	case <-ctx.Done():
		return sandbox.Outcome{ExitCode: 137, Signal: "SIGKILL", WorkspaceBytes: -1}, ctx.Err()
	}
}

func (r *heldRuntime) calls() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.ran...)
}

// TestDrain drives consumeDraining, as the worker runs it, over a real in-process JetStream and a real
// worker.Worker whose containers are held open: once draining begins no call is fetched, the running
// calls finish if they can within the grace period, and are killed (ending cancelled) when it ends or at a
// second signal.
func TestDrain(t *testing.T) {
	tests := []struct {
		name   string
		grace  time.Duration
		finish bool // release the running calls after the drain began
		kill   bool // a second signal after the drain began
		want   call.Status
		msg    string
	}{
		{name: "running calls finish within the grace period", grace: time.Hour, finish: true, want: call.StatusOK},
		{name: "calls still running when the grace period ends are killed", grace: 100 * time.Millisecond,
			want: call.StatusCancelled, msg: "the worker shut down while the call ran"},
		{name: "a second signal kills the running calls at once", grace: time.Hour, kill: true,
			want: call.StatusCancelled, msg: "the worker shut down while the call ran"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancelTest := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancelTest()
			srv := jstest.Server(t, "")
			dispatcher := jstest.Connect(t, srv.URL(), "dispatcher", true)
			conn := jstest.Connect(t, srv.URL(), "worker-1", false)
			rt := &heldRuntime{started: make(chan string, 8), release: make(chan struct{})}
			reg, err := tools.NewRegistry()
			if err != nil {
				t.Fatal(err)
			}
			log := slog.New(slog.NewTextHandler(io.Discard, nil))
			w, err := worker.New(worker.Config{ID: "worker-1", WorkspacesDir: t.TempDir(), Heartbeat: time.Second, AckWait: conn.AckWait(),
				MaxDeliver: conn.MaxDeliver(), Now: conn.Now, UID: 65532, GID: 65532}, rt, conn.Records(), reg, log, worker.WithLeases(conn.Leases()))
			if err != nil {
				t.Fatal(err)
			}

			const slots = 2
			running := []string{submit(ctx, t, dispatcher), submit(ctx, t, dispatcher)}
			workerCtx, drain := context.WithCancel(ctx)
			kill := make(chan struct{})
			consumed := make(chan error, 1)
			go func() {
				consumed <- consumeDraining(workerCtx, tt.grace, kill, log, func(fetchCtx, runCtx context.Context) error {
					return conn.Calls().ConsumeWith(fetchCtx, runCtx, slots, w.Handle)
				})
			}()
			for range running {
				select {
				case <-rt.started:
				case <-ctx.Done():
					t.Fatalf("the calls did not start; ran %v", rt.calls())
				}
			}

			drain()
			late := submit(ctx, t, dispatcher) // published once the drain began: never taken
			switch {
			case tt.finish:
				close(rt.release)
			case tt.kill:
				close(kill)
			}
			select {
			case err := <-consumed:
				if err != nil {
					t.Fatalf("consume: %v", err)
				}
			case <-ctx.Done():
				t.Fatal("the drain did not end")
			}

			for _, id := range running {
				rec, err := dispatcher.Records().Get(ctx, id)
				if err != nil {
					t.Fatal(err)
				}
				r := rec.Result
				if r.Status != tt.want || (tt.msg != "" && (r.Error == nil || !strings.Contains(r.Error.Message, tt.msg))) {
					t.Errorf("call %s ended %s %+v, want %s", id, r.Status, r.Error, tt.want)
				}
			}
			if rec, err := dispatcher.Records().Get(ctx, late); err != nil || rec.Result.Status != call.StatusQueued {
				t.Errorf("the call published during the drain is %+v (%v), want queued for another worker", rec.Result, err)
			}
			if ran := rt.calls(); len(ran) != len(running) {
				t.Errorf("ran %v, want only the calls that were running when the drain began", ran)
			}
		})
	}
}

// submit records and publishes a run_shell call, as the dispatcher does, and returns its id.
func submit(ctx context.Context, t *testing.T, conn *jetstream.Conn) string {
	t.Helper()
	c := &call.Call{ID: call.NewID(), Tenant: "acme", Workspace: "ws", Tool: "run_shell", Args: json.RawMessage(`{"command":"sleep 1"}`),
		CreatedAt: time.Now().UTC(), Limits: call.Limits{TimeoutMS: 60000}}
	if _, err := conn.Records().Create(ctx, call.NewResult(c, call.StatusQueued)); err != nil {
		t.Fatal(err)
	}
	if err := conn.Calls().Publish(ctx, c); err != nil {
		t.Fatal(err)
	}
	return c.ID
}

// TestDrainReturnsConsumeError: an error of consume is the worker's.
func TestDrainReturnsConsumeError(t *testing.T) {
	want := errors.New("subscribe to call subjects: nats: connection closed")
	got := consumeDraining(context.Background(), time.Hour, nil, slog.New(slog.NewTextHandler(io.Discard, nil)),
		func(context.Context, context.Context) error { return want })
	if !errors.Is(got, want) {
		t.Errorf("consumeDraining = %v, want %v", got, want)
	}
}
