// What a call needs of its workspace: Prepare makes it and checks its quota, Hold keeps operations out
// while the call runs, RecordSize notes its size as the call ends.

package workspace

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"time"

	"golang.org/x/sys/unix"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/sandbox"
)

// DefaultSizeTTL is how long a recorded workspace size is trusted. A workspace changes only through calls,
// whose sizes are recorded as they end; the running call's own growth is watched by the sandbox.
const DefaultSizeTTL = 30 * time.Second

// Prepared is a workspace prepared for a call.
type Prepared struct {
	// Dir is the workspace's host path, to mount at /workspace.
	Dir string
	// Bytes is its size on disk when it was prepared, or -1 when there is no quota to measure it for.
	Bytes int64
	// Image is the workspace's default image (SetImage), empty when it has none: the call runs on it
	// unless it asked for an image of its own.
	Image string
}

// measuredSize is a workspace's size as last measured, and when.
type measuredSize struct {
	bytes int64
	at    time.Time
}

// Prepare creates Dir/<tenant>/<name> if needed (mode 0755, owned by the sandbox user when this process is
// root) for a call to mount, reads its default image (SetImage) and, when there is a quota, measures it;
// metadata that cannot be read is an error, never a call on another image. A workspace over its quota returns
// the Prepared workspace together with an *Error of type quota_exceeded, so that a caller may still let
// through a call that only frees space. Names are checked with call.ValidateTenant and
// call.ValidateName; a tenant or workspace entry that is a symlink or not a directory is refused, never
// followed. Prepare takes no lock: the call holds the workspace with Hold.
func (m *Manager) Prepare(tenant, name string) (Prepared, error) {
	ws := Prepared{Bytes: -1}
	dir, err := m.openForCall(tenant, name)
	if err != nil {
		return ws, fmt.Errorf("prepare workspace: %w", err)
	}
	defer dir.Close()
	ws.Dir = path.Join(m.cfg.Dir, tenant, name)
	md, err := m.readMeta(tenant, name)
	if err != nil {
		return ws, fmt.Errorf("prepare workspace: %w", err)
	}
	ws.Image = md.Image
	if m.own.chown {
		// On the open descriptor: no path to race.
		if err := dir.Chown(m.cfg.UID, m.cfg.GID); err != nil {
			return ws, fmt.Errorf("chown workspace %s/%s: %w", tenant, name, err)
		}
	}
	if m.cfg.Quota == 0 {
		return ws, nil
	}
	if n, ok := m.recorded(tenant, name); ok {
		ws.Bytes = n
		if n > m.cfg.Quota {
			return ws, overQuota(name, n, m.cfg.Quota, false)
		}
		return ws, nil
	}
	n, err := diskUsage(int(dir.Fd()), dir.Name())
	ws.Bytes = n
	switch {
	case errors.Is(err, sandbox.ErrTreeTooDeep):
		return ws, overQuota(name, n, m.cfg.Quota, true)
	case err != nil:
		return ws, fmt.Errorf("measure workspace %s/%s: %w", tenant, name, err)
	case n > m.cfg.Quota:
		return ws, overQuota(name, n, m.cfg.Quota, false)
	}
	return ws, nil
}

// Hold takes workspace name's lock shared, for a call that runs in it, and returns its release (which
// marks the workspace used once more). It blocks while a workspace operation holds the lock, until ctx
// ends.
func (m *Manager) Hold(ctx context.Context, tenant, name string) (release func(), err error) {
	if err := checkNames(tenant, name); err != nil {
		return nil, err
	}
	l, err := m.lockWorkspace(ctx, tenant, name, false)
	if err != nil {
		return nil, fmt.Errorf("hold workspace %s/%s: %w", tenant, name, err)
	}
	return func() { l.touch(m.cfg.Now()); l.release() }, nil
}

// RecordSize notes a workspace's size as measured at the end of a call, so that the next call into it
// within SizeTTL does not walk the tree again (Prepare). Negative sizes (not measured) are ignored.
func (m *Manager) RecordSize(tenant, name string, bytes int64) {
	if bytes < 0 || m.cfg.Quota == 0 {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.sizes[tenant+"/"+name] = measuredSize{bytes: bytes, at: m.cfg.Now()}
}

// ForgetSize drops the size recorded for a workspace: its tree changed outside a call (a restore from a
// checkpoint), so the next Prepare measures it again.
func (m *Manager) ForgetSize(tenant, name string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.sizes, tenant+"/"+name)
}

// recorded returns a size recorded less than SizeTTL ago.
func (m *Manager) recorded(tenant, name string) (int64, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.sizes[tenant+"/"+name]
	if !ok || m.cfg.Now().Sub(s.at) >= m.cfg.SizeTTL {
		return 0, false
	}
	return s.bytes, true
}

// Quota is the configured per-workspace quota in bytes (zero: none); pass it to the sandbox as
// Limits.WorkspaceBytes so that a running call is held to it too.
func (m *Manager) Quota() int64 { return m.cfg.Quota }

// openForCall opens Dir/<tenant>/<name>, creating either component that is missing, without following a
// symlink in either.
func (m *Manager) openForCall(tenant, name string) (*os.File, error) {
	if err := call.ValidateTenant(tenant); err != nil {
		return nil, err
	}
	if err := call.ValidateName("workspace", name); err != nil {
		return nil, err
	}
	base, err := os.Open(m.cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("open workspaces dir: %w", err)
	}
	t, err := makeChild(base, tenant)
	base.Close()
	if err != nil {
		return nil, fmt.Errorf("open tenant dir %s: %w", tenant, err)
	}
	defer t.Close()
	ws, err := makeChild(t, name)
	if err != nil {
		return nil, fmt.Errorf("open workspace %s/%s: %w", tenant, name, err)
	}
	return ws, nil
}

// makeChild creates the directory name inside parent (mode 0755) unless it exists, and opens it with
// openDirAt. A symlink or a non-directory there is an error.
func makeChild(parent *os.File, name string) (*os.File, error) {
	if err := unix.Mkdirat(int(parent.Fd()), name, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
		return nil, &os.PathError{Op: "mkdir", Path: name, Err: err}
	}
	fd, err := openDirAt(int(parent.Fd()), name)
	if err != nil {
		if errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) {
			return nil, &os.PathError{Op: "open", Path: name, Err: errors.New("not a directory (a symlink is never followed)")}
		}
		return nil, &os.PathError{Op: "open", Path: name, Err: err}
	}
	return os.NewFile(uintptr(fd), path.Join(parent.Name(), name)), nil
}
