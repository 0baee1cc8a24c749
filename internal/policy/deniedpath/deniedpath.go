// Package deniedpath is policy's denied-path globs ("**/.env", "~/.ssh/**") and how a path matches them,
// apart from the rest of policy so that the runner inside a call's container, which applies a call's
// denied globs to the files it opens, links neither the policy file's YAML nor the shell parser.
package deniedpath

import (
	"errors"
	"fmt"
	"path"
	"strings"
)

// WorkspaceRoot is where a call's workspace is mounted in its container, and what "~" stands for.
const WorkspaceRoot = "/workspace"

// ExpandHome turns "~" into the workspace root and "~/x" into the workspace root's x; ok is false for
// "~name" (another user's home, which a call has none of). Other paths come back as they are.
func ExpandHome(p string) (expanded string, ok bool) {
	switch {
	case p == "~":
		return WorkspaceRoot, true
	case strings.HasPrefix(p, "~/"):
		return WorkspaceRoot + p[1:], true
	case strings.HasPrefix(p, "~"):
		return p, false
	}
	return p, true
}

// A Glob is a denied-path pattern with doublestar semantics, normalized to an absolute pattern:
//   - "**" as a whole segment matches zero or more segments, so "**/.env" matches /workspace/.env and
//     /tmp/a/.env, and "~/.ssh/**" matches /workspace/.ssh itself and everything below it;
//   - within a segment, path.Match syntax: "*", "?", "[a-z]", "\" escapes;
//   - "~" and "~/..." stand for the workspace root, a pattern starting with "**" matches anywhere, any other
//     relative pattern is relative to the workspace root;
//   - names are compared in lower case: "**/.env" matches .ENV and .Env too, which a case-insensitive file
//     system (a casefold directory, a volume from macOS or Windows) serves as the same file.
type Glob struct {
	source   string   // as written in the policy file
	segments []string // absolute pattern split at "/", without the leading empty segment
	folded   []string // segments in lower case, what names are matched against
}

var errEmpty = errors.New("the pattern is empty")

// CompileGlob normalizes and validates a denied-path pattern.
func CompileGlob(pattern string) (Glob, error) {
	if pattern == "" {
		return Glob{}, errEmpty
	}
	if strings.IndexByte(pattern, 0) >= 0 {
		return Glob{}, errors.New("the pattern contains a NUL byte")
	}
	abs, ok := ExpandHome(pattern)
	switch {
	case !ok:
		return Glob{}, fmt.Errorf("pattern %q: only \"~\" and \"~/...\" (the workspace root) are supported", pattern)
	case strings.HasPrefix(abs, "/"):
	case strings.HasPrefix(abs, "**"):
		abs = "/" + abs
	default:
		abs = WorkspaceRoot + "/" + abs
	}
	segs := strings.Split(strings.TrimPrefix(abs, "/"), "/")
	var out []string
	for i, s := range segs {
		switch {
		case s == "" && i == len(segs)-1 && i > 0: // trailing slash: "dir/" means the directory
			continue
		case s == "" || s == ".":
			return Glob{}, fmt.Errorf("pattern %q has an empty or \".\" segment", pattern)
		case s == "..":
			return Glob{}, fmt.Errorf("pattern %q has a \"..\" segment", pattern)
		case s == "**":
			if len(out) > 0 && out[len(out)-1] == "**" {
				continue // "**/**" is "**"
			}
		case strings.Contains(s, "**"):
			return Glob{}, fmt.Errorf("pattern %q: use \"**\" only as a whole path segment, like \"**/x\" or \"dir/**\"", pattern)
		default:
			if _, err := path.Match(s, ""); err != nil {
				return Glob{}, fmt.Errorf("pattern %q: segment %q is malformed: %w", pattern, s, err)
			}
		}
		out = append(out, s)
	}
	folded := make([]string, len(out))
	for i, s := range out {
		folded[i] = strings.ToLower(s)
	}
	return Glob{source: pattern, segments: out, folded: folded}, nil
}

// Match reports whether the clean absolute path name matches g, in any case.
func (g Glob) Match(name string) bool {
	return matchSegments(g.folded, SplitAbs(strings.ToLower(name)))
}

// Source is the pattern as written in the policy file.
func (g Glob) Source() string { return g.source }

// Segments is the absolute pattern split at "/", without the leading empty segment ("**" a whole segment).
// The caller must not change it.
func (g Glob) Segments() []string { return g.segments }

// FoldedSegments is Segments in lower case: what Match compares lower-cased names with. The caller must not
// change it.
func (g Glob) FoldedSegments() []string { return g.folded }

// SplitAbs splits the absolute path name at "/", without the leading empty segment; "/" is no segments.
func SplitAbs(name string) []string {
	name = strings.TrimPrefix(name, "/")
	if name == "" {
		return nil
	}
	return strings.Split(name, "/")
}

// matchSegments matches pattern segments against name segments; "**" matches zero or more segments. It
// runs in O(len(pat)*len(name)) time whatever the number of "**".
func matchSegments(pat, name []string) bool {
	// reach[j] is true when pat[:i] can match name[:j].
	reach := make([]bool, len(name)+1)
	reach[0] = true
	for _, p := range pat {
		next := make([]bool, len(name)+1)
		if p == "**" {
			seen := false
			for j := range reach {
				seen = seen || reach[j]
				next[j] = seen
			}
		} else {
			for j := 0; j < len(name); j++ {
				if reach[j] {
					if ok, _ := path.Match(p, name[j]); ok {
						next[j+1] = true
					}
				}
			}
		}
		reach = next
	}
	return reach[len(name)]
}

// Set matches paths against denied globs with policy's semantics ("**" segments, "~" for the
// workspace, path.Match within a segment). The file tools use it inside the container, with the globs
// the dispatcher's decision carries (Limits.DeniedGlobs). It is immutable and safe for concurrent use.
type Set struct {
	globs []Glob
}

// Compile compiles denied globs as written in a policy file. A nil *Set (no patterns) matches nothing.
func Compile(patterns []string) (*Set, error) {
	if len(patterns) == 0 {
		return nil, nil
	}
	d := &Set{}
	for _, p := range patterns {
		g, err := CompileGlob(p)
		if err != nil {
			return nil, fmt.Errorf("compile denied glob %q: %w", p, err)
		}
		d.globs = append(d.globs, g)
	}
	return d, nil
}

// Match reports whether the clean absolute path p matches a denied glob, and which one (as written).
func (d *Set) Match(p string) (pattern string, ok bool) {
	if d == nil {
		return "", false
	}
	for _, g := range d.globs {
		if g.Match(p) {
			return g.source, true
		}
	}
	return "", false
}
