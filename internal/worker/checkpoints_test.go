package worker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/checkpoint"
	"github.com/toolpool/toolpool/internal/queue"
	"github.com/toolpool/toolpool/internal/queue/jetstream"
	"github.com/toolpool/toolpool/internal/queue/jetstream/jstest"
	"github.com/toolpool/toolpool/internal/queue/queuetest"
	"github.com/toolpool/toolpool/internal/sandbox"
	"github.com/toolpool/toolpool/internal/workspace"
)

// shellRuntime stands in for a container that runs a shell line in its workspace: "write NAME TEXT"
// writes a file, "append NAME LINE" appends a line to one, "cat NAME" prints one; a worker test needs no more of a command than its effect.
func shellRuntime(t *testing.T) runtimeFunc {
	return func(_ context.Context, spec sandbox.Spec) (sandbox.Outcome, error) {
		out := sandbox.Outcome{SandboxTime: time.Millisecond, RunTime: time.Millisecond, WorkspaceBytes: -1}
		line := spec.Argv[len(spec.Argv)-1]
		f := strings.SplitN(line, " ", 3)
		w := sandbox.NewCapWriter(1 << 10)
		switch f[0] {
		case "write":
			if err := os.WriteFile(filepath.Join(spec.WorkspaceDir, f[1]), []byte(f[2]), 0o644); err != nil {
				t.Error(err)
			}
		case "append": // read, take a moment (a container's run), write back: loses a line to a concurrent append
			p := filepath.Join(spec.WorkspaceDir, f[1])
			b, err := os.ReadFile(p)
			if err != nil && !errors.Is(err, os.ErrNotExist) {
				t.Error(err)
			}
			time.Sleep(5 * time.Millisecond)
			if err := os.WriteFile(p, append(b, f[2]+"\n"...), 0o644); err != nil {
				t.Error(err)
			}
		case "image": // the image the call runs on
			io.WriteString(w, spec.Image)
		case "cat":
			b, err := os.ReadFile(filepath.Join(spec.WorkspaceDir, f[1]))
			if err != nil {
				out.ExitCode = 1
				io.WriteString(w, err.Error())
			}
			w.Write(b)
		}
		out.Stdout = w.Captured()
		return out, nil
	}
}

// checkingStore is the real checkpoint store, which also notes, when a head is written, whether the
// call's record was final already; and which fails when armed.
type checkingStore struct {
	checkpoint.Store
	heads     checkpoint.Heads
	records   *queuetest.Store
	callID    atomic.Value // string: the call whose record a head's write must precede
	finalSeen atomic.Bool
	failPut   atomic.Bool
	failOpen  atomic.Bool
}

func (s *checkingStore) Put(ctx context.Context, name string, r io.Reader) error {
	if s.failPut.Load() {
		return errors.New("object store unreachable")
	}
	return s.Store.Put(ctx, name, r)
}

func (s *checkingStore) SwapHead(ctx context.Context, tenant, name string, value []byte, rev uint64) (uint64, bool, error) {
	if s.failPut.Load() {
		return 0, false, errors.New("object store unreachable")
	}
	if id, _ := s.callID.Load().(string); id != "" {
		if res := s.records.Result(id); res != nil && res.Status.Terminal() {
			s.finalSeen.Store(true)
		}
	}
	return s.heads.SwapHead(ctx, tenant, name, value, rev)
}

func (s *checkingStore) TenantHeads(ctx context.Context, tenant string) (map[string][]byte, error) {
	return s.heads.TenantHeads(ctx, tenant)
}

func (s *checkingStore) CreateSnapshot(ctx context.Context, tenant, name, snap string, value []byte) (bool, error) {
	return s.heads.CreateSnapshot(ctx, tenant, name, snap, value)
}

func (s *checkingStore) Snapshots(ctx context.Context, tenant string) (map[string]map[string][]byte, error) {
	return s.heads.Snapshots(ctx, tenant)
}

func (s *checkingStore) DeleteSnapshots(ctx context.Context, tenant, name string) error {
	return s.heads.DeleteSnapshots(ctx, tenant, name)
}

func (s *checkingStore) Tenants(ctx context.Context) ([]string, error) { return s.heads.Tenants(ctx) }

func (s *checkingStore) GetHead(ctx context.Context, tenant, name string) ([]byte, uint64, error) {
	if s.failOpen.Load() {
		return nil, 0, errors.New("object store unreachable")
	}
	return s.heads.GetHead(ctx, tenant, name)
}

func (s *checkingStore) Open(ctx context.Context, name string) (io.ReadCloser, error) {
	if s.failOpen.Load() {
		return nil, errors.New("object store unreachable")
	}
	return s.Store.Open(ctx, name)
}

// TestWorkspaceAcrossWorkersWithoutSharedDir: two workers, each with its own workspaces directory, on one
// JetStream. A call on one writes a file; a call on the other reads it. The checkpoint is written before
// the writing call's result is recorded. With the object store unreachable, a call that wrote says its
// changes were not checkpointed, and a call on the other worker does not run on an old copy.
func TestWorkspaceAcrossWorkersWithoutSharedDir(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, store, records := checkpointStore(t)
	a, b := checkpointWorker(t, conn.Homes(), store, records, "a"), checkpointWorker(t, conn.Homes(), store, records, "b")
	run := func(w *Worker, command string) *call.Result {
		t.Helper()
		c := newCall("run_shell", `{"command":"`+command+`"}`)
		records.Put(call.NewResult(c, call.StatusQueued))
		store.callID.Store(c.ID)
		w.Handle(ctx, &fakeDelivery{c: c})
		return records.Result(c.ID)
	}

	if r := run(a, "write notes.txt from a"); r.Status != call.StatusOK {
		t.Fatalf("write on a: %s %+v", r.Status, r.Error)
	}
	if store.finalSeen.Load() {
		t.Fatal("the checkpoint's head was written after the call's result was recorded")
	}
	if r := run(b, "cat notes.txt"); r.Status != call.StatusOK || r.Stdout != "from a" {
		t.Fatalf("read on b: %s %q %+v; want a's file", r.Status, r.Stdout, r.Error)
	}
	if r := run(b, "write notes.txt from b"); r.Status != call.StatusOK || r.Timing.CheckpointMS < 0 {
		t.Fatalf("write on b: %s %+v", r.Status, r.Error)
	}
	if r := run(a, "cat notes.txt"); r.Status != call.StatusOK || r.Stdout != "from b" {
		t.Fatalf("read on a: %s %q %+v; want b's change over a's older copy", r.Status, r.Stdout, r.Error)
	}

	store.failPut.Store(true) // reads still work, writes fail
	r := run(a, "write notes.txt lost?")
	if r.Status != call.StatusError || r.Error == nil || r.Error.Type != call.ErrCheckpoint ||
		!strings.Contains(r.Error.Message, "the call ran, but the changes it made to workspace \"ws\" could not be checkpointed") {
		t.Fatalf("write with the store unreachable: %s %+v; want checkpoint_failed saying the call ran", r.Status, r.Error)
	}
	store.failOpen.Store(true)
	r = run(b, "cat notes.txt")
	if r.Status != call.StatusError || r.Error == nil || r.Error.Type != call.ErrCheckpoint || !strings.Contains(r.Error.Message, "did not run") {
		t.Fatalf("read on b with the store unreachable: %s %+v; want checkpoint_failed saying nothing ran", r.Status, r.Error)
	}
	store.failPut.Store(false)
	store.failOpen.Store(false)
	// a's unsaved change is kept, and saved by a's next call that may write.
	if r := run(a, "write other.txt x"); r.Status != call.StatusOK {
		t.Fatalf("write on a once the store is back: %s %+v", r.Status, r.Error)
	}
	if r := run(b, "cat notes.txt"); r.Status != call.StatusOK || r.Stdout != "lost?" {
		t.Fatalf("read on b: %q %+v; want the change whose checkpoint failed, saved by the next call", r.Stdout, r.Error)
	}
}

// TestWorkspaceImageTravels: a workspace's default image, set through the workspace API on one worker,
// is the image its calls run on from another worker with a workspaces directory of its own, and so is
// clearing it; a fork on checkpoints carries it; a snapshot restored keeps the workspace's image.
func TestWorkspaceImageTravels(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, store, records := checkpointStore(t)
	a, b := checkpointWorker(t, conn.Homes(), store, records, "a"), checkpointWorker(t, conn.Homes(), store, records, "b")
	handle := func(w *Worker, ws, tool, args string) *call.Result {
		t.Helper()
		c := newCall(tool, args)
		c.Workspace = ws
		records.Put(call.NewResult(c, call.StatusQueued))
		w.Handle(ctx, &fakeDelivery{c: c})
		r := records.Result(c.ID)
		if r.Status != call.StatusOK {
			t.Fatalf("%s %s on %s: %s %+v %s", tool, args, w.cfg.ID, r.Status, r.Error, r.Output)
		}
		return r
	}
	image := func(w *Worker, ws string) string {
		t.Helper()
		return handle(w, ws, "run_shell", `{"command":"image"}`).Stdout
	}
	handle(a, "ws", "run_shell", `{"command":"write f.txt x"}`)
	handle(a, "ws", workspace.OpSetImage, `{"image":"reg.example/tools:1"}`)
	if got := image(b, "ws"); got != "reg.example/tools:1" {
		t.Fatalf("a call on b ran on image %q; want the one set on a", got)
	}
	handle(b, "ws", workspace.OpSnapshot, `{"snapshot":"s1"}`)
	handle(b, "ws", workspace.OpFork, `{"to":"branch"}`)
	if got := image(a, "branch"); got != "reg.example/tools:1" {
		t.Fatalf("a call into the fork ran on image %q; want the workspace's", got)
	}
	handle(b, "ws", workspace.OpSetImage, `{"image":""}`)
	if got := image(a, "ws"); got != "" {
		t.Fatalf("a call on a ran on image %q after b cleared it", got)
	}
	handle(a, "ws", workspace.OpRestore, `{"snapshot":"s1"}`)
	if got := image(b, "ws"); got != "" {
		t.Fatalf("after restoring a snapshot, a call ran on image %q; want the workspace's own (none)", got)
	}
	if got := image(b, "branch"); got != "reg.example/tools:1" {
		t.Fatalf("the fork's image became %q when its source's was cleared", got)
	}
}

// checkpointStore is the real checkpoint store and heads on an in-process JetStream (checked by
// checkingStore), and call records.
func checkpointStore(t *testing.T) (*jetstream.Conn, *checkingStore, *queuetest.Store) {
	t.Helper()
	conn, _ := jstest.Provisioned(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	js, err := conn.Checkpoints(ctx)
	if err != nil {
		t.Fatal(err)
	}
	heads, err := conn.Heads(ctx)
	if err != nil {
		t.Fatal(err)
	}
	records := queuetest.NewStore()
	return conn, &checkingStore{Store: js, heads: heads, records: records}, records
}

// checkpointWorker is a worker with its own workspaces directory that keeps workspaces in store, with the
// workspaces' homes in homes.
func checkpointWorker(t *testing.T, homes Homes, store *checkingStore, records *queuetest.Store, id string, opts ...Option) *Worker {
	t.Helper()
	cfg := testConfig(t)
	cfg.ID = id
	cp, err := checkpoint.New(checkpoint.Config{Dir: cfg.WorkspacesDir, UID: testUID, GID: testGID, Worker: id}, store, store)
	if err != nil {
		t.Fatal(err)
	}
	return newTestWorkerWith(t, cfg, shellRuntime(t), records, append([]Option{WithLeases(newFakeLeases()), WithCheckpoints(cp), WithHomes(homes)}, opts...)...)
}

// TestOneCallAtATimePerWorkspace: two workers, each with its own workspaces directory, take calls into one
// workspace at once (several on each worker), each appending its line to one file. The workspace's home
// lets one such call run at a time across both, each on the checkpoint of the one before: every call
// succeeds and every line is in the latest checkpoint, whichever worker reads it. Without homes, two
// calls append to copies of one checkpoint and the later checkpoint drops the other's line.
func TestOneCallAtATimePerWorkspace(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, store, records := checkpointStore(t)
	workers := []*Worker{checkpointWorker(t, conn.Homes(), store, records, "a"), checkpointWorker(t, conn.Homes(), store, records, "b")}
	const calls = 12
	ids := make([]string, calls)
	var wg sync.WaitGroup
	for i := range calls {
		c := newCall("run_shell", fmt.Sprintf(`{"command":"append lines.txt line-%02d"}`, i))
		ids[i] = c.ID
		records.Put(call.NewResult(c, call.StatusQueued))
		wg.Add(1)
		go func() {
			defer wg.Done()
			workers[i%2].Handle(ctx, &fakeDelivery{c: c})
		}()
	}
	wg.Wait()
	for i, id := range ids {
		if r := records.Result(id); r.Status != call.StatusOK {
			t.Fatalf("call %d: %s %+v", i, r.Status, r.Error)
		}
	}
	for _, w := range workers {
		c := newCall("run_shell", `{"command":"cat lines.txt"}`)
		records.Put(call.NewResult(c, call.StatusQueued))
		w.Handle(ctx, &fakeDelivery{c: c})
		r := records.Result(c.ID)
		lines := strings.Fields(r.Stdout)
		slices.Sort(lines)
		if r.Status != call.StatusOK || len(lines) != calls || len(slices.Compact(lines)) != calls {
			t.Fatalf("lines.txt on worker %s: %s %q; want the %d lines of every call", w.cfg.ID, r.Status, r.Stdout, calls)
		}
	}
}

// grantingHomes grants every home at once, as when a home lapsed while its holder still ran a call (a
// worker that stalled): calls into one workspace then run at the same time on two workers.
type grantingHomes struct{}

func (grantingHomes) AcquireHome(context.Context, string, string, string, time.Duration) (queue.Lease, error) {
	return grantedHome{}, nil
}
func (grantingHomes) HomeOf(context.Context, string, string) (string, error) { return "", nil }

type grantedHome struct{}

func (grantedHome) Renew(context.Context) error   { return nil }
func (grantedHome) Release(context.Context) error { return nil }

// TestNoStaleCheckpoint: when calls into one workspace do run at once on two workers (a home lapsed
// under a worker that stalled), the checkpoint's compare-and-set still keeps every change of a call that
// succeeded: a call whose copy was older than the latest checkpoint when it saved fails, saying its
// changes are not kept, and never replaces that checkpoint.
func TestNoStaleCheckpoint(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, store, records := checkpointStore(t)
	workers := []*Worker{checkpointWorker(t, grantingHomes{}, store, records, "a"), checkpointWorker(t, grantingHomes{}, store, records, "b")}
	// Each worker runs its calls one after the other (a worker's own calls into one workspace are ordered
	// by the home it holds itself), both workers at once.
	const calls = 12
	ids := make([]string, calls)
	var wg sync.WaitGroup
	for k, w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := k; i < calls; i += len(workers) {
				c := newCall("run_shell", fmt.Sprintf(`{"command":"append lines.txt line-%02d"}`, i))
				ids[i] = c.ID
				records.Put(call.NewResult(c, call.StatusQueued))
				w.Handle(ctx, &fakeDelivery{c: c})
			}
		}()
	}
	wg.Wait()
	c := newCall("run_shell", `{"command":"cat lines.txt"}`)
	records.Put(call.NewResult(c, call.StatusQueued))
	workers[0].Handle(ctx, &fakeDelivery{c: c})
	latest := records.Result(c.ID).Stdout
	ok := 0
	for i, id := range ids {
		r, line := records.Result(id), fmt.Sprintf("line-%02d", i)
		switch {
		case r.Status == call.StatusOK:
			ok++
			if !strings.Contains(latest, line) {
				t.Errorf("call %d succeeded but its %s is not in the latest checkpoint:\n%s", i, line, latest)
			}
		case r.Error == nil || r.Error.Type != call.ErrCheckpoint || !strings.Contains(r.Error.Message, "are not kept: while it ran, another worker checkpointed the workspace"):
			t.Errorf("call %d: %s %+v; want ok, or checkpoint_failed saying its changes are not kept", i, r.Status, r.Error)
		}
	}
	if ok == 0 {
		t.Fatal("no call succeeded")
	}
	t.Logf("%d of %d calls succeeded, %d refused as stale", ok, calls, calls-ok)
}

// TestCheckpointBudget: a call that takes its workspace over the checkpoint budget ran, and its result
// says its changes were not checkpointed, why and what to do; the latest checkpoint stays the one before.
func TestCheckpointBudget(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, store, records := checkpointStore(t)
	cfg := testConfig(t)
	cp, err := checkpoint.New(checkpoint.Config{Dir: cfg.WorkspacesDir, UID: testUID, GID: testGID, Worker: cfg.ID, MaxWorkspaceBytes: 8}, store, store)
	if err != nil {
		t.Fatal(err)
	}
	w := newTestWorkerWith(t, cfg, shellRuntime(t), records, WithLeases(newFakeLeases()), WithCheckpoints(cp), WithHomes(conn.Homes()))
	other := checkpointWorker(t, conn.Homes(), store, records, "other")
	run := func(w *Worker, command string) *call.Result {
		c := newCall("run_shell", `{"command":"`+command+`"}`)
		records.Put(call.NewResult(c, call.StatusQueued))
		w.Handle(ctx, &fakeDelivery{c: c})
		return records.Result(c.ID)
	}
	if r := run(w, "write a.txt small"); r.Status != call.StatusOK {
		t.Fatalf("write under the budget: %s %+v", r.Status, r.Error)
	}
	r := run(w, "write b.txt too-large")
	if r.Status != call.StatusError || r.Error == nil || r.Error.Type != call.ErrCheckpoint ||
		!strings.Contains(r.Error.Message, `changes it made to workspace "ws" were not checkpointed, and nothing of them was stored, because they go over a checkpoint budget (checkpoint workspace t/ws: over the checkpoint budget of a workspace: its files hold`) || !strings.Contains(r.Error.Message, "Remove files") {
		t.Fatalf("write over the budget: %s %+v; want checkpoint_failed saying the workspace is over its budget", r.Status, r.Error)
	}
	if r := run(other, "cat b.txt"); r.Status == call.StatusOK {
		t.Fatalf("the file over the budget reached the latest checkpoint: %q", r.Stdout)
	}
}

// TestNoRestoreUnderAWriter: a call changing a workspace on worker a runs on (its home lapsed, as under a
// stall: homes that always grant) while worker b checkpoints a change of its own. A call on a that
// changes nothing must not restore a's copy under the running call: the running call would then write
// back what it read before, over b's change, and its checkpoint would pass on the revision restored.
// With the restore skipped, the running call's checkpoint is refused as stale, and b's change stays.
func TestNoRestoreUnderAWriter(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, store, records := checkpointStore(t)
	started, gate := make(chan struct{}), make(chan struct{})
	gated := func(_ context.Context, spec sandbox.Spec) (sandbox.Outcome, error) {
		// "append-gated NAME LINE": read the file, wait for the gate, write it back with the line.
		f := strings.SplitN(spec.Argv[len(spec.Argv)-1], " ", 3)
		p := filepath.Join(spec.WorkspaceDir, f[1])
		b, _ := os.ReadFile(p)
		close(started)
		<-gate
		if err := os.WriteFile(p, append(b, f[2]+"\n"...), 0o644); err != nil {
			t.Error(err)
		}
		return sandbox.Outcome{SandboxTime: time.Millisecond, RunTime: time.Millisecond, WorkspaceBytes: -1}, nil
	}
	cfg := testConfig(t)
	cfg.ID = "a"
	cp, err := checkpoint.New(checkpoint.Config{Dir: cfg.WorkspacesDir, UID: testUID, GID: testGID, Worker: "a"}, store, store)
	if err != nil {
		t.Fatal(err)
	}
	a := newTestWorkerWith(t, cfg, runtimeFunc(gated), records, WithLeases(newFakeLeases()), WithCheckpoints(cp), WithHomes(grantingHomes{}))
	b := checkpointWorker(t, grantingHomes{}, store, records, "b")
	run := func(w *Worker, tool, args string) *call.Result {
		c := newCall(tool, args)
		records.Put(call.NewResult(c, call.StatusQueued))
		w.Handle(ctx, &fakeDelivery{c: c})
		return records.Result(c.ID)
	}
	if r := run(b, "run_shell", `{"command":"append lines.txt b0"}`); r.Status != call.StatusOK {
		t.Fatalf("first line: %s %+v", r.Status, r.Error)
	}
	var writer *call.Result
	done := make(chan struct{})
	go func() {
		defer close(done)
		writer = run(a, "run_shell", `{"command":"append-gated lines.txt a1"}`)
	}()
	<-started
	if r := run(b, "run_shell", `{"command":"append lines.txt b1"}`); r.Status != call.StatusOK {
		t.Fatalf("b's change while a's call runs: %s %+v", r.Status, r.Error)
	}
	run(a, workspace.OpInfo, `{}`) // changes nothing: must not restore a's copy under its running call
	close(gate)
	<-done
	if writer.Status != call.StatusError || writer.Error == nil || !strings.Contains(writer.Error.Message, "are not kept") {
		t.Fatalf("a's call, whose copy is older than b's checkpoint: %s %+v; want its changes not kept", writer.Status, writer.Error)
	}
	if r := run(b, "run_shell", `{"command":"cat lines.txt"}`); r.Stdout != "b0\nb1\n" {
		t.Fatalf("the latest checkpoint holds %q; want b's two lines (b's call succeeded)", r.Stdout)
	}
}
