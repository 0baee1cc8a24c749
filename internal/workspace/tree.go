package workspace

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// MaxDepth bounds how deep any walk of a workspace descends; a deeper tree is refused, never half-copied.
const MaxDepth = 256

// ErrTooDeep reports a tree nested deeper than MaxDepth.
var ErrTooDeep = fmt.Errorf("directories nest deeper than %d levels", MaxDepth)

// openDirAt opens the directory name in dirfd without following a symlink; a symlink or non-directory is
// ELOOP or ENOTDIR.
func openDirAt(dirfd int, name string) (int, error) {
	for {
		fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if !errors.Is(err, unix.EINTR) {
			return fd, err
		}
	}
}

// openBeneath opens the directory rel (slash-separated, already checked to hold no "..", "." or empty
// component) beneath root one component at a time without following symlinks, creating missing
// components (mode 0755, owned by uid:gid when chown is set) when create is set. It returns the open
// descriptor, which the caller closes.
func openBeneath(root int, rel string, create bool, own owner) (int, error) {
	fd, err := unix.Dup(root)
	if err != nil {
		return -1, err
	}
	if rel == "" || rel == "." {
		return fd, nil
	}
	for _, c := range strings.Split(rel, "/") {
		if create {
			if err := unix.Mkdirat(fd, c, 0o755); err == nil {
				own.chownAt(fd, c)
			} else if !errors.Is(err, unix.EEXIST) {
				unix.Close(fd)
				return -1, &os.PathError{Op: "mkdir", Path: c, Err: err}
			}
		}
		next, err := openDirAt(fd, c)
		unix.Close(fd)
		if err != nil {
			return -1, &os.PathError{Op: "open", Path: c, Err: err}
		}
		fd = next
	}
	return fd, nil
}

// owner is the sandbox user that owns what toolpool writes into a workspace; chown is false when this
// process cannot change owners (not root), so files keep the worker's own user.
type owner struct {
	uid, gid int
	chown    bool
}

func (o owner) chownAt(dirfd int, name string) error {
	if !o.chown {
		return nil
	}
	return unix.Fchownat(dirfd, name, o.uid, o.gid, unix.AT_SYMLINK_NOFOLLOW)
}

func (o owner) chownFd(fd int) error {
	if !o.chown {
		return nil
	}
	return unix.Fchown(fd, o.uid, o.gid)
}

// visit is called for each entry of a walked tree with its directory's descriptor, its name there, its
// path relative to the walk's root and its lstat. For a directory, returning descend false skips it.
type visit func(dirfd int, name, rel string, st *unix.Stat_t) (descend bool, err error)

// walkTree calls fn for every entry under the directory open as fd (which it does not close), parents
// before children, never following a symlink and never leaving fd's filesystem. Entries that vanish
// meanwhile are skipped.
func walkTree(fd int, fn visit) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	dup, err := unix.Dup(fd)
	if err != nil {
		return err
	}
	return walkDir(dup, "", uint64(st.Dev), 1, fn)
}

func walkDir(fd int, rel string, dev uint64, depth int, fn visit) error {
	defer unix.Close(fd)
	names, err := readNames(fd)
	if err != nil {
		return err
	}
	for _, name := range names {
		var st unix.Stat_t
		if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue
			}
			return &os.PathError{Op: "stat", Path: join(rel, name), Err: err}
		}
		r := join(rel, name)
		descend, err := fn(fd, name, r, &st)
		if err != nil {
			return err
		}
		if !descend || st.Mode&unix.S_IFMT != unix.S_IFDIR || uint64(st.Dev) != dev {
			continue
		}
		if depth >= MaxDepth {
			return ErrTooDeep
		}
		child, err := openDirAt(fd, name)
		if err != nil {
			if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
				continue // gone or swapped for a link since the stat: never followed
			}
			return &os.PathError{Op: "open", Path: r, Err: err}
		}
		if err := walkDir(child, r, dev, depth+1, fn); err != nil {
			return err
		}
	}
	return nil
}

// readNames lists the directory open as fd, sorted by the order the filesystem returns.
func readNames(fd int) ([]string, error) {
	buf := make([]byte, 8192)
	var names []string
	for {
		n, err := unix.ReadDirent(fd, buf)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read directory: %w", err)
		}
		if n <= 0 {
			return names, nil
		}
		_, _, names = unix.ParseDirent(buf[:n], -1, names)
	}
}

func join(dir, name string) string {
	if dir == "" {
		return name
	}
	return dir + "/" + name
}

// copyTree copies the tree under src into the empty directory dst (both open descriptors, not closed):
// directories, regular files (a reflink where the filesystem allows, else a copy) and symlinks as they
// are, never followed; anything else (a FIFO or socket a call left) is skipped. Everything it creates is
// owned by own. It reports whether every file was reflinked.
func copyTree(src, dst int, own owner) (reflinked bool, err error) {
	reflinked = true
	dirs := map[string]int{"": dst}
	defer func() {
		for rel, fd := range dirs {
			if rel != "" {
				unix.Close(fd)
			}
		}
	}()
	err = walkTree(src, func(dirfd int, name, rel string, st *unix.Stat_t) (bool, error) {
		parent, ok := dirs[dirOf(rel)]
		if !ok {
			return false, nil // its directory was skipped
		}
		mode := uint32(st.Mode & 0o777)
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			if err := unix.Mkdirat(parent, name, mode|0o700); err != nil {
				return false, &os.PathError{Op: "mkdir", Path: rel, Err: err}
			}
			fd, err := openDirAt(parent, name)
			if err != nil {
				return false, &os.PathError{Op: "open", Path: rel, Err: err}
			}
			own.chownFd(fd)
			dirs[rel] = fd
			return true, nil
		case unix.S_IFREG:
			cloned, err := copyFile(dirfd, parent, name, mode, own)
			if err != nil {
				return false, fmt.Errorf("copy %s: %w", rel, err)
			}
			reflinked = reflinked && cloned
		case unix.S_IFLNK:
			target, err := readlinkAt(dirfd, name)
			if err != nil {
				return false, &os.PathError{Op: "readlink", Path: rel, Err: err}
			}
			if err := unix.Symlinkat(target, parent, name); err != nil {
				return false, &os.PathError{Op: "symlink", Path: rel, Err: err}
			}
			own.chownAt(parent, name)
		}
		return false, nil
	})
	return reflinked, err
}

func dirOf(rel string) string {
	if i := strings.LastIndexByte(rel, '/'); i >= 0 {
		return rel[:i]
	}
	return ""
}

// copyFile copies the regular file name in srcDir to a new file name in dstDir, by reflink when the
// filesystem supports it.
func copyFile(srcDir, dstDir int, name string, mode uint32, own owner) (reflinked bool, err error) {
	in, err := unix.Openat(srcDir, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return false, err
	}
	src := os.NewFile(uintptr(in), name)
	defer src.Close()
	out, err := unix.Openat(dstDir, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, mode)
	if err != nil {
		return false, err
	}
	dst := os.NewFile(uintptr(out), name)
	defer dst.Close()
	own.chownFd(out)
	unix.Fchmod(out, mode)
	if unix.IoctlFileClone(out, in) == nil {
		return true, nil
	}
	_, err = io.Copy(dst, src) // copy_file_range where the kernel can
	return false, err
}

func readlinkAt(dirfd int, name string) (string, error) {
	buf := make([]byte, unix.PathMax)
	n, err := unix.Readlinkat(dirfd, name, buf)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}
