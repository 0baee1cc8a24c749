package workspace

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/call"
)

func wantErr(t *testing.T, err error, typ, msg string) {
	t.Helper()
	var we *Error
	if !errors.As(err, &we) || we.Type != typ || !strings.Contains(we.Msg, msg) {
		t.Fatalf("got %v, want a %s error saying %q", err, typ, msg)
	}
}

// TestSnapshotForkRestore: a snapshot keeps the tree as it was, a fork is an independent copy, a restore
// brings the snapshot back, and delete removes the workspace with its snapshots.
func TestSnapshotForkRestore(t *testing.T) {
	ctx := context.Background()
	m := newManager(t, Config{})
	if _, err := m.Create(ctx, "t1", "ws", tempArchive(t, makeTar(t, false, file("a.txt", "one"), link("l", "a.txt")))); err != nil {
		t.Fatal(err)
	}
	ws := filepath.Join(m.cfg.Dir, "t1", "ws")
	inf, err := m.Snapshot(ctx, "t1", "ws", "s1")
	if err != nil {
		t.Fatal(err)
	}
	if len(inf.Snapshots) != 1 || inf.Snapshots[0].Name != "s1" || inf.Reflinked == nil {
		t.Fatalf("info after snapshot = %+v", inf)
	}
	t.Logf("snapshot reflinked every file: %v", *inf.Reflinked)
	_, err = m.Snapshot(ctx, "t1", "ws", "s1")
	wantErr(t, err, TypeExists, "already")
	os.WriteFile(filepath.Join(ws, "a.txt"), []byte("two"), 0o644)
	os.WriteFile(filepath.Join(ws, "new.txt"), []byte("new"), 0o644)

	if _, err := m.Fork(ctx, "t1", "ws", "", "fork"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Fork(ctx, "t1", "ws", "s1", "fromsnap"); err != nil {
		t.Fatal(err)
	}
	_, err = m.Fork(ctx, "t1", "ws", "", "fork")
	wantErr(t, err, TypeExists, "exists already")
	_, err = m.Fork(ctx, "t1", "ws", "nosuch", "x")
	wantErr(t, err, call.ErrNotFound, "no snapshot")
	os.WriteFile(filepath.Join(ws, "a.txt"), []byte("three"), 0o644)
	read := func(wsName, p string) string {
		b, _ := os.ReadFile(filepath.Join(m.cfg.Dir, "t1", wsName, p))
		return string(b)
	}
	if read("fork", "a.txt") != "two" || read("fork", "new.txt") != "new" || read("fromsnap", "a.txt") != "one" || read("fromsnap", "new.txt") != "" {
		t.Fatalf("fork = %q %q, fork of snapshot = %q %q", read("fork", "a.txt"), read("fork", "new.txt"), read("fromsnap", "a.txt"), read("fromsnap", "new.txt"))
	}
	if l, _ := os.Readlink(filepath.Join(m.cfg.Dir, "t1", "fork", "l")); l != "a.txt" {
		t.Fatalf("fork's link = %q", l)
	}

	if _, err := m.Restore(ctx, "t1", "ws", "s1"); err != nil {
		t.Fatal(err)
	}
	if read("ws", "a.txt") != "one" || read("ws", "new.txt") != "" {
		t.Fatalf("after restore: a.txt=%q new.txt=%q", read("ws", "a.txt"), read("ws", "new.txt"))
	}
	if ents, _ := os.ReadDir(filepath.Join(m.cfg.Dir, "t1", ".trash")); len(ents) != 0 {
		t.Fatalf("trash not emptied: %v", ents)
	}
	list, err := m.List(ctx, "t1")
	if err != nil || len(list) != 3 {
		t.Fatalf("list = %+v, %v", list, err)
	}
	if err := m.Delete(ctx, "t1", "ws"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(ws); !os.IsNotExist(err) {
		t.Fatalf("workspace still there: %v", err)
	}
	if _, err := os.Stat(m.snapDir("t1", "ws")); !os.IsNotExist(err) {
		t.Fatalf("snapshots still there: %v", err)
	}
	wantErr(t, m.Delete(ctx, "t1", "ws"), call.ErrNotFound, "no workspace")
	_, err = m.Info(ctx, "t1", "ws")
	wantErr(t, err, call.ErrNotFound, "no workspace")
}

// TestLimits: a tenant at its workspace count or byte limit is refused with what to remove; another
// tenant is not affected.
func TestLimits(t *testing.T) {
	ctx := context.Background()
	m := newManager(t, Config{MaxWorkspaces: 2, MaxBytes: 256 << 10})
	for _, n := range []string{"a", "b"} {
		if _, err := m.Create(ctx, "t1", n, nil); err != nil {
			t.Fatal(err)
		}
	}
	_, err := m.Create(ctx, "t1", "c", nil)
	wantErr(t, err, call.ErrQuota, "has 2 workspaces, its limit: remove one")
	_, err = m.Fork(ctx, "t1", "a", "", "c")
	wantErr(t, err, call.ErrQuota, "its limit")
	if _, err := m.Create(ctx, "t2", "c", nil); err != nil {
		t.Fatalf("another tenant: %v", err)
	}
	big := makeTar(t, false, file("big", strings.Repeat("x", 300<<10)))
	_, err = m.Upload(ctx, "t1", "a", "", tempArchive(t, big))
	wantErr(t, err, call.ErrQuota, "over its limit of 256.0 KiB")
	if inf, _ := m.Info(ctx, "t1", "a"); inf.Files != 0 {
		t.Fatalf("refused upload wrote %d files", inf.Files)
	}
	if err := m.Delete(ctx, "t1", "b"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Create(ctx, "t1", "c", nil); err != nil {
		t.Fatalf("after removing one: %v", err)
	}
}

// TestQuota: a seed, an upload or a filled tree that would take one workspace past Config.Quota (the quota
// its calls run under) is refused as too large, naming the quota and what to do, with nothing written; what
// fits is taken.
func TestQuota(t *testing.T) {
	ctx := context.Background()
	m := newManager(t, Config{Quota: 128 << 10})
	big := makeTar(t, true, file("big", strings.Repeat("x", 200<<10)))
	_, err := m.Create(ctx, "t1", "seeded", tempArchive(t, big))
	wantErr(t, err, TypeTooLarge, "over the quota of 128.0 KiB a workspace may use")
	if _, err := m.Info(ctx, "t1", "seeded"); err == nil {
		t.Fatal("a refused seed left a workspace")
	}
	if _, err := m.Create(ctx, "t1", "ws", tempArchive(t, makeTar(t, false, file("small", strings.Repeat("y", 60<<10))))); err != nil {
		t.Fatalf("a seed within the quota: %v", err)
	}
	more := makeTar(t, false, file("more", strings.Repeat("z", 80<<10)))
	_, err = m.Upload(ctx, "t1", "ws", "sub", tempArchive(t, more))
	wantErr(t, err, TypeTooLarge, `workspace "ws" uses`)
	if inf, _ := m.Info(ctx, "t1", "ws"); inf.Files != 1 {
		t.Fatalf("a refused upload left %d files, want the seed's 1", inf.Files)
	}
	if _, err := m.Upload(ctx, "t1", "ws", "sub", tempArchive(t, makeTar(t, false, file("fits", strings.Repeat("z", 20<<10))))); err != nil {
		t.Fatalf("an upload within the quota: %v", err)
	}
	_, err = m.CreateFrom(ctx, "t1", "cloned", func(_ context.Context, dir string, _ Limits) error {
		return os.WriteFile(filepath.Join(dir, "blob"), bytes.Repeat([]byte("b"), 200<<10), 0o644)
	})
	wantErr(t, err, TypeTooLarge, "over the quota")
	if _, err := m.Info(ctx, "t1", "cloned"); err == nil {
		t.Fatal("a refused clone left a workspace")
	}
}

// TestSnapshotOverLoweredLimits: a snapshot taken under higher limits is neither restored nor forked past
// the workspace quota or the tenant's byte limit that hold now (an operator lowered them), and the refusal
// changes nothing.
func TestSnapshotOverLoweredLimits(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	before := newManager(t, Config{Dir: dir})
	if _, err := before.Create(ctx, "t1", "ws", tempArchive(t, makeTar(t, false, file("big", strings.Repeat("x", 200<<10))))); err != nil {
		t.Fatal(err)
	}
	if _, err := before.Snapshot(ctx, "t1", "ws", "s"); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "t1", "ws", "big")); err != nil {
		t.Fatal(err)
	}
	bigGone := func() {
		t.Helper()
		if _, err := os.Lstat(filepath.Join(dir, "t1", "ws", "big")); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("a refused restore changed the workspace: big is back (%v)", err)
		}
	}

	quota := newManager(t, Config{Dir: dir, Quota: 128 << 10})
	_, err := quota.Restore(ctx, "t1", "ws", "s")
	wantErr(t, err, TypeTooLarge, `over the quota of 128.0 KiB a workspace may use (the worker's workspace_quota): snapshot "s" of workspace "ws" was taken under a higher quota`)
	bigGone()
	_, err = quota.Fork(ctx, "t1", "ws", "s", "fork")
	wantErr(t, err, TypeTooLarge, `this would put`)
	if _, err := quota.Info(ctx, "t1", "fork"); err == nil {
		t.Fatal("a refused fork left a workspace")
	}
	// A workspace over a lowered quota is not forked either; the message says how to take part of it.
	if _, err := before.Create(ctx, "t1", "live", tempArchive(t, makeTar(t, false, file("big", strings.Repeat("x", 200<<10))))); err != nil {
		t.Fatal(err)
	}
	_, err = quota.Fork(ctx, "t1", "live", "", "fork")
	wantErr(t, err, TypeTooLarge, `pull workspace "live"`)

	// The tenant holds the snapshot and "live" (200 KiB each) and the emptied ws: a restore would add 200 KiB
	// more, 600 in all.
	tenant := newManager(t, Config{Dir: dir, MaxBytes: 500 << 10})
	_, err = tenant.Restore(ctx, "t1", "ws", "s")
	wantErr(t, err, call.ErrQuota, "over its limit")
	bigGone()
	if _, err := newManager(t, Config{Dir: dir, Quota: 256 << 10, MaxBytes: 1 << 20}).Restore(ctx, "t1", "ws", "s"); err != nil {
		t.Fatalf("a restore within both limits: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "t1", "ws", "big")); err != nil {
		t.Fatalf("restored workspace: %v", err)
	}
}

// TestSweep: a workspace unused for longer than the idle TTL is removed; one in use (or used recently) is
// not.
func TestSweep(t *testing.T) {
	ctx := context.Background()
	var mu sync.Mutex
	now := time.Now()
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	m := newManager(t, Config{IdleTTL: time.Hour, Now: clock})
	for _, n := range []string{"old", "busy", "fresh"} {
		if _, err := m.Create(ctx, "t1", n, nil); err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	now = now.Add(50 * time.Minute)
	mu.Unlock()
	release, err := m.Hold(ctx, "t1", "fresh") // used at +50m
	if err != nil {
		t.Fatal(err)
	}
	release()
	inf, _ := m.Info(ctx, "t1", "fresh")
	if want := now.Add(time.Hour); !inf.ExpiresAt.Equal(want.Truncate(time.Microsecond)) && inf.ExpiresAt.Sub(want).Abs() > time.Second {
		t.Fatalf("expires_at = %v, want %v", inf.ExpiresAt, want)
	}
	hold, err := m.Hold(ctx, "t1", "busy")
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	now = now.Add(20 * time.Minute) // +70m: old and busy idle for 70m, fresh for 20m
	mu.Unlock()
	removed, err := m.Sweep(ctx)
	if err != nil || strings.Join(removed, ",") != "t1/old" {
		t.Fatalf("sweep removed %v, %v; want only t1/old (busy is held)", removed, err)
	}
	hold()
	mu.Lock()
	now = now.Add(2 * time.Hour)
	mu.Unlock()
	removed, _ = m.Sweep(ctx)
	if strings.Join(removed, ",") != "t1/busy,t1/fresh" {
		t.Fatalf("second sweep removed %v", removed)
	}
}

// TestTwoManagersOneDir: two managers on one directory (two workers sharing a volume) exclude each other:
// an exclusive operation waits for a call's shared hold, and concurrent uploads and archives never see
// a half-written tree.
func TestTwoManagersOneDir(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	a := newManager(t, Config{Dir: dir})
	b := newManager(t, Config{Dir: dir})
	if _, err := a.Create(ctx, "t1", "ws", nil); err != nil {
		t.Fatal(err)
	}
	release, err := a.Hold(ctx, "t1", "ws")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := b.Snapshot(ctx, "t1", "ws", "s"); done <- err }()
	select {
	case err := <-done:
		t.Fatalf("snapshot ran while a call held the workspace: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// Uploads of whole trees from one manager, archives from the other: every archive holds one
	// generation whole.
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		for i := range 10 {
			gen := strings.Repeat(string(rune('a'+i)), 1000)
			var ents []tent
			for j := range 20 {
				ents = append(ents, file("f"+string(rune('a'+j)), gen))
			}
			if _, err := a.Upload(ctx, "t1", "ws", "", tempArchive(t, makeTar(t, false, ents...))); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	go func() {
		defer wg.Done()
		for range 10 {
			var buf bytes.Buffer
			if err := b.Archive(ctx, "t1", "ws", "", &buf); err != nil {
				t.Error(err)
				return
			}
			gens := map[string]int{}
			zr, err := gzip.NewReader(&buf)
			if err != nil {
				t.Error(err)
				return
			}
			tr := tar.NewReader(zr)
			for {
				h, err := tr.Next()
				if err != nil {
					break
				}
				if h.Typeflag == tar.TypeReg {
					body, _ := io.ReadAll(tr)
					gens[string(body[:1])]++
				}
			}
			if len(gens) > 1 {
				t.Errorf("an archive mixed generations of the tree: %v", gens)
			}
		}
	}()
	wg.Wait()
}
