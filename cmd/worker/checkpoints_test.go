package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/toolpool/toolpool/internal/checkpoint"
	"github.com/toolpool/toolpool/internal/metrics"
	"github.com/toolpool/toolpool/internal/queue/jetstream/jstest"
)

// TestCollectGarbageOnDemand: with no collection scheduled (gc_every 0), a SIGUSR1 (a value on now) runs
// one at once, on the real JetStream store: a deleted workspace's chunk goes and the run is counted.
func TestCollectGarbageOnDemand(t *testing.T) {
	conn, _ := jstest.Provisioned(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	store, err := conn.Checkpoints(ctx)
	if err != nil {
		t.Fatal(err)
	}
	heads, err := conn.Heads(ctx)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	// One chunk object per file (no packs): the test names the deleted file's chunk by its content.
	cp, err := checkpoint.New(checkpoint.Config{Dir: dir, Worker: "w", UID: os.Getuid(), GID: os.Getgid(), Grace: time.Nanosecond, PackFilesUnder: -1}, store, heads)
	if err != nil {
		t.Fatal(err)
	}
	ws := filepath.Join(dir, "acme", "gone")
	if err := os.MkdirAll(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ws, "f"), []byte("deleted data"), 0o644); err != nil {
		t.Fatal(err)
	}
	for range 2 { // saved, then saved deleted
		if _, err := cp.Save(ctx, "acme", "gone"); err != nil {
			t.Fatal(err)
		}
		if err := os.RemoveAll(ws); err != nil {
			t.Fatal(err)
		}
	}
	sum := sha256.Sum256([]byte("deleted data"))
	chunk := "acme/chunks/" + hex.EncodeToString(sum[:])
	if has, err := store.Has(ctx, chunk); err != nil || !has {
		t.Fatalf("the chunk before the collection: %v, %v", has, err)
	}

	reg := prometheus.NewRegistry()
	wm := metrics.NewWorker(reg, metrics.DefaultOptions())
	now := make(chan os.Signal, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		collectGarbage(ctx, cp, conn.Leases(), "w", 0, now, wm, slog.New(slog.NewTextHandler(io.Discard, nil)))
	}()
	now <- os.Interrupt
	// The collection is over once it is counted (its chunk goes before its tree: stopping the collector
	// as soon as the chunk is gone would cut the sweep short).
	counted := func(name string) float64 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != name {
				continue
			}
			sum := 0.0
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
			return sum
		}
		return 0
	}
	for deadline := time.Now().Add(30 * time.Second); counted("toolpool_checkpoint_gc_runs_total") == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no collection counted 30 s after SIGUSR1")
		}
	}
	cancel()
	<-done
	if has, err := store.Has(context.Background(), chunk); err != nil || has {
		t.Fatalf("the deleted workspace's chunk after the collection: %v, %v; want it gone", has, err)
	}
	if swept := counted("toolpool_checkpoint_gc_swept_objects_total"); swept < 2 {
		t.Fatalf("toolpool_checkpoint_gc_swept_objects_total is %v; want the chunk and its tree counted", swept)
	}
}
