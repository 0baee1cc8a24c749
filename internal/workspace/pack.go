package workspace

import (
	"archive/tar"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/toolpool/toolpool/internal/sandbox"
)

// writeTarGz streams the tree under the directory open as fd (not closed) to w as tar.gz: directories,
// regular files and symlinks, never following a link; other entries are left out.
func writeTarGz(fd int, w io.Writer) error {
	gz := gzip.NewWriter(w)
	tw := tar.NewWriter(gz)
	err := walkTree(fd, func(dirfd int, name, rel string, st *unix.Stat_t) (bool, error) {
		h := &tar.Header{Name: rel, Mode: int64(st.Mode & 0o777), ModTime: time.Unix(st.Mtim.Unix()), Format: tar.FormatPAX}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			h.Typeflag, h.Name = tar.TypeDir, rel+"/"
			return true, tw.WriteHeader(h)
		case unix.S_IFLNK:
			target, err := readlinkAt(dirfd, name)
			if err != nil {
				return false, fmt.Errorf("read link %s: %w", rel, err)
			}
			h.Typeflag, h.Linkname = tar.TypeSymlink, target
			return false, tw.WriteHeader(h)
		case unix.S_IFREG:
			in, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
			if err != nil {
				return false, fmt.Errorf("open %s: %w", rel, err)
			}
			f := os.NewFile(uintptr(in), rel)
			defer f.Close()
			var now unix.Stat_t
			if err := unix.Fstat(in, &now); err != nil || now.Mode&unix.S_IFMT != unix.S_IFREG {
				return false, nil // swapped since the walk's stat
			}
			h.Typeflag, h.Size = tar.TypeReg, now.Size
			if err := tw.WriteHeader(h); err != nil {
				return false, err
			}
			if _, err := io.Copy(tw, io.LimitReader(f, now.Size)); err != nil {
				return false, fmt.Errorf("archive %s: %w", rel, err)
			}
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("archive workspace: %w", err)
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("archive workspace: %w", err)
	}
	return gz.Close()
}

// usageOf is the disk space used under the directory open as fd (not closed); 0 when it cannot be
// measured.
func usageOf(fd int) int64 {
	n, _ := diskUsage(fd, "")
	return n
}

// diskUsage is the disk space used under the directory open as fd (not closed), named name in errors,
// as sandbox.DiskUsageOf measures it (never following a symlink; sandbox.ErrTreeTooDeep past its depth).
func diskUsage(fd int, name string) (int64, error) {
	dup, err := unix.Dup(fd)
	if err != nil {
		return 0, fmt.Errorf("measure %s: %w", name, err)
	}
	f := os.NewFile(uintptr(dup), name)
	defer f.Close()
	return sandbox.DiskUsageOf(f)
}
