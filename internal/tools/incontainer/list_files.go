package incontainer

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strings"

	"github.com/toolpool/toolpool/internal/call"
)

const (
	listFilesDefaultDepth = 2
	listFilesMaxDepth     = 10
	listFilesDefaultLimit = 500
	listFilesMaxLimit     = 5000
)

type listFilesArgs struct {
	Path           string `json:"path"`
	Depth          IntArg `json:"depth"`
	IncludeIgnored bool   `json:"include_ignored"`
	Limit          IntArg `json:"limit"`
}

func runListFiles(e *runEnv, raw json.RawMessage) (RunnerResult, error) {
	var a listFilesArgs
	if err := decodeArgs(raw, &a); err != nil {
		return RunnerResult{}, err
	}
	rel, err := e.resolve("path", a.Path)
	if err != nil {
		return RunnerResult{}, err
	}
	depth := a.Depth.Or(listFilesDefaultDepth, listFilesMaxDepth)
	limit := a.Limit.Or(listFilesDefaultLimit, listFilesMaxLimit)

	info, err := e.root.Stat(rel)
	if err != nil {
		return RunnerResult{}, pathErr(err, "list", rel)
	}
	if !info.IsDir() {
		return RunnerResult{}, toolErr(call.ErrInvalidParams, "list %s: it is a file, not a directory: use read_file to read it", showPath(rel))
	}

	var (
		out     strings.Builder
		n       int
		cut     bool
		skipped int
		hidden  int
	)
	if pattern, ok := e.deniedRel(rel); ok {
		return RunnerResult{}, toolErr(call.ErrPolicyDenied, "list %s: it matches the denied pattern %q (secrets and keys stay out of reach); list elsewhere", showPath(rel), pattern)
	}
	var walk func(dir string, level int) error
	walk = func(dir string, level int) error {
		if err := e.ctx.Err(); err != nil {
			return err
		}
		entries, err := fs.ReadDir(e.root.FS(), dir)
		if err != nil {
			if dir == rel {
				return pathErr(err, "list", dir)
			}
			skipped++
			return nil
		}
		sort.Slice(entries, func(i, j int) bool { return entries[i].Name() < entries[j].Name() })
		for _, d := range entries {
			if n >= limit {
				cut = true
				return nil
			}
			p := path.Join(dir, d.Name())
			if _, denied := e.deniedRel(p); denied {
				hidden++
				continue
			}
			n++
			li, err := e.root.Lstat(p)
			if err != nil {
				fmt.Fprintf(&out, "%-8s %s (unreadable: %v)\n", "?", p, err)
				continue
			}
			switch kindOf(li.Mode()) {
			case "dir":
				ignored := ignoredDirs[d.Name()] && !a.IncludeIgnored
				note := ""
				if ignored {
					note = " (ignored: not listed; set include_ignored to see inside)"
				}
				fmt.Fprintf(&out, "%-8s %s/%s\n", "dir", p, note)
				if level < depth && !ignored {
					if err := walk(p, level+1); err != nil {
						return err
					}
				}
			case "symlink":
				target, _ := e.root.Readlink(p)
				fmt.Fprintf(&out, "%-8s %s -> %s\n", "symlink", p, target)
			case "file":
				fmt.Fprintf(&out, "%-8s %s (%d bytes)\n", "file", p, li.Size())
			default:
				fmt.Fprintf(&out, "%-8s %s (%s)\n", "other", p, li.Mode().Type())
			}
		}
		return nil
	}
	if err := walk(rel, 1); err != nil {
		return RunnerResult{}, err
	}
	hiddenNote := ""
	if hidden > 0 {
		hiddenNote = fmt.Sprintf("[%d entries not listed: policy denies them (secrets and keys)]", hidden)
	}
	if n == 0 {
		if hiddenNote != "" {
			return RunnerResult{Output: hiddenNote}, nil
		}
		return RunnerResult{Output: fmt.Sprintf("[%s is an empty directory]", showPath(rel))}, nil
	}
	res := RunnerResult{}
	if hiddenNote != "" {
		fmt.Fprintln(&out, hiddenNote)
	}
	if skipped > 0 {
		fmt.Fprintf(&out, "[%d directories could not be read]\n", skipped)
	}
	if cut {
		fmt.Fprintf(&out, "[listing cut at %d entries: list a subdirectory, lower depth, or raise limit (at most %d)]\n", limit, listFilesMaxLimit)
		res.Truncated = true
	}
	res.Output = strings.TrimSuffix(out.String(), "\n")
	return res, nil
}
