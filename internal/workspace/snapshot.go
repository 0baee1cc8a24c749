// Snapshot, fork and restore: copies of a workspace's tree, reflinked where the filesystem allows.

package workspace

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/toolpool/toolpool/internal/call"
)

// Snapshot saves a copy of workspace name as snapshot snap (a reflink per file where the filesystem
// allows, else a copy). A snapshot counts against the tenant's byte limit.
func (m *Manager) Snapshot(ctx context.Context, tenant, name, snap string) (Info, error) {
	if err := checkNames(tenant, name, snap); err != nil {
		return Info{}, err
	}
	tl, l, err := m.lockForLimits(ctx, tenant, name)
	if err != nil {
		return Info{}, err
	}
	defer tl.release()
	defer l.release()
	src, err := m.openWorkspace(tenant, name)
	if err != nil {
		return Info{}, err
	}
	defer unix.Close(src)
	if _, err := os.Lstat(filepath.Join(m.snapDir(tenant, name), snap)); err == nil {
		return Info{}, &Error{Type: TypeExists, Msg: fmt.Sprintf("workspace %q has a snapshot %q already: choose another name", name, snap)}
	}
	used := usageOf(src)
	if err := m.checkLimits(tenant, 0, used); err != nil {
		return Info{}, err
	}
	if err := os.MkdirAll(m.snapDir(tenant, name), 0o755); err != nil {
		return Info{}, fmt.Errorf("create snapshots dir: %w", err)
	}
	reflinked, err := m.copyInto(tenant, src, filepath.Join(m.snapDir(tenant, name), snap))
	if err != nil {
		return Info{}, fmt.Errorf("snapshot workspace %s: %w", name, err)
	}
	inf, err := m.info(tenant, name)
	inf.Reflinked = &reflinked
	return inf, err
}

// copyInto copies the tree open as src to the new path dst via a staging directory, so that dst appears
// whole or not at all.
func (m *Manager) copyInto(tenant string, src int, dst string) (bool, error) {
	st, err := m.stage(tenant, "copy")
	if err != nil {
		return false, err
	}
	defer st.discard()
	reflinked, err := copyTree(src, st.fd, m.own)
	if err != nil {
		return false, err
	}
	return reflinked, st.moveTo(dst)
}

// openSnapshot opens snapshot snap of workspace name.
func (m *Manager) openSnapshot(tenant, name, snap string) (int, error) {
	fd, err := unix.Open(filepath.Join(m.snapDir(tenant, name), snap), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return -1, &Error{Type: call.ErrNotFound, Msg: fmt.Sprintf("workspace %q has no snapshot %q: GET /v1/workspaces/%s lists its snapshots", name, snap, name)}
	}
	return fd, err
}

// Fork copies workspace name (or its snapshot snap, when not empty) to the new workspace to, which has
// name's default image.
func (m *Manager) Fork(ctx context.Context, tenant, name, snap, to string) (Info, error) {
	if err := checkNames(tenant, name, to); err != nil {
		return Info{}, err
	}
	if snap != "" {
		if err := checkNames(tenant, snap); err != nil {
			return Info{}, err
		}
	}
	tl, err := m.lockTenant(ctx, tenant)
	if err != nil {
		return Info{}, err
	}
	defer tl.release()
	// Locks in name order, so that two forks in opposite directions cannot deadlock.
	first, second := name, to
	if second < first {
		first, second = second, first
	}
	l1, err := m.lockWorkspace(ctx, tenant, first, true)
	if err != nil {
		return Info{}, err
	}
	defer l1.release()
	if first != second {
		l2, err := m.lockWorkspace(ctx, tenant, second, true)
		if err != nil {
			return Info{}, err
		}
		defer l2.release()
	}
	if ok, err := m.exists(tenant, to); err != nil || ok {
		if err == nil {
			err = &Error{Type: TypeExists, Msg: fmt.Sprintf("workspace %q exists already: fork to a new name", to)}
		}
		return Info{}, err
	}
	var src int
	if snap != "" {
		src, err = m.openSnapshot(tenant, name, snap)
	} else {
		src, err = m.openWorkspace(tenant, name)
	}
	if err != nil {
		return Info{}, err
	}
	defer unix.Close(src)
	used := usageOf(src)
	if err := m.checkCopyQuota(to, used, name, snap); err != nil {
		return Info{}, err
	}
	if err := m.checkLimits(tenant, 1, used); err != nil {
		return Info{}, err
	}
	reflinked, err := m.copyInto(tenant, src, m.wsDir(tenant, to))
	if err != nil {
		return Info{}, fmt.Errorf("fork workspace %s: %w", name, err)
	}
	md, err := m.readMeta(tenant, name)
	if err != nil {
		return Info{}, err
	}
	// The fork keeps its source's default image.
	if err := m.writeMeta(tenant, to, meta{CreatedAt: m.cfg.Now().UTC(), Image: md.Image}); err != nil {
		return Info{}, err
	}
	inf, err := m.info(tenant, to)
	inf.Reflinked = &reflinked
	return inf, err
}

// Restore replaces the contents of workspace name with its snapshot snap; the snapshot stays. It refuses
// a snapshot over the workspace quota (too_large) and one whose copy would take the tenant past its byte
// limit (quota_exceeded), changing nothing.
func (m *Manager) Restore(ctx context.Context, tenant, name, snap string) (Info, error) {
	if err := checkNames(tenant, name, snap); err != nil {
		return Info{}, err
	}
	tl, l, err := m.lockForLimits(ctx, tenant, name)
	if err != nil {
		return Info{}, err
	}
	defer tl.release()
	defer l.release()
	cur, err := m.openWorkspace(tenant, name)
	if err != nil {
		return Info{}, err
	}
	var curUsed int64
	if m.cfg.MaxBytes > 0 { // only the tenant's byte limit needs what the replaced tree frees
		curUsed = usageOf(cur)
	}
	unix.Close(cur)
	src, err := m.openSnapshot(tenant, name, snap)
	if err != nil {
		return Info{}, err
	}
	defer unix.Close(src)
	if m.cfg.Quota > 0 || m.cfg.MaxBytes > 0 {
		used := usageOf(src)
		if err := m.checkCopyQuota(name, used, name, snap); err != nil {
			return Info{}, err
		}
		if err := m.checkLimits(tenant, 0, max(0, used-curUsed)); err != nil {
			return Info{}, err
		}
	}
	st, err := m.stage(tenant, "restore")
	if err != nil {
		return Info{}, err
	}
	defer st.discard()
	reflinked, err := copyTree(src, st.fd, m.own)
	if err != nil {
		return Info{}, fmt.Errorf("restore workspace %s: %w", name, err)
	}
	// Swap in one step: the workspace is the old tree or the new one, never a mix.
	if err := unix.Renameat2(unix.AT_FDCWD, st.path, unix.AT_FDCWD, m.wsDir(tenant, name), unix.RENAME_EXCHANGE); err != nil {
		return Info{}, fmt.Errorf("restore workspace %s: swap trees: %w", name, err)
	}
	// st.path now names the old tree, which discard removes.
	inf, err := m.info(tenant, name)
	inf.Reflinked = &reflinked
	return inf, err
}

// CheckCopy refuses (too_large) making workspace name a copy of a tree of size bytes, workspace from's
// (its snapshot snap, when not empty), past the workspace quota: for forks and restores made elsewhere
// than in the workspaces directory (on checkpoints).
func (m *Manager) CheckCopy(name string, size int64, from, snap string) error {
	return m.checkCopyQuota(name, size, from, snap)
}
