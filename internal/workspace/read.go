// Inspection and reading: Info, List, ReadFile and Archive.

package workspace

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/toolpool/toolpool/internal/call"
)

// Info describes workspace name.
func (m *Manager) Info(ctx context.Context, tenant, name string) (Info, error) {
	if err := checkNames(tenant, name); err != nil {
		return Info{}, err
	}
	return m.info(tenant, name)
}

func (m *Manager) info(tenant, name string) (Info, error) {
	fd, err := m.openWorkspace(tenant, name)
	if err != nil {
		return Info{}, err
	}
	defer unix.Close(fd)
	inf := Info{Name: name}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err == nil {
		inf.CreatedAt = time.Unix(st.Mtim.Unix()).UTC()
		inf.LastUsedAt = inf.CreatedAt
	}
	if md, err := m.readMeta(tenant, name); err == nil {
		if !md.CreatedAt.IsZero() {
			inf.CreatedAt = md.CreatedAt
		}
		inf.Image = md.Image
	}
	if lst, err := os.Lstat(m.lockPath(tenant, name)); err == nil {
		inf.LastUsedAt = lst.ModTime().UTC()
	}
	if m.cfg.IdleTTL > 0 {
		inf.ExpiresAt = inf.LastUsedAt.Add(m.cfg.IdleTTL)
	}
	inf.Bytes = usageOf(fd)
	walkTree(fd, func(_ int, _, _ string, st *unix.Stat_t) (bool, error) {
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			inf.Files++
		}
		return true, nil
	})
	if ents, err := os.ReadDir(m.snapDir(tenant, name)); err == nil {
		for _, e := range ents {
			if fi, err := e.Info(); err == nil && e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
				inf.Snapshots = append(inf.Snapshots, Snapshot{Name: e.Name(), CreatedAt: fi.ModTime().UTC()})
			}
		}
	}
	return inf, nil
}

// List describes every workspace of the tenant, by name.
func (m *Manager) List(ctx context.Context, tenant string) ([]Info, error) {
	if err := checkNames(tenant); err != nil {
		return nil, err
	}
	names, err := m.names(tenant)
	if err != nil {
		return nil, err
	}
	out := []Info{}
	for _, n := range names {
		if inf, err := m.info(tenant, n); err == nil {
			out = append(out, inf)
		}
	}
	return out, nil
}

// names lists the tenant's workspace directories.
func (m *Manager) names(tenant string) ([]string, error) {
	ents, err := os.ReadDir(m.tenantDir(tenant))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list workspaces: %w", err)
	}
	var names []string
	for _, e := range ents {
		if e.IsDir() && call.ValidateName("workspace", e.Name()) == nil {
			names = append(names, e.Name())
		}
	}
	return names, nil
}

// ReadFile opens the regular file rel of workspace name (never through a symlink) and calls fn with it
// and its size, holding the workspace's lock shared.
func (m *Manager) ReadFile(ctx context.Context, tenant, name, rel string, fn func(f *os.File, size int64) error) error {
	root, p, done, err := m.openLocked(ctx, tenant, name, rel, false)
	if err != nil {
		return err
	}
	defer done()
	if p == "" {
		return refuse("give the path of a file in the workspace")
	}
	parent, err := openBeneath(root, dirOf(p), false, owner{})
	if err != nil {
		return fileError(rel, err)
	}
	defer unix.Close(parent)
	fd, err := unix.Openat(parent, path.Base(p), unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return fileError(rel, err)
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if !st.Mode().IsRegular() {
		return refuse("%q is not a regular file: download a directory with GET /v1/workspaces/{name}/archive?path=%s", rel, p)
	}
	return fn(f, st.Size())
}

func fileError(rel string, err error) error {
	switch {
	case errors.Is(err, unix.ENOENT):
		return &Error{Type: call.ErrNotFound, Msg: fmt.Sprintf("there is no file %q in the workspace", rel)}
	case errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR):
		return refuse("%q is, or goes through, a symlink: toolpool never follows links on the host; read the link's target path instead", rel)
	}
	return fmt.Errorf("open %s: %w", rel, err)
}

// Archive writes the tree under sub (a directory of workspace name; "" for all of it) to w as tar.gz,
// holding the workspace's lock exclusively so that no call changes it meanwhile. Symlinks are archived
// as links, never followed; FIFOs and sockets are left out.
func (m *Manager) Archive(ctx context.Context, tenant, name, sub string, w io.Writer) error {
	root, sub, done, err := m.openLocked(ctx, tenant, name, sub, true)
	if err != nil {
		return err
	}
	defer done()
	fd, err := openBeneath(root, sub, false, owner{})
	if err != nil {
		return fileError(sub, err)
	}
	defer unix.Close(fd)
	return writeTarGz(fd, w)
}
