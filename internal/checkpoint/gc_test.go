package checkpoint_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/checkpoint"
	"github.com/toolpool/toolpool/internal/queue"
	"github.com/toolpool/toolpool/internal/queue/jetstream/jstest"
)

// testGrace is the grace of the collection tests: short, so that they wait seconds for objects to age.
const testGrace = 2 * time.Second

// gcNode stores each file as chunk objects (no packs), which these tests name by content; packs have
// their own (TestCollectPacks).
func gcNode(t *testing.T, s backend, name string) node {
	t.Helper()
	return newNodeWith(t, s, checkpoint.Config{Worker: name, Grace: testGrace, PackFilesUnder: -1})
}

// chunkOf is the store's name of tenant's chunk of content (a file under the chunk size).
func chunkOf(tenant, content string) string {
	sum := sha256.Sum256([]byte(content))
	return tenant + "/chunks/" + hex.EncodeToString(sum[:])
}

func has(t *testing.T, s backend, name string) bool {
	t.Helper()
	ok, err := s.Has(ctx(t), name)
	if err != nil {
		t.Fatal(err)
	}
	return ok
}

// collectUntil runs Collect until done says so of its result, for up to 30 s: objects age by the
// store's clock, which may count whole seconds (S3's), so that objects written a moment apart age in
// different collections. The result is the last collection's, with Swept and SweptBytes those of all of
// them.
func collectUntil(t *testing.T, cp *checkpoint.Checkpointer, tenant string, done func(checkpoint.Collected) bool) checkpoint.Collected {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var swept int
	var sweptBytes int64
	for wait := 100 * time.Millisecond; ; wait = min(2*wait, time.Second) {
		r, err := cp.Collect(ctx(t), tenant)
		if err != nil {
			t.Fatal(err)
		}
		swept, sweptBytes = swept+r.Swept, sweptBytes+r.SweptBytes
		r.Swept, r.SweptBytes = swept, sweptBytes
		if done(r) {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("collect of %s: %+v after 30s", tenant, r)
		}
		time.Sleep(wait)
	}
}

// TestCollect: garbage collection removes what no head names once it is older than the grace, and
// nothing else. A file's old version goes; a snapshot keeps what it names until its workspace is
// deleted; a deleted workspace's unique chunks go while those it shared with another workspace stay;
// another tenant's objects are never touched; and a restore after the collection, on a worker that
// never had the workspace, is byte-identical.
func TestCollect(t *testing.T) { eachStore(t, collect) }

func collect(t *testing.T, s backend) {
	a, b := gcNode(t, s, "a"), gcNode(t, s, "b")
	shared, unique, other := noise(3000), "unique to one "+noise(100), "only in two "+noise(50)
	first, old, snapped, now := "churn v1 "+noise(40), "churn v2 "+noise(45), "snapped v1 "+noise(40), "snapped v2 "+noise(40)
	write(t, a.ws("acme", "one"), "shared.bin", shared, 0o644)
	write(t, a.ws("acme", "one"), "unique.txt", unique, 0o600)
	write(t, a.ws("acme", "one"), "churn.txt", first, 0o644)
	write(t, a.ws("acme", "one"), "dir/snapped.txt", snapped, 0o644)
	write(t, a.ws("acme", "two"), "shared.bin", shared, 0o644)
	write(t, a.ws("acme", "two"), "sub/other.txt", other, 0o755)
	write(t, a.ws("other", "one"), "churn.txt", old, 0o644)
	for _, ws := range [][2]string{{"acme", "one"}, {"acme", "two"}, {"other", "one"}} {
		if _, err := a.cp.Save(ctx(t), ws[0], ws[1]); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := a.cp.Snapshot(ctx(t), "acme", "one", "before"); err != nil {
		t.Fatal(err)
	}
	// A version of churn.txt that only a replaced checkpoint names.
	write(t, a.ws("acme", "one"), "churn.txt", old, 0o644)
	write(t, a.ws("acme", "one"), "dir/snapped.txt", now, 0o644)
	write(t, a.ws("other", "one"), "churn.txt", "other v2", 0o644)
	for _, ws := range [][2]string{{"acme", "one"}, {"other", "one"}} {
		if _, err := a.cp.Save(ctx(t), ws[0], ws[1]); err != nil {
			t.Fatal(err)
		}
	}
	write(t, a.ws("acme", "one"), "churn.txt", "churn v3", 0o644)
	if _, err := a.cp.Save(ctx(t), "acme", "one"); err != nil {
		t.Fatal(err)
	}

	// Within the grace nothing goes: a Save may be about to name it.
	r, err := a.cp.Collect(ctx(t), "acme")
	if err != nil || r.Swept != 0 || r.Young == 0 || r.Heads != 3 {
		t.Fatalf("collect within the grace: %+v, %v; want nothing swept, the old version young, 3 heads", r, err)
	}
	r = collectUntil(t, a.cp, "acme", func(r checkpoint.Collected) bool { return r.Swept > 0 && r.Young == 0 })
	if r.Young != 0 || !(r.Swept >= 2) || r.SweptBytes < int64(len(old)) {
		t.Fatalf("collect past the grace: %+v; want the old version's chunk and tree swept", r)
	}
	if has(t, s, chunkOf("acme", old)) || !has(t, s, chunkOf("other", old)) {
		t.Fatal("the old version of acme's file is still there, or other's chunk of the same content went")
	}
	for _, c := range []string{shared, unique, other, first, snapped, now} {
		if !has(t, s, chunkOf("acme", c)) {
			t.Fatalf("a chunk a head or snapshot names was swept: %.20q", c)
		}
	}

	// Deleting workspace one drops its head and its snapshot: its unique data becomes garbage.
	if err := os.RemoveAll(a.ws("acme", "one")); err != nil {
		t.Fatal(err)
	}
	if r, err := a.cp.Save(ctx(t), "acme", "one"); err != nil || !r.Head.Deleted {
		t.Fatalf("delete: %+v, %v", r, err)
	}
	collectUntil(t, a.cp, "acme", func(checkpoint.Collected) bool { return !has(t, s, chunkOf("acme", unique)) })
	for _, c := range []string{first, snapped, now} {
		if has(t, s, chunkOf("acme", c)) {
			t.Fatalf("a chunk of the deleted workspace (or of its snapshot) stayed: %.20q", c)
		}
	}
	if !has(t, s, chunkOf("acme", shared)) || !has(t, s, chunkOf("acme", other)) {
		t.Fatal("a chunk workspace two names went with the deleted workspace")
	}
	if r, err := b.cp.Restore(ctx(t), "acme", "two"); err != nil || !r.Changed {
		t.Fatalf("restore after collection: %+v, %v", r, err)
	}
	if got, want := listing(t, b.ws("acme", "two")), listing(t, a.ws("acme", "two")); got != want {
		t.Fatalf("restored after collection:\n%s\nwant:\n%s", got, want)
	}
	if r, err := b.cp.Restore(ctx(t), "other", "one"); err != nil || !r.Changed {
		t.Fatalf("restore of the other tenant's workspace: %+v, %v", r, err)
	}
	if got, want := listing(t, b.ws("other", "one")), listing(t, a.ws("other", "one")); got != want {
		t.Fatalf("the other tenant's workspace:\n%s\nwant:\n%s", got, want)
	}
}

// racing is a store whose first listing of a tenant's chunks (Collect's sweep, after its mark) first runs
// during: a Save that completes between the mark and the sweep.
type racing struct {
	backend
	during func()
}

func (r *racing) List(ctx context.Context, prefix string, fn func(string, int64, time.Time) error) error {
	if f := r.during; f != nil && strings.HasSuffix(prefix, "/chunks/") {
		r.during = nil
		f()
	}
	return r.backend.List(ctx, prefix, fn)
}

// TestSaveRacingCollect: a Save that runs while a Collect is between its mark and its sweep loses
// nothing: neither the chunks it writes before its head, nor a chunk it shares with content that was
// garbage (no head named it, and it was older than the grace) when the mark ran: the Save writes such a
// chunk again rather than trust it. A worker that never had the workspace restores it whole.
func TestSaveRacingCollect(t *testing.T) { eachStore(t, saveRacingCollect) }

func saveRacingCollect(t *testing.T, s backend) {
	rs := &racing{backend: s}
	a, b, c := gcNode(t, rs, "a"), gcNode(t, rs, "b"), gcNode(t, rs, "c")
	revived, fresh := "deleted, then written again "+noise(200), "new "+noise(200)
	write(t, a.ws("acme", "gone"), "f.txt", revived, 0o644)
	if _, err := a.cp.Save(ctx(t), "acme", "gone"); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(a.ws("acme", "gone")); err != nil {
		t.Fatal(err)
	}
	if _, err := a.cp.Save(ctx(t), "acme", "gone"); err != nil {
		t.Fatal(err)
	}
	// Wait until the orphaned chunk is older than the grace, by the store's clock.
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, mod, ok, err := s.Stat(ctx(t), chunkOf("acme", revived))
		if err != nil || !ok {
			t.Fatalf("stat the orphaned chunk: %v, %v", ok, err)
		}
		if time.Since(mod) > testGrace+time.Second {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the orphaned chunk did not age")
		}
		time.Sleep(200 * time.Millisecond)
	}
	write(t, b.ws("acme", "new"), "again.txt", revived, 0o644)
	write(t, b.ws("acme", "new"), "fresh.txt", fresh, 0o644)
	var saved checkpoint.Result
	rs.during = func() {
		var err error
		if saved, err = b.cp.Save(ctx(t), "acme", "new"); err != nil {
			t.Error(err)
		}
	}
	r, err := a.cp.Collect(ctx(t), "acme")
	if err != nil {
		t.Fatal(err)
	}
	if !saved.Changed {
		t.Fatalf("the racing save did not run: %+v", saved)
	}
	if !has(t, s, chunkOf("acme", revived)) || !has(t, s, chunkOf("acme", fresh)) {
		t.Fatalf("collect %+v swept a chunk of the save that ran meanwhile", r)
	}
	if res, err := c.cp.Restore(ctx(t), "acme", "new"); err != nil || !res.Changed {
		t.Fatalf("restore after the race: %+v, %v", res, err)
	}
	if got, want := listing(t, c.ws("acme", "new")), listing(t, b.ws("acme", "new")); got != want {
		t.Fatalf("restored:\n%s\nwant:\n%s", got, want)
	}
	if got, _ := os.ReadFile(filepath.Join(c.ws("acme", "new"), "again.txt")); string(got) != revived {
		t.Fatal("the revived file does not read back")
	}
}

// TestCollectAllOncePerPeriod: workers that each run CollectAll collect each tenant once between them
// while the collect lease (real, in NATS) is held, and every tenant that has a head is collected.
func TestCollectAllOncePerPeriod(t *testing.T) {
	conn, _ := jstest.Provisioned(t, nil)
	s := jsStoreOn(t, conn)
	a, b := gcNode(t, s, "a"), gcNode(t, s, "b")
	for _, tenant := range []string{"acme", "globex", "initech"} {
		write(t, a.ws(tenant, "ws"), "f", tenant, 0o644)
		if _, err := a.cp.Save(ctx(t), tenant, "ws"); err != nil {
			t.Fatal(err)
		}
	}
	collected := map[string][]string{}
	for _, n := range []node{a, b, a} {
		lock := func(ctx context.Context, tenant string) (bool, error) {
			_, err := conn.Leases().AcquireCollect(ctx, tenant, filepath.Base(n.dir), time.Minute)
			if errors.Is(err, queue.ErrExists) {
				return false, nil
			}
			return err == nil, err
		}
		err := n.cp.CollectAll(ctx(t), lock, func(tenant string, r checkpoint.Collected, err error) {
			if err != nil || r.Heads != 1 || r.Kept != 2 {
				t.Errorf("collect of %s: %+v, %v; want its head, tree and chunk", tenant, r, err)
			}
			collected[tenant] = append(collected[tenant], filepath.Base(n.dir))
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if len(collected) != 3 || len(collected["acme"]) != 1 || len(collected["globex"]) != 1 || len(collected["initech"]) != 1 {
		t.Fatalf("collected %v; want each of the 3 tenants once", collected)
	}
}

// opening is a store whose first Open of object name first runs before (Opens run at once: a restore
// fetches files in parallel).
type opening struct {
	backend
	mu     sync.Mutex
	name   string
	before func()
}

func (o *opening) Open(ctx context.Context, name string) (io.ReadCloser, error) {
	o.mu.Lock()
	f := o.before
	if f != nil && name == o.name {
		o.before = nil
	} else {
		f = nil
	}
	o.mu.Unlock()
	if f != nil {
		f()
	}
	return o.backend.Open(ctx, name)
}

// TestRestoreFollowsTheHeadPastACollect: a restore fetching a checkpoint that a later checkpoint replaced
// meanwhile, and whose replaced file a collection then removed, brings the copy to the later checkpoint
// instead of failing.
func TestRestoreFollowsTheHeadPastACollect(t *testing.T) {
	s := jsStore(t)
	o := &opening{backend: s}
	a, b := gcNode(t, s, "a"), gcNode(t, o, "b")
	old := "replaced, then collected " + noise(100)
	write(t, a.ws("acme", "ws"), "x.txt", old, 0o644)
	write(t, a.ws("acme", "ws"), "y.txt", "stays", 0o644)
	if _, err := a.cp.Save(ctx(t), "acme", "ws"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, mod, ok, err := s.Stat(ctx(t), chunkOf("acme", old)); err != nil || !ok || time.Since(mod) > testGrace+time.Second {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the chunk did not age")
		}
		time.Sleep(200 * time.Millisecond)
	}
	o.name, o.before = chunkOf("acme", old), func() {
		write(t, a.ws("acme", "ws"), "x.txt", "the new version", 0o644)
		if _, err := a.cp.Save(ctx(t), "acme", "ws"); err != nil {
			t.Error(err)
		}
		if r, err := a.cp.Collect(ctx(t), "acme"); err != nil || r.Swept == 0 {
			t.Errorf("collect: %+v, %v; want the replaced chunk swept", r, err)
		}
	}
	r, err := b.cp.Restore(ctx(t), "acme", "ws")
	if err != nil || r.Head.Seq != 2 {
		t.Fatalf("restore across a collection: %+v, %v; want checkpoint 2", r, err)
	}
	if got, want := listing(t, b.ws("acme", "ws")), listing(t, a.ws("acme", "ws")); got != want {
		t.Fatalf("restored:\n%s\nwant:\n%s", got, want)
	}
}
