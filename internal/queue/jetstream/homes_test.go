package jetstream_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/queue"
	"github.com/toolpool/toolpool/internal/queue/jetstream"
	"github.com/toolpool/toolpool/internal/queue/jetstream/jstest"
)

// TestHomes: a workspace's home is held by one acquisition at a time, across workers and within one;
// HomeOf names its holder; a released home is taken at once, and a home whose holder stopped renewing it
// lapses on the server's clock and is taken by another worker. Names that are not valid key tokens
// ("a.b", "x..y") are homes of their own.
func TestHomes(t *testing.T) {
	srv := jstest.Server(t, "")
	jstest.Connect(t, srv.URL(), "dispatcher", true)
	a := jstest.Connect(t, srv.URL(), "worker-a", false).Homes()
	b := jstest.Connect(t, srv.URL(), "worker-b", false).Homes()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	la, err := a.AcquireHome(ctx, "a.b", "x..y", "worker-a", 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.AcquireHome(ctx, "a.b", "x..y", "worker-b", 2*time.Second); !errors.Is(err, queue.ErrExists) {
		t.Fatalf("second worker's acquire: %v; want ErrExists", err)
	}
	if _, err := a.AcquireHome(ctx, "a.b", "x..y", "worker-a", 2*time.Second); !errors.Is(err, queue.ErrExists) {
		t.Fatalf("the holder's second acquire: %v; want ErrExists (one call at a time on one worker too)", err)
	}
	if h, err := b.HomeOf(ctx, "a.b", "x..y"); err != nil || h != "worker-a" {
		t.Fatalf("HomeOf = %q, %v; want worker-a", h, err)
	}
	// Another workspace, and the same workspace name of another tenant, are other homes.
	for _, k := range [][2]string{{"a.b", "x.y"}, {"a", "b.x..y"}} {
		l, err := b.AcquireHome(ctx, k[0], k[1], "worker-b", 2*time.Second)
		if err != nil {
			t.Fatalf("home of %s/%s: %v; want its own", k[0], k[1], err)
		}
		_ = l.Release(ctx)
	}
	if err := la.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	if err := la.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if h, err := b.HomeOf(ctx, "a.b", "x..y"); err != nil || h != "" {
		t.Fatalf("HomeOf after release = %q, %v; want none", h, err)
	}
	lb, err := b.AcquireHome(ctx, "a.b", "x..y", "worker-b", time.Second)
	if err != nil {
		t.Fatalf("acquire a released home: %v", err)
	}
	// worker-b stops renewing: its home lapses on the server's clock, and worker-a takes it.
	start := time.Now()
	for {
		h, err := a.HomeOf(ctx, "a.b", "x..y")
		if err != nil {
			t.Fatal(err)
		}
		if h == "" {
			break
		}
		if time.Since(start) > 10*time.Second {
			t.Fatalf("home still held by %q %s after its 1s TTL", h, time.Since(start))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := a.AcquireHome(ctx, "a.b", "x..y", "worker-a", 2*time.Second); err != nil {
		t.Fatalf("take over a lapsed home: %v", err)
	}
	if err := lb.Renew(ctx); !errors.Is(err, queue.ErrConflict) {
		t.Fatalf("renew of the lapsed home: %v; want ErrConflict", err)
	}
}

// TestHeads: the first worker to ask makes the heads bucket; a head is written by compare-and-set on the
// revision its writer read, a stale writer is refused and changes nothing, and every worker reads the
// latest head; TenantHeads lists a tenant's heads, not another's.
func TestHeads(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a, b := twoWorkersHeads(ctx, t)
	if v, rev, err := a.GetHead(ctx, "acme", "x..y"); err != nil || v != nil || rev != 0 {
		t.Fatalf("GetHead of none = %q, %d, %v", v, rev, err)
	}
	r1, ok, err := a.SwapHead(ctx, "acme", "x..y", []byte("a1"), 0)
	if err != nil || !ok || r1 == 0 {
		t.Fatalf("first head: %d %v %v", r1, ok, err)
	}
	if _, ok, err := b.SwapHead(ctx, "acme", "x..y", []byte("b1"), 0); err != nil || ok {
		t.Fatalf("a second first head: %v %v; want refused", ok, err)
	}
	r2, ok, err := b.SwapHead(ctx, "acme", "x..y", []byte("b2"), r1)
	if err != nil || !ok || r2 <= r1 {
		t.Fatalf("head at the revision read: %d %v %v", r2, ok, err)
	}
	if _, ok, err := a.SwapHead(ctx, "acme", "x..y", []byte("a2"), r1); err != nil || ok {
		t.Fatalf("stale head: %v %v; want refused", ok, err)
	}
	if v, rev, err := a.GetHead(ctx, "acme", "x..y"); err != nil || string(v) != "b2" || rev != r2 {
		t.Fatalf("GetHead = %q, %d, %v; want b2 at %d", v, rev, err, r2)
	}
	if v, _, err := a.GetHead(ctx, "acme.x", "y"); err != nil || v != nil {
		t.Fatalf("another tenant's workspace: %q %v; want none", v, err)
	}
	if _, ok, err := a.SwapHead(ctx, "acme", "other", []byte("o1"), 0); err != nil || !ok {
		t.Fatalf("head of another workspace: %v %v", ok, err)
	}
	if _, ok, err := a.SwapHead(ctx, "acme.x", "y", []byte("x1"), 0); err != nil || !ok {
		t.Fatalf("head of another tenant: %v %v", ok, err)
	}
	all, err := b.TenantHeads(ctx, "acme")
	if err != nil || len(all) != 2 || string(all["x..y"]) != "b2" || string(all["other"]) != "o1" {
		t.Fatalf("TenantHeads(acme) = %q, %v; want x..y and other, the latest of each", all, err)
	}
	if none, err := b.TenantHeads(ctx, "nobody"); err != nil || len(none) != 0 {
		t.Fatalf("TenantHeads of a tenant without heads = %q, %v", none, err)
	}
}

// TestSnapshotHeads: a snapshot is created once under its name (a second create is refused and changes
// nothing), listed by workspace and name for its tenant only, never among the tenant's heads, and deleted
// with its workspace's snapshots, not another workspace's.
func TestSnapshotHeads(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a, b := twoWorkersHeads(ctx, t)
	if _, ok, err := a.SwapHead(ctx, "acme", "ws", []byte("h1"), 0); err != nil || !ok {
		t.Fatalf("head: %v %v", ok, err)
	}
	for _, s := range []struct{ tenant, ws, snap, v string }{
		{"acme", "ws", "s1", "v1"}, {"acme", "ws", "s.2", "v2"}, {"acme", "other", "s1", "o1"}, {"acme.ws", "s1", "x", "t2"},
	} {
		if ok, err := a.CreateSnapshot(ctx, s.tenant, s.ws, s.snap, []byte(s.v)); err != nil || !ok {
			t.Fatalf("create snapshot %+v: %v %v", s, ok, err)
		}
	}
	if ok, err := b.CreateSnapshot(ctx, "acme", "ws", "s1", []byte("again")); err != nil || ok {
		t.Fatalf("a snapshot of a name taken: %v %v; want refused", ok, err)
	}
	all, err := b.Snapshots(ctx, "acme")
	if err != nil || len(all) != 2 || len(all["ws"]) != 2 || string(all["ws"]["s1"]) != "v1" || string(all["ws"]["s.2"]) != "v2" || string(all["other"]["s1"]) != "o1" {
		t.Fatalf("Snapshots(acme) = %q, %v; want ws's s1 and s.2, other's s1", all, err)
	}
	if heads, err := b.TenantHeads(ctx, "acme"); err != nil || len(heads) != 1 || string(heads["ws"]) != "h1" {
		t.Fatalf("TenantHeads(acme) = %q, %v; want the head of ws alone, no snapshot", heads, err)
	}
	if err := a.DeleteSnapshots(ctx, "acme", "ws"); err != nil {
		t.Fatal(err)
	}
	if all, err := b.Snapshots(ctx, "acme"); err != nil || len(all) != 1 || string(all["other"]["s1"]) != "o1" {
		t.Fatalf("Snapshots(acme) after deleting ws's = %q, %v; want other's alone", all, err)
	}
	if ok, err := b.CreateSnapshot(ctx, "acme", "ws", "s1", []byte("new")); err != nil || !ok {
		t.Fatalf("a snapshot of a deleted snapshot's name: %v %v", ok, err)
	}
	if err := a.DeleteSnapshots(ctx, "nobody", "ws"); err != nil {
		t.Fatalf("delete the snapshots of a workspace with none: %v", err)
	}
}

// twoWorkersHeads opens the heads bucket from two workers' connections to one server (the first makes it).
func twoWorkersHeads(ctx context.Context, t *testing.T) (a, b *jetstream.Heads) {
	t.Helper()
	srv := jstest.Server(t, "")
	jstest.Connect(t, srv.URL(), "dispatcher", true)
	var err error
	if a, err = jstest.Connect(t, srv.URL(), "worker-a", false).Heads(ctx); err != nil {
		t.Fatal(err)
	}
	if b, err = jstest.Connect(t, srv.URL(), "worker-b", false).Heads(ctx); err != nil {
		t.Fatal(err)
	}
	return a, b
}
