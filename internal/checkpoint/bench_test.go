package checkpoint_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/checkpoint"
	"github.com/toolpool/toolpool/internal/checkpoint/s3store"
	"github.com/toolpool/toolpool/internal/checkpoint/s3store/s3test"
	"github.com/toolpool/toolpool/internal/queue/jetstream/jstest"
)

// benchTree writes files files of size bytes each into root, a hundred per directory.
func benchTree(b *testing.B, root string, files, size int) {
	b.Helper()
	body := []byte(noise(size))
	for i := range files {
		dir := filepath.Join(root, fmt.Sprintf("pkg%04d", i/100))
		if i%100 == 0 {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				b.Fatal(err)
			}
		}
		copy(body, fmt.Sprintf("%08d", i)) // every file its own content
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%03d.go", i%100)), body, 0o644); err != nil {
			b.Fatal(err)
		}
	}
}

// savedTree writes workspace acme/repo of 10 000 files (100 directories, 1 KiB each) under dir, cp's, and
// saves it; it returns the workspace's root.
func savedTree(b *testing.B, cp *checkpoint.Checkpointer, dir string) string {
	b.Helper()
	root := filepath.Join(dir, "acme", "repo")
	benchTree(b, root, 10_000, 1024)
	if _, err := cp.Save(context.Background(), "acme", "repo"); err != nil {
		b.Fatal(err)
	}
	return root
}

func benchNode(b *testing.B, s backend, name string) (string, *checkpoint.Checkpointer) {
	b.Helper()
	dir := filepath.Join(b.TempDir(), name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	cp, err := checkpoint.New(checkpoint.Config{Dir: dir, Worker: name, UID: os.Getuid(), GID: os.Getgid()}, s, s)
	if err != nil {
		b.Fatal(err)
	}
	return dir, cp
}

func benchStore(b *testing.B) backend {
	b.Helper()
	conn, _ := jstest.Provisioned(b, nil)
	s, err := conn.Checkpoints(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	return stores{s, jsHeads(b, conn)}
}

// BenchmarkSaveOneFileChange is what a checkpoint adds to a call that changed one file of a workspace of
// 10 000 files (100 directories, 1 KiB each) on JetStream's object store: each iteration rewrites one
// file and saves; p50 and p95 of the saves are reported. Issue 27's goal: p50 under 20 ms.
func BenchmarkSaveOneFileChange(b *testing.B) {
	s := benchStore(b)
	dir, cp := benchNode(b, s, "a")
	root := savedTree(b, cp, dir)
	ctx := context.Background()
	var took []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		p := filepath.Join(root, fmt.Sprintf("pkg%04d", i%100), fmt.Sprintf("f%03d.go", i%100))
		if err := os.WriteFile(p, []byte(noise(1024)+fmt.Sprint(i)), 0o644); err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		r, err := cp.Save(ctx, "acme", "repo")
		took = append(took, time.Since(start))
		if err != nil || !r.Changed || r.Files != 1 {
			b.Fatalf("save %d: %+v, %v", i, r, err)
		}
	}
	b.StopTimer()
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(took[len(took)*95/100].Microseconds())/1000, "p95-ms")
}

// BenchmarkSnapshotForkRestore is the cost of a snapshot, a fork and a restore of a workspace of 10 000
// files (100 directories, 1 KiB each) on JetStream: each writes heads and moves no data, so none depends
// on the workspace's size. Each iteration snapshots the workspace, forks it to a new workspace and
// restores the snapshot; p50 and p95 of each are reported.
func BenchmarkSnapshotForkRestore(b *testing.B) {
	s := benchStore(b)
	dir, cp := benchNode(b, s, "a")
	savedTree(b, cp, dir)
	ctx := context.Background()
	var snap, fork, restore []time.Duration
	timed := func(to *[]time.Duration, f func() (checkpoint.Head, error)) {
		start := time.Now()
		h, err := f()
		*to = append(*to, time.Since(start))
		if err != nil || h.Files != 10_000 {
			b.Fatalf("%+v, %v", h, err)
		}
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		name := fmt.Sprintf("s%d", i)
		timed(&snap, func() (checkpoint.Head, error) { return cp.Snapshot(ctx, "acme", "repo", name) })
		timed(&fork, func() (checkpoint.Head, error) { return cp.Fork(ctx, "acme", "repo", "", "f"+name, nil) })
		timed(&restore, func() (checkpoint.Head, error) { return cp.RestoreSnapshot(ctx, "acme", "repo", name, nil) })
	}
	b.StopTimer()
	for _, m := range []struct {
		name string
		took []time.Duration
	}{{"snapshot", snap}, {"fork", fork}, {"restore", restore}} {
		slices.Sort(m.took)
		b.ReportMetric(float64(m.took[len(m.took)/2].Microseconds())/1000, m.name+"-p50-ms")
		b.ReportMetric(float64(m.took[len(m.took)*95/100].Microseconds())/1000, m.name+"-p95-ms")
	}
}

// BenchmarkWorkspace100k checkpoints a workspace of 100 000 files (1000 directories, 1 KiB each, 98 MiB)
// on JetStream's object store and restores it on another node: the first save (every file read and
// stored), a save with nothing changed (the walk), a one-file change, the restore on an empty node and
// the restore of a one-file change over an up-to-date copy. Run it once (-benchtime 1x).
func BenchmarkWorkspace100k(b *testing.B) {
	s := benchStore(b)
	dirA, a := benchNode(b, s, "a")
	_, bb := benchNode(b, s, "b")
	root := filepath.Join(dirA, "acme", "big")
	const files, size = 100_000, 1024
	benchTree(b, root, files, size)
	ctx := context.Background()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		timed := func(name string, f func() (checkpoint.Result, error)) checkpoint.Result {
			start := time.Now()
			r, err := f()
			if err != nil {
				b.Fatalf("%s: %v", name, err)
			}
			took := time.Since(start)
			b.ReportMetric(took.Seconds(), name+"-s")
			// As it goes, too: the whole benchmark takes minutes on a loaded machine.
			fmt.Fprintf(os.Stderr, "BenchmarkWorkspace100k: %s %.2f s (%d files, %d chunks, %d bytes moved)\n", name, took.Seconds(), r.Files, r.Chunks, r.Bytes)
			return r
		}
		r := timed("first-save", func() (checkpoint.Result, error) { return a.Save(ctx, "acme", "big") })
		if i == 0 && (r.Files != files || r.Bytes != files*size) {
			b.Fatalf("first save: %+v", r)
		}
		timed("unchanged-save", func() (checkpoint.Result, error) { return a.Save(ctx, "acme", "big") })
		if err := os.WriteFile(filepath.Join(root, "pkg0500", "f050.go"), []byte(noise(size)+fmt.Sprint(i)), 0o644); err != nil {
			b.Fatal(err)
		}
		timed("one-file-save", func() (checkpoint.Result, error) { return a.Save(ctx, "acme", "big") })
		start := time.Now()
		r = timed("restore-empty", func() (checkpoint.Result, error) { return bb.Restore(ctx, "acme", "big") })
		b.ReportMetric(float64(r.Files)/time.Since(start).Seconds(), "restore-files/s")
		b.ReportMetric(float64(r.Bytes)/(1<<20)/time.Since(start).Seconds(), "restore-MiB/s")
		if err := os.WriteFile(filepath.Join(root, "pkg0999", "f099.go"), []byte(noise(size)+"x"+fmt.Sprint(i)), 0o644); err != nil {
			b.Fatal(err)
		}
		timed("one-file-save-2", func() (checkpoint.Result, error) { return a.Save(ctx, "acme", "big") })
		timed("one-file-restore", func() (checkpoint.Result, error) { return bb.Restore(ctx, "acme", "big") })
	}
}

// BenchmarkRestoreThroughput restores a workspace of 100 MiB (100 files of 1 MiB, each its own content)
// on a node that never had it, once per iteration (each on a fresh node), from JetStream's object store
// and from a real S3 server (versitygw), and reports MB/s: what a failover fetches.
func BenchmarkRestoreThroughput(b *testing.B) {
	for name, store := range map[string]func(*testing.B) backend{"jetstream": benchStore, "s3": func(b *testing.B) backend {
		s, err := s3store.New(s3test.Server(b), nil)
		if err != nil {
			b.Fatal(err)
		}
		conn, _ := jstest.Provisioned(b, nil)
		return stores{s, jsHeads(b, conn)}
	}} {
		b.Run(name, func(b *testing.B) {
			s := store(b)
			dir, cp := benchNode(b, s, "a")
			benchTree(b, filepath.Join(dir, "acme", "big"), 100, 1<<20)
			ctx := context.Background()
			if _, err := cp.Save(ctx, "acme", "big"); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			var took time.Duration
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				_, other := benchNode(b, s, fmt.Sprintf("n%d", i))
				b.StartTimer()
				r, err := other.Restore(ctx, "acme", "big")
				if err != nil || r.Bytes != 100<<20 {
					b.Fatalf("restore: %+v, %v", r, err)
				}
				took += r.Took
			}
			b.ReportMetric(float64(b.N*100)*(1<<20)/1e6/took.Seconds(), "MB/s")
		})
	}
}

// BenchmarkCollect is one tenant's garbage collection on JetStream's object store: a workspace of 10 000
// files (100 directories, 1 KiB each) and, each iteration, 100 of its files rewritten and checkpointed
// (100 chunks and the trees on their paths become garbage) before the timed Collect, with a grace of a
// nanosecond so that it sweeps them. It reports the collection's p50 and what it swept per run.
func BenchmarkCollect(b *testing.B) {
	s := benchStore(b)
	dir := filepath.Join(b.TempDir(), "a")
	cp, err := checkpoint.New(checkpoint.Config{Dir: dir, Worker: "a", UID: os.Getuid(), GID: os.Getgid(), Grace: time.Nanosecond}, s, s)
	if err != nil {
		b.Fatal(err)
	}
	root := savedTree(b, cp, dir)
	ctx := context.Background()
	var took []time.Duration
	var swept int
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		for f := range 100 {
			p := filepath.Join(root, fmt.Sprintf("pkg%04d", f), "f000.go")
			if err := os.WriteFile(p, []byte(fmt.Sprintf("iteration %d file %d %s", i, f, noise(200))), 0o644); err != nil {
				b.Fatal(err)
			}
		}
		if _, err := cp.Save(ctx, "acme", "repo"); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		r, err := cp.Collect(ctx, "acme")
		if err != nil || r.Kept < 10_000 {
			b.Fatalf("collect: %+v, %v", r, err)
		}
		took, swept = append(took, r.Took), swept+r.Swept
	}
	b.StopTimer()
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)/2].Microseconds())/1000, "collect-p50-ms")
	b.ReportMetric(float64(swept)/float64(b.N), "swept/op")
}
