package tools

import (
	"encoding/json"
	"time"
)

var writeFileTool = builtin{
	name: "write_file",
	kind: KindEdit,
	description: `Write a whole file in the workspace: creates it (and any missing parent directories) or ` +
		`replaces its entire content. The replacement is atomic (a temporary file renamed into place) and keeps ` +
		`an existing file's permissions. Returns whether the file was created or overwritten and how many bytes ` +
		`were written.
Prefer edit_file to change part of an existing file: it is cheaper and cannot lose content you did not ` +
		`read. Use write_file for new files or complete rewrites, and read the file first when it exists. ` +
		`"content" is written exactly as given (UTF-8, no newline added). Paths are relative to /workspace (or ` +
		`absolute under /workspace). The content is limited to 64 MiB.`,
	schema: `{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "properties": {
    "path": {"type": "string", "minLength": 1, "description": "The file to write, relative to /workspace or absolute under /workspace."},
    "content": {"type": "string", "description": "The complete new content of the file."}
  },
  "required": ["path", "content"],
  "additionalProperties": false
}`,
	timeout:     30 * time.Second,
	outputBytes: 4 << 10,
	facts:       func(args json.RawMessage) Facts { return pathFacts(args, false, "path") },
	check:       pathChecks("path"),
	runner:      true,
}
