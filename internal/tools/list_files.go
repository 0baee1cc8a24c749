package tools

import (
	"encoding/json"
	"time"
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
	runner:      true,
}
