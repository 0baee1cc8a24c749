package sandbox

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// MaxTreeDepth bounds how deep DiskUsage descends. A workspace nested deeper cannot be measured, and a
// quota that cannot be measured fails closed: DiskUsage returns ErrTreeTooDeep.
const MaxTreeDepth = 256

// ErrTreeTooDeep is returned by DiskUsage for a tree nested deeper than MaxTreeDepth directories.
var ErrTreeTooDeep = fmt.Errorf("directories nest deeper than %d levels", MaxTreeDepth)

// DiskUsage returns the disk space the tree under dir occupies: the allocated blocks of every file,
// directory and symlink, each inode counted once however many hard links it has (du's answer, so a sparse
// file counts what it allocated, not its length). It never follows a symlink, neither to descend nor to
// stat: every directory is opened relative to its parent's descriptor with O_NOFOLLOW, so a tree that a
// container changes while it is measured can make the count approximate, but can never make DiskUsage read
// anything outside dir. Entries that vanish while it walks are skipped. dir itself must be a directory and
// is opened normally (the caller owns the path up to it). It returns ErrTreeTooDeep (wrapped) for a tree
// nested deeper than MaxTreeDepth. Safe for concurrent use; it holds one descriptor and one 8 KiB buffer per
// level of depth, and remembers only inodes with several links.
func DiskUsage(dir string) (int64, error) {
	f, err := os.Open(dir)
	if err != nil {
		return 0, fmt.Errorf("measure %s: %w", dir, err)
	}
	defer f.Close()
	return DiskUsageOf(f)
}

// DiskUsageOf is DiskUsage for the directory open as dir, for a caller that reached it without following
// symlinks (with O_NOFOLLOW at each component). It does not close dir.
func DiskUsageOf(dir *os.File) (int64, error) {
	fd, err := unix.Openat(int(dir.Fd()), ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("measure %s: %w", dir.Name(), &os.PathError{Op: "open", Path: dir.Name(), Err: err})
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return 0, fmt.Errorf("measure %s: %w", dir.Name(), &os.PathError{Op: "fstat", Path: dir.Name(), Err: err})
	}
	w := &walker{seen: map[inode]bool{}}
	w.count(&st)
	if err := w.walk(fd, st.Dev, 1); err != nil {
		return w.total, fmt.Errorf("measure %s: %w", dir.Name(), err)
	}
	return w.total, nil
}

type inode struct{ dev, ino uint64 }

type walker struct {
	total int64
	seen  map[inode]bool // inodes with more than one link, counted once
}

func (w *walker) count(st *unix.Stat_t) {
	if st.Nlink > 1 && st.Mode&unix.S_IFMT != unix.S_IFDIR {
		k := inode{uint64(st.Dev), st.Ino}
		if w.seen[k] {
			return
		}
		w.seen[k] = true
	}
	w.total += st.Blocks * 512
}

// walk counts the entries of the directory open as fd, descending into subdirectories on the same device,
// and closes fd. It streams the directory (one buffer per level), so a directory of millions of entries
// costs no more memory than a small one.
func (w *walker) walk(fd int, dev uint64, depth int) error {
	defer unix.Close(fd)
	buf := make([]byte, 8192)
	var names []string
	for {
		n, err := unix.ReadDirent(fd, buf)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("read directory: %w", err)
		}
		if n <= 0 {
			return nil
		}
		_, _, names = unix.ParseDirent(buf[:n], -1, names[:0])
		for _, name := range names {
			if err := w.entry(fd, name, dev, depth); err != nil {
				return err
			}
		}
	}
}

func (w *walker) entry(fd int, name string, dev uint64, depth int) error {
	var st unix.Stat_t
	if err := fstatat(fd, name, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil // removed while we walk
		}
		return fmt.Errorf("stat %s: %w", name, err)
	}
	w.count(&st)
	if st.Mode&unix.S_IFMT != unix.S_IFDIR || uint64(st.Dev) != dev {
		return nil // not a directory, or a mount point: never leave the filesystem
	}
	if depth >= MaxTreeDepth {
		return ErrTreeTooDeep
	}
	child, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		// Gone, or swapped for a symlink or a file since the stat: never follow it.
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
			return nil
		}
		return fmt.Errorf("open %s: %w", name, err)
	}
	return w.walk(child, dev, depth+1)
}

// fstatat stats name in the directory fd without following a symlink.
func fstatat(fd int, name string, st *unix.Stat_t) error {
	for {
		err := unix.Fstatat(fd, name, st, unix.AT_SYMLINK_NOFOLLOW)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}
