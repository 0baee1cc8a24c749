package incontainer

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strings"
	"time"

	"github.com/toolpool/toolpool/internal/call"
)

const (
	globDefaultLimit = 200
	globMaxLimit     = 5000
	// walkMaxEntries bounds how many entries glob and grep visit in one call.
	walkMaxEntries = 200000
	// globMaxPatterns bounds the patterns one brace expression expands to.
	globMaxPatterns = 64
)

type globArgs struct {
	Pattern string `json:"pattern"`
	Path    string `json:"path"`
	Limit   IntArg `json:"limit"`
}

type globMatch struct {
	path  string
	mtime time.Time
}

func runGlob(e *runEnv, raw json.RawMessage) (RunnerResult, error) {
	var a globArgs
	if err := decodeArgs(raw, &a); err != nil {
		return RunnerResult{}, err
	}
	base, err := e.resolve("path", a.Path)
	if err != nil {
		return RunnerResult{}, err
	}
	limit := a.Limit.Or(globDefaultLimit, globMaxLimit)
	pat := a.Pattern
	if strings.HasPrefix(pat, WorkspaceDir+"/") && base == "." {
		pat = strings.TrimPrefix(pat, WorkspaceDir+"/")
	}
	g, err := compileGlob(pat)
	if err != nil {
		return RunnerResult{}, toolErr(call.ErrInvalidParams, "%v", err)
	}
	info, err := e.root.Stat(base)
	if err != nil {
		return RunnerResult{}, pathErr(err, "search", base)
	}
	if !info.IsDir() {
		return RunnerResult{}, toolErr(call.ErrInvalidParams, "search %s: it is a file, not a directory: give a directory as path", showPath(base))
	}

	var matches []globMatch
	visited := 0
	stopped := false
	hidden := 0
	err = fs.WalkDir(e.root.FS(), base, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == base {
				return pathErr(err, "search", base)
			}
			return nil // an unreadable directory is skipped
		}
		if visited++; visited > walkMaxEntries {
			stopped = true
			return fs.SkipAll
		}
		if visited%1024 == 0 {
			if err := e.ctx.Err(); err != nil {
				return err
			}
		}
		if p == base {
			return nil
		}
		if _, denied := e.deniedRel(p); denied {
			hidden++
			if d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		segs := strings.Split(relTo(base, p), "/")
		if d.IsDir() {
			if ignoredDirs[d.Name()] && !g.names(d.Name()) {
				return fs.SkipDir
			}
			if !g.matchPrefix(segs) {
				return fs.SkipDir
			}
			return nil
		}
		if g.match(segs) {
			m := globMatch{path: p}
			if li, err := e.root.Lstat(p); err == nil {
				m.mtime = li.ModTime()
			}
			matches = append(matches, m)
		}
		return nil
	})
	if err != nil {
		return RunnerResult{}, err
	}
	hiddenNote := ""
	if hidden > 0 {
		hiddenNote = fmt.Sprintf("[%d files or directories were not looked at: policy denies them (secrets and keys)]", hidden)
	}
	if len(matches) == 0 {
		msg := fmt.Sprintf("No files match %q under %s.", a.Pattern, showPath(base))
		if hiddenNote != "" {
			msg += " " + hiddenNote
		}
		if !strings.Contains(pat, "/") && !strings.Contains(pat, "**") {
			msg += " The pattern has no \"/\", so it only matches files directly in that directory: try \"**/" + pat + "\" to search every level."
		}
		if stopped {
			msg += fmt.Sprintf(" The search stopped after %d entries: give a narrower path.", walkMaxEntries)
		}
		return RunnerResult{Output: msg}, nil
	}
	sort.Slice(matches, func(i, j int) bool {
		if !matches[i].mtime.Equal(matches[j].mtime) {
			return matches[i].mtime.After(matches[j].mtime)
		}
		return matches[i].path < matches[j].path
	})
	var out strings.Builder
	for i, m := range matches {
		if i == limit {
			break
		}
		out.WriteString(m.path)
		out.WriteByte('\n')
	}
	res := RunnerResult{}
	if len(matches) > limit {
		fmt.Fprintf(&out, "[%d files match; showing the %d most recently modified: narrow the pattern or path, or raise limit (at most %d)]\n", len(matches), limit, globMaxLimit)
		res.Truncated = true
	}
	if stopped {
		fmt.Fprintf(&out, "[the search stopped after visiting %d entries: there may be more matches; give a narrower path]\n", walkMaxEntries)
		res.Truncated = true
	}
	if hiddenNote != "" {
		out.WriteString(hiddenNote + "\n")
	}
	res.Output = strings.TrimSuffix(out.String(), "\n")
	return res, nil
}

// relTo returns p (a descendant of base, both workspace-relative) relative to base.
func relTo(base, p string) string {
	if base == "." {
		return p
	}
	return strings.TrimPrefix(p, base+"/")
}

// glob is a compiled doublestar pattern: one segment list per brace alternative.
type glob struct {
	alts [][]string
}

// compileGlob expands braces, splits on "/" and checks every segment's syntax.
func compileGlob(pattern string) (*glob, error) {
	if pattern == "" {
		return nil, errors.New("the glob pattern is empty")
	}
	if strings.HasPrefix(pattern, "/") {
		return nil, fmt.Errorf("glob pattern %q is absolute: make it relative to path (or start it with %s/)", pattern, WorkspaceDir)
	}
	expanded, err := expandBraces(pattern)
	if err != nil {
		return nil, err
	}
	g := &glob{}
	for _, p := range expanded {
		var segs []string
		for _, s := range strings.Split(path.Clean(p), "/") {
			if s == ".." {
				return nil, fmt.Errorf("glob pattern %q uses \"..\": patterns match below path; change path instead", pattern)
			}
			if s == "**" {
				if len(segs) > 0 && segs[len(segs)-1] == "**" {
					continue
				}
			} else if _, err := path.Match(s, ""); err != nil {
				return nil, fmt.Errorf("glob pattern %q is malformed at %q: %w (escape a literal *, ?, [ or \\ with \\)", pattern, s, err)
			}
			segs = append(segs, s)
		}
		g.alts = append(g.alts, segs)
	}
	return g, nil
}

// match reports whether the path segments segs match the pattern.
func (g *glob) match(segs []string) bool {
	for _, pat := range g.alts {
		if matchSegs(pat, segs) {
			return true
		}
	}
	return false
}

// matchPrefix reports whether some path below the directory segs could match.
func (g *glob) matchPrefix(segs []string) bool {
	for _, pat := range g.alts {
		if matchDirPrefix(pat, segs) {
			return true
		}
	}
	return false
}

// names reports whether some alternative names the directory name as a literal segment.
func (g *glob) names(name string) bool {
	for _, pat := range g.alts {
		for _, s := range pat {
			if s == name {
				return true
			}
		}
	}
	return false
}

// matchSegs reports whether the pattern segments pat match the path segments segs, by dynamic programming
// over (pattern position, path position) so that many "**" cannot make it exponential.
func matchSegs(pat, segs []string) bool {
	n := len(segs)
	next := make([]bool, n+1) // next[j]: pat[i+1:] matches segs[j:]
	next[n] = true
	for i := len(pat) - 1; i >= 0; i-- {
		cur := make([]bool, n+1)
		if pat[i] == "**" {
			cur[n] = next[n]
			for j := n - 1; j >= 0; j-- {
				cur[j] = next[j] || cur[j+1]
			}
		} else {
			for j := 0; j < n; j++ {
				if next[j+1] {
					cur[j], _ = path.Match(pat[i], segs[j])
				}
			}
		}
		next = cur
	}
	return next[0]
}

func matchDirPrefix(pat, segs []string) bool {
	for len(segs) > 0 {
		if len(pat) == 0 {
			return false
		}
		if pat[0] == "**" {
			return true
		}
		if ok, _ := path.Match(pat[0], segs[0]); !ok {
			return false
		}
		pat, segs = pat[1:], segs[1:]
	}
	return len(pat) > 0
}

// expandBraces expands "{a,b}" alternatives (nested ones too) into separate patterns. A backslash escapes
// the character after it: "\{", "\}" and "\," are literal, outside braces and in them.
func expandBraces(p string) ([]string, error) {
	open := -1
	for i := 0; i < len(p) && open < 0; i++ {
		switch p[i] {
		case '\\':
			i++
		case '{':
			open = i
		}
	}
	if open < 0 {
		return []string{p}, nil
	}
	depth, close := 0, -1
	var commas []int
	for i := open; i < len(p) && close < 0; i++ {
		switch p[i] {
		case '\\':
			i++
		case '{':
			depth++
		case '}':
			depth--
			if depth == 0 {
				close = i
			}
		case ',':
			if depth == 1 {
				commas = append(commas, i)
			}
		}
	}
	if close < 0 {
		return nil, fmt.Errorf("glob pattern %q has a \"{\" without a matching \"}\"", p)
	}
	var out []string
	start := open + 1
	for _, end := range append(commas, close) {
		rest, err := expandBraces(p[:open] + p[start:end] + p[close+1:])
		if err != nil {
			return nil, err
		}
		out = append(out, rest...)
		if len(out) > globMaxPatterns {
			return nil, fmt.Errorf("glob pattern %q expands to more than %d patterns: use fewer braces", p, globMaxPatterns)
		}
		start = end + 1
	}
	return out, nil
}
