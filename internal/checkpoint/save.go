package checkpoint

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"
)

// MaxDepth bounds how deep a walk of a workspace descends.
const MaxDepth = 256

// ErrTooDeep reports a tree nested deeper than MaxDepth.
var ErrTooDeep = fmt.Errorf("directories nest deeper than %d levels", MaxDepth)

// Save checkpoints the workspace Dir/<tenant>/<name>: it stores the chunks of the files that changed
// since this worker's last Save or Restore of it, the trees on their paths, and a new head. A workspace
// that did not change writes nothing (Result.Changed false); a workspace that is gone is saved as
// deleted. The head is written last: a Save that fails leaves the latest checkpoint as it was, whatever
// it stored before failing (content-addressed objects that nothing names are harmless), and the next
// Save stores the same changes again.
//
// Save reads the workspace as it stands; the caller keeps writers out, or accepts that a file written
// meanwhile is saved as it was when read (the next Save catches up).
func (c *Checkpointer) Save(ctx context.Context, tenant, name string) (res Result, err error) {
	defer c.observe("save", time.Now(), &res, &err)
	st := c.state(tenant, name)
	defer st.mu.Unlock()
	return c.save(ctx, tenant, name, st)
}

// observe reports an operation that began at start to Config.Observe, once it returned *res and *err.
func (c *Checkpointer) observe(op string, start time.Time, res *Result, err *error) {
	if c.cfg.Observe != nil {
		c.cfg.Observe(op, *res, time.Since(start), *err)
	}
}

// save is Save with the workspace's state st locked.
func (c *Checkpointer) save(ctx context.Context, tenant, name string, st *wsState) (res Result, err error) {
	start := time.Now()
	defer func() {
		switch {
		case err == nil || errors.Is(err, ErrStale):
			st.unsavedSince.Store(0) // a stale copy's changes are not retried: they can never be kept
		case st.unsavedSince.Load() == 0:
			st.unsavedSince.Store(c.cfg.Now().UnixNano())
		}
	}()
	root, exists, err := c.openWorkspace(tenant, name)
	if err != nil {
		return Result{}, fmt.Errorf("checkpoint workspace %s/%s: %w", tenant, name, err)
	}
	// The tenant's bytes reserved for this save: given back unless its head is written (or was already).
	var undo func()
	kept := false
	defer func() {
		if !kept && undo != nil {
			undo()
		}
	}()
	sc := &scanned{root: emptyTree, files: map[string]fileState{}}
	if !exists {
		// A deleted workspace frees what it held of its tenant's budget.
		if undo, err = c.reserve(ctx, tenant, name, 0); err != nil {
			return Result{}, fmt.Errorf("checkpoint workspace %s/%s: %w", tenant, name, err)
		}
	}
	if exists {
		defer unix.Close(root)
		budget := func(total int64) (err error) {
			undo, err = c.reserve(ctx, tenant, name, total)
			return err
		}
		if sc, err = c.scan(ctx, root, tenant, st, budget); err != nil {
			return Result{}, fmt.Errorf("checkpoint workspace %s/%s: %w", tenant, name, err)
		}
	}
	res = Result{Files: sc.read, Chunks: int(sc.chunks.Load()), Bytes: sc.bytes.Load()}
	seq, created, image, imageKept := st.head.Seq, st.head.Created, st.head.Image, st.head.ImageKept
	if st.head.Tree == "" {
		// This copy was restored from no checkpoint (a new workspace, or a worker that restarted): it is
		// the latest checkpoint only if it holds what that checkpoint holds. Otherwise the head is written
		// only where there is none (revision 0): a copy that never saw the latest checkpoint is stale.
		h, rev, ok, err := c.readHead(ctx, tenant, name)
		if err != nil {
			return res, fmt.Errorf("checkpoint workspace %s/%s: %w", tenant, name, err)
		}
		switch {
		case ok && h.Tree == sc.root && h.Deleted == !exists:
			st.head, st.headRev = h, rev
		case ok:
			seq, created, image, imageKept = h.Seq, h.Created, h.Image, h.ImageKept
		case !exists:
			return res, nil // never saved, and gone: nothing to say
		}
	}
	if st.head.Tree != "" && st.head.Tree == sc.root && st.head.Deleted == !exists {
		kept = true // the head holds these bytes already
		st.files, st.dirs = sc.files, sc.dirState
		res.Head, res.Took = st.head, time.Since(start)
		return res, c.dropSnapshots(ctx, tenant, name, st.head) // a retry of a delete whose snapshots stayed
	}
	now := c.cfg.Now().UTC()
	h := Head{Tree: sc.root, Seq: seq + 1, Deleted: !exists, Worker: c.cfg.Worker, At: now, Files: len(sc.files), Bytes: sc.total, Created: created}
	if exists && !st.head.Deleted {
		h.Image, h.ImageKept = image, imageKept // a workspace made again under a deleted one's name starts without
	}
	if h.Created.IsZero() || st.head.Deleted {
		h.Created = now
	}
	b, _ := json.Marshal(h)
	rev, swapped, err := c.heads.SwapHead(ctx, tenant, name, b, st.headRev)
	if err != nil {
		return res, fmt.Errorf("checkpoint workspace %s/%s: store head: %w", tenant, name, err)
	}
	if !swapped {
		// Another worker checkpointed the workspace since this copy was restored or saved: its changes
		// cannot be kept without losing that checkpoint's. Forget what is known of the copy, so that the
		// next Restore compares it whole and makes it the latest checkpoint.
		latest, _, _, _ := c.readHead(ctx, tenant, name)
		was := st.head.Seq
		st.head, st.headRev, st.files, st.dirs = Head{}, 0, nil, nil
		return res, fmt.Errorf("checkpoint workspace %s/%s: %w (checkpoint %d, by worker %s at %s); this copy was at checkpoint %d",
			tenant, name, ErrStale, latest.Seq, latest.Worker, latest.At.Format(time.RFC3339), was)
	}
	kept = true
	st.head, st.headRev, st.files, st.dirs = h, rev, sc.files, sc.dirState
	res.Changed, res.Head, res.Took = true, h, time.Since(start)
	return res, c.dropSnapshots(ctx, tenant, name, h)
}

// dropSnapshots removes the snapshots of a workspace whose head h says it was deleted: they go with it.
// Should it fail, the Save fails, and its retry (SaveUnsaved) removes them.
func (c *Checkpointer) dropSnapshots(ctx context.Context, tenant, name string, h Head) error {
	if !h.Deleted {
		return nil
	}
	if err := c.heads.DeleteSnapshots(ctx, tenant, name); err != nil {
		return fmt.Errorf("checkpoint workspace %s/%s (deleted): %w", tenant, name, err)
	}
	return nil
}

// scanned is a workspace as read by scan.
type scanned struct {
	root  string               // its root tree's digest
	dirs  map[string]string    // every directory's tree digest, by path ("" the root)
	files map[string]fileState // every file, by path
	// dirState is every directory's entries and digest, for the next scan.
	dirState map[string]dirState
	total    int64 // the files' bytes
	read     int   // how many files were read (not known by their stat)
	// chunks and bytes count what was stored (chunks and packs).
	chunks atomic.Int64
	bytes  atomic.Int64

	// prev is what was known of the files before the scan (the copy's state at its head), whose packed
	// files a small file read with the same bytes refers to again (reuse); byDigest indexes its packed
	// files by digest, built once when first needed.
	prev     map[string]fileState
	prevOnce sync.Once
	byDigest map[string]fileState
	// packs gathers the Save's new small files (nil when nothing is stored).
	packs *packer
}

// reuse returns how the state before the scan keeps a small file of path rel whose bytes have digest d:
// as the same path's file if it had the same bytes (packed or not), else as any packed file of the same
// bytes. A Save may name what it returns without storing it: the head it replaces (by compare-and-set)
// names it, so a Collect never sweeps it before the new head does.
func (sc *scanned) reuse(rel, d string) (fileState, bool) {
	if k, ok := sc.prev[rel]; ok && len(k.chunks) == 1 && k.chunks[0] == d {
		return k, true
	}
	sc.prevOnce.Do(func() {
		sc.byDigest = map[string]fileState{}
		for _, k := range sc.prev {
			if k.pack != "" {
				sc.byDigest[k.chunks[0]] = k
			}
		}
	})
	k, ok := sc.byDigest[d]
	return k, ok
}

// packer writes a Save's new small files into pack objects: the files' bytes one after the other, stored
// under the SHA-256 of the whole like every object, sealed once they hold PackBytes (the last when every
// file was read: flush). Each file's entry learns its pack and offset once its pack is stored.
type packer struct {
	c      *Checkpointer
	tenant string
	sc     *scanned

	mu      sync.Mutex
	buf     []byte
	members []packed
}

// packed is a file in a pack being filled: its entry and state, which learn the pack, and its offset.
type packed struct {
	e   *entry
	fs  *fileState
	off int64
}

// add puts b, the bytes of the file of e and fs, into the pack being filled; a pack it fills is stored.
func (p *packer) add(ctx context.Context, b []byte, e *entry, fs *fileState) error {
	p.mu.Lock()
	var full []byte
	var fullMembers []packed
	if len(p.buf) > 0 && len(p.buf)+len(b) > PackBytes {
		full, fullMembers = p.buf, p.members
		p.buf, p.members = nil, nil
	}
	if p.buf == nil {
		p.buf = make([]byte, 0, PackBytes)
	}
	p.members = append(p.members, packed{e: e, fs: fs, off: int64(len(p.buf))})
	p.buf = append(p.buf, b...)
	p.mu.Unlock()
	if full == nil {
		return nil
	}
	return p.store(ctx, full, fullMembers)
}

// flush stores the pack being filled, if it holds anything.
func (p *packer) flush(ctx context.Context) error {
	p.mu.Lock()
	b, members := p.buf, p.members
	p.buf, p.members = nil, nil
	p.mu.Unlock()
	if len(members) == 0 {
		return nil
	}
	return p.store(ctx, b, members)
}

// store stores pack b and tells its members where their bytes are.
func (p *packer) store(ctx context.Context, b []byte, members []packed) error {
	sum := sha256.Sum256(b)
	d := hex.EncodeToString(sum[:])
	if err := p.c.putObject(ctx, packName(p.tenant, d), b); err != nil {
		return fmt.Errorf("store pack of %d files: %w", len(members), err)
	}
	p.sc.chunks.Add(1)
	p.sc.bytes.Add(int64(len(b)))
	for _, m := range members {
		m.e.Pack, m.e.Off = d, m.off
		m.fs.pack, m.fs.off = d, m.off
	}
	return nil
}

// dirNode is a directory being scanned: its entries, and which of them are directories still to digest.
type dirNode struct {
	rel     string
	entries []entry
	subdirs map[int]*dirNode // by index in entries
}

// fileJob is a file whose content must be read: its stat did not match what was known.
type fileJob struct {
	rel string
	e   *entry
	fs  *fileState
}

// scan reads the tree under root. Files whose stat matches what st knows keep their chunks, and
// directories whose entries are the same keep their digests; the other files are read and cut into
// chunks. With budget (a Save), budget is asked about the files' total bytes once the tree is walked,
// and nothing is stored when it says no; then the new chunks and trees are stored.
func (c *Checkpointer) scan(ctx context.Context, root int, tenant string, st *wsState, budget func(total int64) error) (*scanned, error) {
	upload := budget != nil
	sc := &scanned{dirs: map[string]string{}, files: map[string]fileState{}, dirState: map[string]dirState{}, prev: st.files}
	if upload && c.cfg.PackFilesUnder > 0 {
		sc.packs = &packer{c: c, tenant: tenant, sc: sc}
	}
	w := &walker{c: c, root: root, known: st.files, sc: sc}
	top, err := w.run()
	if err != nil {
		return sc, err
	}
	if upload {
		// Before anything is stored: a refused Save leaves nothing of itself behind.
		if err := budget(sc.total); err != nil {
			return sc, err
		}
	}
	jobs := w.jobs
	sc.read = len(jobs)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(c.cfg.Parallel)
	for _, j := range jobs {
		g.Go(func() error { return c.readFile(gctx, root, tenant, j, upload, sc) })
	}
	if err := g.Wait(); err != nil {
		return sc, err
	}
	if sc.packs != nil {
		if err := sc.packs.flush(ctx); err != nil {
			return sc, err
		}
	}
	for _, j := range jobs {
		sc.files[j.rel] = *j.fs
	}
	var trees []tree
	sc.root = c.digest(top, st.dirs, sc, &trees)
	if upload {
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(c.cfg.Parallel)
		for _, t := range trees {
			g.Go(func() error { return c.putObject(gctx, treeName(tenant, t.digest), t.body) })
		}
		if err := g.Wait(); err != nil {
			return sc, err
		}
	}
	return sc, nil
}

// tree is a tree object to store.
type tree struct {
	digest string
	body   []byte
}

// walker walks a tree's directories in parallel: Parallel goroutines take directories off a queue, stat
// their entries and queue their subdirectories. Each directory is opened from the root, beneath it.
type walker struct {
	c     *Checkpointer
	root  int
	known map[string]fileState
	sc    *scanned

	mu      sync.Mutex
	more    *sync.Cond
	queue   []*dirNode
	depth   map[*dirNode]int
	pending int // directories queued or being read
	err     error
	jobs    []fileJob
}

// run walks the tree and returns its root directory.
func (w *walker) run() (*dirNode, error) {
	w.more = sync.NewCond(&w.mu)
	top := &dirNode{rel: "", subdirs: map[int]*dirNode{}}
	w.queue, w.depth, w.pending = []*dirNode{top}, map[*dirNode]int{top: 0}, 1
	var wg sync.WaitGroup
	for range w.c.cfg.Parallel {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				w.mu.Lock()
				for len(w.queue) == 0 && w.pending > 0 {
					w.more.Wait()
				}
				if w.pending == 0 {
					w.mu.Unlock()
					return
				}
				n := w.queue[len(w.queue)-1]
				w.queue = w.queue[:len(w.queue)-1]
				depth, failed := w.depth[n], w.err != nil
				w.mu.Unlock()
				var err error
				if !failed {
					err = w.dir(n, depth)
				}
				w.mu.Lock()
				if err != nil && w.err == nil {
					w.err = err
				}
				w.pending--
				w.more.Broadcast()
				w.mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return top, w.err
}

// dir reads directory n: its entries, with the files whose stat is known and those to read.
func (w *walker) dir(n *dirNode, depth int) error {
	if depth > MaxDepth {
		return ErrTooDeep
	}
	fd, err := openDir(w.root, n.rel)
	if errors.Is(err, unix.ENOENT) {
		return nil // removed while we looked: empty
	}
	if err != nil {
		return fmt.Errorf("open directory %q: %w", n.rel, err)
	}
	defer unix.Close(fd)
	dup, err := openDir(fd, "") // the os.File owns this one
	if err != nil {
		return fmt.Errorf("read directory %q: %w", n.rel, err)
	}
	d := os.NewFile(uintptr(dup), n.rel)
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return fmt.Errorf("read directory %q: %w", n.rel, err)
	}
	n.entries = make([]entry, 0, len(names))
	type pending struct {
		rel string
		i   int
		sig statSig
	}
	var reads []pending
	var subdirs []*dirNode
	var total int64
	reused := map[string]fileState{}
	for _, name := range names {
		var s unix.Stat_t
		if err := unix.Fstatat(fd, name, &s, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue // removed while we looked
			}
			return fmt.Errorf("stat %q: %w", join(n.rel, name), err)
		}
		p := join(n.rel, name)
		e := entry{Name: name, Mode: s.Mode & 0o777, MTime: s.Mtim.Nano()}
		switch s.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			e.Type, e.Size = typeFile, s.Size
			sig := sigOf(&s)
			total += s.Size
			if k, ok := w.known[p]; ok && k.sig == sig {
				e.Chunks, e.Pack, e.Off = k.chunks, k.pack, k.off
				reused[p] = k
			} else {
				reads = append(reads, pending{p, len(n.entries), sig})
			}
		case unix.S_IFDIR:
			e.Type, e.MTime = typeDir, 0
			child := &dirNode{rel: p, subdirs: map[int]*dirNode{}}
			n.subdirs[len(n.entries)] = child
			subdirs = append(subdirs, child)
		case unix.S_IFLNK:
			target := make([]byte, unix.PathMax)
			k, err := unix.Readlinkat(fd, name, target)
			if errors.Is(err, unix.ENOENT) {
				continue
			}
			if err != nil {
				return fmt.Errorf("read symlink %q: %w", p, err)
			}
			e.Type, e.Mode, e.MTime, e.Target = typeSymlink, 0, 0, string(target[:k])
		default:
			continue // FIFOs, sockets, devices are not kept
		}
		n.entries = append(n.entries, e)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, r := range reads {
		w.jobs = append(w.jobs, fileJob{rel: r.rel, e: &n.entries[r.i], fs: &fileState{sig: r.sig}})
	}
	for p, k := range reused {
		w.sc.files[p] = k
	}
	w.sc.total += total
	for _, child := range subdirs {
		w.depth[child] = depth + 1
		w.queue = append(w.queue, child)
		w.pending++
	}
	return nil
}

// readFile reads one file of a scan, cuts it into chunks and stores those the store may not have.
func (c *Checkpointer) readFile(ctx context.Context, root int, tenant string, j fileJob, upload bool, sc *scanned) error {
	fd, err := openAt(root, j.rel, unix.O_RDONLY)
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ELOOP) {
		// Removed, or replaced by a symlink, since the walk: saved as it was seen, empty; the next Save
		// sees what is there.
		j.e.Size, j.e.Chunks, j.e.Pack, j.e.Off = 0, nil, "", 0
		j.fs.sig = statSig{}
		return nil
	}
	if err != nil {
		return fmt.Errorf("open %q: %w", j.rel, err)
	}
	f := os.NewFile(uintptr(fd), j.rel)
	defer f.Close()
	var s unix.Stat_t
	if err := unix.Fstat(fd, &s); err != nil {
		return fmt.Errorf("stat %q: %w", j.rel, err)
	}
	j.fs.sig = sigOf(&s) // the stat of the content read, for the next Save
	j.e.MTime, j.e.Mode = s.Mtim.Nano(), s.Mode&0o777
	// One byte more than the stat says: a file read whole in its first chunk is known to end there.
	buf := make([]byte, min(int64(c.cfg.ChunkBytes), s.Size+1))
	var size int64
	for {
		n, err := io.ReadFull(f, buf)
		last := errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
		if n > 0 {
			sum := sha256.Sum256(buf[:n])
			d := hex.EncodeToString(sum[:])
			if len(j.fs.chunks) == 0 && last && (!upload || int64(n) < c.cfg.PackFilesUnder) {
				// Its entry is packFile's alone from here: a pack another goroutine stores fills it in.
				j.fs.chunks = []string{d}
				return c.packFile(ctx, j, buf[:n], d, sc)
			}
			j.fs.chunks = append(j.fs.chunks, d)
			size += int64(n)
			if upload {
				if err := c.putChunk(ctx, tenant, d, buf[:n], sc); err != nil {
					return err
				}
			}
		}
		if last {
			break
		}
		if err != nil {
			return fmt.Errorf("read %q: %w", j.rel, err)
		}
		if n == len(buf) && len(buf) < c.cfg.ChunkBytes {
			buf = make([]byte, c.cfg.ChunkBytes) // grew since the stat
		}
	}
	j.e.Size, j.e.Chunks, j.e.Pack, j.e.Off = size, j.fs.chunks, j.fs.pack, j.fs.off
	return nil
}

// packFile keeps a file of one chunk (small enough to pack, or read by a scan that stores nothing), b of digest d: where the state before the scan has the same
// bytes (reuse), else, in a Save, in a new pack. A scan that stores nothing (a Restore's) leaves a file
// it cannot reuse unpacked: its tree then differs from the checkpoint's, which Restore compares by chunks.
func (c *Checkpointer) packFile(ctx context.Context, j fileJob, b []byte, d string, sc *scanned) error {
	if k, ok := sc.reuse(j.rel, d); ok {
		j.fs.pack, j.fs.off = k.pack, k.off
		j.e.Size, j.e.Chunks, j.e.Pack, j.e.Off = int64(len(b)), j.fs.chunks, k.pack, k.off
		return nil
	}
	j.e.Size, j.e.Chunks = int64(len(b)), j.fs.chunks
	if sc.packs == nil {
		return nil
	}
	return sc.packs.add(ctx, b, j.e, j.fs)
}

// putChunk stores a chunk unless it is in the store, written within half the grace: known so to this
// worker, or so the store says (another workspace of the tenant, or another worker, stored it). An older
// copy is written again, so that a Collect running meanwhile never sweeps it (Collect).
func (c *Checkpointer) putChunk(ctx context.Context, tenant, digest string, b []byte, sc *scanned) error {
	name := chunkName(tenant, digest)
	if c.isFresh(name) {
		return nil
	}
	_, modified, has, err := c.store.Stat(ctx, name)
	if err != nil {
		return fmt.Errorf("look up chunk %s: %w", name, err)
	}
	if has {
		c.learn(name, modified)
		if c.isFresh(name) {
			return nil
		}
	}
	before := c.cfg.Now()
	if err := c.store.Put(ctx, name, bytes.NewReader(b)); err != nil {
		return fmt.Errorf("store chunk %s: %w", name, err)
	}
	c.learn(name, before)
	sc.chunks.Add(1)
	sc.bytes.Add(int64(len(b)))
	return nil
}

// digest computes the tree digests of n and its subdirectories. A directory whose entries are those
// prev has for it keeps its digest; the others are encoded and added to trees, to store.
func (c *Checkpointer) digest(n *dirNode, prev map[string]dirState, sc *scanned, trees *[]tree) string {
	for i, sub := range n.subdirs {
		n.entries[i].Tree = c.digest(sub, prev, sc, trees)
	}
	sort.Slice(n.entries, func(i, j int) bool { return n.entries[i].Name < n.entries[j].Name })
	var d string
	if p, ok := prev[n.rel]; ok && slices.EqualFunc(p.entries, n.entries, sameEntry) {
		d = p.digest
	} else {
		var b []byte
		b, d = encodeTree(n.entries)
		if d != emptyTree {
			*trees = append(*trees, tree{digest: d, body: b})
		}
	}
	sc.dirs[n.rel] = d
	sc.dirState[n.rel] = dirState{entries: n.entries, digest: d}
	return d
}

// sameEntry reports whether two entries encode the same.
func sameEntry(a, b entry) bool {
	return a.Name == b.Name && a.Type == b.Type && a.Mode == b.Mode && a.Size == b.Size && a.MTime == b.MTime &&
		a.Tree == b.Tree && a.Target == b.Target && slices.Equal(a.Chunks, b.Chunks) && a.Pack == b.Pack && a.Off == b.Off
}

func sigOf(s *unix.Stat_t) statSig {
	return statSig{ino: s.Ino, size: s.Size, mtime: s.Mtim.Nano(), ctime: s.Ctim.Nano(), mode: s.Mode}
}
