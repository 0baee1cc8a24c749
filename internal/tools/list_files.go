package tools

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strings"
	"time"

	"github.com/toolpool/toolpool/internal/call"
)

const (
	listFilesDefaultDepth = 2
	listFilesMaxDepth     = 10
	listFilesDefaultLimit = 500
	listFilesMaxLimit     = 5000
)

var listFilesTool = builtin{
	name: "list_files",
	kind: KindRead,
	description: `List a directory of the workspace, recursively down to "depth" levels (default 2: the ` +
		`directory's entries and their entries). One entry per line: its type (dir, file, symlink), its path ` +
		`relative to /workspace (directories end in "/"), then the size in bytes for files or the target for ` +
		`symlinks. Entries are sorted by name, each directory's contents right after it. Symlinks are shown, ` +
		`not followed.
Version-control, dependency and cache directories (.git, node_modules, __pycache__, .venv, venv, .tox, ...) are ` +
		`shown but not entered; set include_ignored to list their contents. At most "limit" entries are returned ` +
		`(default 500, at most 5000); the output says when the listing was cut. To find files by name use glob; ` +
		`to search contents use grep.`,
	schema: `{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "properties": {
    "path": {"type": "string", "description": "The directory to list, relative to /workspace or absolute under /workspace. Default: the workspace."},
    "depth": {"type": "integer", "minimum": 1, "maximum": 10, "description": "How many levels to descend. 1 lists only the directory's own entries. Default 2."},
    "include_ignored": {"type": "boolean", "description": "Also enter .git, node_modules, __pycache__, .venv and similar directories. Default false."},
    "limit": {"type": "integer", "minimum": 1, "maximum": 5000, "description": "How many entries to return at most. Default 500."}
  },
  "additionalProperties": false
}`,
	timeout:     30 * time.Second,
	outputBytes: 256 << 10,
	facts:       func(args json.RawMessage) Facts { return pathFacts(args, true, "path") },
	check:       pathChecks("path"),
	run:         runListFiles,
}

type listFilesArgs struct {
	Path           string `json:"path"`
	Depth          intArg `json:"depth"`
	IncludeIgnored bool   `json:"include_ignored"`
	Limit          intArg `json:"limit"`
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
	depth := a.Depth.or(listFilesDefaultDepth, listFilesMaxDepth)
	limit := a.Limit.or(listFilesDefaultLimit, listFilesMaxLimit)

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
