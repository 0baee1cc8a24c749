package tools

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"time"

	"go.yaml.in/yaml/v3"
)

// Defaults for custom tools that leave them unset.
const (
	defaultCustomTimeout     = 60 * time.Second
	defaultCustomOutputBytes = 64 << 10
)

// customNameRE is what OpenAI, Anthropic and MCP all accept as a tool name.
var customNameRE = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_-]{0,63}$`)

// CustomTool is a tool the operator declares in configuration (tools.custom). The worker runs Command in
// the call's container (in Image when set), with the JSON arguments on stdin and the workspace as working
// directory; its stdout, stderr and exit code become the result, as for run_shell.
type CustomTool struct {
	Name        string `json:"name" yaml:"name"`
	Description string `json:"description" yaml:"description"`
	// Schema is the JSON Schema of the arguments: an object schema; empty means "no arguments". In YAML it
	// is written as a mapping (or a JSON string).
	Schema json.RawMessage `json:"schema,omitempty" yaml:"-"`
	// Image is an optional OCI image reference to run Command in.
	Image   string   `json:"image,omitempty" yaml:"image,omitempty"`
	Command []string `json:"command" yaml:"command"`
	// Kind defaults to KindOther.
	Kind Kind `json:"kind,omitempty" yaml:"kind,omitempty"`
	// Timeout defaults to 60s. In YAML and JSON it is a duration string ("30s").
	Timeout time.Duration `json:"-" yaml:"-"`
	// OutputBytes caps the model-facing output; it defaults to 64 KiB.
	OutputBytes int64 `json:"output_bytes,omitempty" yaml:"output_bytes,omitempty"`
}

// customFile is CustomTool as written in a configuration file.
type customFile struct {
	Name        string   `json:"name" yaml:"name"`
	Description string   `json:"description" yaml:"description"`
	Schema      any      `json:"schema,omitempty" yaml:"schema,omitempty"`
	Image       string   `json:"image,omitempty" yaml:"image,omitempty"`
	Command     []string `json:"command" yaml:"command"`
	Kind        Kind     `json:"kind,omitempty" yaml:"kind,omitempty"`
	Timeout     string   `json:"timeout,omitempty" yaml:"timeout,omitempty"`
	OutputBytes int64    `json:"output_bytes,omitempty" yaml:"output_bytes,omitempty"`
}

// UnmarshalYAML reads a custom tool from configuration, with the schema as a YAML mapping or a JSON string
// and the timeout as a duration string.
func (c *CustomTool) UnmarshalYAML(n *yaml.Node) error {
	var f customFile
	if err := n.Decode(&f); err != nil {
		return fmt.Errorf("decode custom tool: %w", err)
	}
	return c.fromFile(f)
}

// UnmarshalJSON reads a custom tool with the timeout as a duration string.
func (c *CustomTool) UnmarshalJSON(b []byte) error {
	var f customFile
	if err := json.Unmarshal(b, &f); err != nil {
		return fmt.Errorf("decode custom tool: %w", err)
	}
	return c.fromFile(f)
}

func (c *CustomTool) fromFile(f customFile) error {
	*c = CustomTool{
		Name: f.Name, Description: f.Description, Image: f.Image, Command: f.Command, Kind: f.Kind,
		OutputBytes: f.OutputBytes,
	}
	if f.Timeout != "" {
		d, err := time.ParseDuration(f.Timeout)
		if err != nil {
			return fmt.Errorf("parse timeout of custom tool %q: %w", f.Name, err)
		}
		c.Timeout = d
	}
	switch s := f.Schema.(type) {
	case nil:
	case string:
		c.Schema = json.RawMessage(s)
	default:
		b, err := json.Marshal(s)
		if err != nil {
			return fmt.Errorf("encode schema of custom tool %q: %w", f.Name, err)
		}
		c.Schema = b
	}
	return nil
}

// tool checks c and compiles it into a Tool.
func (c *CustomTool) tool() (*Tool, error) {
	if !customNameRE.MatchString(c.Name) {
		return nil, fmt.Errorf("check custom tool %q: the name must match %s", c.Name, customNameRE)
	}
	if c.Description == "" {
		return nil, fmt.Errorf("check custom tool %q: the description is empty: tell the model what the tool does", c.Name)
	}
	if len(c.Command) == 0 || c.Command[0] == "" {
		return nil, fmt.Errorf("check custom tool %q: the command is empty", c.Name)
	}
	k := c.Kind
	if k == "" {
		k = KindOther
	}
	if !k.Valid() {
		return nil, fmt.Errorf("check custom tool %q: kind %q is not one of %v", c.Name, c.Kind, Kinds)
	}
	if c.Timeout < 0 || c.OutputBytes < 0 {
		return nil, fmt.Errorf("check custom tool %q: timeout and output_bytes must not be negative", c.Name)
	}
	schema := c.Schema
	if len(schema) == 0 {
		schema = json.RawMessage(`{"type":"object","properties":{},"additionalProperties":false}`)
	}
	t := &Tool{
		Name: c.Name, Description: c.Description, Kind: k, Schema: slices.Clone(schema),
		DefaultTimeout: c.Timeout, DefaultOutputBytes: c.OutputBytes, Custom: true, Image: c.Image,
		command: slices.Clone(c.Command), shell: true,
	}
	if t.DefaultTimeout == 0 {
		t.DefaultTimeout = defaultCustomTimeout
	}
	if t.DefaultOutputBytes == 0 {
		t.DefaultOutputBytes = defaultCustomOutputBytes
	}
	if err := t.compile(); err != nil {
		return nil, fmt.Errorf("check custom tool %q: %w", c.Name, err)
	}
	return t, nil
}
