package containerd

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/toolpool/toolpool/internal/sandbox/sandboxinit"
)

// The host side of the pool's workspace slots. A pooled container's /workspace is a read-only bind of its
// own slot directory, made a slave of the host's mount: a mount the worker makes on the slot directory at
// claim time propagates into that container (and only into it: a slave receives what is mounted under
// the part of the tree it shows), while nothing the container mounts could propagate back (and it cannot
// mount: it has no capability and seccomp refuses mount(2)). The slots directory is a mount of its own,
// made private (cut off from whatever the host's mounts share) and then shared (a peer group of its own),
// so that the only mounts that reach containers through it are the worker's.

// setupSlotsDir creates dir as a bind mount of itself with a peer group of its own.
func setupSlotsDir(dir string) error {
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return fmt.Errorf("create slots dir: %w", err)
	}
	steps := []struct {
		src   string
		flags uintptr
	}{{dir, unix.MS_BIND}, {"", unix.MS_PRIVATE}, {"", unix.MS_SHARED}}
	for _, s := range steps {
		if err := unix.Mount(s.src, dir, "", s.flags, ""); err != nil {
			_ = unmountDetach(dir)
			return fmt.Errorf("set up slots mount %s: %w", dir, err)
		}
	}
	return nil
}

// bindWorkspace mounts the host directory ws on the slot directory dir, nosuid and nodev, read-only when
// readOnly, without following a symlink at ws, and returns ws's identity as the container will see it at
// /workspace. The flags are set on the detached mount before it is attached, so that the copy that
// propagates into the container has them too (a later remount would not propagate).
func bindWorkspace(dir, ws string, readOnly bool) (sandboxinit.FileID, error) {
	fd, err := unix.Open(ws, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return sandboxinit.FileID{}, fmt.Errorf("open workspace %s: %w", ws, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return sandboxinit.FileID{}, fmt.Errorf("stat workspace %s: %w", ws, err)
	}
	tree, err := unix.OpenTree(fd, "", unix.AT_EMPTY_PATH|unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return sandboxinit.FileID{}, fmt.Errorf("clone workspace mount %s: %w", ws, err)
	}
	defer unix.Close(tree)
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV}
	if readOnly {
		attr.Attr_set |= unix.MOUNT_ATTR_RDONLY
	}
	if err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH, &attr); err != nil {
		return sandboxinit.FileID{}, fmt.Errorf("set workspace mount flags %s: %w", ws, err)
	}
	if err := unix.MoveMount(tree, "", unix.AT_FDCWD, dir, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return sandboxinit.FileID{}, fmt.Errorf("mount workspace %s on slot %s: %w", ws, dir, err)
	}
	return sandboxinit.FileID{Dev: st.Dev, Ino: st.Ino}, nil
}

// unmountDetach unmounts whatever is mounted on dir (lazily, and everything beneath it); nothing mounted
// is not an error.
func unmountDetach(dir string) error {
	for {
		err := unix.Unmount(dir, unix.MNT_DETACH)
		switch {
		case err == nil:
			continue // stacked mounts: the next one
		case errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT):
			return nil // not a mount point (any more)
		default:
			return fmt.Errorf("unmount %s: %w", dir, err)
		}
	}
}

// removeSlotDir unmounts and removes one slot directory.
func removeSlotDir(dir string) error {
	if err := unmountDetach(dir); err != nil {
		return err
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove slot dir: %w", err)
	}
	return nil
}

// removeSlotsTree unmounts a slots directory and removes it with its slot directories, never recursing
// into a directory that is still a mount point (a workspace mounted on a slot would otherwise lose its
// files): a slot that cannot be unmounted is an error, and it and the slots directory stay.
func removeSlotsTree(dir string) error {
	if err := unmountDetach(dir); err != nil {
		return err
	}
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("read slots dir: %w", err)
	}
	var errs []error
	for _, e := range entries {
		errs = append(errs, removeSlotDir(filepath.Join(dir, e.Name())))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove slots dir: %w", err)
	}
	return nil
}
