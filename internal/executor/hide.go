package executor

import (
	"errors"
	"fmt"
	"path"

	"golang.org/x/sys/unix"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/policy/deniedpath"
	"github.com/toolpool/toolpool/internal/tools"
)

// maxHidden is the most paths under denied globs a workspace may hold for a call that hides them: each is
// a mount of its own in the call's container.
const maxHidden = 1000

// hiddenPaths returns the paths of the workspace at dir that call c's container must not see: those its
// denied globs match (call.Limits.DeniedGlobs), for the tools that do not apply the globs themselves
// (run_shell, custom tools; the built-in file tools check each path they open, in their runner). A
// workspace with more than maxHidden of them is the caller's error to fix. The executor's Finder keeps the
// readings of directories that did not change, so that a large workspace is not read whole for each call.
func (e *Executor) hiddenPaths(c *call.Call, tool *tools.Tool, dir string) ([]string, *call.ErrorInfo, error) {
	if tool.TakesDeniedGlobs() || len(c.Limits.DeniedGlobs) == 0 {
		return nil, nil, nil
	}
	set, err := deniedpath.Compile(c.Limits.DeniedGlobs)
	if err != nil {
		return nil, &call.ErrorInfo{Type: call.ErrInvalidParams, Message: fmt.Sprintf("the call's denied globs do not compile: %v", err)}, nil
	}
	hidden, err := e.finder.Find(set, dir, maxHidden)
	if errors.Is(err, deniedpath.ErrTooMany) {
		return nil, &call.ErrorInfo{Type: call.ErrPermissionDenied, Message: fmt.Sprintf("toolpool did not run this call: "+
			"the workspace holds more than %d files or directories under the denied globs (%v), and each must be hidden from "+
			"the call's container. Remove them from the workspace, or keep them in fewer directories (a denied "+
			"directory counts once).", maxHidden, err)}, nil
	}
	if err != nil {
		return nil, nil, err
	}
	return hidden, nil, nil
}

// gitControlGlobs are git's control files in a workspace: a repository's (and a submodule's or a linked
// worktree's) config, hooks and commondir. Hooks and core.fsmonitor are how a workspace turns into code
// that runs outside the sandbox later (after a download, in the platform's CI), so they are read-only in
// every container unless policy grants writing them (call.Limits.WriteGitControl).
var gitControlGlobs = []string{
	"**/.git/config", "**/.git/hooks", "**/.git/commondir", "**/.git/config.worktree",
	"**/.git/worktrees/*/config.worktree", "**/.git/worktrees/*/commondir",
	"**/.git/modules/**/config", "**/.git/modules/**/hooks", "**/.git/modules/**/commondir",
	"**/.git/modules/**/config.worktree",
}

// gitDirGlobs find every .git: a gitfile (a regular file that points git at another directory) is
// read-only like the control files; a .git directory without hooks gets an empty one, read-only, so that
// a call cannot create it.
var gitDirGlobs = []string{"**/.git"}

var gitControl, gitDirs = mustCompile(gitControlGlobs), mustCompile(gitDirGlobs)

func mustCompile(globs []string) *deniedpath.Set {
	s, err := deniedpath.Compile(globs)
	if err != nil {
		panic(err)
	}
	return s
}

// readOnlyPaths returns the paths of the workspace at dir that call c's container may read but not change:
// git's control files, unless policy lets the call write them. It creates the hooks directory a .git
// directory lacks (empty, as git init makes it), beneath dir without following a link.
func (e *Executor) readOnlyPaths(c *call.Call, dir string) ([]string, error) {
	if c.Limits.WriteGitControl {
		return nil, nil
	}
	paths, err := e.finder.Find(gitControl, dir, maxHidden)
	if err != nil {
		return nil, err
	}
	dotGits, err := e.finder.Find(gitDirs, dir, maxHidden)
	if err != nil {
		return nil, err
	}
	for _, g := range dotGits {
		hooks, made, err := ensureHooks(dir, g)
		if err != nil {
			return nil, err
		}
		if made {
			paths = append(paths, hooks)
		}
	}
	return append(paths, dotGits...), nil
}

// ensureHooks creates the hooks directory of the .git directory at rel beneath root when it has none, and
// reports whether it did; a gitfile, or a .git reached through a link, gets nothing.
func ensureHooks(root, rel string) (string, bool, error) {
	hooks := path.Join(rel, "hooks")
	rootFD, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", false, fmt.Errorf("open workspace: %w", err)
	}
	defer unix.Close(rootFD)
	gitFD, err := unix.Openat2(rootFD, rel, &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS})
	if err != nil {
		return "", false, nil // a gitfile, a link, or gone
	}
	defer unix.Close(gitFD)
	switch err := unix.Mkdirat(gitFD, "hooks", 0o755); {
	case err == nil:
		// The .git's owner's, as git init would have made it, for a call that may write it.
		var st unix.Stat_t
		if err := unix.Fstat(gitFD, &st); err != nil {
			return "", false, fmt.Errorf("stat %s: %w", rel, err)
		}
		if err := unix.Fchownat(gitFD, "hooks", int(st.Uid), int(st.Gid), unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return "", false, fmt.Errorf("chown %s: %w", hooks, err)
		}
		return hooks, true, nil
	case errors.Is(err, unix.EEXIST):
		return "", false, nil // found by the walk unless it appeared since: either way not ours to add
	default:
		return "", false, fmt.Errorf("create %s: %w", hooks, err)
	}
}
