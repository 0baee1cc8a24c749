package checkpoint

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"
)

// Restore brings this worker's copy of the workspace Dir/<tenant>/<name> to its latest checkpoint, which
// any worker may have written: it fetches only the trees that differ from the local copy's and the files
// whose chunks differ, writes each file beside its place and renames it into place, and removes what the
// checkpoint does not have. A workspace without a checkpoint is left as it is (Result.Changed false); one
// whose checkpoint says it was deleted is removed. When the head is still the one this worker last saved
// or restored, the copy is left as it is without being read: changes of a Save that failed are kept for
// the next Save, never undone. A copy this worker knows nothing of (it restarted) is made the head's.
//
// A Restore that fails (the store unreachable, a corrupt object) returns the error with the copy partly
// updated, every file either as it was or as the checkpoint has it; the next Restore finishes the job.
// The caller keeps calls out of the workspace meanwhile.
func (c *Checkpointer) Restore(ctx context.Context, tenant, name string) (res Result, err error) {
	defer c.observe("restore", time.Now(), &res, &err)
	return c.restore(ctx, tenant, name)
}

// restoreTries bounds how many heads one Restore tries: each try after the first follows a head that
// moved while the one before was fetched.
const restoreTries = 3

// restore is Restore, unobserved. An object missing from the store while a head is fetched is one
// garbage collection removed after a later checkpoint replaced that head (Collect): restore then brings
// the copy to the head that replaced it.
func (c *Checkpointer) restore(ctx context.Context, tenant, name string) (res Result, err error) {
	st := c.state(tenant, name)
	defer st.mu.Unlock()
	for try := 1; ; try++ {
		res, err = c.restoreHead(ctx, tenant, name, st)
		if err == nil || try == restoreTries || !errors.Is(err, os.ErrNotExist) {
			return res, err
		}
		if h, _, ok, herr := c.readHead(ctx, tenant, name); herr != nil || !ok || h == res.Head {
			return res, err // the head did not move: the store lost an object its head names
		}
	}
}

// restoreHead brings the copy, whose state st is locked, to the workspace's head as it reads it now; the
// Result's Head is that head.
func (c *Checkpointer) restoreHead(ctx context.Context, tenant, name string, st *wsState) (Result, error) {
	start := time.Now()
	h, rev, ok, err := c.readHead(ctx, tenant, name)
	if err != nil {
		return Result{}, fmt.Errorf("restore workspace %s/%s: %w", tenant, name, err)
	}
	if !ok {
		return Result{}, nil
	}
	res := Result{Head: h}
	if st.head.Tree != "" && st.head == h && !h.Deleted && !c.hasCopy(tenant, name) {
		// The copy was removed behind this worker's back (the workspaces sweep expired it): it is not at
		// the head, it is not there. Restore it whole.
		st.head, st.headRev, st.files, st.dirs = Head{}, 0, nil, nil
	}
	if st.head.Tree != "" && st.head == h {
		st.headRev = rev
		// Nobody checkpointed the workspace since this worker last did or restored it: its copy is at
		// the head, or ahead of it by changes a failed Save left to the next one, which are not undone.
		res.Took = time.Since(start)
		return res, nil
	}
	if h.Deleted {
		if err := c.removeWorkspace(tenant, name); err != nil {
			return res, fmt.Errorf("restore workspace %s/%s (deleted): %w", tenant, name, err)
		}
		st.head, st.headRev, st.files, st.dirs = h, rev, nil, nil
		res.Changed, res.Took = true, time.Since(start)
		return res, nil
	}
	root, err := c.makeWorkspace(tenant, name)
	if err != nil {
		return res, fmt.Errorf("restore workspace %s/%s: %w", tenant, name, err)
	}
	defer unix.Close(root)
	// The local copy as it is (by stat, against what this worker last knew of it): a call that ran here
	// and was not saved, or a copy this worker never saved or restored, is compared by content.
	local, err := c.scan(ctx, root, tenant, st, nil)
	if err != nil {
		return res, fmt.Errorf("restore workspace %s/%s: read local copy: %w", tenant, name, err)
	}
	if local.root == h.Tree {
		st.head, st.headRev, st.files, st.dirs = h, rev, local.files, local.dirState
		res.Took = time.Since(start)
		return res, nil
	}
	a := &applier{c: c, root: root, tenant: tenant, local: local, written: map[string]fileState{}}
	if err := a.dir(ctx, "", h.Tree, 0); err != nil {
		return res, fmt.Errorf("restore workspace %s/%s: %w", tenant, name, err)
	}
	if err := a.writeAll(ctx); err != nil {
		return res, fmt.Errorf("restore workspace %s/%s: %w", tenant, name, err)
	}
	// What the copy is now, by stat: the files written are known by the stat taken as they were written.
	known := &wsState{files: local.files, dirs: local.dirState}
	for p, f := range a.written {
		known.files[p] = f
	}
	after, err := c.scan(ctx, root, tenant, known, nil)
	if err != nil {
		return res, fmt.Errorf("restore workspace %s/%s: read restored copy: %w", tenant, name, err)
	}
	if after.root != h.Tree {
		return res, fmt.Errorf("restore workspace %s/%s: the restored copy does not match checkpoint %d (%s): it changed while it was restored", tenant, name, h.Seq, h.Tree)
	}
	st.head, st.headRev, st.files, st.dirs = h, rev, after.files, after.dirState
	res.Changed, res.Files, res.Chunks, res.Bytes, res.Took = true, len(a.jobs), a.chunks, a.bytes, time.Since(start)
	res.Moved = h.Worker != c.cfg.Worker
	return res, nil
}

// hasCopy reports whether Dir/<tenant>/<name> is there (an error to open it counts as there: the call's
// own opening of its workspace reports it).
func (c *Checkpointer) hasCopy(tenant, name string) bool {
	fd, exists, err := c.openWorkspace(tenant, name)
	if exists {
		unix.Close(fd)
	}
	return exists || err != nil
}

// removeWorkspace removes Dir/<tenant>/<name> if it is there.
func (c *Checkpointer) removeWorkspace(tenant, name string) error {
	base, err := unix.Open(c.cfg.Dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open workspaces dir: %w", err)
	}
	defer unix.Close(base)
	t, err := openDir(base, tenant)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("open tenant dir %s: %w", tenant, err)
	}
	defer unix.Close(t)
	return removeAt(t, name)
}

// applier makes a local copy what a checkpoint's trees say.
type applier struct {
	c      *Checkpointer
	root   int
	tenant string
	local  *scanned
	jobs   []writeJob

	mu      sync.Mutex
	written map[string]fileState
	chunks  int
	bytes   int64
}

// writeJob is a file to fetch and write.
type writeJob struct {
	rel string
	e   entry
}

// dir makes directory rel (which exists) hold what tree digest lists: directories and symlinks at once,
// files as jobs for later.
func (a *applier) dir(ctx context.Context, rel, digest string, depth int) error {
	if depth > MaxDepth {
		return ErrTooDeep
	}
	if a.local.dirs[rel] == digest {
		return nil // the same already
	}
	want, err := a.c.getTree(ctx, a.tenant, digest)
	if err != nil {
		return err
	}
	fd, err := openDir(a.root, rel)
	if err != nil {
		return fmt.Errorf("open directory %q: %w", rel, err)
	}
	defer unix.Close(fd)
	dup, err := openDir(fd, "") // its own offset: a dup would share fd's, read to its end before
	if err != nil {
		return err
	}
	d := os.NewFile(uintptr(dup), rel)
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return fmt.Errorf("read directory %q: %w", rel, err)
	}
	wanted := make(map[string]bool, len(want))
	for _, e := range want {
		wanted[e.Name] = true
	}
	for _, n := range names {
		if !wanted[n] {
			if err := removeAt(fd, n); err != nil {
				return err
			}
		}
	}
	for _, e := range want {
		p := join(rel, e.Name)
		var s unix.Stat_t
		err := unix.Fstatat(fd, e.Name, &s, unix.AT_SYMLINK_NOFOLLOW)
		have := uint32(0)
		switch {
		case err == nil:
			have = s.Mode & unix.S_IFMT
		case !errors.Is(err, unix.ENOENT):
			return fmt.Errorf("stat %q: %w", p, err)
		}
		switch e.Type {
		case typeDir:
			if have != 0 && have != unix.S_IFDIR {
				if err := removeAt(fd, e.Name); err != nil {
					return err
				}
				have = 0
			}
			if have == 0 {
				if err := unix.Mkdirat(fd, e.Name, 0o755); err != nil {
					return fmt.Errorf("create directory %q: %w", p, err)
				}
				if err := a.c.own(fd, e.Name); err != nil {
					return err
				}
			}
			if err := unix.Fchmodat(fd, e.Name, e.Mode, 0); err != nil {
				return fmt.Errorf("chmod %q: %w", p, err)
			}
			if err := a.dir(ctx, p, e.Tree, depth+1); err != nil {
				return err
			}
		case typeSymlink:
			if have == unix.S_IFLNK {
				buf := make([]byte, unix.PathMax)
				if n, err := unix.Readlinkat(fd, e.Name, buf); err == nil && string(buf[:n]) == e.Target {
					continue
				}
			}
			tmp := tempName()
			if err := unix.Symlinkat(e.Target, fd, tmp); err != nil {
				return fmt.Errorf("create symlink %q: %w", p, err)
			}
			if err := a.c.own(fd, tmp); err != nil {
				_ = unix.Unlinkat(fd, tmp, 0)
				return err
			}
			if err := a.replace(fd, tmp, e.Name, have); err != nil {
				return err
			}
		case typeFile:
			if k, ok := a.local.files[p]; ok && have == unix.S_IFREG && slices.Equal(k.chunks, e.Chunks) {
				// The same bytes: the copy keeps them where the checkpoint has them (a file read
				// back has no pack of its own), so that its tree is the checkpoint's.
				k.pack, k.off = e.Pack, e.Off
				a.local.files[p] = k
				if s.Mode&0o777 != e.Mode {
					if err := unix.Fchmodat(fd, e.Name, e.Mode, 0); err != nil {
						return fmt.Errorf("chmod %q: %w", p, err)
					}
				}
				if s.Mtim.Nano() != e.MTime {
					// Touched without a change of its bytes: its time is the checkpoint's too.
					ts := unix.NsecToTimespec(e.MTime)
					if err := unix.UtimesNanoAt(fd, e.Name, []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW); err != nil {
						return fmt.Errorf("set times of %q: %w", p, err)
					}
				}
				continue
			}
			a.jobs = append(a.jobs, writeJob{rel: p, e: e})
		}
	}
	return nil
}

// replace renames tmp over name in dirfd; a directory there (have) is removed first.
func (a *applier) replace(dirfd int, tmp, name string, have uint32) error {
	if have == unix.S_IFDIR {
		if err := removeAt(dirfd, name); err != nil {
			_ = unix.Unlinkat(dirfd, tmp, 0)
			return err
		}
	}
	if err := unix.Renameat(dirfd, tmp, dirfd, name); err != nil {
		_ = unix.Unlinkat(dirfd, tmp, 0)
		return fmt.Errorf("rename %q into place: %w", name, err)
	}
	return nil
}

// writeAll fetches and writes the files of the jobs, Parallel at a time: each pack the files need is
// fetched once, and its files written from it; a file of chunks is fetched chunk by chunk.
func (a *applier) writeAll(ctx context.Context) error {
	byPack := map[string][]writeJob{}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(a.c.cfg.Parallel)
	for _, j := range a.jobs {
		if j.e.Pack != "" {
			byPack[j.e.Pack] = append(byPack[j.e.Pack], j)
			continue
		}
		g.Go(func() error { return a.write(gctx, j, nil) })
	}
	for d, jobs := range byPack {
		g.Go(func() error { return a.writePack(gctx, d, jobs) })
	}
	return g.Wait()
}

// writePack fetches pack d and writes the files of jobs from it, each checked against its digest.
func (a *applier) writePack(ctx context.Context, d string, jobs []writeJob) error {
	pack, err := readObject(ctx, a.c.store, packName(a.tenant, d), d, MaxPackBytes)
	if err != nil {
		return fmt.Errorf("fetch pack %s of %q and %d other files: %w", d, jobs[0].rel, len(jobs)-1, err)
	}
	a.mu.Lock()
	a.chunks++
	a.mu.Unlock()
	for _, j := range jobs {
		end := j.e.Off + j.e.Size
		if end > int64(len(pack)) {
			return fmt.Errorf("fetch %q: pack %s holds %d bytes, not the %d..%d its checkpoint names (corrupt store)", j.rel, d, len(pack), j.e.Off, end)
		}
		b := pack[j.e.Off:end]
		if sum := sha256.Sum256(b); hex.EncodeToString(sum[:]) != j.e.Chunks[0] {
			return fmt.Errorf("fetch %q: its bytes in pack %s do not match its digest (corrupt store)", j.rel, d)
		}
		if err := a.write(ctx, j, b); err != nil {
			return err
		}
	}
	return nil
}

// write writes a file into a new file beside it and renames that into place: its bytes are packed, or
// (packed nil) its chunks are fetched.
func (a *applier) write(ctx context.Context, j writeJob, packed []byte) (err error) {
	parent, leaf := splitRel(j.rel)
	dfd, err := openDir(a.root, parent)
	if err != nil {
		return fmt.Errorf("open directory %q: %w", parent, err)
	}
	defer unix.Close(dfd)
	tmp := tempName()
	fd, err := openAt(dfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL)
	if err != nil {
		return fmt.Errorf("create %q: %w", j.rel, err)
	}
	f := os.NewFile(uintptr(fd), tmp)
	defer func() {
		if f != nil {
			f.Close()
		}
		if err != nil {
			_ = unix.Unlinkat(dfd, tmp, 0)
		}
	}()
	var n int64
	if j.e.Pack != "" {
		if _, err := f.Write(packed); err != nil {
			return fmt.Errorf("write %q: %w", j.rel, err)
		}
		n = int64(len(packed))
	} else if n, err = a.fetchChunks(ctx, j, f); err != nil {
		return err
	}
	if err := f.Chmod(os.FileMode(j.e.Mode)); err != nil {
		return fmt.Errorf("chmod %q: %w", j.rel, err)
	}
	if a.c.chown {
		if err := f.Chown(a.c.cfg.UID, a.c.cfg.GID); err != nil {
			return fmt.Errorf("chown %q: %w", j.rel, err)
		}
	}
	ts := unix.NsecToTimespec(j.e.MTime)
	if err := unix.UtimesNanoAt(dfd, tmp, []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("set times of %q: %w", j.rel, err)
	}
	err = f.Close()
	f = nil
	if err != nil {
		return fmt.Errorf("write %q: %w", j.rel, err)
	}
	var s unix.Stat_t
	have := uint32(0)
	if unix.Fstatat(dfd, leaf, &s, unix.AT_SYMLINK_NOFOLLOW) == nil {
		have = s.Mode & unix.S_IFMT
	}
	if err := a.replace(dfd, tmp, leaf, have); err != nil {
		return err
	}
	if err := unix.Fstatat(dfd, leaf, &s, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("stat %q: %w", j.rel, err)
	}
	a.mu.Lock()
	a.written[j.rel] = fileState{sig: sigOf(&s), chunks: j.e.Chunks, pack: j.e.Pack, off: j.e.Off}
	if j.e.Pack == "" {
		a.chunks += len(j.e.Chunks)
	}
	a.bytes += n
	a.mu.Unlock()
	return nil
}

// fetchChunks fetches the chunks of j's file into f and returns how many bytes they hold.
func (a *applier) fetchChunks(ctx context.Context, j writeJob, f *os.File) (int64, error) {
	var n int64
	for _, d := range j.e.Chunks {
		b, err := readObject(ctx, a.c.store, chunkName(a.tenant, d), d, MaxChunkBytes)
		if err != nil {
			return n, fmt.Errorf("fetch %q: %w", j.rel, err)
		}
		if _, err := f.Write(b); err != nil {
			return n, fmt.Errorf("write %q: %w", j.rel, err)
		}
		n += int64(len(b))
	}
	return n, nil
}

// tempName is a name for a file being written beside its place.
func tempName() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return ".tp-restore-" + hex.EncodeToString(b[:])
}
