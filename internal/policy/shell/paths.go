package shell

import (
	"errors"
	"fmt"
	"path"
	"strings"
	"unicode/utf8"

	"github.com/toolpool/toolpool/internal/policy/deniedpath"
)

// WorkspaceRoot is where a call's workspace is mounted in its container, and what "~" stands for.
const WorkspaceRoot = deniedpath.WorkspaceRoot

// maxPathBytes bounds a path (Linux's PATH_MAX).
const maxPathBytes = 4096

// ResolvePath turns a path as a model gives it into a clean absolute path inside the container's file
// system: "~" and "~/..." become the workspace root, a relative path is joined to the workspace root, and
// the result is cleaned lexically ("a/../b" is "b"). Symbolic links are not followed: policy runs outside
// the container, and the container's mounts enforce containment a second time.
//
// It rejects inputs that cannot be a path: empty, longer than 4096 bytes, invalid UTF-8, a NUL or another
// control character, or "~name" (another user's home).
func ResolvePath(p string) (string, error) {
	switch {
	case p == "":
		return "", errors.New("the path is empty")
	case len(p) > maxPathBytes:
		return "", fmt.Errorf("the path is %d bytes long: the limit is %d", len(p), maxPathBytes)
	case !utf8.ValidString(p):
		return "", errors.New("the path is not valid UTF-8")
	}
	for i := 0; i < len(p); i++ {
		if c := p[i]; c < 0x20 || c == 0x7f {
			return "", fmt.Errorf("the path contains the control character %q", c)
		}
	}
	abs, ok := deniedpath.ExpandHome(p)
	switch {
	case !ok:
		return "", fmt.Errorf("the path %q names another user's home: use a path inside %s", p, WorkspaceRoot)
	case !strings.HasPrefix(abs, "/"):
		abs = WorkspaceRoot + "/" + abs
	}
	return path.Clean(abs), nil
}

// within reports whether the clean absolute path p is root or below it, comparing whole components:
// /workspace2 is not within /workspace.
func within(root, p string) bool {
	if root == "/" {
		return strings.HasPrefix(p, "/")
	}
	return p == root || strings.HasPrefix(p, root+"/")
}

func withinAny(roots []string, p string) bool {
	for _, r := range roots {
		if within(r, p) {
			return true
		}
	}
	return false
}

// systemDirs are never written by a call, whatever roots a policy allows.
var systemDirs = []string{
	"/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/opt", "/proc", "/root",
	"/run", "/sbin", "/srv", "/sys", "/usr", "/var",
}

func isSystemPath(p string) bool {
	if p == "/" {
		return true
	}
	for _, d := range systemDirs {
		if within(d, p) {
			return true
		}
	}
	return false
}

// harmlessDevices may be read and written by any command.
var harmlessDevices = map[string]bool{
	"/dev/null": true, "/dev/zero": true, "/dev/stdin": true, "/dev/stdout": true, "/dev/stderr": true,
	"/dev/tty": true, "/dev/random": true, "/dev/urandom": true, "/dev/full": true,
}

func isHarmlessDevice(p string) bool {
	if harmlessDevices[p] {
		return true
	}
	if rest, ok := strings.CutPrefix(p, "/dev/fd/"); ok && rest != "" && strings.Trim(rest, "0123456789") == "" {
		return true
	}
	return false
}

// Paths are the effective path rules of one tool: a path must be inside one of the roots of every layer
// and must match none of the denied globs. The policy engine builds them from its layers; the analyser
// and the engine's checks of a tool's own paths judge by them.
type Paths struct {
	Roots  [][]string // per layer that sets roots
	Denied []deniedpath.Glob
}

// InRoots reports whether the clean absolute path p is inside the roots of every layer.
func (r Paths) InRoots(p string) bool {
	for _, layerRoots := range r.Roots {
		if !withinAny(layerRoots, p) {
			return false
		}
	}
	return true
}

// RootsText names the roots for a message to the model.
func (r Paths) RootsText() string {
	if len(r.Roots) == 0 {
		return WorkspaceRoot
	}
	return strings.Join(r.Roots[len(r.Roots)-1], ", ")
}

// DeniedBy returns the first denied glob that matches the clean absolute path p.
func (r Paths) DeniedBy(p string) (deniedpath.Glob, bool) {
	for _, g := range r.Denied {
		if g.Match(p) {
			return g, true
		}
	}
	return deniedpath.Glob{}, false
}

// DeniedDetail says, for a finding, that p matches the denied glob g.
func DeniedDetail(p string, g deniedpath.Glob) string {
	return fmt.Sprintf("%s matches the denied pattern %q (secrets and keys stay out of reach); do not read or write it", p, g.Source())
}
