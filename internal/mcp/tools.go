package mcp

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/tools"
)

// sdkTool is t as the SDK lists it, with the result summary as its output schema.
func sdkTool(t tools.MCPTool) *sdk.Tool {
	a := t.Annotations
	return &sdk.Tool{
		Name: t.Name, Description: t.Description, InputSchema: t.InputSchema, OutputSchema: outputSchema,
		Annotations: &sdk.ToolAnnotations{
			ReadOnlyHint: a.ReadOnlyHint, DestructiveHint: &a.DestructiveHint,
			IdempotentHint: a.IdempotentHint, OpenWorldHint: &a.OpenWorldHint,
		},
	}
}

// summary is a tool result's structuredContent: the result envelope (call.Result) without the output,
// which is the result's text content.
type summary struct {
	ID          string          `json:"id"`
	Tool        string          `json:"tool"`
	Workspace   string          `json:"workspace"`
	Status      call.Status     `json:"status"`
	ExitCode    *int            `json:"exit_code,omitempty"`
	Truncated   bool            `json:"truncated"`
	OutputBytes int64           `json:"output_bytes"`
	Error       *call.ErrorInfo `json:"error,omitempty"`
	Decision    *call.Decision  `json:"decision,omitempty"`
	Timing      call.Timing     `json:"timing"`
	TraceID     string          `json:"trace_id,omitempty"`
}

// outputSchema is summary's JSON Schema: every tool's output schema.
var outputSchema = json.RawMessage(`{
  "type": "object",
  "description": "The call's result envelope without its output, which is the result's text.",
  "properties": {
    "id": {"type": "string", "description": "The call's id, for toolpool_get_result."},
    "tool": {"type": "string"},
    "workspace": {"type": "string"},
    "status": {"type": "string", "enum": ["ok", "error", "timeout", "denied", "pending_approval", "queued", "running", "cancelled", "expired", "lost"]},
    "exit_code": {"type": "integer"},
    "truncated": {"type": "boolean", "description": "The output was cut; the text says how to read the rest."},
    "output_bytes": {"type": "integer"},
    "error": {"type": "object", "properties": {"type": {"type": "string"}, "message": {"type": "string"}}, "required": ["type", "message"]},
    "decision": {"type": "object", "properties": {"action": {"type": "string"}, "rule": {"type": "string"}, "reason": {"type": "string"}}, "required": ["action"]},
    "timing": {"type": "object", "properties": {"queued_ms": {"type": "integer"}, "sandbox_ms": {"type": "integer"}, "run_ms": {"type": "integer"}, "total_ms": {"type": "integer"}}},
    "trace_id": {"type": "string"}
  },
  "required": ["id", "tool", "workspace", "status", "truncated", "output_bytes", "timing"]
}`)

func summarize(r *call.Result) summary {
	return summary{ID: r.ID, Tool: r.Tool, Workspace: r.Workspace, Status: r.Status, ExitCode: r.ExitCode,
		Truncated: r.Truncated, OutputBytes: r.OutputBytes, Error: r.Error, Decision: r.Decision, Timing: r.Timing, TraceID: r.TraceID}
}

// toolResult is a final record as a tool result: its output as text, its envelope as structured content,
// and isError for every status but ok, so that a tool's own failure and a policy denial reach the model.
func toolResult(r *call.Result) *sdk.CallToolResult {
	text := r.Output
	if text == "" && r.Status == call.StatusOK {
		text = "(no output)"
	}
	return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: text}}, StructuredContent: summarize(r), IsError: r.Status != call.StatusOK}
}

// waitingResult is a call that has not finished when the handler stops waiting: not an error, but what
// the call waits for and how to fetch its result.
func waitingResult(r *call.Result, why string) *sdk.CallToolResult {
	text := fmt.Sprintf("Call %s (%s) %s. It has not finished: call %s with {\"id\": %q} to get its result.", r.ID, r.Tool, why, getResultName, r.ID)
	return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: text}}, StructuredContent: summarize(r)}
}

// pendingResult is a call that waits for a person's approval.
func pendingResult(r *call.Result) *sdk.CallToolResult {
	why := "waits for a person's approval"
	if r.Decision != nil && r.Decision.Reason != "" {
		why += " (" + r.Decision.Reason + ")"
	}
	return waitingResult(r, why+"; it runs once approved")
}

// failure is a request toolpool refused before a call existed (bad arguments or workspace, over quota),
// as a tool error the model can act on.
func failure(msg string) *sdk.CallToolResult {
	return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: msg}}, IsError: true}
}

// approvalPrompt is the elicitation that asks the person at the client to approve res.
func approvalPrompt(res *call.Result, args []byte) *sdk.ElicitParams {
	const maxShown = 2000
	shown := string(args)
	if len(shown) > maxShown {
		shown = shown[:maxShown] + fmt.Sprintf("… (%d more bytes; digest %s)", len(args)-maxShown, res.ArgsDigest)
	}
	msg := fmt.Sprintf("toolpool: approve %s in workspace %s?\n\n%s", res.Tool, res.Workspace, shown)
	if res.Decision != nil && res.Decision.Reason != "" {
		msg += "\n\nPolicy: " + res.Decision.Reason
	}
	msg += "\n\nAccept runs it; decline denies it."
	return &sdk.ElicitParams{Mode: "form", Message: msg, RequestedSchema: json.RawMessage(`{"type":"object","properties":{}}`)}
}

const getResultName = "toolpool_get_result"

var getResultTool = &sdk.Tool{
	Name: getResultName,
	Description: "Returns the result of an earlier toolpool call by its id: the result of a call that waited for approval " +
		"or ran longer than the tools/call waited. Waits up to wait_seconds for the call to finish.",
	InputSchema: json.RawMessage(`{"type":"object","properties":{` +
		`"id":{"type":"string","description":"The call's id, as the earlier result gave it (c_...)."},` +
		`"wait_seconds":{"type":"integer","minimum":0,"maximum":300,"description":"How long to wait for the call to finish; default 60."}},` +
		`"required":["id"],"additionalProperties":false}`),
	OutputSchema: outputSchema,
	Annotations:  &sdk.ToolAnnotations{ReadOnlyHint: true, DestructiveHint: new(false), IdempotentHint: true, OpenWorldHint: new(false)},
}

// getResult is toolpool_get_result: the call's record, once final or after wait_seconds.
func (h *Handler) getResult(ctx context.Context, req *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
	var args struct {
		ID          string `json:"id"`
		WaitSeconds *int   `json:"wait_seconds"`
	}
	dec := json.NewDecoder(bytes.NewReader(req.Params.Arguments))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&args); err != nil {
		return failure("the arguments must be {\"id\": \"c_...\", \"wait_seconds\": 60}: " + strings.TrimPrefix(err.Error(), "json: ")), nil
	}
	if !call.ValidID(args.ID) {
		return failure(fmt.Sprintf("%q is not a call id: give the id an earlier result named (c_ and 26 letters and digits)", args.ID)), nil
	}
	wait := 60 * time.Second
	if args.WaitSeconds != nil {
		if *args.WaitSeconds < 0 || *args.WaitSeconds > 300 {
			return failure(fmt.Sprintf("wait_seconds %d must be from 0 to 300", *args.WaitSeconds)), nil
		}
		wait = time.Duration(*args.WaitSeconds) * time.Second
	}
	res, err := h.calls.Wait(ctx, args.ID, func(*call.Result) bool { return true })
	if err != nil {
		return rejected(err)
	}
	return h.await(ctx, req, res, newProgress(req), min(wait, h.cfg.MaxWait))
}
