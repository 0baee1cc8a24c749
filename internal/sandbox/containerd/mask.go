package containerd

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/toolpool/toolpool/internal/sandbox"
)

// Hiding paths of the workspace (sandbox.Spec.Hidden). Every hidden path gets a mount of its own on the
// host, on top of it in a mount of the workspace that only the call's container sees: an empty read-only
// directory over a directory, an empty read-only file over anything else. The container sees the
// workspace through that mount: a pooled container through its slot (the masks are mounted beneath the
// slot after the workspace is, and propagate with it), a cold one through a view directory of its own
// that runc binds recursively at /workspace. The workspace itself never changes, and no other call's
// container sees the masks. runc never resolves a path inside the workspace: the worker mounts the
// masks, resolving each path beneath the workspace mount with openat2 (no symlink, no ".." out, no other
// mount), and mounting on the file descriptor it got.

const (
	// viewsPrefix names the view directories in StateDir: views.<start time in ns>.
	viewsPrefix = "views."
	// maskDirName holds the empty file and directory that masks are bound from.
	maskDirName = "mask"
)

// views makes cold calls' workspace views. Its zero value is ready; the directory is set up on first use.
type views struct {
	once sync.Once
	dir  string // StateDir/views.<start>: a mount of its own whose subdirectories are the views
	err  error
}

// makeView mounts spec's workspace (read-only when spec says so) on a fresh view directory for the call,
// applies spec's Hidden and ReadOnlyPaths beneath it (maskWorkspace), and returns the view and how to
// remove it. On failure nothing stays mounted.
func (r *Runtime) makeView(spec sandbox.Spec) (string, func() error, error) {
	v := &r.views
	v.once.Do(func() {
		v.dir = filepath.Join(r.cfg.StateDir, fmt.Sprintf("%s%d", viewsPrefix, r.started.UnixNano()))
		v.err = setupSlotsDir(v.dir)
	})
	if v.err != nil {
		return "", nil, fmt.Errorf("set up workspace views: %w", v.err)
	}
	dir := filepath.Join(v.dir, spec.ID)
	if err := os.Mkdir(dir, 0o755); err != nil {
		return "", nil, fmt.Errorf("create workspace view: %w", err)
	}
	release := func() error { return removeSlotDir(dir) }
	if _, err := bindWorkspace(dir, spec.WorkspaceDir, spec.WorkspaceReadOnly); err != nil {
		return "", nil, errors.Join(err, release())
	}
	if err := r.maskWorkspace(dir, spec); err != nil {
		return "", nil, errors.Join(err, release())
	}
	return dir, release, nil
}

// releaseView removes a call's view once its container is made; a failure goes to Config.OnCleanup.
func (r *Runtime) releaseView(release func() error) {
	if err := release(); err != nil && r.cfg.OnCleanup != nil {
		r.cfg.OnCleanup(0, nil, err)
	}
}

// closeViews unmounts and removes this Runtime's view directory, once no call uses it.
func (r *Runtime) closeViews() error {
	if r.views.dir == "" {
		return nil
	}
	return removeSlotsTree(r.views.dir)
}

// removeOldViews removes the view directories of earlier Runtimes on this StateDir, unmounting what a
// crashed worker left mounted on them without entering any workspace.
func (r *Runtime) removeOldViews() error {
	old, _ := filepath.Glob(filepath.Join(r.cfg.StateDir, viewsPrefix+"*"))
	var errs []error
	for _, dir := range old {
		if dir != r.views.dir {
			errs = append(errs, removeSlotsTree(dir))
		}
	}
	return errors.Join(errs...)
}

// maskSources returns the empty file and the empty directory masks are bound from, making them when
// they are missing. They belong to root and are read-only for everyone; the masks are read-only mounts
// besides.
func (r *Runtime) maskSources() (file, dir string, err error) {
	base := filepath.Join(r.cfg.StateDir, maskDirName)
	file, dir = filepath.Join(base, "file"), filepath.Join(base, "dir")
	if err := os.MkdirAll(dir, 0o555); err != nil {
		return "", "", fmt.Errorf("create mask directory: %w", err)
	}
	f, err := os.OpenFile(file, os.O_CREATE|os.O_RDONLY, 0o444)
	if err != nil {
		return "", "", fmt.Errorf("create mask file: %w", err)
	}
	f.Close()
	return file, dir, nil
}

// needsMasks reports whether spec's workspace needs maskWorkspace.
func needsMasks(spec sandbox.Spec) bool { return len(spec.Hidden)+len(spec.ReadOnlyPaths) > 0 }

// maskWorkspace mounts a mask on each path of spec.Hidden and a read-only bind of itself on each path of
// spec.ReadOnlyPaths (not hidden), relative to the mounted workspace at dir. A path that is gone, or
// whose last component is a symbolic link (its target, if denied, has a mask of its own), is skipped; a
// path that leads through a symbolic link, another mount or out of the workspace is an error, and so is
// any failure to mount: a call whose masks are not all in place must not run.
func (r *Runtime) maskWorkspace(dir string, spec sandbox.Spec) error {
	if !needsMasks(spec) {
		return nil
	}
	hidden := spec.Hidden
	srcFile, srcDir, err := r.maskSources()
	if err != nil {
		return err
	}
	root, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("hide denied paths: open workspace: %w", err)
	}
	defer unix.Close(root)
	masks := map[bool]string{false: srcFile, true: srcDir}
	for _, rel := range hidden {
		if err := hideOne(root, rel, masks); err != nil {
			return fmt.Errorf("hide denied path %s: %w", rel, err)
		}
	}
	var readOnly []string
	for _, rel := range spec.ReadOnlyPaths {
		if slices.Contains(hidden, rel) {
			continue // a mask is read-only already
		}
		if err := bindReadOnly(root, rel); err != nil {
			return fmt.Errorf("make %s read-only: %w", rel, err)
		}
		readOnly = append(readOnly, rel)
	}
	// Then every directory above a mask, deepest first, becomes a mount point of its own (a recursive
	// bind of itself, with the masks beneath it): renaming it is EBUSY, as renaming a mask is. Otherwise
	// a call could move a masked file's directory (.git, .docker) to a name no glob matches, and the next
	// call would read it there.
	for _, rel := range ancestors(append(slices.Clone(hidden), readOnly...)) {
		if err := pinDir(root, rel); err != nil {
			return fmt.Errorf("pin directory %s: %w", rel, err)
		}
	}
	return nil
}

// ancestors returns the directories above the paths (not the root itself), each once, deepest first.
func ancestors(paths []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, p := range paths {
		for d := filepath.Dir(p); d != "." && !seen[d]; d = filepath.Dir(d) {
			seen[d] = true
			out = append(out, d)
		}
	}
	slices.SortFunc(out, func(a, b string) int { return strings.Count(b, "/") - strings.Count(a, "/") })
	return out
}

// pinDir binds directory rel beneath root onto itself, with what is mounted beneath it, writable as it
// was: a mount point no call can rename.
func pinDir(root int, rel string) error {
	return atBeneath(root, rel, func(target int) error { return bindSelf(target, 0) })
}

// atBeneath runs do on rel beneath root, opened by openBeneath; a path that is gone is skipped.
func atBeneath(root int, rel string, do func(target int) error) error {
	target, err := openBeneath(root, rel)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return err
	}
	defer unix.Close(target)
	return do(target)
}

// bindSelf binds what the descriptor target opens onto itself, with everything mounted beneath it,
// setting attrs (MOUNT_ATTR_...) on the whole copy first.
func bindSelf(target int, attrs uint64) error {
	tree, err := unix.OpenTree(target, "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_EMPTY_PATH|unix.AT_RECURSIVE)
	if err != nil {
		return fmt.Errorf("clone: %w", err)
	}
	defer unix.Close(tree)
	if attrs != 0 {
		attr := unix.MountAttr{Attr_set: attrs}
		if err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, &attr); err != nil {
			return fmt.Errorf("set mount flags: %w", err)
		}
	}
	if err := unix.MoveMount(tree, "", target, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH); err != nil {
		return fmt.Errorf("mount: %w", err)
	}
	return nil
}

// bindReadOnly binds rel beneath root onto itself read-only, with everything beneath it (a directory's
// files and subdirectories alike). A gitfile is a regular file named .git: a directory named .git is
// left as it is (its control files have paths of their own).
func bindReadOnly(root int, rel string) error {
	return atBeneath(root, rel, func(target int) error {
		var st unix.Stat_t
		if err := unix.Fstat(target, &st); err != nil {
			return fmt.Errorf("stat: %w", err)
		}
		kind := st.Mode & unix.S_IFMT
		switch {
		case kind == unix.S_IFLNK:
			return fmt.Errorf("it is a symbolic link, which cannot be made read-only where it points: replace %s by the file or directory it points to", rel)
		case kind == unix.S_IFDIR && filepath.Base(rel) == ".git":
			return nil
		}
		return bindSelf(target, unix.MOUNT_ATTR_RDONLY|unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV)
	})
}

// openBeneath opens rel beneath root as an O_PATH descriptor, refusing a symbolic link on the way, a way
// out of root and another mount; a last component that is a link is opened as the link.
func openBeneath(root int, rel string) (int, error) {
	if rel == "" || strings.HasPrefix(rel, "/") || filepath.Clean(rel) != rel || rel == ".." || strings.HasPrefix(rel, "../") {
		return -1, errors.New("not a clean relative path")
	}
	fd, err := unix.Openat2(root, rel, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
	})
	if err != nil {
		return -1, fmt.Errorf("open beneath the workspace: %w", err)
	}
	return fd, nil
}

// hideOne mounts a clone of the right mask on rel beneath root.
func hideOne(root int, rel string, masks map[bool]string) error {
	return atBeneath(root, rel, func(target int) error { return hideAt(target, masks) }) // gone: nothing to hide
}

// hideAt mounts a clone of the right mask on target.
func hideAt(target int, masks map[bool]string) error {
	var st unix.Stat_t
	if err := unix.Fstat(target, &st); err != nil {
		return fmt.Errorf("stat: %w", err)
	}
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		return nil // the link itself holds no content; its target is judged by its own name
	}
	mask, err := unix.OpenTree(unix.AT_FDCWD, masks[st.Mode&unix.S_IFMT == unix.S_IFDIR], unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return fmt.Errorf("clone mask: %w", err)
	}
	defer unix.Close(mask)
	// The flags go on the detached mount, so that the copy that propagates into a pooled container has them.
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV | unix.MOUNT_ATTR_NOEXEC}
	if err := unix.MountSetattr(mask, "", unix.AT_EMPTY_PATH, &attr); err != nil {
		return fmt.Errorf("set mask flags: %w", err)
	}
	if err := unix.MoveMount(mask, "", target, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH); err != nil {
		return fmt.Errorf("mount mask: %w", err)
	}
	return nil
}
