package tools

import (
	"encoding/json"
	"time"
)

var editFileTool = builtin{
	name: "edit_file",
	kind: KindEdit,
	description: `Replace text in a file of the workspace: "old_string" is replaced by "new_string". ` +
		`old_string must match the file exactly, whitespace and indentation included, and occur exactly once, ` +
		`unless "replace_all" is true (then every occurrence is replaced, e.g. to rename a variable). Include ` +
		`enough surrounding lines in old_string to make it unique. Read the file with read_file first and copy ` +
		`the text after the line-number tab, never the line numbers. Returns a unified diff of the change.
Errors: "not found" (re-read the file and check whitespace, indentation and line breaks), "found N times" ` +
		`(add context or set replace_all), old_string equal to new_string. An empty old_string creates a new file ` +
		`(or fills an empty one) with new_string. Files with CRLF line endings are matched with "\n" in old_string ` +
		`too. Files larger than 16 MiB cannot be edited: use run_shell.`,
	schema: `{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "properties": {
    "path": {"type": "string", "minLength": 1, "description": "The file to edit, relative to /workspace or absolute under /workspace."},
    "old_string": {"type": "string", "description": "The exact text to replace. Empty to create a new file."},
    "new_string": {"type": "string", "description": "The text to put in its place."},
    "replace_all": {"type": "boolean", "description": "Replace every occurrence instead of exactly one. Default false."}
  },
  "required": ["path", "old_string", "new_string"],
  "additionalProperties": false
}`,
	timeout:     30 * time.Second,
	outputBytes: 64 << 10,
	facts:       func(args json.RawMessage) Facts { return pathFacts(args, false, "path") },
	check:       pathChecks("path"),
	runner:      true,
}
