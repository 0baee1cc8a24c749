package checkpoint

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// beneath resolves a path inside a workspace: never through a symlink, never out of it.
const beneath = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS

// openAt opens rel (slash-separated; "" is root itself) beneath root with flags, following no symlink.
func openAt(root int, rel string, flags int) (int, error) {
	if rel == "" {
		rel = "."
	}
	for {
		fd, err := unix.Openat2(root, rel, &unix.OpenHow{Flags: uint64(flags | unix.O_CLOEXEC | unix.O_NOFOLLOW), Resolve: beneath})
		if !errors.Is(err, unix.EINTR) && !errors.Is(err, unix.EAGAIN) {
			return fd, err
		}
	}
}

// openDir opens the directory rel beneath root.
func openDir(root int, rel string) (int, error) {
	return openAt(root, rel, unix.O_RDONLY|unix.O_DIRECTORY)
}

// openWorkspace opens Dir/<tenant>/<name>; exists is false (with no error) when it is not there.
func (c *Checkpointer) openWorkspace(tenant, name string) (fd int, exists bool, err error) {
	base, err := unix.Open(c.cfg.Dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, false, fmt.Errorf("open workspaces dir: %w", err)
	}
	defer unix.Close(base)
	fd, err = openDir(base, tenant+"/"+name)
	if errors.Is(err, unix.ENOENT) {
		return -1, false, nil
	}
	if err != nil {
		return -1, false, fmt.Errorf("open workspace %s/%s: %w", tenant, name, err)
	}
	return fd, true, nil
}

// makeWorkspace creates Dir/<tenant>/<name> (and the tenant's directory) if missing and opens it.
func (c *Checkpointer) makeWorkspace(tenant, name string) (int, error) {
	base, err := unix.Open(c.cfg.Dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open workspaces dir: %w", err)
	}
	defer unix.Close(base)
	for _, rel := range []string{tenant, tenant + "/" + name} {
		parent, leaf := splitRel(rel)
		pfd, err := openDir(base, parent)
		if err != nil {
			return -1, fmt.Errorf("open %s: %w", parent, err)
		}
		err = unix.Mkdirat(pfd, leaf, 0o755)
		if err == nil && rel != tenant {
			c.own(pfd, leaf)
		}
		unix.Close(pfd)
		if err != nil && !errors.Is(err, unix.EEXIST) {
			return -1, fmt.Errorf("create %s: %w", rel, err)
		}
	}
	return openDir(base, tenant+"/"+name)
}

// own gives name in dirfd to the sandbox user, when this process may.
func (c *Checkpointer) own(dirfd int, name string) error {
	if !c.chown {
		return nil
	}
	if err := unix.Fchownat(dirfd, name, c.cfg.UID, c.cfg.GID, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("chown %s: %w", name, err)
	}
	return nil
}

// splitRel splits a slash-separated path into its parent ("" for the root) and last component.
func splitRel(rel string) (parent, leaf string) {
	for i := len(rel) - 1; i >= 0; i-- {
		if rel[i] == '/' {
			return rel[:i], rel[i+1:]
		}
	}
	return "", rel
}

func join(parent, name string) string {
	if parent == "" {
		return name
	}
	return parent + "/" + name
}

// removeAt removes name from dirfd, a directory with everything in it, never following a symlink.
func removeAt(dirfd int, name string) error {
	err := unix.Unlinkat(dirfd, name, 0)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	if !errors.Is(err, unix.EISDIR) && !errors.Is(err, unix.EPERM) {
		return fmt.Errorf("remove %s: %w", name, err)
	}
	fd, err := openAt(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return fmt.Errorf("open %s: %w", name, err)
	}
	d := os.NewFile(uintptr(fd), name)
	names, err := d.Readdirnames(-1)
	if err == nil {
		for _, n := range names {
			if err = removeAt(fd, n); err != nil {
				break
			}
		}
	}
	d.Close()
	if err != nil {
		return err
	}
	if err := unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("remove %s: %w", name, err)
	}
	return nil
}
