package tools

import (
	"encoding/json"
	"time"

	"github.com/toolpool/toolpool/internal/tools/incontainer"
)

var grepTool = builtin{
	name: "grep",
	kind: KindSearch,
	description: `Search file contents in the workspace with a regular expression (Go RE2 syntax: like PCRE ` +
		`without backreferences or lookaround; escape literal characters such as "(" or "." with "\"). Returns ` +
		`matching lines as "path:line:text" (path relative to /workspace, 1-based line number); with "context", ` +
		`surrounding lines are shown as "path-line-text" and groups are separated by "--".
"path" is the file or directory to search (default: the workspace). "glob" keeps only files whose path ` +
		`matches it: a pattern without "/" is matched against the file name ("*.go"), one with "/" against the ` +
		`path relative to "path" ("src/**/*.ts"). "ignore_case" makes the search case-insensitive. Binary files ` +
		`and directories such as .git, node_modules, __pycache__ and .venv are skipped. Only the first 1 MiB of a line ` +
		`is searched. Lines are cut to 500 bytes ` +
		`in the output. At most "limit" matching lines are returned (default 200, at most 2000); the output says ` +
		`when it stopped. No match is not an error: the output says so. To find files by name use glob.`,
	schema: `{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "properties": {
    "pattern": {"type": "string", "minLength": 1, "description": "The regular expression (Go RE2 syntax) to search for."},
    "path": {"type": "string", "description": "The file or directory to search, relative to /workspace or absolute under /workspace. Default: the workspace."},
    "glob": {"type": "string", "minLength": 1, "description": "Only search files matching this glob, e.g. \"*.py\" or \"src/**/*.{ts,tsx}\"."},
    "ignore_case": {"type": "boolean", "description": "Match regardless of case. Default false."},
    "context": {"type": "integer", "minimum": 0, "maximum": 20, "description": "Lines of context to show before and after each match. Default 0."},
    "limit": {"type": "integer", "minimum": 1, "maximum": 2000, "description": "How many matching lines to return at most. Default 200."}
  },
  "required": ["pattern"],
  "additionalProperties": false
}`,
	timeout:     60 * time.Second,
	outputBytes: incontainer.GrepOutputBytes + 4<<10,
	facts:       func(args json.RawMessage) Facts { return pathFacts(args, true, "path") },
	check:       pathChecks("path"),
	runner:      true,
}
