package jetstream_test

import (
	"context"
	"errors"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/toolpool/toolpool/internal/queue/jetstream"
	"github.com/toolpool/toolpool/internal/queue/jetstream/jstest"
)

// TestCheckpointsStore: the first worker to ask makes the checkpoint object store, with no TTL and with
// direct gets off (reads from the leader only); a second worker opens the same one; objects are stored,
// read, looked up, and a missing one is os.ErrNotExist.
func TestCheckpointsStore(t *testing.T) {
	srv := jstest.Server(t, "")
	jstest.Connect(t, srv.URL(), "dispatcher", true)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a, err := jstest.Connect(t, srv.URL(), "worker-a", false).Checkpoints(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b, err := jstest.Connect(t, srv.URL(), "worker-b", false).Checkpoints(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Put(ctx, "acme/heads/repo", strings.NewReader("head")); err != nil {
		t.Fatal(err)
	}
	rc, err := b.Open(ctx, "acme/heads/repo")
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(rc)
	rc.Close()
	if string(got) != "head" {
		t.Fatalf("read %q through the second worker's store", got)
	}
	if has, err := b.Has(ctx, "acme/heads/repo"); err != nil || !has {
		t.Fatalf("Has: %v, %v", has, err)
	}
	if has, err := b.Has(ctx, "acme/heads/none"); err != nil || has {
		t.Fatalf("Has of a missing object: %v, %v", has, err)
	}
	if _, err := b.Open(ctx, "acme/heads/none"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Open of a missing object: %v; want os.ErrNotExist", err)
	}

	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := natsjs.New(nc)
	st, err := js.Stream(ctx, "OBJ_"+jetstream.DefaultConfig().Bucket+"_checkpoints")
	if err != nil {
		t.Fatal(err)
	}
	if cfg := st.CachedInfo().Config; cfg.AllowDirect || cfg.MaxAge != 0 {
		t.Fatalf("checkpoint stream: allow_direct %v, max_age %s; want reads from the leader and no TTL", cfg.AllowDirect, cfg.MaxAge)
	}
}
