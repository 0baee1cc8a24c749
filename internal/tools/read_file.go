package tools

import (
	"encoding/json"
	"time"

	"github.com/toolpool/toolpool/internal/tools/incontainer"
)

var readFileTool = builtin{
	name: "read_file",
	kind: KindRead,
	description: `Read a text file from the workspace. Returns its lines numbered like "cat -n": each line is ` +
		`the line number right-aligned in 6 columns, a tab, then the line's text (line endings are not shown; ` +
		`CRLF files show without the "\r"). The numbers are for reference only: never include them in edit_file's ` +
		`old_string or new_string.
By default it returns the first 2000 lines. For a large file, read it in pieces with "offset" (the 1-based line ` +
		`to start at) and "limit" (how many lines); when more follows, the output ends with a note giving the ` +
		`offset to continue from. Lines longer than 2000 bytes are cut (with a note), and the output is capped at ` +
		`256 KiB.
Paths are relative to /workspace (or absolute under /workspace). Binary files are refused: inspect them with ` +
		`run_shell (file, xxd, strings). A directory is refused: use list_files. To find a file, use glob; to find ` +
		`text in many files, use grep.`,
	schema: `{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "properties": {
    "path": {"type": "string", "minLength": 1, "description": "The file to read, relative to /workspace or absolute under /workspace."},
    "offset": {"type": "integer", "minimum": 1, "description": "The 1-based line number to start at. Default 1."},
    "limit": {"type": "integer", "minimum": 1, "maximum": 10000, "description": "How many lines to return at most. Default 2000."}
  },
  "required": ["path"],
  "additionalProperties": false
}`,
	timeout:     30 * time.Second,
	outputBytes: incontainer.ReadFileOutputBytes + 4<<10,
	facts:       func(args json.RawMessage) Facts { return pathFacts(args, false, "path") },
	check:       pathChecks("path"),
	runner:      true,
}
