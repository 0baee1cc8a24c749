package executor

import (
	"errors"
	"fmt"
	"path"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/policy/deniedpath"
	"github.com/toolpool/toolpool/internal/tools"
)

// maxHidden is the most paths under denied globs a workspace may hold for a call that hides them: each is
// a mount of its own in the call's container.
const maxHidden = 1000

// hiddenPaths returns the paths of the workspace at dir that call c's container must not see: those its
// denied globs match (call.Limits.DeniedGlobs) and every other name of their files (hard links). The
// built-in file tools check each path they open against the globs, in their runner, so their containers
// hide only the other names, which no glob matches. A workspace with more than maxHidden of them is the
// caller's error to fix. The executor's Finder keeps the readings of directories that did not change, so
// that a large workspace is not read whole for each call.
func (e *Executor) hiddenPaths(c *call.Call, tool *tools.Tool, dir string) ([]string, *call.ErrorInfo, error) {
	if len(c.Limits.DeniedGlobs) == 0 {
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
	if tool.TakesDeniedGlobs() {
		hidden = slices.DeleteFunc(hidden, func(p string) bool {
			_, named := set.Match(path.Join(deniedpath.WorkspaceRoot, p))
			return named // the runner refuses it by name
		})
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
// read-only like the control files; a .git directory that lacks hooks, config or commondir gets one that
// means what its absence meant (ensureControl), read-only, so that a call cannot create it.
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
// git's control files, unless policy lets the call write them. It creates the control files a .git
// directory lacks (ensureControl), beneath dir without following a link, except for a call whose whole
// workspace is read-only (the read-only posture), which can create nothing and whose workspace is left
// as it is.
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
		if c.Limits.ReadOnlyWorkspace {
			break
		}
		made, err := ensureControl(dir, g)
		if err != nil {
			return nil, err
		}
		paths = append(paths, made...)
	}
	return append(paths, dotGits...), nil
}

// missingControl are the control files a .git directory may lack, and what ensureControl puts in their
// place: each means what its absence meant, so git behaves as before, and once it is read-only a call
// cannot create the real thing. An empty hooks directory (as git init makes it) runs no hook; an empty
// config sets nothing (git creates the file on the first git config, which could set core.hooksPath or
// core.fsmonitor); a commondir of "." names the .git directory itself as the common directory, which is
// where git looks without one (a commondir naming another directory would make git read that
// directory's config and hooks). config.worktree needs nothing: git reads it only when the config,
// read-only, turns on extensions.worktreeConfig.
var missingControl = []struct {
	name    string
	dir     bool
	content string
}{{name: "hooks", dir: true}, {name: "config"}, {name: "commondir", content: ".\n"}}

// ensureControl creates the control files the .git directory at rel beneath root lacks (missingControl),
// owned like the .git directory, and returns the paths it created; a gitfile, or a .git reached through a
// link, gets nothing.
func ensureControl(root, rel string) ([]string, error) {
	rootFD, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open workspace: %w", err)
	}
	defer unix.Close(rootFD)
	gitFD, err := unix.Openat2(rootFD, rel, &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS})
	if err != nil {
		return nil, nil // a gitfile, a link, or gone
	}
	defer unix.Close(gitFD)
	var st unix.Stat_t
	if err := unix.Fstat(gitFD, &st); err != nil {
		return nil, fmt.Errorf("stat %s: %w", rel, err)
	}
	var made []string
	for _, m := range missingControl {
		p := path.Join(rel, m.name)
		created, err := createControl(gitFD, m.name, m.dir, m.content)
		if err != nil {
			return nil, fmt.Errorf("create %s: %w", p, err)
		}
		if !created {
			continue // found by the walk unless it appeared since: either way not ours to add
		}
		// The .git's owner's, as git would have made it, for a call that may write it.
		if err := unix.Fchownat(gitFD, m.name, int(st.Uid), int(st.Gid), unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return nil, fmt.Errorf("chown %s: %w", p, err)
		}
		made = append(made, p)
	}
	return made, nil
}

// createControl creates name in the directory gitFD (O_PATH) unless something of that name exists, and
// reports whether it did.
func createControl(gitFD int, name string, dir bool, content string) (bool, error) {
	if dir {
		switch err := unix.Mkdirat(gitFD, name, 0o755); {
		case err == nil:
			return true, nil
		case errors.Is(err, unix.EEXIST):
			return false, nil
		default:
			return false, err
		}
	}
	fd, err := unix.Openat(gitFD, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
	if errors.Is(err, unix.EEXIST) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer unix.Close(fd)
	if _, err := unix.Write(fd, []byte(content)); err != nil {
		return false, err
	}
	return true, nil
}
