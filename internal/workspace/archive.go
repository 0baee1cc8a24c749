package workspace

import (
	"archive/tar"
	"archive/zip"
	"bufio"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"
)

// An archive is extracted in two passes over a local copy: the first reads every header, checks each
// entry against the rules below and against the workspace as it stands, and writes nothing; the second
// writes the entries the first accepted. A refused archive leaves the workspace as it was.
//
// Refused: absolute names, ".." components, names that are not clean UTF-8 paths, names that collide
// with another entry or only differ from one in case, hard links, devices, FIFOs and other special files,
// setuid and setgid bits, symlinks whose target is absolute or leaves the workspace, entries under a
// symlink (written through it) or under a file, entries that would write through a symlink or file
// already in the workspace, and more entries or bytes than the limits.

// Limits bound one archive.
type Limits struct {
	// Files is the most entries (files, directories and links) an archive may hold.
	Files int
	// Bytes is the most bytes its files may hold once extracted.
	Bytes int64
}

// entry is one checked archive entry.
type entry struct {
	name string // clean, relative to the extraction directory; "" for the directory itself
	kind byte   // 'd', 'f' or 'l'
	mode uint32 // permission bits
	size int64
	link string // a symlink's target
	mod  time.Time
}

// archive iterates the entries of an archive: next returns the raw header as an entry whose name is
// not yet checked, and a reader of a file's contents. io.EOF at the end.
type archive interface {
	next() (raw rawEntry, body io.Reader, err error)
}

// rawEntry is an entry as the archive states it.
type rawEntry struct {
	name     string
	typ      string // "file", "dir", "symlink", "hard link", "character device", "block device", "FIFO", ...
	mode     int64  // including setuid/setgid bits, in Unix encoding
	size     int64
	link     string
	mod      time.Time
	readLink func() (string, error) // zip keeps a symlink's target as its contents
}

// openArchive sniffs f (tar, tar.gz or zip) and returns an iterator from its start.
func openArchive(f *os.File) (archive, error) {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	head := make([]byte, 512)
	n, _ := io.ReadFull(f, head)
	head = head[:n]
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	switch {
	case n == 0:
		return nil, refuse("the archive is empty: send a tar, tar.gz or zip file")
	case bytes.HasPrefix(head, []byte{0x1f, 0x8b}):
		gz, err := gzip.NewReader(bufio.NewReader(f))
		if err != nil {
			return nil, refuse("the archive looks gzip-compressed but is not: %v", err)
		}
		return &tarArchive{tr: tar.NewReader(gz)}, nil
	case bytes.HasPrefix(head, []byte("PK\x03\x04")) || bytes.HasPrefix(head, []byte("PK\x05\x06")):
		st, err := f.Stat()
		if err != nil {
			return nil, err
		}
		zr, err := zip.NewReader(f, st.Size())
		if err != nil {
			return nil, refuse("the zip archive cannot be read: %v", err)
		}
		return &zipArchive{files: zr.File}, nil
	case n >= 262 && string(head[257:262]) == "ustar",
		n == 512 && bytes.Count(head, []byte{0}) == 512: // an empty tar (tar -cf x.tar -T /dev/null): its end blocks
		return &tarArchive{tr: tar.NewReader(bufio.NewReader(f))}, nil
	}
	return nil, refuse("the upload is not a tar, tar.gz or zip archive (its first bytes match none of them)")
}

type tarArchive struct{ tr *tar.Reader }

func (a *tarArchive) next() (rawEntry, io.Reader, error) {
	for {
		h, err := a.tr.Next()
		if err == io.EOF {
			return rawEntry{}, nil, io.EOF
		}
		if err != nil {
			return rawEntry{}, nil, refuse("the tar archive is malformed: %v", err)
		}
		r := rawEntry{name: h.Name, mode: h.Mode, size: h.Size, link: h.Linkname, mod: h.ModTime}
		switch h.Typeflag {
		case tar.TypeXGlobalHeader:
			continue // pax global metadata, not an entry
		case tar.TypeReg, tar.TypeRegA:
			r.typ = "file"
		case tar.TypeDir:
			r.typ = "dir"
		case tar.TypeSymlink:
			r.typ = "symlink"
		case tar.TypeLink:
			r.typ = "hard link"
		case tar.TypeChar:
			r.typ = "character device"
		case tar.TypeBlock:
			r.typ = "block device"
		case tar.TypeFifo:
			r.typ = "FIFO"
		default:
			r.typ = fmt.Sprintf("entry of tar type %q", h.Typeflag)
		}
		return r, a.tr, nil
	}
}

type zipArchive struct {
	files []*zip.File
	i     int
}

func (a *zipArchive) next() (rawEntry, io.Reader, error) {
	if a.i >= len(a.files) {
		return rawEntry{}, nil, io.EOF
	}
	f := a.files[a.i]
	a.i++
	m := f.Mode()
	r := rawEntry{name: f.Name, mode: int64(m.Perm()), size: int64(f.UncompressedSize64), mod: f.Modified}
	if m&os.ModeSetuid != 0 {
		r.mode |= 0o4000
	}
	if m&os.ModeSetgid != 0 {
		r.mode |= 0o2000
	}
	switch {
	case m&os.ModeSymlink != 0:
		r.typ = "symlink"
		r.readLink = func() (string, error) {
			if f.UncompressedSize64 > unix.PathMax {
				return "", refuse("the symlink %q has a target longer than %d bytes", f.Name, unix.PathMax)
			}
			rc, err := f.Open()
			if err != nil {
				return "", refuse("the zip entry %q cannot be read: %v", f.Name, err)
			}
			defer rc.Close()
			b, err := io.ReadAll(io.LimitReader(rc, unix.PathMax+1))
			if err != nil {
				return "", refuse("the zip entry %q cannot be read: %v", f.Name, err)
			}
			return string(b), nil
		}
		return r, nil, nil
	case m.IsDir():
		r.typ = "dir"
		return r, nil, nil
	case m&os.ModeNamedPipe != 0:
		r.typ = "FIFO"
	case m&os.ModeCharDevice != 0:
		r.typ = "character device"
	case m&os.ModeDevice != 0:
		r.typ = "block device"
	case m&os.ModeSocket != 0:
		r.typ = "socket"
	case m&os.ModeIrregular != 0:
		r.typ = "irregular file"
	default:
		r.typ = "file"
		rc, err := f.Open()
		if err != nil {
			return rawEntry{}, nil, refuse("the zip entry %q cannot be read: %v", f.Name, err)
		}
		return r, &closingReader{rc}, nil
	}
	return r, nil, nil
}

// closingReader closes a zip entry's reader at its end, so that a checksum mismatch surfaces as a read
// error.
type closingReader struct{ rc io.ReadCloser }

func (c *closingReader) Read(p []byte) (int, error) {
	n, err := c.rc.Read(p)
	if err == io.EOF {
		c.rc.Close()
	}
	return n, err
}

// checker holds what the first pass learned so far.
type checker struct {
	dest    string // the extraction directory relative to the workspace root
	limits  Limits
	root    int // the workspace, for checking what exists
	kinds   map[string]byte
	folded  map[string]string // lower-cased path -> path as named
	probed  map[string]error  // parent directories checked in the workspace
	entries []entry
	bytes   int64
}

// checkArchive runs the first pass over f: it refuses (a *Error of type invalid_params, or too_large for
// the limits) anything listed above and returns the entries to write into dest (already checked to be a
// clean relative path) of the workspace open as root.
func checkArchive(f *os.File, root int, dest string, limits Limits) ([]entry, error) {
	a, err := openArchive(f)
	if err != nil {
		return nil, err
	}
	c := &checker{dest: dest, limits: limits, root: root, kinds: map[string]byte{}, folded: map[string]string{}, probed: map[string]error{}}
	for {
		raw, body, err := a.next()
		if err == io.EOF {
			return c.entries, nil
		}
		if err != nil {
			return nil, err
		}
		e, err := c.check(raw)
		if err != nil {
			return nil, err
		}
		if e == nil {
			continue
		}
		if e.kind == 'f' && body != nil {
			// Read the contents now, so that a stream that does not hold what its header says (a corrupt
			// gzip, a zip whose checksum fails) is refused before anything is written.
			n, err := io.Copy(io.Discard, io.LimitReader(body, e.size+1))
			if err != nil {
				return nil, refuse("the archive's entry %q cannot be read: %v", raw.name, err)
			}
			if n != e.size {
				return nil, refuse("the archive's entry %q holds %d bytes, not the %d its header says", raw.name, n, e.size)
			}
		}
		c.entries = append(c.entries, *e)
	}
}

// check judges one entry; nil, nil for an entry to skip (the archive's own root directory).
func (c *checker) check(raw rawEntry) (*entry, error) {
	if len(c.entries) >= c.limits.Files {
		return nil, &Error{Type: TypeTooLarge, Msg: fmt.Sprintf("the archive holds more than %d entries, the limit: split it, or leave generated files out", c.limits.Files)}
	}
	name, err := cleanName(raw.name, raw.typ == "dir")
	if err != nil {
		return nil, err
	}
	switch raw.typ {
	case "file", "dir", "symlink":
	case "hard link":
		return nil, refuse("the archive's entry %q is a hard link (to %q): hard links are refused; archive the file itself (tar --hard-dereference)", raw.name, raw.link)
	default:
		return nil, refuse("the archive's entry %q is a %s: only files, directories and symlinks are accepted", raw.name, raw.typ)
	}
	if raw.mode&0o6000 != 0 {
		return nil, refuse("the archive's entry %q has the setuid or setgid bit (mode %o): remove it (chmod ug-s) and archive again", raw.name, raw.mode&0o7777)
	}
	if name == "" {
		if raw.typ != "dir" {
			return nil, refuse("the archive has an entry with an empty name")
		}
		return nil, nil
	}
	e := &entry{name: name, kind: map[string]byte{"file": 'f', "dir": 'd', "symlink": 'l'}[raw.typ], mode: uint32(raw.mode & 0o777), mod: raw.mod}
	switch e.kind {
	case 'f':
		e.size = raw.size
		if raw.size < 0 {
			return nil, refuse("the archive's entry %q has a negative size", raw.name)
		}
		c.bytes += raw.size
		if c.bytes > c.limits.Bytes {
			return nil, &Error{Type: TypeTooLarge, Msg: fmt.Sprintf("the archive holds more than %s of files, the limit: split it, or leave large files out", FormatBytes(c.limits.Bytes))}
		}
	case 'l':
		e.link = raw.link
		if raw.readLink != nil {
			if e.link, err = raw.readLink(); err != nil {
				return nil, err
			}
		}
		if err := c.checkLink(raw.name, name, e.link); err != nil {
			return nil, err
		}
	}
	if err := c.checkPlace(raw.name, name, e.kind); err != nil {
		return nil, err
	}
	return e, nil
}

// cleanName returns name relative to the extraction directory, or refuses it.
func cleanName(name string, dir bool) (string, error) {
	if !utf8.ValidString(name) {
		return "", refuse("the archive has an entry whose name %q is not valid UTF-8: rename it", name)
	}
	for _, r := range name {
		if r < 0x20 || r == 0x7f || r == '\\' {
			return "", refuse("the archive's entry %q has the character %q in its name: rename it", name, r)
		}
	}
	if strings.HasPrefix(name, "/") {
		return "", refuse("the archive's entry %q has an absolute path: archive paths relative to the tree's root (tar -C DIR .)", name)
	}
	n := name
	for strings.HasPrefix(n, "./") {
		n = n[2:]
	}
	if dir {
		n = strings.TrimSuffix(n, "/")
	}
	if n == "" || n == "." {
		return "", nil
	}
	if len(n) > 4096 {
		return "", refuse("the archive's entry %.40q... has a path longer than 4096 bytes", name)
	}
	for _, part := range strings.Split(n, "/") {
		switch {
		case part == "..":
			return "", refuse("the archive's entry %q has a \"..\" component: archive paths must stay inside the tree", name)
		case part == "" || part == ".":
			return "", refuse("the archive's entry %q is not a clean path (an empty or \".\" component)", name)
		case len(part) > 255:
			return "", refuse("the archive's entry %.40q... has a name component longer than 255 bytes", name)
		}
	}
	return n, nil
}

// checkLink refuses a symlink whose target is absolute or leads out of the workspace.
func (c *checker) checkLink(raw, name, target string) error {
	switch {
	case target == "":
		return refuse("the archive's symlink %q has an empty target", raw)
	case strings.HasPrefix(target, "/"):
		return refuse("the archive's symlink %q points to the absolute path %q: links must point inside the workspace, relatively", raw, target)
	}
	resolved := path.Join(c.dest, path.Dir(name), target)
	if resolved == ".." || strings.HasPrefix(resolved, "../") {
		return refuse("the archive's symlink %q points to %q, outside the workspace: links must point inside it", raw, target)
	}
	return nil
}

// checkPlace refuses an entry that collides with another, that sits under a symlink or file of the
// archive, or that would write through (or over) a symlink or file in the workspace.
func (c *checker) checkPlace(raw, name string, kind byte) error {
	parts := strings.Split(name, "/")
	for i := 1; i <= len(parts); i++ {
		p := strings.Join(parts[:i], "/")
		k := byte('d')
		if i == len(parts) {
			k = kind
		}
		if prev, ok := c.kinds[p]; ok {
			switch {
			case prev == 'l' && i < len(parts):
				return refuse("the archive's entry %q would be written through the symlink %q, an earlier entry: links that later entries write through are refused", raw, p)
			case prev != 'd' && i < len(parts):
				return refuse("the archive's entry %q sits under %q, which the archive makes a file", raw, p)
			case i == len(parts) && (prev != 'd' || k != 'd'):
				return refuse("the archive names %q twice: each path may appear once", name)
			}
			continue
		}
		low := strings.ToLower(p)
		if other, ok := c.folded[low]; ok && other != p {
			return refuse("the archive's entries %q and %q differ only in case: they would collide on a case-insensitive filesystem; rename one", other, p)
		}
		c.folded[low] = p
		c.kinds[p] = k
		if err := c.probe(raw, p, k); err != nil {
			return err
		}
	}
	return nil
}

// probe checks that the workspace path dest/p (p new to this archive, kind k) can be written without
// going through a symlink or a file, and without replacing a directory with something else.
func (c *checker) probe(raw, p string, k byte) error {
	full := path.Join(c.dest, p)
	parent := dirOf(full)
	err, ok := c.probed[parent]
	if !ok {
		fd, oerr := openBeneath(c.root, parent, false, owner{})
		switch {
		case oerr == nil:
			unix.Close(fd)
		case errors.Is(oerr, unix.ENOENT):
			err = errMissing
		case errors.Is(oerr, unix.ELOOP) || errors.Is(oerr, unix.ENOTDIR):
			err = refuse("the archive's entry %q would be written through %q, which is a symlink or a file in the workspace: remove it first", raw, parent)
		default:
			err = fmt.Errorf("check workspace path %s: %w", parent, oerr)
		}
		c.probed[parent] = err
	}
	if err == errMissing {
		return nil
	}
	if err != nil {
		return err
	}
	fd, oerr := openBeneath(c.root, parent, false, owner{})
	if oerr != nil {
		return fmt.Errorf("check workspace path %s: %w", parent, oerr)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if serr := unix.Fstatat(fd, path.Base(full), &st, unix.AT_SYMLINK_NOFOLLOW); serr != nil {
		return nil // nothing there yet
	}
	isDir := st.Mode&unix.S_IFMT == unix.S_IFDIR
	switch {
	case k == 'd' && !isDir && st.Mode&unix.S_IFMT == unix.S_IFLNK:
		return refuse("the archive's entry %q would be written through %q, a symlink in the workspace: remove it first", raw, full)
	case k == 'd' && !isDir:
		return refuse("the archive's entry %q needs %q to be a directory, and the workspace has a file there: remove it first", raw, full)
	case k != 'd' && isDir:
		return refuse("the archive's entry %q would replace the directory %q in the workspace: remove it first", raw, full)
	}
	return nil
}

// errMissing marks a parent directory that does not exist yet (and will be created).
var errMissing = errors.New("missing")

// extract runs the second pass: it writes the checked entries from f into dest of the workspace open as
// root, owned by own. Files and links already there are replaced (never written through); directories
// are kept.
func extract(f *os.File, root int, dest string, entries []entry, own owner) error {
	a, err := openArchive(f)
	if err != nil {
		return err
	}
	base, err := openBeneath(root, dest, true, own)
	if err != nil {
		return fmt.Errorf("open %s: %w", dest, err)
	}
	defer unix.Close(base)
	i := 0
	for i < len(entries) {
		raw, body, err := a.next()
		if err != nil {
			return fmt.Errorf("read archive again: %w", err)
		}
		name, _ := cleanName(raw.name, raw.typ == "dir")
		if name == "" {
			continue
		}
		e := entries[i]
		if name != e.name {
			return fmt.Errorf("read archive again: entry %q where %q was checked", name, e.name)
		}
		i++
		if err := writeEntry(base, e, body, own); err != nil {
			return fmt.Errorf("write %s: %w", e.name, err)
		}
	}
	return nil
}

func writeEntry(base int, e entry, body io.Reader, own owner) error {
	parent, err := openBeneath(base, dirOf(e.name), true, own)
	if err != nil {
		return err
	}
	defer unix.Close(parent)
	name := path.Base(e.name)
	ts := []unix.Timespec{unix.NsecToTimespec(e.mod.UnixNano()), unix.NsecToTimespec(e.mod.UnixNano())}
	switch e.kind {
	case 'd':
		if err := unix.Mkdirat(parent, name, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
			return err
		}
		fd, err := openDirAt(parent, name)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		own.chownFd(fd)
		return unix.Fchmod(fd, e.mode|0o700)
	case 'l':
		if err := unix.Unlinkat(parent, name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
			return err
		}
		if err := unix.Symlinkat(e.link, parent, name); err != nil {
			return err
		}
		own.chownAt(parent, name)
		return nil
	}
	if err := unix.Unlinkat(parent, name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return err
	}
	fd, err := unix.Openat(parent, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, e.mode)
	if err != nil {
		return err
	}
	out := os.NewFile(uintptr(fd), name)
	defer out.Close()
	own.chownFd(fd)
	if err := unix.Fchmod(fd, e.mode); err != nil {
		return err
	}
	if body != nil {
		n, err := io.Copy(out, io.LimitReader(body, e.size))
		if err != nil {
			return err
		}
		if n != e.size {
			return fmt.Errorf("short entry: %d of %d bytes", n, e.size)
		}
	}
	if !e.mod.IsZero() {
		_ = unix.UtimesNanoAt(parent, name, ts, unix.AT_SYMLINK_NOFOLLOW)
	}
	return nil
}
