package worker

import (
	"errors"
	"fmt"
	"os"
	"path"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/sandbox"
	"github.com/toolpool/toolpool/internal/workspace"
)

// WorkspacesConfig configures Workspaces.
type WorkspacesConfig struct {
	// Dir holds every tenant's workspaces, as Dir/<tenant>/<workspace>; it must be an absolute path that
	// no container can write (only workspaces themselves are mounted).
	Dir string
	// UID and GID own each workspace directory; they must be the sandbox's user.
	UID, GID int
	// Quota is the most disk space (allocated blocks, as du counts them) one workspace may use; zero means
	// no quota.
	Quota int64
	// SizeTTL is how long a size recorded at the end of a call (Record) stands in for measuring the
	// workspace again when the next call starts; zero means DefaultSizeTTL.
	SizeTTL time.Duration
	// Now replaces time.Now, for tests.
	Now func() time.Time
}

// DefaultSizeTTL is how long a recorded workspace size is trusted. A workspace changes only through calls,
// whose sizes are recorded as they end; the running call's own growth is watched by the sandbox.
const DefaultSizeTTL = 30 * time.Second

// Validate checks the configuration.
func (c *WorkspacesConfig) Validate() error {
	switch {
	case c.Dir == "" || !path.IsAbs(c.Dir) || path.Clean(c.Dir) != c.Dir:
		return fmt.Errorf("workspaces dir %q must be a clean absolute path", c.Dir)
	case c.Quota < 0:
		return fmt.Errorf("workspace quota %d is negative", c.Quota)
	}
	return nil
}

// Workspaces creates, measures and removes the tenants' workspace directories on the host. Every host-side
// operation resolves tenant and workspace one component at a time with O_NOFOLLOW beneath Dir and works on
// the opened descriptor: a symlink planted anywhere (by a call inside a workspace, or by anything else) is
// never followed, and the tree inside a workspace is measured and removed without following its symlinks
// either. Safe for concurrent use.
type Workspaces struct {
	cfg WorkspacesConfig

	mu    sync.Mutex
	sizes map[string]measuredSize // by tenant/workspace
}

// measuredSize is a workspace's size as last measured, and when.
type measuredSize struct {
	bytes int64
	at    time.Time
}

// NewWorkspaces creates cfg.Dir if needed and returns Workspaces on it.
func NewWorkspaces(cfg WorkspacesConfig) (*Workspaces, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("validate workspaces config: %w", err)
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("create workspaces dir: %w", err)
	}
	if cfg.SizeTTL == 0 {
		cfg.SizeTTL = DefaultSizeTTL
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Workspaces{cfg: cfg, sizes: map[string]measuredSize{}}, nil
}

// Record notes a workspace's size as measured at the end of a call, so that the next call into it within
// SizeTTL does not walk the tree again. Negative sizes (not measured) are ignored.
func (w *Workspaces) Record(tenant, workspace string, bytes int64) {
	if bytes < 0 || w.cfg.Quota == 0 {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.sizes[tenant+"/"+workspace] = measuredSize{bytes: bytes, at: w.cfg.Now()}
}

// recorded returns a size Recorded less than SizeTTL ago.
func (w *Workspaces) recorded(tenant, workspace string) (int64, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	m, ok := w.sizes[tenant+"/"+workspace]
	if !ok || w.cfg.Now().Sub(m.at) >= w.cfg.SizeTTL {
		return 0, false
	}
	return m.bytes, true
}

// Quota is the configured per-workspace quota in bytes (zero: none); pass it to the sandbox as
// Limits.WorkspaceBytes so that a running call is held to it too.
func (w *Workspaces) Quota() int64 { return w.cfg.Quota }

// Workspace is a prepared workspace.
type Workspace struct {
	// Dir is the workspace's host path, to mount at /workspace.
	Dir string
	// Bytes is its size on disk when it was prepared, or -1 when there is no quota to measure it for.
	Bytes int64
}

// QuotaError reports a workspace that is over its quota. Calls that could add to it must not run; the
// message says so in words a model can act on.
type QuotaError struct {
	Tenant, Workspace string
	Used, Quota       int64
	// TooDeep reports that the workspace nests directories too deep to measure, which counts as over.
	TooDeep bool
}

func (e *QuotaError) Error() string {
	if e.TooDeep {
		return fmt.Sprintf("workspace %q nests directories deeper than %d levels, so its size cannot be checked against its quota of %s: calls into it are refused until the deep directories are removed",
			e.Workspace, sandbox.MaxTreeDepth, workspace.FormatBytes(e.Quota))
	}
	return fmt.Sprintf("workspace %q uses %s, over its quota of %s: calls into it are refused until files are deleted to bring it under the quota, or an operator raises the quota",
		e.Workspace, workspace.FormatBytes(e.Used), workspace.FormatBytes(e.Quota))
}

// Prepare creates Dir/<tenant>/<workspace> if needed (mode 0755, owned by the sandbox user when this
// process is root) and, when there is a quota, measures it. A workspace over its quota returns the
// Workspace together with a *QuotaError, so that a caller may still let through a call that only frees
// space. Names are checked with call.ValidateTenant and call.ValidateName; a tenant or workspace entry that
// is a symlink or not a directory is refused, never followed.
func (w *Workspaces) Prepare(tenant, workspace string) (Workspace, error) {
	ws := Workspace{Bytes: -1}
	dir, err := w.open(tenant, workspace, true)
	if err != nil {
		return ws, fmt.Errorf("prepare workspace: %w", err)
	}
	defer dir.Close()
	ws.Dir = path.Join(w.cfg.Dir, tenant, workspace)
	if os.Geteuid() == 0 {
		// On the open descriptor: no path to race.
		if err := dir.Chown(w.cfg.UID, w.cfg.GID); err != nil {
			return ws, fmt.Errorf("chown workspace %s/%s: %w", tenant, workspace, err)
		}
	}
	if w.cfg.Quota == 0 {
		return ws, nil
	}
	if n, ok := w.recorded(tenant, workspace); ok {
		ws.Bytes = n
		if n > w.cfg.Quota {
			return ws, &QuotaError{Tenant: tenant, Workspace: workspace, Used: n, Quota: w.cfg.Quota}
		}
		return ws, nil
	}
	n, err := sandbox.DiskUsageOf(dir)
	ws.Bytes = n
	switch {
	case errors.Is(err, sandbox.ErrTreeTooDeep):
		return ws, &QuotaError{Tenant: tenant, Workspace: workspace, Used: n, Quota: w.cfg.Quota, TooDeep: true}
	case err != nil:
		return ws, fmt.Errorf("measure workspace %s/%s: %w", tenant, workspace, err)
	case n > w.cfg.Quota:
		return ws, &QuotaError{Tenant: tenant, Workspace: workspace, Used: n, Quota: w.cfg.Quota}
	}
	return ws, nil
}

// open opens Dir/<tenant>/<workspace> without following a symlink in either component, creating the
// components first when create is set.
func (w *Workspaces) open(tenant, workspace string, create bool) (*os.File, error) {
	if err := validateNames(tenant, workspace); err != nil {
		return nil, err
	}
	base, err := os.Open(w.cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("open workspaces dir: %w", err)
	}
	t, err := openChild(base, tenant, create)
	base.Close()
	if err != nil {
		return nil, fmt.Errorf("open tenant dir %s: %w", tenant, err)
	}
	defer t.Close()
	ws, err := openChild(t, workspace, create)
	if err != nil {
		return nil, fmt.Errorf("open workspace %s/%s: %w", tenant, workspace, err)
	}
	return ws, nil
}

// openChild opens the directory name inside parent with O_NOFOLLOW, creating it first (mode 0755) when
// create is set. A symlink or a non-directory there is an error.
func openChild(parent *os.File, name string, create bool) (*os.File, error) {
	if create {
		if err := unix.Mkdirat(int(parent.Fd()), name, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
			return nil, &os.PathError{Op: "mkdir", Path: name, Err: err}
		}
	}
	fd, err := unix.Openat(int(parent.Fd()), name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) {
			return nil, &os.PathError{Op: "open", Path: name, Err: errors.New("not a directory (a symlink is never followed)")}
		}
		return nil, &os.PathError{Op: "open", Path: name, Err: err}
	}
	return os.NewFile(uintptr(fd), path.Join(parent.Name(), name)), nil
}

func validateNames(tenant, workspace string) error {
	if err := call.ValidateTenant(tenant); err != nil {
		return err
	}
	return call.ValidateName("workspace", workspace)
}
