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
// Find matches every name once against an automaton of the globs' segments, so a 10k-file tree costs a
// few milliseconds; it reads directories only (getdents), it stats nothing.
func (d *Set) Find(root string, limit int) ([]string, error) {
	if d == nil {
		return nil, nil
	}
	f := finder{set: d, limit: limit, segs: make([][]segment, len(d.globs))}
	for i, g := range d.globs {
		if len(g.segments) >= 64 {
			f.slow = true // the automaton keeps a glob's positions in one uint64
		}
		for _, s := range g.segments {
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
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("find denied paths in %s: %w", root, err)
	}
	if err := f.walk(fd, "", state); err != nil {
		return nil, fmt.Errorf("find denied paths in %s: %w", root, err)
	}
	return f.found, nil
}

type finder struct {
	set   *Set
	segs  [][]segment
	slow  bool // a glob too long for the automaton: match every full path
	limit int
	found []string
	bufs  [][]byte
}

// walk lists the directory fd (which it closes), rel beneath the root, whose automaton state is state.
func (f *finder) walk(fd int, rel string, state []uint64) error {
	defer unix.Close(fd)
	var subdirs []string
	var subStates [][]uint64
	next := make([]uint64, len(state))
	buf := f.buf()
	defer f.putBuf(buf)
	for {
		n, err := unix.Getdents(fd, buf)
		if err != nil {
			return fmt.Errorf("read directory %s: %w", cmp.Or(rel, "."), err)
		}
		if n <= 0 {
			break
		}
		for b := buf[:n]; len(b) >= direntHeader; {
			reclen := int(binary.NativeEndian.Uint16(b[16:18]))
			if reclen < direntHeader || reclen > len(b) {
				return fmt.Errorf("read directory %s: a malformed entry", cmp.Or(rel, "."))
			}
			typ, nameBytes := b[18], b[direntHeader:reclen]
			b = b[reclen:]
			if i := bytes.IndexByte(nameBytes, 0); i >= 0 {
				nameBytes = nameBytes[:i]
			}
			name := string(nameBytes)
			if name == "." || name == ".." {
				continue
			}
			var hit, alive bool
			if f.slow {
				_, hit = f.set.Match(WorkspaceRoot + "/" + join(rel, name))
				alive = true
			} else {
				alive = f.step(state, name, next)
				hit = f.accepts(next)
			}
			if hit {
				if f.limit > 0 && len(f.found) >= f.limit {
					return fmt.Errorf("%w: more than %d (the first ones: %s)", ErrTooMany, f.limit, strings.Join(f.found[:min(5, len(f.found))], ", "))
				}
				f.found = append(f.found, join(rel, name))
				continue
			}
			// DT_UNKNOWN (a filesystem without types): try it as a directory.
			if alive && (typ == unix.DT_DIR || typ == unix.DT_UNKNOWN) {
				subdirs = append(subdirs, name)
				subStates = append(subStates, slices.Clone(next))
			}
		}
	}
	for i, name := range subdirs {
		sub, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
				continue // gone, or not a directory (any more): nothing beneath it to hide
			}
			return fmt.Errorf("open %s: %w", join(rel, name), err)
		}
		if err := f.walk(sub, join(rel, name), subStates[i]); err != nil {
			return err
		}
	}
	return nil
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
