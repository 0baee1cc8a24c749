package checkpoint_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/checkpoint"
	"github.com/toolpool/toolpool/internal/checkpoint/s3store"
	"github.com/toolpool/toolpool/internal/checkpoint/s3store/s3test"
	"github.com/toolpool/toolpool/internal/queue/jetstream"
	"github.com/toolpool/toolpool/internal/queue/jetstream/jstest"
)

// backend is where checkpoints live: an object store for chunks and trees, and the heads.
type backend interface {
	checkpoint.Store
	checkpoint.Heads
}

// stores joins an object store and the heads.
type stores struct {
	checkpoint.Store
	checkpoint.Heads
}

// jsHeads is the real heads: a JetStream key-value bucket, on conn's in-process server.
func jsHeads(t testing.TB, conn *jetstream.Conn) checkpoint.Heads {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h, err := conn.Heads(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// jsStore is the real default store: a JetStream object store on an in-process server, with its heads.
func jsStore(t *testing.T) backend {
	t.Helper()
	conn, _ := jstest.Provisioned(t, nil)
	return jsStoreOn(t, conn)
}

// jsStoreOn is jsStore on conn's server.
func jsStoreOn(t *testing.T, conn *jetstream.Conn) backend {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := conn.Checkpoints(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return stores{s, jsHeads(t, conn)}
}

// s3Store is the S3 option: a bucket on a real S3 server (versitygw) the test starts; the heads are in
// JetStream, as a worker keeps them.
func s3Store(t *testing.T) backend {
	t.Helper()
	s, err := s3store.New(s3test.Server(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	conn, _ := jstest.Provisioned(t, nil)
	return stores{s, jsHeads(t, conn)}
}

// eachStore runs test against each implementation of the store.
func eachStore(t *testing.T, test func(t *testing.T, s backend)) {
	for name, store := range map[string]func(*testing.T) backend{"jetstream": jsStore, "s3": s3Store} {
		t.Run(name, func(t *testing.T) { test(t, store(t)) })
	}
}

// node is one worker's side: its own workspaces directory and checkpointer, on a shared store.
type node struct {
	dir string
	cp  *checkpoint.Checkpointer
}

func newNode(t *testing.T, s backend, name string, chunk int) node {
	t.Helper()
	dir := filepath.Join(t.TempDir(), name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cp, err := checkpoint.New(checkpoint.Config{Dir: dir, Worker: name, ChunkBytes: chunk, UID: os.Getuid(), GID: os.Getgid()}, s, s)
	if err != nil {
		t.Fatal(err)
	}
	return node{dir: dir, cp: cp}
}

func (n node) ws(tenant, name string) string { return filepath.Join(n.dir, tenant, name) }

func write(t *testing.T, root, rel, content string, mode os.FileMode) {
	t.Helper()
	p := filepath.Join(root, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
}

// listing describes a tree: every entry's type, permission bits, content digest or target, and a file's
// modification time.
func listing(t *testing.T, root string) string {
	t.Helper()
	var lines []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		info, err := os.Lstat(p)
		if err != nil {
			return err
		}
		switch {
		case info.Mode()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			lines = append(lines, fmt.Sprintf("%q link %s", rel, target))
		case info.IsDir():
			lines = append(lines, fmt.Sprintf("%q dir %o", rel, info.Mode().Perm()))
		default:
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			sum := sha256.Sum256(b)
			lines = append(lines, fmt.Sprintf("%q file %o %d %s %d", rel, info.Mode().Perm(), len(b), hex.EncodeToString(sum[:8]), info.ModTime().UnixNano()))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// noise returns n bytes that repeat nowhere.
func noise(n int) string {
	var b strings.Builder
	for i := 0; b.Len() < n; i++ {
		sum := sha256.Sum256([]byte(fmt.Sprint(i)))
		b.Write(sum[:])
	}
	return b.String()[:n]
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return c
}

// TestAcrossWorkspaceRoots: what one node saves, another with its own directory restores exactly (files,
// modes, times, symlinks, empty files and directories, a name that is not UTF-8, a file of several
// chunks), and changes travel back, deletions and type changes included. Each Save sends only the
// chunks that changed.
func TestAcrossWorkspaceRoots(t *testing.T) { eachStore(t, acrossWorkspaceRoots) }

func acrossWorkspaceRoots(t *testing.T, s backend) {
	const chunk = 64 << 10
	a, b := newNode(t, s, "a", chunk), newNode(t, s, "b", chunk)
	wa := a.ws("acme", "repo")
	big := noise(3*chunk + 1600) // four chunks, the last one short
	write(t, wa, "README.md", "hello\n", 0o644)
	write(t, wa, "bin/run.sh", "#!/bin/sh\necho run\n", 0o755)
	write(t, wa, "src/pkg/a.go", "package pkg\n", 0o600)
	write(t, wa, "data/big.bin", big, 0o644)
	write(t, wa, "empty", "", 0o644)
	write(t, wa, "dir-then-file/x", "x", 0o644)
	write(t, wa, "\xff\xfe-not-utf8", "raw name", 0o644)
	if err := os.MkdirAll(filepath.Join(wa, "empty-dir"), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("src/pkg/a.go", filepath.Join(wa, "link")); err != nil {
		t.Fatal(err)
	}
	r, err := a.cp.Save(ctx(t), "acme", "repo")
	if err != nil {
		t.Fatal(err)
	}
	if !r.Changed || r.Files != 7 || r.Chunks != 5 || r.Head.Seq != 1 {
		t.Fatalf("first save: %+v; want changed, 7 files read, 5 objects stored (4 chunks of big.bin, one pack of the 5 small files, none of empty), seq 1", r)
	}
	if r, err := a.cp.Save(ctx(t), "acme", "repo"); err != nil || r.Changed || r.Files != 0 || r.Chunks != 0 {
		t.Fatalf("save without a change: %+v, %v; want nothing read or stored", r, err)
	}

	r, err = b.cp.Restore(ctx(t), "acme", "repo")
	if err != nil {
		t.Fatal(err)
	}
	wb := b.ws("acme", "repo")
	if !r.Changed || r.Files != 7 {
		t.Fatalf("restore: %+v; want 7 files written", r)
	}
	if got, want := listing(t, wb), listing(t, wa); got != want {
		t.Fatalf("restored tree differs:\n%s\nwant:\n%s", got, want)
	}
	if r, err := b.cp.Restore(ctx(t), "acme", "repo"); err != nil || r.Changed {
		t.Fatalf("second restore: %+v, %v; want nothing to do", r, err)
	}

	// Changes on b: one byte of one chunk of the big file, a file removed, a directory replaced by a
	// file, a file replaced by a directory, a new file, a mode change, a symlink retargeted.
	bb := []byte(big)
	bb[chunk+5] = 'X'
	write(t, wb, "data/big.bin", string(bb), 0o644)
	if err := os.Remove(filepath.Join(wb, "README.md")); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(wb, "dir-then-file")); err != nil {
		t.Fatal(err)
	}
	write(t, wb, "dir-then-file", "now a file", 0o644)
	if err := os.Remove(filepath.Join(wb, "empty")); err != nil {
		t.Fatal(err)
	}
	write(t, wb, "empty/inside", "now a directory", 0o644)
	write(t, wb, "new.txt", "new\n", 0o644)
	if err := os.Chmod(filepath.Join(wb, "src/pkg/a.go"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(wb, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("bin/run.sh", filepath.Join(wb, "link")); err != nil {
		t.Fatal(err)
	}
	r, err = b.cp.Save(ctx(t), "acme", "repo")
	if err != nil {
		t.Fatal(err)
	}
	// Read: big.bin, dir-then-file, empty/inside, new.txt, and a.go (its mode changed its stat). Stored:
	// one chunk of big.bin and one pack of the three new contents (a.go keeps its place in its pack).
	if !r.Changed || r.Head.Seq != 2 || r.Files != 5 || r.Chunks != 2 {
		t.Fatalf("incremental save: %+v; want seq 2, 5 files read, 2 objects stored", r)
	}
	r, err = a.cp.Restore(ctx(t), "acme", "repo")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := listing(t, wa), listing(t, wb); got != want {
		t.Fatalf("tree restored over an older copy differs:\n%s\nwant:\n%s", got, want)
	}
	// Written: big.bin (its four chunks), dir-then-file, empty/inside, new.txt.
	if r.Files != 4 {
		t.Fatalf("incremental restore: %+v; want 4 files written", r)
	}

	// Deleted on a: b's copy goes.
	if err := os.RemoveAll(wa); err != nil {
		t.Fatal(err)
	}
	if r, err := a.cp.Save(ctx(t), "acme", "repo"); err != nil || !r.Changed || !r.Head.Deleted {
		t.Fatalf("save of a removed workspace: %+v, %v; want a deleted head", r, err)
	}
	if _, err := b.cp.Restore(ctx(t), "acme", "repo"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(wb); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the copy of a deleted workspace is still there: %v", err)
	}
}

// TestChunksSharedWithinTenant: a workspace holding the same files as another of its tenant stores no
// chunk; another tenant's does (chunks are never shared across tenants). Files are not packed here: a
// pack is shared only by the checkpoints of the workspace that wrote it, and their snapshots and forks.
func TestChunksSharedWithinTenant(t *testing.T) { eachStore(t, chunksSharedWithinTenant) }

func chunksSharedWithinTenant(t *testing.T, s backend) {
	a, b := newNodeWith(t, s, checkpoint.Config{Worker: "a", PackFilesUnder: -1}), newNodeWith(t, s, checkpoint.Config{Worker: "b", PackFilesUnder: -1})
	for _, ws := range []string{a.ws("acme", "one"), b.ws("acme", "two"), b.ws("other", "three")} {
		write(t, ws, "go.mod", "module example.com/x\n", 0o644)
		write(t, ws, "lib/lib.go", strings.Repeat("package lib\n", 10000), 0o644)
	}
	if r, err := a.cp.Save(ctx(t), "acme", "one"); err != nil || r.Chunks != 2 {
		t.Fatalf("first workspace: %+v, %v; want 2 chunks stored", r, err)
	}
	if r, err := b.cp.Save(ctx(t), "acme", "two"); err != nil || !r.Changed || r.Files != 2 || r.Chunks != 0 {
		t.Fatalf("same files, same tenant: %+v, %v; want 2 files read and no chunk stored", r, err)
	}
	if r, err := b.cp.Save(ctx(t), "other", "three"); err != nil || r.Chunks != 2 {
		t.Fatalf("same files, another tenant: %+v, %v; want 2 chunks stored", r, err)
	}
}

// failing is a store whose reads and writes fail once armed: the object store (and NATS, which holds the
// heads) unreachable.
type failing struct {
	backend
	fail atomic.Bool
}

var errUnreachable = errors.New("object store unreachable")

func (f *failing) Put(ctx context.Context, name string, r io.Reader) error {
	if f.fail.Load() {
		return errUnreachable
	}
	return f.backend.Put(ctx, name, r)
}

func (f *failing) Open(ctx context.Context, name string) (io.ReadCloser, error) {
	if f.fail.Load() {
		return nil, errUnreachable
	}
	return f.backend.Open(ctx, name)
}

func (f *failing) GetHead(ctx context.Context, tenant, name string) ([]byte, uint64, error) {
	if f.fail.Load() {
		return nil, 0, errUnreachable
	}
	return f.backend.GetHead(ctx, tenant, name)
}

func (f *failing) SwapHead(ctx context.Context, tenant, name string, value []byte, rev uint64) (uint64, bool, error) {
	if f.fail.Load() {
		return 0, false, errUnreachable
	}
	return f.backend.SwapHead(ctx, tenant, name, value, rev)
}

// TestStoreUnreachable: a Save that cannot store leaves the latest checkpoint as it was and stores the
// changes on the next Save; a Restore that cannot read leaves the copy as it was.
func TestStoreUnreachable(t *testing.T) {
	s := &failing{backend: jsStore(t)}
	a, b := newNode(t, s, "a", 0), newNode(t, s, "b", 0)
	wa := a.ws("acme", "repo")
	write(t, wa, "f", "one", 0o644)
	if _, err := a.cp.Save(ctx(t), "acme", "repo"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.cp.Restore(ctx(t), "acme", "repo"); err != nil {
		t.Fatal(err)
	}
	write(t, wa, "f", "two", 0o644)
	s.fail.Store(true)
	if _, err := a.cp.Save(ctx(t), "acme", "repo"); !errors.Is(err, errUnreachable) {
		t.Fatalf("save with the store unreachable: %v; want its error", err)
	}
	if a.cp.OldestUnsaved() <= 0 {
		t.Fatal("a failed save left no unsaved change to report")
	}
	before := listing(t, b.ws("acme", "repo"))
	if _, err := b.cp.Restore(ctx(t), "acme", "repo"); !errors.Is(err, errUnreachable) {
		t.Fatalf("restore with the store unreachable: %v; want its error", err)
	}
	if after := listing(t, b.ws("acme", "repo")); after != before {
		t.Fatalf("a failed restore changed the copy:\n%s\nwas:\n%s", after, before)
	}
	s.fail.Store(false)
	if r, err := a.cp.Restore(ctx(t), "acme", "repo"); err != nil || r.Changed {
		t.Fatalf("restore on the node whose save failed: %+v, %v; want its unsaved change kept", r, err)
	}
	if got, _ := os.ReadFile(filepath.Join(wa, "f")); string(got) != "two" {
		t.Fatalf("the unsaved change was undone: f = %q", got)
	}
	if r, err := b.cp.Restore(ctx(t), "acme", "repo"); err != nil || r.Changed {
		t.Fatalf("restore after a failed save: %+v, %v; want the checkpoint before it, unchanged", r, err)
	}
	// The worker's retry of unsaved workspaces stores the change, with no call into the workspace.
	if got := a.cp.Unsaved(); len(got) != 1 || got[0] != (checkpoint.Workspace{Tenant: "acme", Name: "repo"}) {
		t.Fatalf("unsaved workspaces: %v; want acme/repo", got)
	}
	if _, err := a.cp.Save(ctx(t), "acme", "repo"); err != nil {
		t.Fatalf("save the unsaved once the store is back: %v", err)
	}
	if age := a.cp.OldestUnsaved(); age != 0 {
		t.Fatalf("after the retry, the oldest unsaved change is %s old; want none", age)
	}
	if r, err := a.cp.Save(ctx(t), "acme", "repo"); err != nil || r.Changed || r.Head.Seq != 2 {
		t.Fatalf("save after the retry: %+v, %v; want nothing more to store, at seq 2", r, err)
	}
	if _, err := b.cp.Restore(ctx(t), "acme", "repo"); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(b.ws("acme", "repo"), "f")); string(got) != "two" {
		t.Fatalf("restored f = %q, want two", got)
	}
}

// TestHostileCheckpoint: a head or tree that names a path outside the workspace, or content that does
// not match its digest, or a packed file whose place in its pack is not there or holds other bytes, is
// refused and nothing is written outside the workspace.
func TestHostileCheckpoint(t *testing.T) {
	s := jsStore(t)
	b := newNode(t, s, "b", 0)
	put := func(name string, body []byte) string {
		sum := sha256.Sum256(body)
		d := hex.EncodeToString(sum[:])
		if name == "" {
			name = "acme/trees/" + d
		}
		if err := s.Put(ctx(t), name, bytes.NewReader(body)); err != nil {
			t.Fatal(err)
		}
		return d
	}
	chunk := put("", []byte("owned")) // stored under trees/, named by its digest
	if err := s.Put(ctx(t), "acme/chunks/"+chunk, strings.NewReader("owned")); err != nil {
		t.Fatal(err)
	}
	// A pack of "owned" then other bytes: an entry must name the first five, whose digest is chunk's.
	sum := sha256.Sum256([]byte("ownedOTHER"))
	pack := put("acme/packs/"+hex.EncodeToString(sum[:]), []byte("ownedOTHER"))
	packed := func(size, off int) string {
		return fmt.Sprintf(`[{"n":"x","y":"f","s":%d,"c":["%s"],"p":"%s","o":%d}]`, size, chunk, pack, off)
	}
	for _, tc := range []struct{ name, tree, want string }{
		{"bad pack", `[{"n":"x","y":"f","s":5,"c":["` + chunk + `"],"p":"../../etc/passwd"}]`, "bad pack reference"},
		{"packed in two chunks", `[{"n":"x","y":"f","s":5,"c":["` + chunk + `","` + chunk + `"],"p":"` + pack + `"}]`, "bad pack reference"},
		{"past the pack", packed(5, 8), "pack " + pack + " holds 10 bytes, not the 8..13"},
		{"other bytes of the pack", packed(5, 5), "do not match its digest"},
		{"dot-dot", `[{"n":"..","y":"f","c":["` + chunk + `"]}]`, "bad entry name"},
		{"slash", `[{"n":"a/../../x","y":"f","c":["` + chunk + `"]}]`, "bad entry name"},
		{"bad chunk", `[{"n":"x","y":"f","c":["../../etc/passwd"]}]`, "bad chunk digest"},
		{"twice", `[{"n":"x","y":"f"},{"n":"x","y":"f"}]`, "twice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tree := put("", []byte(tc.tree))
			put("acme/heads/evil", []byte(`{"tree":"`+tree+`","seq":1}`))
			_, err := b.cp.Restore(ctx(t), "acme", "evil")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("restore: %v; want an error saying %q", err, tc.want)
			}
			if _, err := os.Lstat(filepath.Join(b.dir, "acme", "x")); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("something was written beside the workspace: %v", err)
			}
		})
	}
	t.Run("corrupt tree", func(t *testing.T) {
		if err := s.Put(ctx(t), "acme/trees/"+strings.Repeat("ab", 32), strings.NewReader(`[]`)); err != nil {
			t.Fatal(err)
		}
		put("acme/heads/evil", []byte(`{"tree":"`+strings.Repeat("ab", 32)+`","seq":1}`))
		if _, err := b.cp.Restore(ctx(t), "acme", "evil"); err == nil || !strings.Contains(err.Error(), "does not match its digest") {
			t.Fatalf("restore of a corrupt tree: %v", err)
		}
	})
}

// TestTooDeep: a tree nested deeper than MaxDepth is refused whole, and the latest checkpoint stays.
func TestTooDeep(t *testing.T) {
	s := jsStore(t)
	a := newNode(t, s, "a", 0)
	ws := a.ws("acme", "deep")
	write(t, ws, "f", "x", 0o644)
	if _, err := a.cp.Save(ctx(t), "acme", "deep"); err != nil {
		t.Fatal(err)
	}
	deep := ws
	for range checkpoint.MaxDepth + 1 {
		deep = filepath.Join(deep, "d")
	}
	if err := os.MkdirAll(deep, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := a.cp.Save(ctx(t), "acme", "deep"); !errors.Is(err, checkpoint.ErrTooDeep) {
		t.Fatalf("save of a tree %d levels deep: %v; want ErrTooDeep", checkpoint.MaxDepth+1, err)
	}
	b := newNode(t, s, "b", 0)
	if r, err := b.cp.Restore(ctx(t), "acme", "deep"); err != nil || r.Head.Seq != 1 {
		t.Fatalf("restore after the refused save: %+v, %v; want checkpoint 1", r, err)
	}
}

// TestStaleCopyNeverOverwrites: two workers restored the same checkpoint; one saves a change, then the
// other saves a change made on its copy, now older than the latest checkpoint. The second Save is refused
// with ErrStale and changes nothing in the store; it is not retried as unsaved; the next Restore makes
// the stale copy the latest checkpoint, and a Save after it keeps both workers' changes.
func TestStaleCopyNeverOverwrites(t *testing.T) { eachStore(t, staleCopyNeverOverwrites) }

func staleCopyNeverOverwrites(t *testing.T, s backend) {
	a, b, c := newNode(t, s, "a", 0), newNode(t, s, "b", 0), newNode(t, s, "c", 0)
	write(t, a.ws("acme", "repo"), "f", "one", 0o644)
	if _, err := a.cp.Save(ctx(t), "acme", "repo"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.cp.Restore(ctx(t), "acme", "repo"); err != nil {
		t.Fatal(err)
	}
	write(t, b.ws("acme", "repo"), "from-b", "b", 0o644)
	if _, err := b.cp.Save(ctx(t), "acme", "repo"); err != nil {
		t.Fatal(err)
	}
	write(t, a.ws("acme", "repo"), "from-a", "a", 0o644)
	_, err := a.cp.Save(ctx(t), "acme", "repo")
	if !errors.Is(err, checkpoint.ErrStale) || !strings.Contains(err.Error(), "checkpoint 2, by worker b") {
		t.Fatalf("save of a stale copy: %v; want ErrStale naming checkpoint 2 by b", err)
	}
	if age := a.cp.OldestUnsaved(); age != 0 {
		t.Fatalf("a stale copy's refused change is waiting to be saved again (%s): it never can be", age)
	}
	if _, err := c.cp.Restore(ctx(t), "acme", "repo"); err != nil {
		t.Fatal(err)
	}
	if got, want := listing(t, c.ws("acme", "repo")), listing(t, b.ws("acme", "repo")); got != want {
		t.Fatalf("the latest checkpoint is not b's after a stale save:\n%s\nwant:\n%s", got, want)
	}
	if r, err := a.cp.Restore(ctx(t), "acme", "repo"); err != nil || !r.Changed || !r.Moved {
		t.Fatalf("restore of the stale copy: %+v, %v; want it made the latest checkpoint, b's (moved)", r, err)
	}
	if got, want := listing(t, a.ws("acme", "repo")), listing(t, b.ws("acme", "repo")); got != want {
		t.Fatalf("stale copy after restore:\n%s\nwant:\n%s", got, want)
	}
	write(t, a.ws("acme", "repo"), "from-a", "a", 0o644)
	if r, err := a.cp.Save(ctx(t), "acme", "repo"); err != nil || r.Head.Seq != 3 {
		t.Fatalf("save after restore: %+v, %v; want checkpoint 3", r, err)
	}
	if _, err := c.cp.Restore(ctx(t), "acme", "repo"); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"f", "from-a", "from-b"} {
		if _, err := os.Stat(filepath.Join(c.ws("acme", "repo"), f)); err != nil {
			t.Fatalf("%s missing from the latest checkpoint: %v", f, err)
		}
	}
}

// TestFirstCheckpointFenced: a copy restored when the workspace had no checkpoint yet is stale once
// another worker wrote the first one: its Save is refused, not written over that checkpoint. A copy that
// holds exactly the latest checkpoint (a worker that restarted over it) saves nothing and adopts it.
func TestFirstCheckpointFenced(t *testing.T) {
	s := jsStore(t)
	a, b := newNode(t, s, "a", 0), newNode(t, s, "b", 0)
	if r, err := a.cp.Restore(ctx(t), "acme", "new"); err != nil || r.Changed {
		t.Fatalf("restore of a workspace without a checkpoint: %+v, %v", r, err)
	}
	write(t, b.ws("acme", "new"), "from-b", "b", 0o644)
	if _, err := b.cp.Save(ctx(t), "acme", "new"); err != nil {
		t.Fatal(err)
	}
	write(t, a.ws("acme", "new"), "from-a", "a", 0o644)
	if _, err := a.cp.Save(ctx(t), "acme", "new"); !errors.Is(err, checkpoint.ErrStale) {
		t.Fatalf("save of a copy that never saw the first checkpoint: %v; want ErrStale", err)
	}
	cp, err := checkpoint.New(checkpoint.Config{Dir: b.dir, Worker: "b", UID: os.Getuid(), GID: os.Getgid()}, s, s)
	if err != nil {
		t.Fatal(err)
	}
	if r, err := cp.Save(ctx(t), "acme", "new"); err != nil || r.Changed || r.Head.Seq != 1 {
		t.Fatalf("save of a copy that is the latest checkpoint, after a restart: %+v, %v; want checkpoint 1, nothing written", r, err)
	}
}

// TestWorkspaceBudget: a Save of a workspace whose files hold more than its checkpoint budget is refused
// with ErrOverBudget, saying by how much, before anything is stored: no chunk of the new file, the latest
// checkpoint as it was. The change waits on the worker, and a Save under the budget stores it.
func TestWorkspaceBudget(t *testing.T) {
	s := jsStore(t)
	dir, a := budgetNode(t, s, checkpoint.Config{MaxWorkspaceBytes: 1000})
	b := newNode(t, s, "b", 0)
	ws := filepath.Join(dir, "acme", "repo")
	write(t, ws, "f", strings.Repeat("f", 600), 0o644)
	if _, err := a.Save(ctx(t), "acme", "repo"); err != nil {
		t.Fatal(err)
	}
	g := strings.Repeat("g", 600)
	write(t, ws, "g", g, 0o644)
	_, err := a.Save(ctx(t), "acme", "repo")
	if !errors.Is(err, checkpoint.ErrOverBudget) || !strings.Contains(err.Error(), "its files hold 1200 bytes, 200 over the budget of 1000 (checkpoints.max_workspace_bytes)") {
		t.Fatalf("save over the budget: %v; want ErrOverBudget saying by how much", err)
	}
	noChunk(t, s, "acme", g)
	if _, err := b.cp.Restore(ctx(t), "acme", "repo"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(b.ws("acme", "repo"), "g")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the file over the budget is in the latest checkpoint: %v", err)
	}
	if a.OldestUnsaved() <= 0 {
		t.Fatal("the change over the budget is not reported as waiting")
	}
	if err := os.Remove(filepath.Join(ws, "f")); err != nil {
		t.Fatal(err)
	}
	if r, err := a.Save(ctx(t), "acme", "repo"); err != nil || !r.Changed || r.Head.Bytes != 600 {
		t.Fatalf("save back under the budget: %+v, %v", r, err)
	}
	if _, err := b.cp.Restore(ctx(t), "acme", "repo"); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(b.ws("acme", "repo"), "g")); string(got) != g {
		t.Fatal("the change saved under the budget is not in the latest checkpoint")
	}
}

// TestTenantBudget: the latest checkpoints of a tenant's workspaces together stay under its budget. A Save
// that would take the tenant past it is refused with ErrOverBudget, saying by how much, before anything
// is stored; a workspace's own earlier checkpoint does not count against it; other tenants are apart.
func TestTenantBudget(t *testing.T) {
	s := jsStore(t)
	dir, a := budgetNode(t, s, checkpoint.Config{MaxTenantBytes: 1000})
	save := func(tenant, ws, file string, size int) error {
		write(t, filepath.Join(dir, tenant, ws), file, strings.Repeat(file, size), 0o644)
		_, err := a.Save(ctx(t), tenant, ws)
		return err
	}
	if err := save("acme", "one", "a", 600); err != nil {
		t.Fatal(err)
	}
	err := save("acme", "two", "b", 500)
	if !errors.Is(err, checkpoint.ErrOverBudget) || !strings.Contains(err.Error(),
		"of tenant acme: its workspaces' checkpoints would hold 1100 bytes (this one 500, the others 600), 100 over the budget of 1000 (checkpoints.max_tenant_bytes)") {
		t.Fatalf("save past the tenant's budget: %v; want ErrOverBudget saying by how much", err)
	}
	noChunk(t, s, "acme", strings.Repeat("b", 500))
	if b, _, err := s.GetHead(ctx(t), "acme", "two"); err != nil || b != nil {
		t.Fatalf("a refused save wrote a head: %q %v", b, err)
	}
	if err := save("other", "two", "b", 500); err != nil {
		t.Fatalf("another tenant's save: %v; want its own budget", err)
	}
	if err := os.Remove(filepath.Join(dir, "acme", "two", "b")); err != nil {
		t.Fatal(err)
	}
	if err := save("acme", "two", "c", 300); err != nil {
		t.Fatalf("save under the tenant's budget: %v", err)
	}
	if err := save("acme", "one", "d", 100); err != nil {
		t.Fatalf("a workspace growing to 700 bytes beside 300: %v; its own checkpoint must not count twice", err)
	}
}

// budgetNode is worker "a" with its own workspaces directory on s, configured by cfg (budgets).
func budgetNode(t *testing.T, s backend, cfg checkpoint.Config) (string, *checkpoint.Checkpointer) {
	t.Helper()
	cfg.Dir, cfg.Worker, cfg.UID, cfg.GID = t.TempDir(), "a", os.Getuid(), os.Getgid()
	cp, err := checkpoint.New(cfg, s, s)
	if err != nil {
		t.Fatal(err)
	}
	return cfg.Dir, cp
}

// noChunk fails the test when s holds a chunk of tenant's with content: a refused save stored it.
func noChunk(t *testing.T, s backend, tenant, content string) {
	t.Helper()
	sum := sha256.Sum256([]byte(content))
	if has, err := s.Has(ctx(t), tenant+"/chunks/"+hex.EncodeToString(sum[:])); err != nil || has {
		t.Fatalf("a refused save stored a chunk (%v, %v)", has, err)
	}
}

// TestRestoreOfARemovedCopy: a copy removed behind the checkpointer's back (the workspaces sweep expires a
// worker's copy of an idle workspace) is restored whole by the next Restore, never taken for up to date:
// a call would otherwise run on an empty directory, and its checkpoint drop every other file.
func TestRestoreOfARemovedCopy(t *testing.T) {
	ctx := ctx(t)
	a := newNode(t, jsStore(t), "a", 0)
	write(t, a.ws("acme", "ws"), "keep.txt", "kept", 0o644)
	if _, err := a.cp.Save(ctx, "acme", "ws"); err != nil {
		t.Fatal(err)
	}
	want := listing(t, a.ws("acme", "ws"))
	if err := os.RemoveAll(a.ws("acme", "ws")); err != nil {
		t.Fatal(err)
	}
	if r, err := a.cp.Restore(ctx, "acme", "ws"); err != nil || !r.Changed {
		t.Fatalf("restore of a removed copy: %+v, %v; want it restored", r, err)
	}
	if got := listing(t, a.ws("acme", "ws")); got != want {
		t.Fatalf("restored copy:\n%s\nwant:\n%s", got, want)
	}
}

// TestObserve: Config.Observe hears every Save and Restore, with its result and error (the worker's
// checkpoint metrics are counted there).
func TestObserve(t *testing.T) {
	type seen struct {
		op     string
		r      checkpoint.Result
		failed bool
	}
	var got []seen
	s := &failing{backend: jsStore(t)}
	a := newNode(t, s, "a", 0)
	dir := t.TempDir()
	b, err := checkpoint.New(checkpoint.Config{Dir: dir, Worker: "b", UID: os.Getuid(), GID: os.Getgid(),
		Observe: func(op string, r checkpoint.Result, took time.Duration, err error) {
			if took <= 0 {
				t.Errorf("%s observed taking %s", op, took)
			}
			got = append(got, seen{op, r, err != nil})
		}}, s, s)
	if err != nil {
		t.Fatal(err)
	}
	write(t, a.ws("acme", "repo"), "f", "one", 0o644)
	if _, err := a.cp.Save(ctx(t), "acme", "repo"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Restore(ctx(t), "acme", "repo"); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "acme", "repo"), "g", "two", 0o644)
	s.fail.Store(true)
	if _, err := b.Save(ctx(t), "acme", "repo"); err == nil {
		t.Fatal("save with the store unreachable succeeded")
	}
	if len(got) != 2 || got[0].op != "restore" || !got[0].r.Moved || got[0].r.Files != 1 || got[0].failed ||
		got[1].op != "save" || !got[1].failed {
		t.Fatalf("observed %+v; want the restore that moved the workspace here, then the failed save", got)
	}
}

// held is heads whose workspace head writes wait until every one of n saves has either reached its head
// write or been refused: saves that all checked the tenant's budget before any of them wrote.
type held struct {
	backend
	n       int
	mu      sync.Mutex
	arrived int
	all     chan struct{}
}

func (h *held) done() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.arrived++; h.arrived == h.n {
		close(h.all)
	}
}

func (h *held) SwapHead(ctx context.Context, tenant, name string, value []byte, rev uint64) (uint64, bool, error) {
	if !strings.HasPrefix(name, ".") {
		h.done()
		select {
		case <-h.all:
		case <-ctx.Done():
			return 0, false, ctx.Err()
		}
	}
	return h.backend.SwapHead(ctx, tenant, name, value, rev)
}

// TestTenantBudgetConcurrentSaves: eight workers checkpoint eight workspaces of one tenant at once, each
// 300 bytes under a tenant budget of 1000, every head write held until all eight have checked the budget:
// exactly three are kept and five refused with ErrOverBudget, and the tenant's checkpoints hold at most
// its budget. A refused save's reservation is given back: once a workspace is deleted, another fits.
func TestTenantBudgetConcurrentSaves(t *testing.T) {
	const n = 8
	h := &held{backend: jsStore(t), n: n, all: make(chan struct{})}
	nodes := make([]string, n)
	cps := make([]*checkpoint.Checkpointer, n)
	for i := range n {
		nodes[i], cps[i] = budgetNode(t, h, checkpoint.Config{MaxTenantBytes: 1000})
		write(t, filepath.Join(nodes[i], "acme", fmt.Sprint("ws", i)), "f", strings.Repeat(fmt.Sprint(i), 300), 0o644)
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = cps[i].Save(ctx(t), "acme", fmt.Sprint("ws", i))
			if errors.Is(errs[i], checkpoint.ErrOverBudget) {
				h.done()
			}
		}()
	}
	wg.Wait()
	var kept []int
	for i, err := range errs {
		switch {
		case err == nil:
			kept = append(kept, i)
		case !errors.Is(err, checkpoint.ErrOverBudget):
			t.Fatalf("save %d: %v", i, err)
		}
	}
	listed, err := cps[0].List(ctx(t), "acme")
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, l := range listed {
		total += l.Head.Bytes
	}
	if len(kept) != 3 || len(listed) != 3 || total > 1000 {
		t.Fatalf("saves kept %v, listed %d workspaces of %d bytes; want 3 kept, at most 1000 bytes", kept, len(listed), total)
	}
	// A refused save reserved nothing: deleting one kept workspace makes room for exactly one refused.
	first := kept[0]
	if err := os.RemoveAll(filepath.Join(nodes[first], "acme", fmt.Sprint("ws", first))); err != nil {
		t.Fatal(err)
	}
	h.n, h.arrived, h.all = 0, 0, make(chan struct{})
	close(h.all)
	if _, err := cps[first].Save(ctx(t), "acme", fmt.Sprint("ws", first)); err != nil {
		t.Fatal(err)
	}
	refused := -1
	for i, err := range errs {
		if err != nil {
			refused = i
			break
		}
	}
	if _, err := cps[refused].Save(ctx(t), "acme", fmt.Sprint("ws", refused)); err != nil {
		t.Fatalf("a save into the room a deleted workspace freed: %v", err)
	}
}

// TestRestoreOfATouchedFile: a file whose time changed but not its bytes (touch, a checkout writing the
// same content) is restored by setting its time in place: the copy is then the checkpoint's, never
// refused as changed while it was restored.
func TestRestoreOfATouchedFile(t *testing.T) {
	s := jsStore(t)
	a, b := newNode(t, s, "a", 0), newNode(t, s, "b", 0)
	write(t, a.ws("acme", "ws"), "same.txt", "same bytes", 0o644)
	write(t, a.ws("acme", "ws"), "other.txt", "other", 0o644)
	if _, err := a.cp.Save(ctx(t), "acme", "ws"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.cp.Restore(ctx(t), "acme", "ws"); err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(filepath.Join(a.ws("acme", "ws"), "same.txt"), later, later); err != nil {
		t.Fatal(err)
	}
	if r, err := a.cp.Save(ctx(t), "acme", "ws"); err != nil || !r.Changed {
		t.Fatalf("save of a touched file: %+v, %v; want a new checkpoint", r, err)
	}
	if r, err := b.cp.Restore(ctx(t), "acme", "ws"); err != nil || !r.Changed || r.Files != 0 {
		t.Fatalf("restore of a touched file: %+v, %v; want its time set, no file written", r, err)
	}
	if got, want := listing(t, b.ws("acme", "ws")), listing(t, a.ws("acme", "ws")); got != want {
		t.Fatalf("restored:\n%s\nwant:\n%s", got, want)
	}
}
