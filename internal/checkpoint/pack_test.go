package checkpoint_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/checkpoint"
)

// tally is a store that counts the objects opened, by name.
type tally struct {
	backend
	mu     sync.Mutex
	opened map[string]int
}

func (c *tally) Open(ctx context.Context, name string) (io.ReadCloser, error) {
	c.mu.Lock()
	if c.opened == nil {
		c.opened = map[string]int{}
	}
	c.opened[name]++
	c.mu.Unlock()
	return c.backend.Open(ctx, name)
}

// opens returns how many objects of kind ("chunks", "packs") were opened, and the most times one was.
func (c *tally) opens(kind string) (objects, most int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for name, n := range c.opened {
		if strings.Contains(name, "/"+kind+"/") {
			objects++
			most = max(most, n)
		}
	}
	return objects, most
}

// reset forgets what was opened.
func (c *tally) reset() {
	c.mu.Lock()
	clear(c.opened)
	c.mu.Unlock()
}

// objects returns the size of every object of tenant's of kind ("chunks", "packs"), by name.
func objects(t *testing.T, s backend, tenant, kind string) map[string]int64 {
	t.Helper()
	got := map[string]int64{}
	if err := s.List(ctx(t), tenant+"/"+kind+"/", func(name string, size int64, _ time.Time) error {
		got[name] = size
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return got
}

// smallFiles writes n files of size bytes each, every one different, under dir/ of root, in 10 directories.
func smallFiles(t *testing.T, root, dir string, n, size int) {
	t.Helper()
	for i := range n {
		write(t, root, fmt.Sprintf("%s/d%d/f%d.txt", dir, i%10, i), fmt.Sprintf("%s %d %s", dir, i, noise(size))[:size], 0o644)
	}
}

// TestPacks: a Save writes the new small files of a workspace into a few pack objects, not one object
// each, sealing a pack once it holds PackBytes; a large file keeps its chunks. A worker that never had
// the workspace restores it exactly, opening each pack once. A one-file change writes a pack of that file
// alone, a file touched or chmodded without a change keeps its place, and a worker restoring the change
// fetches only that pack (and sets the other two files' time and mode in place).
func TestPacks(t *testing.T) { eachStore(t, packs) }

func packs(t *testing.T, s backend) {
	cs := &tally{backend: s}
	a, b := newNodeWith(t, s, checkpoint.Config{Worker: "a"}), newNodeWith(t, cs, checkpoint.Config{Worker: "b"})
	wa, wb := a.ws("acme", "repo"), b.ws("acme", "repo")
	smallFiles(t, wa, "src", 400, 1024)      // 400 KiB in one pack
	smallFiles(t, wa, "assets", 25, 200<<10) // 5000 KiB: a pack sealed at 4 MiB, and the rest
	big := noise(300 << 10)                  // over PackFilesUnder: a chunk of its own
	write(t, wa, "big.bin", big, 0o644)
	write(t, wa, "empty", "", 0o644)
	r, err := a.cp.Save(ctx(t), "acme", "repo")
	if err != nil {
		t.Fatal(err)
	}
	packs, chunks := objects(t, s, "acme", "packs"), objects(t, s, "acme", "chunks")
	if r.Files != 427 || r.Chunks != len(packs)+1 || len(chunks) != 1 || len(packs) < 2 || len(packs) > 3 {
		t.Fatalf("first save: %+v, %d packs, %d chunks; want 427 files read into 2 or 3 packs and big.bin's chunk", r, len(packs), len(chunks))
	}
	for name, size := range packs {
		if size > checkpoint.PackBytes {
			t.Fatalf("pack %s holds %d bytes, over PackBytes", name, size)
		}
	}

	r, err = b.cp.Restore(ctx(t), "acme", "repo")
	if err != nil || !r.Changed || r.Files != 427 {
		t.Fatalf("restore: %+v, %v; want 427 files written", r, err)
	}
	if got, want := listing(t, wb), listing(t, wa); got != want {
		t.Fatalf("restored tree differs:\n%.2000s\nwant:\n%.2000s", got, want)
	}
	if n, most := cs.opens("packs"); n != len(packs) || most != 1 {
		t.Fatalf("restore opened %d packs, one %d times; want each of the %d packs once", n, most, len(packs))
	}
	if n, _ := cs.opens("chunks"); n != 1 {
		t.Fatalf("restore opened %d chunks; want big.bin's alone", n)
	}
	cs.reset()

	// One file changed, one touched (same bytes, new time), one chmodded.
	changed := "changed " + noise(100)
	write(t, wa, "src/d3/f3.txt", changed, 0o644)
	now := time.Now()
	if err := os.Chtimes(filepath.Join(wa, "src/d4/f4.txt"), now, now); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(wa, "src/d5/f5.txt"), 0o600); err != nil {
		t.Fatal(err)
	}
	r, err = a.cp.Save(ctx(t), "acme", "repo")
	if err != nil || r.Files != 3 || r.Chunks != 1 || r.Bytes != int64(len(changed)) {
		t.Fatalf("incremental save: %+v, %v; want 3 files read and one pack of the changed file alone", r, err)
	}
	if after := objects(t, s, "acme", "packs"); len(after) != len(packs)+1 {
		t.Fatalf("incremental save: %d packs, then %d; want one more", len(packs), len(after))
	}
	r, err = b.cp.Restore(ctx(t), "acme", "repo")
	if err != nil || r.Files != 1 || r.Chunks != 1 {
		t.Fatalf("incremental restore: %+v, %v; want the changed file written from its pack, the others' time and mode set", r, err)
	}
	if got, want := listing(t, wb), listing(t, wa); got != want {
		t.Fatalf("incrementally restored tree differs:\n%.2000s\nwant:\n%.2000s", got, want)
	}
	if n, most := cs.opens("packs"); n != 1 || most != 1 {
		t.Fatalf("incremental restore opened %d packs, one %d times; want the new pack once", n, most)
	}
	// b saves what it restored without storing anything: its copy is known to be at the checkpoint.
	if r, err := b.cp.Save(ctx(t), "acme", "repo"); err != nil || r.Changed || r.Chunks != 0 {
		t.Fatalf("save of the restored copy: %+v, %v; want nothing stored", r, err)
	}
}

// newPacks returns the names in after that are not in before.
func newPacks(before, after map[string]int64) []string {
	var names []string
	for name := range after {
		if _, ok := before[name]; !ok {
			names = append(names, name)
		}
	}
	return names
}

// TestPreviousFormatRestores: a checkpoint written before packs (every file its own chunk object) is
// restored by a worker that packs; that worker's next Save packs only what changed, never the files the
// previous checkpoint holds as chunks; and the tree that mixes both restores on another worker.
func TestPreviousFormatRestores(t *testing.T) { eachStore(t, previousFormatRestores) }

func previousFormatRestores(t *testing.T, s backend) {
	old := newNodeWith(t, s, checkpoint.Config{Worker: "old", PackFilesUnder: -1})
	a, b := newNodeWith(t, s, checkpoint.Config{Worker: "a"}), newNodeWith(t, s, checkpoint.Config{Worker: "b"})
	smallFiles(t, old.ws("acme", "ws"), "src", 50, 500)
	if _, err := old.cp.Save(ctx(t), "acme", "ws"); err != nil {
		t.Fatal(err)
	}
	chunks := objects(t, s, "acme", "chunks")
	if n := len(objects(t, s, "acme", "packs")); n != 0 || len(chunks) != 50 {
		t.Fatalf("the previous format: %d chunks and %d packs; want 50 chunks, no pack", len(chunks), n)
	}
	if r, err := a.cp.Restore(ctx(t), "acme", "ws"); err != nil || r.Files != 50 {
		t.Fatalf("restore of the previous format: %+v, %v; want 50 files written", r, err)
	}
	if got, want := listing(t, a.ws("acme", "ws")), listing(t, old.ws("acme", "ws")); got != want {
		t.Fatalf("restored:\n%s\nwant:\n%s", got, want)
	}
	changed, added := "changed "+noise(300), "added "+noise(200)
	write(t, a.ws("acme", "ws"), "src/d1/f1.txt", changed, 0o644)
	write(t, a.ws("acme", "ws"), "new.txt", added, 0o644)
	if r, err := a.cp.Save(ctx(t), "acme", "ws"); err != nil || r.Files != 2 || r.Chunks != 1 {
		t.Fatalf("save over the previous format: %+v, %v; want 2 files read into one pack", r, err)
	}
	packs := objects(t, s, "acme", "packs")
	for _, size := range packs {
		if len(packs) != 1 || size != int64(len(changed)+len(added)) {
			t.Fatalf("packs %v; want one of the changed and the added file alone", packs)
		}
	}
	if n := len(objects(t, s, "acme", "chunks")); n != 50 {
		t.Fatalf("%d chunks; want the 50 of the previous checkpoint, none new", n)
	}
	for _, n := range []node{b, old} {
		if _, err := n.cp.Restore(ctx(t), "acme", "ws"); err != nil {
			t.Fatal(err)
		}
		if got, want := listing(t, n.ws("acme", "ws")), listing(t, a.ws("acme", "ws")); got != want {
			t.Fatalf("the mixed tree restored on %s:\n%s\nwant:\n%s", n.dir, got, want)
		}
	}
}

// TestCollectPacks: a pack is kept, whole, while any head names one of its files (a partly dead pack
// stays), swept once none does and it is older than the grace; a pack a Save writes while a Collect is
// between its mark and its sweep is kept; and the workspace restores on a worker that never had it.
func TestCollectPacks(t *testing.T) { eachStore(t, collectPacks) }

func collectPacks(t *testing.T, s backend) {
	rs := &racing{backend: s}
	a := newNodeWith(t, rs, checkpoint.Config{Worker: "a", Grace: testGrace})
	b := newNodeWith(t, rs, checkpoint.Config{Worker: "b", Grace: testGrace})
	save := func(ws string) []string {
		t.Helper()
		before := objects(t, s, "acme", "packs")
		if _, err := a.cp.Save(ctx(t), "acme", ws); err != nil {
			t.Fatal(err)
		}
		return newPacks(before, objects(t, s, "acme", "packs"))
	}
	write(t, a.ws("acme", "one"), "a.txt", "a v1 "+noise(100), 0o644)
	write(t, a.ws("acme", "one"), "b.txt", "b stays "+noise(100), 0o644)
	write(t, a.ws("acme", "two"), "c.txt", "c "+noise(100), 0o644)
	p1, p2 := save("one"), save("two")
	write(t, a.ws("acme", "one"), "a.txt", "a v2 "+noise(90), 0o644)
	p3 := save("one")
	if len(p1) != 1 || len(p2) != 1 || len(p3) != 1 {
		t.Fatalf("new packs %v, %v, %v; want one by each save", p1, p2, p3)
	}
	if r, err := a.cp.Collect(ctx(t), "acme"); err != nil || r.Swept != 0 {
		t.Fatalf("collect within the grace: %+v, %v; want nothing swept", r, err)
	}
	// The first checkpoint's root tree goes; the pack of a.txt's first version stays for b.txt.
	collectUntil(t, a.cp, "acme", func(r checkpoint.Collected) bool { return r.Swept > 0 })
	for _, p := range [][]string{p1, p2, p3} {
		if !has(t, s, p[0]) {
			t.Fatalf("pack %s, which a head names, was swept", p[0])
		}
	}

	// Workspace two deleted: its pack goes. A Save that runs between the mark and the sweep keeps its pack.
	if err := os.RemoveAll(a.ws("acme", "two")); err != nil {
		t.Fatal(err)
	}
	save("two")
	write(t, b.ws("acme", "three"), "d.txt", "d "+noise(100), 0o644)
	var racing []string
	rs.during = func() {
		before := objects(t, s, "acme", "packs")
		if _, err := b.cp.Save(ctx(t), "acme", "three"); err != nil {
			t.Error(err)
		}
		racing = newPacks(before, objects(t, s, "acme", "packs"))
	}
	collectUntil(t, a.cp, "acme", func(checkpoint.Collected) bool { return !has(t, s, p2[0]) })
	if len(racing) != 1 || !has(t, s, racing[0]) {
		t.Fatalf("the pack of the save that raced the collect (%v) was swept, or it wrote none", racing)
	}
	if !has(t, s, p1[0]) || !has(t, s, p3[0]) {
		t.Fatal("a pack workspace one names went with workspace two")
	}
	c := newNodeWith(t, s, checkpoint.Config{Worker: "c"})
	for _, ws := range []struct {
		n    node
		name string
	}{{a, "one"}, {b, "three"}} {
		if _, err := c.cp.Restore(ctx(t), "acme", ws.name); err != nil {
			t.Fatal(err)
		}
		if got, want := listing(t, c.ws("acme", ws.name)), listing(t, ws.n.ws("acme", ws.name)); got != want {
			t.Fatalf("restored after collection:\n%s\nwant:\n%s", got, want)
		}
	}
}

// TestCorruptPack: a pack whose bytes are not what its digest says fails the Restore with an error that
// says so, and the restore writes none of its files.
func TestCorruptPack(t *testing.T) {
	s := jsStore(t)
	a, b := newNodeWith(t, s, checkpoint.Config{Worker: "a"}), newNodeWith(t, s, checkpoint.Config{Worker: "b"})
	write(t, a.ws("acme", "ws"), "x.txt", "x "+noise(100), 0o644)
	write(t, a.ws("acme", "ws"), "y.txt", "y "+noise(100), 0o644)
	if _, err := a.cp.Save(ctx(t), "acme", "ws"); err != nil {
		t.Fatal(err)
	}
	for name := range objects(t, s, "acme", "packs") {
		if err := s.Put(ctx(t), name, strings.NewReader("not the pack")); err != nil {
			t.Fatal(err)
		}
	}
	_, err := b.cp.Restore(ctx(t), "acme", "ws")
	if err == nil || !strings.Contains(err.Error(), "does not match its digest (corrupt store)") {
		t.Fatalf("restore of a corrupt pack: %v; want an error saying the store is corrupt", err)
	}
	for _, f := range []string{"x.txt", "y.txt"} {
		if _, err := os.Lstat(filepath.Join(b.ws("acme", "ws"), f)); !os.IsNotExist(err) {
			t.Fatalf("%s of a corrupt pack was written: %v", f, err)
		}
	}
}
