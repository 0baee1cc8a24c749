package tools

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/toolpool/toolpool/internal/tools/incontainer"
)

// ReadOutputTool is the name of the tool that reads a call's full output by range. The dispatcher answers
// it from the output store at once; it never reaches a worker.
const ReadOutputTool = "read_output"

var readOutputTool = builtin{
	name:  ReadOutputTool,
	kind:  KindRead,
	local: true,
	description: `Read part of the full stdout or stderr of an earlier call whose output was cut (its output ` +
		`says "cut here" and names this tool with the call_id, stream, offset and limit to use). Returns the ` +
		`bytes from "offset" on, at most "limit" of them, as text (bytes that are not UTF-8 show as U+FFFD), ` +
		`followed by a line saying which bytes these were and the offset to read next. Prefer a narrower ` +
		`offset and limit over reading everything: read the part that matters (an error near the end, a test's ` +
		`name).`,
	schema: `{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "properties": {
    "call_id": {"type": "string", "pattern": "^c_[a-z2-7]{26}$", "description": "The id of the call whose output to read (\"c_...\")."},
    "stream": {"type": "string", "enum": ["stdout", "stderr"], "description": "Which stream. Default stdout."},
    "offset": {"type": "integer", "minimum": 0, "description": "The first byte to read, from 0. Default 0."},
    "limit": {"type": "integer", "minimum": 1, "description": "The most bytes to read. Default and ceiling: the output cap of this call."}
  },
  "required": ["call_id"],
  "additionalProperties": false
}`,
	timeout:     10 * time.Second,
	outputBytes: 30000,
	plan: func(json.RawMessage) (Invocation, error) {
		return Invocation{}, &ArgsError{Tool: ReadOutputTool, Problems: []string{"read_output is answered by the dispatcher and never runs on a worker: call it through POST /v1/calls"}}
	},
}

// ReadOutputArgs are read_output's arguments.
type ReadOutputArgs struct {
	CallID string `json:"call_id"`
	Stream string `json:"stream"`
	Offset int64  `json:"offset"`
	Limit  int64  `json:"limit"`
}

// ParseReadOutput decodes read_output arguments that passed Validate, with their defaults filled in.
func ParseReadOutput(args json.RawMessage) (ReadOutputArgs, error) {
	var a struct {
		CallID string             `json:"call_id"`
		Stream string             `json:"stream"`
		Offset incontainer.IntArg `json:"offset"`
		Limit  incontainer.IntArg `json:"limit"`
	}
	if err := json.Unmarshal(incontainer.NormalArgs(args), &a); err != nil {
		return ReadOutputArgs{}, fmt.Errorf("decode read_output arguments: %w", err)
	}
	if a.Stream == "" {
		a.Stream = "stdout"
	}
	return ReadOutputArgs{CallID: a.CallID, Stream: a.Stream, Offset: int64(a.Offset), Limit: int64(a.Limit)}, nil
}

// ReadHint is what the model is told to call to read bytes offset..offset+limit of stream of call id: the
// read_output tool, or the HTTP range endpoint.
func ReadHint(callID, stream string, offset, limit int64) string {
	return fmt.Sprintf(`read_output {"call_id":%q,"stream":%q,"offset":%d,"limit":%d} or GET /v1/calls/%s/%s?offset=%d&limit=%d`,
		callID, stream, offset, limit, callID, stream, offset, limit)
}
