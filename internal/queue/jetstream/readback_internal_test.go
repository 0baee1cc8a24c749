package jetstream

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolpool/toolpool/internal/queue"
)

// unreadable is a real bucket whose Gets fail while fail is set, as when a slow server answers a read after
// its caller's deadline.
type unreadable struct {
	jetstream.KeyValue
	fail *atomic.Bool
}

func (kv unreadable) Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error) {
	if kv.fail.Load() {
		return nil, context.DeadlineExceeded
	}
	return kv.KeyValue.Get(ctx, key)
}

// TestRenewRefusedButUnreadIsNoConflict: a renewal the server refused because an earlier renewal of the
// same holder was applied (its reply lost) is not a conflict while the lease cannot be read back: the guard
// would stop a healthy call and record nothing. Once the lease reads back, the renewal adopts its own
// revision; a lease taken by another holder is still a conflict.
func TestRenewRefusedButUnreadIsNoConflict(t *testing.T) {
	c := provisioned(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	fail := &atomic.Bool{}
	leases := &Leases{session: c.session, kv: unreadable{c.leases.kv, fail}}
	acquired, err := leases.AcquireLease(ctx, "c_slow", "w1", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	l := acquired.(*lease)
	before := l.rev
	if err := l.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	l.rev = before // the renewal was applied, but its reply never came back

	fail.Store(true)
	if err := l.Renew(ctx); err == nil || errors.Is(err, queue.ErrConflict) {
		t.Fatalf("renew refused with the lease unreadable = %v, want an error that is not queue.ErrConflict", err)
	}
	fail.Store(false)
	if err := l.Renew(ctx); err != nil {
		t.Fatalf("renew once the lease reads back = %v, want the applied renewal adopted", err)
	}

	if err := leases.kv.Delete(ctx, "c_slow"); err != nil { // lapsed and removed by the server
		t.Fatal(err)
	}
	if _, err := leases.AcquireLease(ctx, "c_slow", "w2", 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := l.Renew(ctx); !errors.Is(err, queue.ErrConflict) {
		t.Fatalf("renew of a lease another holder took = %v, want queue.ErrConflict", err)
	}
}

// TestHeadWritesRefusedButUnreadAreErrors: a head or snapshot write the server refused, whose key cannot be
// read back, is an error (its outcome is unknown), never "moved on" or "exists"; read back, the refusal is
// the answer.
func TestHeadWritesRefusedButUnreadAreErrors(t *testing.T) {
	c := provisioned(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	real, err := c.Heads(ctx)
	if err != nil {
		t.Fatal(err)
	}
	fail := &atomic.Bool{}
	h := &Heads{session: c.session, kv: unreadable{real.kv, fail}}
	if _, ok, err := h.SwapHead(ctx, "t", "ws", []byte("tree-1"), 0); err != nil || !ok {
		t.Fatalf("first head: %v %v", ok, err)
	}
	if ok, err := h.CreateSnapshot(ctx, "t", "ws", "s", []byte("tree-1")); err != nil || !ok {
		t.Fatalf("first snapshot: %v %v", ok, err)
	}

	fail.Store(true)
	if _, ok, err := h.SwapHead(ctx, "t", "ws", []byte("tree-2"), 0); err == nil || ok {
		t.Errorf("head write refused, unread = %v, %v; want an error", ok, err)
	}
	if ok, err := h.CreateSnapshot(ctx, "t", "ws", "s", []byte("tree-2")); err == nil || ok {
		t.Errorf("snapshot write refused, unread = %v, %v; want an error", ok, err)
	}
	fail.Store(false)
	if _, ok, err := h.SwapHead(ctx, "t", "ws", []byte("tree-2"), 0); err != nil || ok {
		t.Errorf("head write refused, read back = %v, %v; want not swapped and no error", ok, err)
	}
	if ok, err := h.CreateSnapshot(ctx, "t", "ws", "s", []byte("tree-2")); err != nil || ok {
		t.Errorf("snapshot write refused, read back = %v, %v; want not created and no error", ok, err)
	}
}
