package deniedpath

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// ErrTooMany is the error of Find when a workspace holds more matches than its limit.
var ErrTooMany = errors.New("too many paths under denied globs")

// Find walks the host directory root, which a call's container sees at WorkspaceRoot, and returns the
// paths in it that match a denied glob, relative to root ("a/.env", ".ssh"), every directory and
// dot-directory included. A directory that matches is listed and not entered: hiding it hides what it
// holds. The walk never follows a symbolic link, and lists a link that matches like any other name (the
// caller decides what hiding one means). More than limit matches (limit > 0) is ErrTooMany. A nil *Set
// finds nothing and reads nothing.
//
// A matched file's content under another name is found too: every other hard link to a file that
// matches, or that a matching directory holds, anywhere in the tree ("notes.txt" when it is a second name
// of ".env"), is listed after the matches. Find reads the matching directories for this (at most
// maxLinkedScan names; more is ErrTooMany) and stats only the names whose inode number is one of theirs.
//
// Find matches every name once against an automaton of the globs' segments, so a 10k-file tree costs a
// few milliseconds; it reads directories only (getdents), it stats nothing but hard link candidates.
func (d *Set) Find(root string, limit int) ([]string, error) {
	return d.find(root, limit, nil)
}

func (d *Set) find(root string, limit int, cache *dirCache) ([]string, error) {
	if d == nil {
		return nil, nil
	}
	f := finder{set: d, limit: limit, segs: make([][]segment, len(d.globs)), cache: cache, began: time.Now()}
	for i, g := range d.globs {
		if len(g.segments) >= 64 {
			f.slow = true // the automaton keeps a glob's positions in one uint64
		}
		for _, s := range g.folded {
			f.segs[i] = append(f.segs[i], compileSegment(s))
		}
	}
	start := make([]uint64, len(d.globs))
	for i := range start {
		start[i] = f.closure(i, 1)
	}
	var state []uint64
	if !f.slow {
		state = make([]uint64, len(start))
		if !f.step(start, strings.TrimPrefix(WorkspaceRoot, "/"), state) { // WorkspaceRoot is one segment
			return nil, nil // no glob reaches into the workspace
		}
	}
	fd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("find denied paths in %s: %w", root, err)
	}
	defer unix.Close(fd)
	f.root = fd
	if err := f.walk("", state); err != nil {
		return nil, fmt.Errorf("find denied paths in %s: %w", root, err)
	}
	if err := f.addLinks(); err != nil {
		return nil, fmt.Errorf("find denied paths in %s: %w", root, err)
	}
	return f.found, nil
}

// maxLinkedScan bounds the names Find reads inside matching directories to find other names of their files.
const maxLinkedScan = 100000

// fileRef is a name in the tree that is not a directory, with the inode number its directory lists.
type fileRef struct {
	rel string
	ino uint64
}

// addLinks adds to the matches every other name of a file they hold: the names outside them whose inode
// number is one of a matched file's, confirmed by fstatat (device and inode) on both.
func (f *finder) addLinks() error {
	hidden := map[uint64][]string{}
	for _, h := range f.hitRefs {
		hidden[h.ino] = append(hidden[h.ino], h.rel)
		if !h.dir {
			continue
		}
		if err := f.scanHidden(h.rel, hidden); err != nil {
			return err
		}
	}
	if len(hidden) == 0 {
		return nil
	}
	seen := map[string]bool{}
	for _, dir := range f.files {
		for _, c := range dir {
			if names := hidden[c.ino]; len(names) > 0 && !seen[c.rel] {
				if err := f.addLink(c, names, seen); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// addLink adds c to the matches when it is another name of the file at one of names.
func (f *finder) addLink(c fileRef, names []string, seen map[string]bool) error {
	var cst unix.Stat_t
	if err := unix.Fstatat(f.root, c.rel, &cst, unix.AT_SYMLINK_NOFOLLOW); err != nil || cst.Mode&unix.S_IFMT == unix.S_IFDIR {
		return nil // gone since, or not what the directory said
	}
	for _, n := range names {
		var hst unix.Stat_t
		if err := unix.Fstatat(f.root, n, &hst, unix.AT_SYMLINK_NOFOLLOW); err != nil || hst.Dev != cst.Dev || hst.Ino != cst.Ino {
			continue
		}
		if f.limit > 0 && len(f.found) >= f.limit {
			return fmt.Errorf("%w: more than %d (the first ones: %s)", ErrTooMany, f.limit, strings.Join(f.found[:min(5, len(f.found))], ", "))
		}
		f.found = append(f.found, c.rel)
		seen[c.rel] = true
		return nil
	}
	return nil
}

// scanHidden adds the inode numbers of the files beneath the matched directory rel to hidden.
func (f *finder) scanHidden(rel string, hidden map[uint64][]string) error {
	return f.readDir(rel, func(name string, typ byte, ino uint64) error {
		f.scanned++
		if f.scanned > maxLinkedScan {
			return fmt.Errorf("%w: the hidden directories hold more than %d names", ErrTooMany, maxLinkedScan)
		}
		p := join(rel, name)
		if typ == unix.DT_DIR {
			return f.scanHidden(p, hidden)
		}
		if typ == unix.DT_UNKNOWN {
			if err := f.scanHidden(p, hidden); err != nil {
				return err
			}
		}
		hidden[ino] = append(hidden[ino], p)
		return nil
	})
}

// readDir calls fn for each entry of the directory rel beneath the root (never through a link); a
// directory gone, or not one, has none.
func (f *finder) readDir(rel string, fn func(name string, typ byte, ino uint64) error) error {
	fd, err := unix.Openat2(f.root, cmp.Or(rel, "."), &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
			return nil
		}
		return fmt.Errorf("open %s: %w", rel, err)
	}
	defer unix.Close(fd)
	return f.readEntries(fd, cmp.Or(rel, "."), fn)
}

// readEntries calls fn for each entry of the open directory fd (named name in errors), "." and ".."
// left out, with the type and inode number getdents gives.
func (f *finder) readEntries(fd int, name string, fn func(name string, typ byte, ino uint64) error) error {
	buf := f.buf()
	defer f.putBuf(buf)
	for {
		n, err := unix.Getdents(fd, buf)
		if err != nil {
			return fmt.Errorf("read directory %s: %w", name, err)
		}
		if n <= 0 {
			return nil
		}
		for b := buf[:n]; len(b) >= direntHeader; {
			reclen := int(binary.NativeEndian.Uint16(b[16:18]))
			if reclen < direntHeader || reclen > len(b) {
				return fmt.Errorf("read directory %s: a malformed entry", name)
			}
			ino, typ, nameBytes := binary.NativeEndian.Uint64(b[0:8]), b[18], b[direntHeader:reclen]
			b = b[reclen:]
			if i := bytes.IndexByte(nameBytes, 0); i >= 0 {
				nameBytes = nameBytes[:i]
			}
			if entry := string(nameBytes); entry != "." && entry != ".." {
				if err := fn(entry, typ, ino); err != nil {
					return err
				}
			}
		}
	}
}

type finder struct {
	set   *Set
	segs  [][]segment
	slow  bool // a glob too long for the automaton: match every full path
	limit int
	found []string
	// hitRefs are the matches with their inode numbers, files the names that are not directories: what
	// addLinks compares.
	hitRefs []hitRef
	files   [][]fileRef
	scanned int // names read inside matched directories
	bufs    [][]byte
	root    int       // the tree's root, O_PATH
	cache   *dirCache // nil: read every directory
	began   time.Time
}

// walk lists the directory rel beneath the root, whose automaton state is state, and those beneath it.
// With a cache, a directory whose identity and change time are what they were at an earlier walk is not
// read again: its matches and subdirectories are the cache's.
func (f *finder) walk(rel string, state []uint64) error {
	name := cmp.Or(rel, ".")
	if f.cache != nil {
		var st unix.Stat_t
		if err := unix.Fstatat(f.root, name, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil {
			if e := f.cache.dirs[rel]; e != nil && e.id == idOf(&st) {
				return f.replay(e)
			}
		}
	}
	fd, err := unix.Openat2(f.root, name, &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		if rel != "" && (errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR)) {
			return nil // gone, or not a directory (any more): nothing beneath it to hide
		}
		return fmt.Errorf("open %s: %w", name, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("stat %s: %w", name, err)
	}
	e := &cachedDir{id: idOf(&st)}
	if f.cache != nil {
		f.cache.reads++
	}
	next := make([]uint64, len(state))
	err = f.readEntries(fd, name, func(entry string, typ byte, ino uint64) error {
		var hit, alive bool
		if f.slow {
			_, hit = f.set.Match(WorkspaceRoot + "/" + join(rel, entry))
			alive = true
		} else {
			alive = f.step(state, strings.ToLower(entry), next)
			hit = f.accepts(next)
		}
		if hit {
			e.hits = append(e.hits, join(rel, entry))
			e.hitRefs = append(e.hitRefs, hitRef{rel: join(rel, entry), ino: ino, dir: typ == unix.DT_DIR || typ == unix.DT_UNKNOWN})
			return nil
		}
		if typ != unix.DT_DIR {
			e.files = append(e.files, fileRef{rel: join(rel, entry), ino: ino})
		}
		// DT_UNKNOWN (a filesystem without types): try it as a directory.
		if alive && (typ == unix.DT_DIR || typ == unix.DT_UNKNOWN) {
			e.subdirs = append(e.subdirs, join(rel, entry))
			e.states = append(e.states, slices.Clone(next))
		}
		return nil
	})
	if err != nil {
		return err
	}
	// Only a directory last changed well before this walk began is kept: a change after the walk read it
	// then has a later change time, even where the file system's clock is coarse.
	if f.cache != nil && time.Unix(st.Ctim.Unix()).Before(f.began.Add(-f.cache.racy)) {
		f.cache.dirs[rel] = e
	}
	return f.replay(e)
}

// replay adds a directory's matches and walks its subdirectories.
func (f *finder) replay(e *cachedDir) error {
	for _, h := range e.hits {
		if f.limit > 0 && len(f.found) >= f.limit {
			return fmt.Errorf("%w: more than %d (the first ones: %s)", ErrTooMany, f.limit, strings.Join(f.found[:min(5, len(f.found))], ", "))
		}
		f.found = append(f.found, h)
	}
	f.hitRefs = append(f.hitRefs, e.hitRefs...)
	if len(e.files) > 0 {
		f.files = append(f.files, e.files) // the directory's own slice: nothing copied
	}
	for i, sub := range e.subdirs {
		if err := f.walk(sub, e.states[i]); err != nil {
			return err
		}
	}
	return nil
}

// racyChange is how long before a walk a directory must have last changed for the walk's reading of it to
// be cached: more than the coarsest file system timestamp granularity (a jiffy) by far.
const racyChange = 100 * time.Millisecond

// dirID is what tells that a directory is the one a cached reading was of, unchanged: a directory's change
// time moves with every entry created, removed or renamed in it.
type dirID struct {
	dev, ino     uint64
	ctime, mtime int64 // nanoseconds
}

func idOf(st *unix.Stat_t) dirID {
	return dirID{dev: st.Dev, ino: st.Ino, ctime: st.Ctim.Nano(), mtime: st.Mtim.Nano()}
}

// cachedDir is one directory's reading: its matches and the subdirectories to walk, with their states.
type cachedDir struct {
	id      dirID
	hits    []string
	hitRefs []hitRef
	files   []fileRef // the names that are not directories, for addLinks
	subdirs []string
	states  [][]uint64
}

// hitRef is a match with the inode number its directory lists, and whether it is (or may be) a directory.
type hitRef struct {
	rel string
	ino uint64
	dir bool
}

// dirCache holds the readings of one tree, for one set of globs, by relative path ("" the root).
type dirCache struct {
	dirs  map[string]*cachedDir
	racy  time.Duration // racyChange; tests shorten it
	reads int           // directories the last walk read
}

// Finder is Set.Find with a memory: it keeps, per tree and set of globs, the readings of directories that
// had not changed for a while, and reads again only those whose identity or change time moved (a
// stat instead of reading and matching every name). The answers are Set.Find's. Safe for concurrent
// use; walks of one tree with the same globs take turns.
type Finder struct {
	mu    sync.Mutex
	trees map[string]*finderTree
	racy  time.Duration // racyChange when zero; tests shorten it
}

type finderTree struct {
	mu    sync.Mutex
	cache dirCache
}

// maxFinderTrees bounds a Finder's memory: past it, a tree's readings are dropped to make room.
const maxFinderTrees = 256

// Find is d.Find(root, limit), with the readings kept from earlier walks of root with the same globs.
func (fi *Finder) Find(d *Set, root string, limit int) ([]string, error) {
	if d == nil {
		return nil, nil
	}
	key := root
	for _, g := range d.globs {
		key += "\x00" + g.source
	}
	fi.mu.Lock()
	if fi.trees == nil {
		fi.trees = map[string]*finderTree{}
	}
	t := fi.trees[key]
	if t == nil {
		for k := range fi.trees {
			if len(fi.trees) < maxFinderTrees {
				break
			}
			delete(fi.trees, k)
		}
		t = &finderTree{cache: dirCache{dirs: map[string]*cachedDir{}, racy: cmp.Or(fi.racy, racyChange)}}
		fi.trees[key] = t
	}
	fi.mu.Unlock()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.cache.reads = 0
	found, err := d.find(root, limit, &t.cache)
	if err != nil {
		clear(t.cache.dirs)
	}
	return found, err
}

// direntHeader is the size of linux_dirent64 before its name: inode, offset, record length, type.
const direntHeader = 19

// buf returns a buffer for getdents, reused across the directories of one walk.
func (f *finder) buf() []byte {
	if n := len(f.bufs); n > 0 {
		b := f.bufs[n-1]
		f.bufs = f.bufs[:n-1]
		return b
	}
	return make([]byte, 32<<10)
}

func (f *finder) putBuf(b []byte) { f.bufs = append(f.bufs, b) }

func join(rel, name string) string {
	if rel == "" {
		return name
	}
	return rel + "/" + name
}

// accepts reports whether a glob has matched in state.
func (f *finder) accepts(state []uint64) bool {
	for i, s := range state {
		if s&(1<<len(f.segs[i])) != 0 {
			return true
		}
	}
	return false
}

// step consumes one name segment from state into next (of the same length); alive is false when no glob
// can match anything beneath it.
func (f *finder) step(state []uint64, name string, next []uint64) (alive bool) {
	for i, s := range state {
		segs := f.segs[i]
		var n uint64
		for pos := 0; s != 0 && pos < len(segs); pos++ {
			if s&(1<<pos) == 0 {
				continue
			}
			s &^= 1 << pos
			switch {
			case segs[pos].any:
				n |= 1 << pos
			case segs[pos].match(name):
				n |= 1 << (pos + 1)
			}
		}
		if n != 0 {
			n = f.closure(i, n)
			alive = alive || n&^(1<<len(segs)) != 0
		}
		next[i] = n
	}
	return alive
}

// closure adds to the positions s of glob i the ones a "**" may skip to (it matches zero segments).
func (f *finder) closure(i int, s uint64) uint64 {
	for pos, seg := range f.segs[i] {
		if seg.any && s&(1<<pos) != 0 {
			s |= 1 << (pos + 1)
		}
	}
	return s
}

// segment is one compiled glob segment: "**", a literal, a "*" with a literal suffix or prefix, or any
// other path.Match pattern.
type segment struct {
	any              bool // "**"
	pattern, literal string
	kind             byte // 'l' literal, 's' "*suffix", 'p' "prefix*", 'm' path.Match
	// head and tail are the literal text a path.Match pattern starts and ends with: a cheap first test.
	head, tail string
}

func compileSegment(s string) segment {
	const meta = `*?[\`
	switch {
	case s == "**":
		return segment{any: true}
	case !strings.ContainsAny(s, meta):
		return segment{kind: 'l', literal: s}
	case s[0] == '*' && !strings.ContainsAny(s[1:], meta):
		return segment{kind: 's', literal: s[1:]}
	case s[len(s)-1] == '*' && !strings.ContainsAny(s[:len(s)-1], meta):
		return segment{kind: 'p', literal: s[:len(s)-1]}
	}
	head := s[:strings.IndexAny(s, meta)]
	tail := "" // after the last "*" or "?", unless a class or an escape makes the end hard to read
	if !strings.ContainsAny(s, `[\`) {
		tail = s[strings.LastIndexAny(s, "*?")+1:]
	}
	return segment{kind: 'm', pattern: s, head: head, tail: tail}
}

func (s segment) match(name string) bool {
	switch s.kind {
	case 'l':
		return name == s.literal
	case 's':
		return strings.HasSuffix(name, s.literal)
	case 'p':
		return strings.HasPrefix(name, s.literal)
	}
	if !strings.HasPrefix(name, s.head) || !strings.HasSuffix(name, s.tail) {
		return false
	}
	ok, _ := path.Match(s.pattern, name)
	return ok
}
