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
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/sandbox"
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
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("create workspaces dir: %w", err)
	}
	return &Manager{cfg: cfg, own: owner{uid: cfg.UID, gid: cfg.GID, chown: os.Geteuid() == 0}}, nil
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
		err = &Error{Type: TypeExists, Msg: fmt.Sprintf("workspace %q exists already: create it under a new name, upload into it (POST /v1/workspaces/%s/files), or delete it first", name, name)}
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

// Create makes workspace name, empty or with the contents of the archive in f (tar, tar.gz or zip; nil
// for none). It refuses a name in use (already_exists), a tenant at its limits (quota_exceeded) and a
// hostile archive (invalid_params, too_large), in each case writing nothing.
func (m *Manager) Create(ctx context.Context, tenant, name string, f *os.File) (_ Info, retErr error) {
	if err := checkNames(tenant, name); err != nil {
		return Info{}, err
	}
	done, err := m.lockNew(ctx, tenant, name)
	if err != nil {
		return Info{}, err
	}
	defer func() { done(retErr != nil) }()
	var entries []entry
	var size int64
	if f != nil {
		// Checked and extracted in a staging directory, moved into place whole.
		staging, err := m.stage(tenant, "new")
		if err != nil {
			return Info{}, err
		}
		entries, err = checkArchive(f, staging.fd, "", m.cfg.Archive)
		if err == nil {
			for _, e := range entries {
				size += e.size
			}
			err = m.checkQuota(name, 0, size)
		}
		if err == nil {
			err = m.checkLimits(tenant, 1, size)
		}
		if err == nil {
			err = extract(f, staging.fd, "", entries, m.own)
		}
		if err == nil {
			err = staging.moveTo(m.wsDir(tenant, name))
		}
		staging.discard()
		if err != nil {
			return Info{}, err
		}
	} else {
		if err := m.checkLimits(tenant, 1, 0); err != nil {
			return Info{}, err
		}
		if err := os.Mkdir(m.wsDir(tenant, name), 0o755); err != nil {
			return Info{}, fmt.Errorf("create workspace: %w", err)
		}
		if m.own.chown {
			os.Lchown(m.wsDir(tenant, name), m.cfg.UID, m.cfg.GID)
		}
	}
	if err := m.writeMeta(tenant, name, meta{CreatedAt: m.cfg.Now().UTC()}); err != nil {
		return Info{}, err
	}
	return m.info(tenant, name)
}

func (m *Manager) writeMeta(tenant, name string, md meta) error {
	b, _ := json.Marshal(md)
	tmp := m.metaPath(tenant, name) + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return fmt.Errorf("write workspace metadata: %w", err)
	}
	if err := os.Rename(tmp, m.metaPath(tenant, name)); err != nil {
		return fmt.Errorf("write workspace metadata: %w", err)
	}
	return nil
}

// Fill writes a new workspace's tree into dir, an empty directory owned by the sandbox user that nothing
// else sees, within limits (CreateFrom checks them again afterwards). It must stop when ctx ends.
type Fill func(ctx context.Context, dir string, limits Limits) error

// CreateFrom makes workspace name from the tree fill writes (a git clone). fill runs with no lock held,
// in a staging directory under the tenant's trash; then, holding the tenant's lock and the workspace's,
// CreateFrom refuses a name in use (already_exists), a tree over the archive limits (too_large: more
// entries than Limits.Files, directories and links included, or more bytes than Limits.Bytes) or over the
// tenant's limits (quota_exceeded), and otherwise moves the tree into place whole. Everything in it is
// made the sandbox user's, without setuid or setgid bits; a FIFO, socket or device refuses the tree.
// Whatever fails, including fill, nothing of the workspace stays.
func (m *Manager) CreateFrom(ctx context.Context, tenant, name string, fill Fill) (_ Info, retErr error) {
	if err := checkNames(tenant, name); err != nil {
		return Info{}, err
	}
	// Refused early, before the slow part, and checked again under the locks.
	if err := m.refuseTaken(tenant, name); err != nil {
		return Info{}, err
	}
	if err := m.prepareTenant(tenant); err != nil {
		return Info{}, err
	}
	if err := m.checkLimits(tenant, 1, 0); err != nil {
		return Info{}, err
	}
	staging, err := m.stage(tenant, "fill")
	if err != nil {
		return Info{}, err
	}
	defer staging.discard()
	if staging.path == "" {
		return Info{}, errors.New("create workspace: the staging directory has no path")
	}
	if err := fill(ctx, staging.path, m.cfg.Archive); err != nil {
		return Info{}, err
	}
	size, err := m.claimTree(staging.fd, m.cfg.Archive)
	if err != nil {
		return Info{}, err
	}
	if err := m.checkQuota(name, 0, size); err != nil {
		return Info{}, err
	}
	done, err := m.lockNew(ctx, tenant, name)
	if err != nil {
		return Info{}, err
	}
	defer func() { done(retErr != nil) }()
	if err := m.checkLimits(tenant, 1, size); err != nil {
		return Info{}, err
	}
	if err := staging.moveTo(m.wsDir(tenant, name)); err != nil {
		return Info{}, err
	}
	if err := m.writeMeta(tenant, name, meta{CreatedAt: m.cfg.Now().UTC()}); err != nil {
		return Info{}, err
	}
	return m.info(tenant, name)
}

// claimTree checks a filled tree against limits and makes it the sandbox user's: it returns its size on
// disk, refuses more entries or file bytes than the limits and anything but files, directories and
// symlinks, and chowns every entry and clears setuid and setgid bits, never following a link.
func (m *Manager) claimTree(root int, limits Limits) (int64, error) {
	var entries int
	var bytes int64
	err := walkTree(root, func(dirfd int, name, rel string, st *unix.Stat_t) (bool, error) {
		if entries++; entries > limits.Files {
			return false, &Error{Type: TypeTooLarge, Msg: fmt.Sprintf("the repository holds more than %d entries (files, directories and links, .git included), the limit (archive_max_files): clone a smaller repository", limits.Files)}
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			if bytes += st.Size; bytes > limits.Bytes {
				return false, &Error{Type: TypeTooLarge, Msg: fmt.Sprintf("the repository holds more than %s of files, .git included, the limit (archive_max_bytes): clone a smaller repository", FormatBytes(limits.Bytes))}
			}
		case unix.S_IFDIR, unix.S_IFLNK:
		default:
			return false, refuse("the tree holds %q, which is not a file, directory or symlink: toolpool does not keep FIFOs, sockets or devices", rel)
		}
		if m.own.chown && (int(st.Uid) != m.cfg.UID || int(st.Gid) != m.cfg.GID) {
			if err := unix.Fchownat(dirfd, name, m.cfg.UID, m.cfg.GID, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				return false, fmt.Errorf("chown %s: %w", rel, err)
			}
		}
		if st.Mode&unix.S_IFMT != unix.S_IFLNK && st.Mode&(unix.S_ISUID|unix.S_ISGID) != 0 {
			if err := unix.Fchmodat(dirfd, name, st.Mode&0o777, 0); err != nil {
				return false, fmt.Errorf("clear setuid bits of %s: %w", rel, err)
			}
		}
		return true, nil
	})
	if errors.Is(err, ErrTooDeep) {
		return 0, &Error{Type: TypeTooLarge, Msg: fmt.Sprintf("the tree nests directories deeper than %d levels: toolpool cannot check it", MaxDepth)}
	}
	if err != nil {
		return 0, err
	}
	m.own.chownFd(root)
	return usageOf(root), nil
}

// staging is a directory under the tenant's trash where a tree is built before it is moved into place.
type staging struct {
	fd   int
	path string
}

// stage makes a staging directory under the tenant's trash, which the caller discards.
func (m *Manager) stage(tenant, what string) (*staging, error) {
	tfd, err := unix.Open(m.trashDir(tenant), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open trash dir: %w", err)
	}
	defer unix.Close(tfd)
	var b [8]byte
	rand.Read(b[:])
	name := what + "-" + hex.EncodeToString(b[:])
	if err := unix.Mkdirat(tfd, name, 0o755); err != nil {
		return nil, fmt.Errorf("create staging dir: %w", err)
	}
	fd, err := openDirAt(tfd, name)
	if err != nil {
		return nil, fmt.Errorf("open staging dir: %w", err)
	}
	m.own.chownFd(fd)
	var dir string
	if p, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", tfd)); err == nil {
		dir = filepath.Join(p, name)
	}
	return &staging{fd: fd, path: dir}, nil
}

// moveTo renames the staged tree to dst, which must not exist.
func (s *staging) moveTo(dst string) error {
	if err := unix.Renameat2(unix.AT_FDCWD, s.path, unix.AT_FDCWD, dst, unix.RENAME_NOREPLACE); err != nil {
		return fmt.Errorf("move tree into place: %w", err)
	}
	s.path = ""
	return nil
}

// discard closes the staging directory and removes it unless it was moved.
func (s *staging) discard() {
	unix.Close(s.fd)
	if s.path != "" {
		os.RemoveAll(s.path) // unlinkat beneath an opened parent: never follows a link
	}
}

// Upload extracts the archive in f into the directory dest (relative to the workspace root; "" for the
// root) of an existing workspace, replacing files of the same names. A hostile archive, or one that
// would take the tenant past its byte limit, is refused with nothing written.
func (m *Manager) Upload(ctx context.Context, tenant, name, dest string, f *os.File) (Info, error) {
	fd, dest, done, err := m.openLocked(ctx, tenant, name, dest, true)
	if err != nil {
		return Info{}, err
	}
	defer done()
	if dest != "" {
		if _, err := checkArchivePath(fd, dest); err != nil {
			return Info{}, err
		}
	}
	entries, err := checkArchive(f, fd, dest, m.cfg.Archive)
	if err != nil {
		return Info{}, err
	}
	var size int64
	for _, e := range entries {
		size += e.size
	}
	if m.cfg.Quota > 0 {
		if err := m.checkQuota(name, usageOf(fd), size); err != nil {
			return Info{}, err
		}
	}
	if err := m.checkLimits(tenant, 0, size); err != nil {
		return Info{}, err
	}
	if err := extract(f, fd, dest, entries, m.own); err != nil {
		return Info{}, fmt.Errorf("extract archive: %w", err)
	}
	return m.info(tenant, name)
}

// cleanDest checks a path inside a workspace given by a client ("", "." and "/" are the root).
func cleanDest(p string) (string, error) {
	p = strings.TrimPrefix(strings.TrimPrefix(p, "/workspace"), "/")
	if p == "" || p == "." {
		return "", nil
	}
	n, err := cleanName(p, true)
	if err != nil {
		var we *Error
		if errors.As(err, &we) {
			we.Msg = strings.Replace(we.Msg, "the archive's entry", "the path", 1)
		}
		return "", err
	}
	return n, nil
}

// checkArchivePath refuses a destination that exists as something other than a directory, or that
// goes through a symlink. It returns whether it exists.
func checkArchivePath(root int, dest string) (bool, error) {
	fd, err := openBeneath(root, dest, false, owner{})
	switch {
	case err == nil:
		unix.Close(fd)
		return true, nil
	case errors.Is(err, unix.ENOENT):
		return false, nil
	case errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR):
		return false, refuse("the path %q is, or goes through, a symlink or a file in the workspace: give a directory", dest)
	}
	return false, err
}

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
	if b, err := os.ReadFile(m.metaPath(tenant, name)); err == nil {
		var md meta
		if json.Unmarshal(b, &md) == nil && !md.CreatedAt.IsZero() {
			inf.CreatedAt = md.CreatedAt
		}
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

// checkQuota refuses adding bytes to workspace name, which uses used, past Config.Quota. The bytes added
// are counted whole, as if no file they replace were freed.
func (m *Manager) checkQuota(name string, used, add int64) error {
	return m.quotaError(name, used, add, "upload less (leave out build outputs and dependencies, or push parts separately after deleting what they replace), or have an operator raise the quota")
}

// checkCopyQuota refuses making workspace name a copy of workspace from (snapshot snap of it, when not
// empty), a tree of size bytes, past Config.Quota: a quota lowered since the tree was made, say.
func (m *Manager) checkCopyQuota(name string, size int64, from, snap string) error {
	fix := fmt.Sprintf("pull workspace %q (GET /v1/workspaces/%s/archive, or toolpool ws pull %s) and push only the part you need into a new workspace, or have an operator raise the quota", from, from, from)
	if snap != "" {
		fix = fmt.Sprintf("snapshot %q of workspace %q was taken under a higher quota and stays as it was; have an operator raise the quota to restore or fork it", snap, from)
	}
	return m.quotaError(name, 0, size, fix)
}

// quotaError is the too_large error of putting add bytes into workspace name, which uses used, past
// Config.Quota (nil when within it); fix says what the caller can do instead.
func (m *Manager) quotaError(name string, used, add int64, fix string) error {
	if m.cfg.Quota <= 0 || used+add <= m.cfg.Quota {
		return nil
	}
	what := fmt.Sprintf("this would put %s into workspace %q", FormatBytes(add), name)
	if used > 0 {
		what = fmt.Sprintf("workspace %q uses %s and this would add %s", name, FormatBytes(used), FormatBytes(add))
	}
	return &Error{Type: TypeTooLarge, Msg: fmt.Sprintf("%s, over the quota of %s a workspace may use (the worker's workspace_quota): %s",
		what, FormatBytes(m.cfg.Quota), fix)}
}

// checkLimits refuses adding workspaces and bytes that would take the tenant past its limits, naming
// what to remove.
func (m *Manager) checkLimits(tenant string, addWorkspaces int, addBytes int64) error {
	if m.cfg.MaxWorkspaces == 0 && m.cfg.MaxBytes == 0 {
		return nil
	}
	names, err := m.names(tenant)
	if err != nil {
		return err
	}
	type use struct {
		name  string
		bytes int64
	}
	var uses []use
	var total int64
	for _, n := range names {
		b, _ := sandbox.DiskUsage(m.wsDir(tenant, n))
		s, _ := sandbox.DiskUsage(m.snapDir(tenant, n))
		uses = append(uses, use{n, b + s})
		total += b + s
	}
	sort.Slice(uses, func(i, j int) bool { return uses[i].bytes > uses[j].bytes })
	var largest []string
	for i, u := range uses {
		if i == 5 {
			break
		}
		largest = append(largest, fmt.Sprintf("%s (%s with its snapshots)", u.name, FormatBytes(u.bytes)))
	}
	if addWorkspaces > 0 && m.cfg.MaxWorkspaces > 0 && len(names)+addWorkspaces > m.cfg.MaxWorkspaces {
		return &Error{Type: call.ErrQuota, Msg: fmt.Sprintf("tenant %s has %d workspaces, its limit: remove one you no longer need (DELETE /v1/workspaces/{name}, or toolpool ws rm NAME) before creating another; the largest: %s",
			tenant, len(names), strings.Join(largest, ", "))}
	}
	if m.cfg.MaxBytes > 0 && total+addBytes > m.cfg.MaxBytes {
		return &Error{Type: call.ErrQuota, Msg: fmt.Sprintf("tenant %s's workspaces and snapshots use %s and this would add %s, over its limit of %s: remove workspaces or snapshots you no longer need (DELETE /v1/workspaces/{name}); the largest: %s",
			tenant, FormatBytes(total), FormatBytes(addBytes), FormatBytes(m.cfg.MaxBytes), strings.Join(largest, ", "))}
	}
	return nil
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

// Fork copies workspace name (or its snapshot snap, when not empty) to the new workspace to.
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
	if err := m.writeMeta(tenant, to, meta{CreatedAt: m.cfg.Now().UTC()}); err != nil {
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

// Delete removes workspace name with its snapshots. It waits for running calls in it to end.
func (m *Manager) Delete(ctx context.Context, tenant, name string) error {
	if err := checkNames(tenant, name); err != nil {
		return err
	}
	l, err := m.lockWorkspace(ctx, tenant, name, true)
	if err != nil {
		return err
	}
	defer l.release()
	if ok, err := m.exists(tenant, name); err != nil || !ok {
		if err == nil {
			err = notFound(name)
		}
		l.remove()
		return err
	}
	return m.remove(tenant, name, l)
}

// remove deletes a workspace whose lock l is held exclusively: the tree is moved to the trash first, so
// that it vanishes from its name at once.
func (m *Manager) remove(tenant, name string, l *lock) error {
	var b [8]byte
	rand.Read(b[:])
	trash := filepath.Join(m.trashDir(tenant), "rm-"+hex.EncodeToString(b[:]))
	if err := os.Rename(m.wsDir(tenant, name), trash); err != nil {
		return fmt.Errorf("delete workspace %s: %w", name, err)
	}
	if err := os.RemoveAll(trash); err != nil {
		return fmt.Errorf("delete workspace %s: %w", name, err)
	}
	if err := os.RemoveAll(m.snapDir(tenant, name)); err != nil {
		return fmt.Errorf("delete snapshots of %s: %w", name, err)
	}
	os.Remove(m.metaPath(tenant, name))
	l.remove()
	return nil
}

// Sweep removes every workspace unused for longer than IdleTTL (by its lock's modification time, or the
// directory's when it has never been locked) and returns their tenant/name. A workspace in use (its
// lock held) is left for the next sweep. It does nothing when IdleTTL is zero.
func (m *Manager) Sweep(ctx context.Context) ([]string, error) {
	if m.cfg.IdleTTL == 0 {
		return nil, nil
	}
	tenants, err := os.ReadDir(m.cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("list tenants: %w", err)
	}
	var removed []string
	for _, t := range tenants {
		if !t.IsDir() || call.ValidateTenant(t.Name()) != nil {
			continue
		}
		names, err := m.names(t.Name())
		if err != nil {
			continue
		}
		for _, n := range names {
			if ctx.Err() != nil {
				return removed, ctx.Err()
			}
			if !m.idle(t.Name(), n) {
				continue
			}
			if err := m.prepareTenant(t.Name()); err != nil {
				return removed, err
			}
			l, ok, err := tryAcquire(m.lockPath(t.Name(), n))
			if err != nil || !ok {
				continue // in use now
			}
			if m.idle(t.Name(), n) { // still, now that nobody else can use it
				if err := m.remove(t.Name(), n, l); err == nil {
					removed = append(removed, t.Name()+"/"+n)
				}
			}
			l.release()
		}
	}
	slices.Sort(removed)
	return removed, nil
}

// idle reports whether workspace name was last used more than IdleTTL ago.
func (m *Manager) idle(tenant, name string) bool {
	st, err := os.Lstat(m.lockPath(tenant, name))
	if err != nil {
		if st, err = os.Lstat(m.wsDir(tenant, name)); err != nil {
			return false
		}
	}
	return m.cfg.Now().Sub(st.ModTime()) > m.cfg.IdleTTL
}

// FormatBytes renders n in the largest binary unit that keeps it at least 1, with one decimal.
func FormatBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d bytes", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 4; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTP"[exp])
}
