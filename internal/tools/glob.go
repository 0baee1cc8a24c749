package tools

import (
	"encoding/json"
	"time"
)

var globTool = builtin{
	name: "glob",
	kind: KindSearch,
	description: `Find files in the workspace whose path matches a glob pattern. Returns matching file paths ` +
		`(relative to /workspace), one per line, most recently modified first.
Pattern syntax: "*" matches any characters except "/", "?" one character, "[abc]" a character class, ` +
		`"{a,b}" alternatives, and "**" any number of directories (including none). The pattern is matched against ` +
		`paths relative to "path" (default: the workspace): "*.go" matches only files directly in it, "**/*.go" Go ` +
		`files at any depth, "src/**/*.{ts,tsx}" TypeScript files under src. Directories such as .git, ` +
		`node_modules, __pycache__ and .venv are skipped unless the pattern names them.
At most "limit" paths are returned (default 200, at most 5000); the output says when there were more. No ` +
		`match is not an error: the output says so. To search file contents use grep; to browse use list_files.`,
	schema: `{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "properties": {
    "pattern": {"type": "string", "minLength": 1, "description": "The glob pattern, e.g. \"**/*.py\" or \"src/**/test_*.go\"."},
    "path": {"type": "string", "description": "The directory to search in, relative to /workspace or absolute under /workspace. Default: the workspace."},
    "limit": {"type": "integer", "minimum": 1, "maximum": 5000, "description": "How many paths to return at most. Default 200."}
  },
  "required": ["pattern"],
  "additionalProperties": false
}`,
	timeout:     60 * time.Second,
	outputBytes: 256 << 10,
	facts:       func(args json.RawMessage) Facts { return pathFacts(args, true, "path") },
	check:       pathChecks("path"),
	runner:      true,
}
