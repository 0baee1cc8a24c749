// Package workspace manages tenants' workspaces on the worker's host: create (empty or from an archive),
// list, inspect, upload into, read from, archive, snapshot, fork, restore, delete and expire them. It works
// on the workspaces directory that every worker may share (a ReadWriteMany volume), never follows a symlink
// inside a workspace, and writes everything it extracts as the sandbox user.
//
// Layout under Dir, per tenant: <tenant>/<name> is the workspace (what calls mount); <tenant>/.ws holds
// each workspace's lock file (<name>.lock, whose modification time is its last use) and metadata
// (<name>.json); <tenant>/.snapshots/<name>/<snapshot> holds snapshots; <tenant>/.trash is where trees
// are staged and removed. Workspace and snapshot names never start with a dot, so none collides.
//
// Concurrency, across goroutines and across workers sharing Dir: every operation on a workspace holds its
// lock. Calls (Hold) hold it shared, so calls into one workspace run concurrently as they always have;
// the operations of this package hold it exclusively, so an upload, snapshot, fork, restore, archive or
// delete never sees or leaves a half-changed tree: it waits for running calls to end, and calls wait for
// it. Operations that count against the tenant's limits also hold the tenant's lock, so two workers
// cannot both take the last free place.
package workspace

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/toolpool/toolpool/internal/call"
)

// Config configures a Manager.
type Config struct {
	// Dir holds every tenant's workspaces (the worker's workspaces directory).
	Dir string
	// UID and GID are the sandbox user, who owns everything written into a workspace.
	UID, GID int
	// IdleTTL is how long a workspace may go unused before Sweep removes it (with its snapshots); zero
	// keeps workspaces forever.
	IdleTTL time.Duration
	// MaxWorkspaces is the most workspaces a tenant may have; zero means no limit.
	MaxWorkspaces int
	// MaxBytes is the most disk space a tenant's workspaces and snapshots may use together; zero means no
	// limit.
	MaxBytes int64
	// Archive bounds each uploaded archive; zero fields take DefaultArchiveLimits'.
	Archive Limits
	// Quota is the most disk space one workspace may use, the quota its calls run under (the worker's
	// workspace_quota); zero means none. A seed, upload or clone that would take a workspace past it is
	// refused (too_large) with nothing written: a workspace seeded past its quota could take no call
	// that writes.
	Quota int64
	// SizeTTL is how long a size recorded at the end of a call (RecordSize) stands in for measuring the
	// workspace again when the next call starts (Prepare); zero means DefaultSizeTTL.
	SizeTTL time.Duration
	// Now replaces time.Now, for tests.
	Now func() time.Time
}

// DefaultArchiveLimits bound an uploaded archive when the configuration does not.
var DefaultArchiveLimits = Limits{Files: 100_000, Bytes: 4 << 30}

// Validate checks the configuration.
func (c *Config) Validate() error {
	switch {
	case c.Dir == "" || !filepath.IsAbs(c.Dir) || filepath.Clean(c.Dir) != c.Dir:
		return fmt.Errorf("workspaces dir %q must be a clean absolute path", c.Dir)
	case c.IdleTTL < 0 || c.MaxWorkspaces < 0 || c.MaxBytes < 0 || c.Archive.Files < 0 || c.Archive.Bytes < 0 || c.Quota < 0:
		return errors.New("workspace idle TTL and limits must not be negative")
	}
	return nil
}

// Error is a refusal the caller must act on: Type is a call error type (invalid_params, not_found,
// already_exists, quota_exceeded, too_large) and Msg says what to do.
type Error struct {
	Type string
	Msg  string
}

func (e *Error) Error() string { return e.Msg }

// Error types beyond those of package call.
const (
	TypeExists   = "already_exists"
	TypeTooLarge = "too_large"
)

func refuse(format string, a ...any) error {
	return &Error{Type: call.ErrInvalidParams, Msg: fmt.Sprintf(format, a...)}
}

// Info describes a workspace.
type Info struct {
	Name       string     `json:"name"`
	Bytes      int64      `json:"bytes"` // disk space used, as du counts it
	Files      int64      `json:"files"` // entries of any kind but directories
	CreatedAt  time.Time  `json:"created_at"`
	LastUsedAt time.Time  `json:"last_used_at"`
	ExpiresAt  time.Time  `json:"expires_at,omitzero"` // zero when workspaces do not expire
	Snapshots  []Snapshot `json:"snapshots,omitempty"`
	// Reflinked, after a snapshot, fork or restore, reports whether every file was shared by reflink
	// rather than copied.
	Reflinked *bool `json:"reflinked,omitempty"`
	// Image is the workspace's default image (SetImage): the OCI image reference its calls run on when
	// they ask for none. Empty when it has none.
	Image string `json:"image,omitempty"`
}

// Snapshot is a saved copy of a workspace.
type Snapshot struct {
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"created_at"`
}

// Manager manages the workspaces under one directory. Safe for concurrent use, also by several processes
// and machines on one shared directory.
type Manager struct {
	cfg Config
	own owner

	mu    sync.Mutex
	sizes map[string]measuredSize // by tenant/workspace, recorded by RecordSize
}

// New returns a Manager on cfg.Dir, creating it if needed.
func New(cfg Config) (*Manager, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("validate workspace config: %w", err)
	}
	if cfg.Archive.Files == 0 {
		cfg.Archive.Files = DefaultArchiveLimits.Files
	}
	if cfg.Archive.Bytes == 0 {
		cfg.Archive.Bytes = DefaultArchiveLimits.Bytes
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.SizeTTL == 0 {
		cfg.SizeTTL = DefaultSizeTTL
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("create workspaces dir: %w", err)
	}
	return &Manager{cfg: cfg, own: owner{uid: cfg.UID, gid: cfg.GID, chown: os.Geteuid() == 0}, sizes: map[string]measuredSize{}}, nil
}

func (m *Manager) tenantDir(tenant string) string { return filepath.Join(m.cfg.Dir, tenant) }
func (m *Manager) wsDir(t, n string) string       { return filepath.Join(m.cfg.Dir, t, n) }
func (m *Manager) metaDir(t string) string        { return filepath.Join(m.cfg.Dir, t, ".ws") }
func (m *Manager) lockPath(t, n string) string    { return filepath.Join(m.metaDir(t), n+".lock") }
func (m *Manager) metaPath(t, n string) string    { return filepath.Join(m.metaDir(t), n+".json") }
func (m *Manager) snapDir(t, n string) string     { return filepath.Join(m.cfg.Dir, t, ".snapshots", n) }
func (m *Manager) trashDir(t string) string       { return filepath.Join(m.cfg.Dir, t, ".trash") }

// meta is what a workspace's .json file keeps.
type meta struct {
	CreatedAt time.Time `json:"created_at"`
	// Image is the workspace's default image (SetImage), empty for none.
	Image string `json:"image,omitempty"`
}

func checkNames(tenant string, names ...string) error {
	if err := call.ValidateTenant(tenant); err != nil {
		return &Error{Type: call.ErrInvalidParams, Msg: err.Error()}
	}
	for _, n := range names {
		if err := call.ValidateName("workspace", n); err != nil {
			return &Error{Type: call.ErrInvalidParams, Msg: err.Error()}
		}
	}
	return nil
}

// prepareTenant creates the tenant's directories.
func (m *Manager) prepareTenant(tenant string) error {
	for _, d := range []string{m.tenantDir(tenant), m.metaDir(tenant), m.trashDir(tenant)} {
		if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("create %s: %w", d, err)
		}
	}
	return nil
}

// lockTenant takes the tenant's lock, which operations that count against its limits hold.
func (m *Manager) lockTenant(ctx context.Context, tenant string) (*lock, error) {
	if err := m.prepareTenant(tenant); err != nil {
		return nil, err
	}
	return acquire(ctx, filepath.Join(m.metaDir(tenant), ".tenant.lock"), true)
}

// lockForLimits takes the tenant's lock, then workspace name's exclusively; release both.
func (m *Manager) lockForLimits(ctx context.Context, tenant, name string) (tl, l *lock, err error) {
	if tl, err = m.lockTenant(ctx, tenant); err != nil {
		return nil, nil, err
	}
	if l, err = m.lockWorkspace(ctx, tenant, name, true); err != nil {
		tl.release()
		return nil, nil, err
	}
	return tl, l, nil
}

// lockWorkspace takes the workspace's lock and marks it used.
func (m *Manager) lockWorkspace(ctx context.Context, tenant, name string, exclusive bool) (*lock, error) {
	if err := m.prepareTenant(tenant); err != nil {
		return nil, err
	}
	l, err := acquire(ctx, m.lockPath(tenant, name), exclusive)
	if err != nil {
		return nil, err
	}
	l.touch(m.cfg.Now())
	return l, nil
}

// lockNew takes the tenant's lock and new workspace name's, and refuses a name in use. done releases both;
// when failed it first removes the name's lock file: nothing of a refused workspace stays.
func (m *Manager) lockNew(ctx context.Context, tenant, name string) (done func(failed bool), err error) {
	tl, l, err := m.lockForLimits(ctx, tenant, name)
	if err != nil {
		return nil, err
	}
	if err := m.refuseTaken(tenant, name); err != nil {
		l.release()
		tl.release()
		return nil, err
	}
	return func(failed bool) {
		if failed {
			l.remove()
		}
		l.release()
		tl.release()
	}, nil
}

// refuseTaken refuses (already_exists) a workspace name in use.
func (m *Manager) refuseTaken(tenant, name string) error {
	ok, err := m.exists(tenant, name)
	if err == nil && ok {
		err = &Error{Type: TypeExists, Msg: fmt.Sprintf("workspace %q exists already: create it under a new name, upload into it (POST /v1/workspaces/%s/files), change its default image (PATCH /v1/workspaces/%s with {\"image\": REF}), or delete it first", name, name, name)}
	}
	return err
}

// exists reports whether workspace name is a directory (never following a symlink).
func (m *Manager) exists(tenant, name string) (bool, error) {
	st, err := os.Lstat(m.wsDir(tenant, name))
	switch {
	case errors.Is(err, os.ErrNotExist):
		return false, nil
	case err != nil:
		return false, err
	case !st.IsDir():
		return false, fmt.Errorf("workspace %s/%s is not a directory", tenant, name)
	}
	return true, nil
}

func notFound(name string) error {
	return &Error{Type: call.ErrNotFound, Msg: fmt.Sprintf("there is no workspace %q: create it (PUT /v1/workspaces/%s) or list yours (GET /v1/workspaces)", name, name)}
}

// openWorkspace opens an existing workspace's directory without following symlinks.
func (m *Manager) openWorkspace(tenant, name string) (int, error) {
	base, err := unix.Open(m.tenantDir(tenant), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return -1, notFound(name)
	}
	if err != nil {
		return -1, fmt.Errorf("open tenant dir: %w", err)
	}
	defer unix.Close(base)
	fd, err := openDirAt(base, name)
	if errors.Is(err, unix.ENOENT) {
		return -1, notFound(name)
	}
	if err != nil {
		return -1, fmt.Errorf("open workspace %s: %w", name, err)
	}
	return fd, nil
}

// openLocked checks tenant, name and the client's path rel (cleanDest), takes workspace name's lock
// (exclusive or shared) and opens its directory without following symlinks. It returns the open
// directory, rel cleaned, and done, which closes the directory and releases the lock.
func (m *Manager) openLocked(ctx context.Context, tenant, name, rel string, exclusive bool) (root int, clean string, done func(), err error) {
	if err := checkNames(tenant, name); err != nil {
		return -1, "", nil, err
	}
	if clean, err = cleanDest(rel); err != nil {
		return -1, "", nil, err
	}
	l, err := m.lockWorkspace(ctx, tenant, name, exclusive)
	if err != nil {
		return -1, "", nil, err
	}
	if root, err = m.openWorkspace(tenant, name); err != nil {
		l.release()
		return -1, "", nil, err
	}
	return root, clean, func() { unix.Close(root); l.release() }, nil
}
