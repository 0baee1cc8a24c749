package checkpoint_test

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/toolpool/toolpool/internal/checkpoint"
)

// counting counts the objects written, and the chunks, packs and trees read: operations on heads move none
// (they may look for a head an earlier version stored as an object).
type counting struct {
	backend
	puts, opens atomic.Int64
}

func (c *counting) Put(ctx context.Context, name string, r io.Reader) error {
	c.puts.Add(1)
	return c.backend.Put(ctx, name, r)
}

func (c *counting) Open(ctx context.Context, name string) (io.ReadCloser, error) {
	if strings.Contains(name, "/chunks/") || strings.Contains(name, "/packs/") || strings.Contains(name, "/trees/") {
		c.opens.Add(1)
	}
	return c.backend.Open(ctx, name)
}

// TestSnapshotsOnCheckpoints: two nodes with their own directories. A snapshot taken on a, a restore of
// it on b, a fork on b of a's workspace and a fork of the snapshot each write a head and move no object;
// each node's next Restore brings its copy to them. Names taken, missing snapshots and budgets are
// refused with nothing written; a deleted workspace's snapshots go with it; List reads the shared heads.
func TestSnapshotsOnCheckpoints(t *testing.T) { eachStore(t, snapshotsOnCheckpoints) }

func snapshotsOnCheckpoints(t *testing.T, s backend) {
	ctx := ctx(t)
	cs := &counting{backend: s}
	a, b := newNode(t, cs, "a", 0), newNode(t, cs, "b", 0)
	write(t, a.ws("acme", "ws"), "notes.txt", "one", 0o644)
	write(t, a.ws("acme", "ws"), "src/main.go", "package main", 0o600)
	if _, err := a.cp.Save(ctx, "acme", "ws"); err != nil {
		t.Fatal(err)
	}
	atS1 := listing(t, a.ws("acme", "ws"))
	moved := func(what string, op func() error) {
		t.Helper()
		puts, opens := cs.puts.Load(), cs.opens.Load()
		if err := op(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if p, o := cs.puts.Load()-puts, cs.opens.Load()-opens; p != 0 || o != 0 {
			t.Fatalf("%s wrote %d objects and read %d chunks, packs or trees; want none (heads only)", what, p, o)
		}
	}
	moved("snapshot on a", func() error {
		h, err := a.cp.Snapshot(ctx, "acme", "ws", "s1")
		if err == nil && (h.Files != 2 || h.Bytes != 15) {
			t.Fatalf("snapshot's head: %+v; want 2 files of 15 bytes", h)
		}
		return err
	})
	write(t, a.ws("acme", "ws"), "notes.txt", "two", 0o644)
	write(t, a.ws("acme", "ws"), "later.txt", "after the snapshot", 0o644)
	if _, err := a.cp.Save(ctx, "acme", "ws"); err != nil {
		t.Fatal(err)
	}
	atLatest := listing(t, a.ws("acme", "ws"))

	moved("fork on b of a's workspace", func() error {
		_, err := b.cp.Fork(ctx, "acme", "ws", "", "copy", nil)
		return err
	})
	moved("fork on b of a's snapshot", func() error {
		_, err := b.cp.Fork(ctx, "acme", "ws", "s1", "old", nil)
		return err
	})
	moved("restore on b of a's snapshot", func() error {
		_, err := b.cp.RestoreSnapshot(ctx, "acme", "ws", "s1", nil)
		return err
	})
	for _, n := range []struct {
		node node
		ws   string
		want string
	}{{b, "ws", atS1}, {a, "ws", atS1}, {a, "copy", atLatest}, {b, "copy", atLatest}, {a, "old", atS1}} {
		if _, err := n.node.cp.Restore(ctx, "acme", n.ws); err != nil {
			t.Fatal(err)
		}
		if got := listing(t, n.node.ws("acme", n.ws)); got != n.want {
			t.Fatalf("%s on %s:\n%s\nwant:\n%s", n.ws, n.node.dir, got, n.want)
		}
	}

	// Refusals write nothing.
	if _, err := b.cp.Snapshot(ctx, "acme", "ws", "s1"); !errors.Is(err, checkpoint.ErrExists) {
		t.Fatalf("a snapshot name taken: %v; want ErrExists", err)
	}
	if _, err := a.cp.Fork(ctx, "acme", "ws", "", "copy", nil); !errors.Is(err, checkpoint.ErrExists) {
		t.Fatalf("a fork to a workspace that exists: %v; want ErrExists", err)
	}
	if _, err := a.cp.RestoreSnapshot(ctx, "acme", "ws", "nope", nil); !errors.Is(err, checkpoint.ErrNoSnapshot) {
		t.Fatalf("a restore of a missing snapshot: %v; want ErrNoSnapshot", err)
	}
	if _, err := a.cp.Snapshot(ctx, "acme", "none", "s1"); !errors.Is(err, checkpoint.ErrNoWorkspace) {
		t.Fatalf("a snapshot of a missing workspace: %v; want ErrNoWorkspace", err)
	}
	refused := errors.New("over the quota")
	if _, err := a.cp.Fork(ctx, "acme", "ws", "", "big", func(checkpoint.Head) error { return refused }); err != refused {
		t.Fatalf("a fork its admit refuses: %v; want admit's error as it is", err)
	}
	small := newNodeWith(t, cs, checkpoint.Config{Worker: "small", MaxWorkspaceBytes: 4})
	if _, err := small.cp.Fork(ctx, "acme", "ws", "", "big", nil); !errors.Is(err, checkpoint.ErrOverBudget) {
		t.Fatalf("a fork over the workspace budget: %v; want ErrOverBudget", err)
	}

	list, err := b.cp.List(ctx, "acme")
	if err != nil || len(list) != 3 || list[0].Name != "copy" || list[1].Name != "old" || list[2].Name != "ws" ||
		len(list[2].Snapshots) != 1 || list[2].Snapshots[0].Name != "s1" || len(list[0].Snapshots) != 0 || list[2].Head.Files != 2 {
		t.Fatalf("List = %+v, %v; want copy, old, and ws with its snapshot s1 (and no big)", list, err)
	}

	// Deleting a workspace deletes its snapshots; a new workspace of that name has none.
	if err := os.RemoveAll(a.ws("acme", "ws")); err != nil {
		t.Fatal(err)
	}
	if _, err := a.cp.Save(ctx, "acme", "ws"); err != nil {
		t.Fatal(err)
	}
	if snaps, err := b.cp.SnapshotsOf(ctx, "acme", "ws"); err != nil || len(snaps) != 0 {
		t.Fatalf("snapshots of a deleted workspace: %+v, %v; want none", snaps, err)
	}
	if list, err := b.cp.List(ctx, "acme"); err != nil || len(list) != 2 {
		t.Fatalf("List after the delete = %+v, %v; want copy and old", list, err)
	}
	if _, err := b.cp.Fork(ctx, "acme", "old", "", "ws", nil); err != nil {
		t.Fatalf("a fork to a deleted workspace's name: %v", err)
	}
	if _, err := a.cp.Restore(ctx, "acme", "ws"); err != nil {
		t.Fatal(err)
	}
	if got := listing(t, a.ws("acme", "ws")); got != atS1 {
		t.Fatalf("fork to a deleted workspace's name:\n%s\nwant:\n%s", got, atS1)
	}
}

// TestSnapshotSavesUnsavedFirst: a snapshot on a worker whose last Save of the workspace failed
// checkpoints the workspace first: the snapshot holds what the calls wrote.
func TestSnapshotSavesUnsavedFirst(t *testing.T) {
	ctx := ctx(t)
	s := &failing{backend: jsStore(t)}
	a, b := newNode(t, s, "a", 0), newNode(t, s, "b", 0)
	write(t, a.ws("acme", "ws"), "f.txt", "saved", 0o644)
	if _, err := a.cp.Save(ctx, "acme", "ws"); err != nil {
		t.Fatal(err)
	}
	write(t, a.ws("acme", "ws"), "f.txt", "unsaved", 0o644)
	s.fail.Store(true)
	if _, err := a.cp.Save(ctx, "acme", "ws"); err == nil {
		t.Fatal("save with the store unreachable succeeded")
	}
	s.fail.Store(false)
	if _, err := a.cp.Snapshot(ctx, "acme", "ws", "s"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.cp.Fork(ctx, "acme", "ws", "s", "f", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := b.cp.Restore(ctx, "acme", "f"); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(b.ws("acme", "f"), "f.txt")); err != nil || string(got) != "unsaved" {
		t.Fatalf("the snapshot's f.txt: %q, %v; want the change whose save had failed", got, err)
	}
}

// newNodeWith is a node configured by cfg (its directory set here).
func newNodeWith(t *testing.T, s backend, cfg checkpoint.Config) node {
	t.Helper()
	cfg.Dir = filepath.Join(t.TempDir(), cfg.Worker)
	cfg.UID, cfg.GID = os.Getuid(), os.Getgid()
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cp, err := checkpoint.New(cfg, s, s)
	if err != nil {
		t.Fatal(err)
	}
	return node{dir: cfg.Dir, cp: cp}
}
