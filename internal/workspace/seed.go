// Seeding and upload: a workspace made empty, from an archive or from a filled tree (a clone), and an
// archive extracted into an existing one.

package workspace

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

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
