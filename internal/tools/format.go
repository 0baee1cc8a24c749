package tools

import (
	"encoding/json"
	"fmt"
)

// The formats Render knows.
const (
	FormatNative    = "native"
	FormatOpenAI    = "openai"
	FormatAnthropic = "anthropic"
	FormatMCP       = "mcp"
)

// Formats lists every format Render knows.
var Formats = []string{FormatNative, FormatOpenAI, FormatAnthropic, FormatMCP}

// NativeTool is toolpool's own description of a tool (GET /v1/tools).
type NativeTool struct {
	Name               string          `json:"name"`
	Description        string          `json:"description"`
	Kind               Kind            `json:"kind"`
	ReadOnly           bool            `json:"read_only"`
	Schema             json.RawMessage `json:"schema"`
	DefaultTimeoutMS   int64           `json:"default_timeout_ms"`
	DefaultOutputBytes int64           `json:"default_output_bytes"`
	Custom             bool            `json:"custom,omitempty"`
}

// OpenAITool is a tool in OpenAI's function-calling shape.
type OpenAITool struct {
	Type     string         `json:"type"` // "function"
	Function OpenAIFunction `json:"function"`
}

// OpenAIFunction is the function of an OpenAITool.
type OpenAIFunction struct {
	Name        string          `json:"name"`
	Description string          `json:"description"`
	Parameters  json.RawMessage `json:"parameters"`
}

// AnthropicTool is a tool in Anthropic's tool-use shape.
type AnthropicTool struct {
	Name        string          `json:"name"`
	Description string          `json:"description"`
	InputSchema json.RawMessage `json:"input_schema"`
}

// MCPTool is a tool in the Model Context Protocol's tools/list shape.
type MCPTool struct {
	Name        string          `json:"name"`
	Description string          `json:"description"`
	InputSchema json.RawMessage `json:"inputSchema"`
	Annotations MCPAnnotations  `json:"annotations"`
}

// MCPAnnotations are an MCP tool's behaviour hints.
type MCPAnnotations struct {
	ReadOnlyHint    bool `json:"readOnlyHint"`
	DestructiveHint bool `json:"destructiveHint"`
	IdempotentHint  bool `json:"idempotentHint"`
	OpenWorldHint   bool `json:"openWorldHint"`
}

// Native renders ts in toolpool's own shape.
func Native(ts []*Tool) []NativeTool {
	out := make([]NativeTool, 0, len(ts))
	for _, t := range ts {
		out = append(out, NativeTool{
			Name: t.Name, Description: t.Description, Kind: t.Kind, ReadOnly: t.ReadOnly(), Schema: t.Schema,
			DefaultTimeoutMS: t.DefaultTimeout.Milliseconds(), DefaultOutputBytes: t.DefaultOutputBytes, Custom: t.Custom,
		})
	}
	return out
}

// OpenAI renders ts as OpenAI function-calling tools. The vendor formats leave out the schemas' "$schema"
// keyword, which some model APIs reject.
func OpenAI(ts []*Tool) []OpenAITool {
	out := make([]OpenAITool, 0, len(ts))
	for _, t := range ts {
		out = append(out, OpenAITool{Type: "function", Function: OpenAIFunction{
			Name: t.Name, Description: t.Description, Parameters: t.bare,
		}})
	}
	return out
}

// Anthropic renders ts as Anthropic tool-use tools.
func Anthropic(ts []*Tool) []AnthropicTool {
	out := make([]AnthropicTool, 0, len(ts))
	for _, t := range ts {
		out = append(out, AnthropicTool{Name: t.Name, Description: t.Description, InputSchema: t.bare})
	}
	return out
}

// MCP renders ts as MCP tools. A tool that is not read-only is marked destructive (it may overwrite,
// delete or run anything); read and search tools are idempotent. A tool reaches an open world when it
// fetches (through the worker's egress proxy) or when the tenant's policy grants its container network
// (WithNetwork); every other call runs in a container with loopback only.
func MCP(ts []*Tool, opts ...RenderOption) []MCPTool {
	var o renderOptions
	for _, opt := range opts {
		opt(&o)
	}
	out := make([]MCPTool, 0, len(ts))
	for _, t := range ts {
		out = append(out, MCPTool{
			Name: t.Name, Description: t.Description, InputSchema: t.Schema,
			Annotations: MCPAnnotations{
				ReadOnlyHint:    t.ReadOnly(),
				DestructiveHint: !t.ReadOnly(),
				IdempotentHint:  t.Kind == KindRead || t.Kind == KindSearch,
				OpenWorldHint:   t.Kind == KindFetch || (o.network != nil && o.network(t.Name)),
			},
		})
	}
	return out
}

// RenderOption adjusts how Render and MCP describe tools.
type RenderOption func(*renderOptions)

type renderOptions struct {
	network func(tool string) bool
}

// WithNetwork tells the MCP format which tools the tenant's policy grants network egress (their
// openWorldHint). Without it, only fetch tools reach an open world.
func WithNetwork(granted func(tool string) bool) RenderOption {
	return func(o *renderOptions) { o.network = granted }
}

// Render renders ts in the named format (one of Formats; "" means native), ready for json.Marshal. Only
// the MCP format uses opts.
func Render(format string, ts []*Tool, opts ...RenderOption) (any, error) {
	switch format {
	case "", FormatNative:
		return Native(ts), nil
	case FormatOpenAI:
		return OpenAI(ts), nil
	case FormatAnthropic:
		return Anthropic(ts), nil
	case FormatMCP:
		return MCP(ts, opts...), nil
	}
	return nil, fmt.Errorf("render tools: unknown format %q: use one of %v", format, Formats)
}
