// Package tools is toolpool's tool registry: each tool's name, description, kind and JSON Schema, the checks
// the dispatcher runs on a call's arguments, how a worker runs the call in its container (Plan), and how
// the finished process becomes the call's result (Finish), one file per built-in tool.
//
// None of it touches files or the network. The built-in tools' implementations run inside the call's
// container, in package incontainer (the toolpool-runner binary); this package shares only its constants
// and result type, so that the runner links neither the JSON Schema validator nor anything else only the
// dispatcher and the worker need.
package tools

import (
	"encoding/json"
	"fmt"
	"path"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/toolpool/toolpool/internal/tools/incontainer"
)

// Kind says what a tool does, for policy and for the read-only and destructive hints of the formats.
type Kind string

// The kinds a tool may have.
const (
	KindRead    Kind = "read"
	KindEdit    Kind = "edit"
	KindDelete  Kind = "delete"
	KindMove    Kind = "move"
	KindSearch  Kind = "search"
	KindExecute Kind = "execute"
	KindFetch   Kind = "fetch"
	KindOther   Kind = "other"
)

// Kinds lists every valid Kind.
var Kinds = []Kind{KindRead, KindEdit, KindDelete, KindMove, KindSearch, KindExecute, KindFetch, KindOther}

// Valid reports whether k is one of Kinds.
func (k Kind) Valid() bool { return slices.Contains(Kinds, k) }

// Tool is one tool of a Registry. Its exported fields are read-only after NewRegistry returns; a *Tool is
// safe for concurrent use.
type Tool struct {
	Name string
	// Description is written for a model: how to use the tool well, what it returns, its limits.
	Description string
	Kind        Kind
	// Schema is the JSON Schema (draft 2020-12) of the tool's arguments, always an object schema.
	Schema json.RawMessage
	// DefaultTimeout bounds a call that asked for no timeout of its own.
	DefaultTimeout time.Duration
	// DefaultOutputBytes caps the model-facing output when policy sets no tighter cap.
	DefaultOutputBytes int64
	// Custom is true for a tool the operator declared in configuration.
	Custom bool
	// Image is the OCI image a custom tool runs in; empty means the host's read-only view, like built-ins.
	Image string
	// Local is true for a tool the dispatcher answers itself, without a worker (read_output).
	Local bool

	compiled *jsonschema.Schema
	doc      any             // the decoded schema, to describe what an argument must be
	bare     json.RawMessage // Schema without "$schema", for the vendor formats
	command  []string
	shell    bool // Finish composes stdout, stderr and exit code rather than decoding an incontainer.RunnerResult
	spec     *builtin
}

// Streams reports whether the tool's stdout and stderr are the command's own (run_shell, custom tools):
// those are streamed live and kept in full; a runner tool's stdout is only its result.
func (t *Tool) Streams() bool { return t.shell }

// ReadOnly reports whether the tool only reads: true for the read, search and fetch kinds.
func (t *Tool) ReadOnly() bool {
	return t.Kind == KindRead || t.Kind == KindSearch || t.Kind == KindFetch
}

// Invocation is how a worker runs one call in its container.
type Invocation struct {
	// Argv is the process to run. When Runner is set, Argv is incontainer.RunnerPath,
	// incontainer.RunnerCommand and the tool name.
	Argv []string
	// Stdin is fed to the process, then closed. Runner and custom tools get the JSON arguments.
	Stdin []byte
	// Cwd is absolute and under incontainer.WorkspaceDir.
	Cwd string
	// Env holds "NAME=value" entries added to the container's environment.
	Env []string
	// Runner means Argv[0] is the in-container runner, which writes one incontainer.RunnerResult to stdout.
	Runner bool
	// Egress means the call needs the worker's egress proxy socket mounted at incontainer.EgressSocket.
	Egress bool
	// Timeout, when non-zero, is the timeout the call's own arguments asked for (run_shell's timeout_ms);
	// the worker uses the smaller of it and the call's limit.
	Timeout time.Duration
	// Image, when non-empty, is the OCI image to run in (custom tools).
	Image string
}

// Facts is what policy needs to judge a call.
type Facts struct {
	// Paths are the workspace paths the call names, absolute and cleaned ("/workspace/src/a.go"). A path that
	// climbs out of the workspace stays visible as where it points ("/etc/passwd") so policy can deny it.
	Paths []string `json:"paths,omitempty"`
	// Command is run_shell's shell command.
	Command string `json:"command,omitempty"`
	// Env is run_shell's env argument: the variables the command gets on top of the sandbox's.
	Env map[string]string `json:"env,omitempty"`
	// Cwd is run_shell's cwd argument as given ("" for the workspace); Paths holds it resolved too.
	Cwd string `json:"cwd,omitempty"`
	// URL is web_fetch's URL.
	URL string `json:"url,omitempty"`
}

// builtin is the static definition of a built-in tool.
type builtin struct {
	name        string
	description string
	kind        Kind
	schema      string
	timeout     time.Duration
	outputBytes int64
	// facts extracts Facts from arguments that passed the schema.
	facts func(args json.RawMessage) Facts
	// check returns problems the schema cannot express (a path climbing out of the workspace); nil if none.
	check func(args json.RawMessage) []string
	// plan overrides the default runner invocation (run_shell).
	plan func(args json.RawMessage) (Invocation, error)
	// runner marks the tools the in-container runner implements (incontainer.RunnerTools): a call runs
	// incontainer.RunnerPath with the tool's name.
	runner bool
	// egress marks tools whose runner needs the egress proxy.
	egress bool
	// local marks tools the dispatcher answers itself (read_output).
	local bool
}

// builtins lists the built-in tools in the order List returns them.
var builtins = []*builtin{
	&readFileTool, &writeFileTool, &editFileTool, &listFilesTool, &globTool, &grepTool, &runShellTool, &webFetchTool, &readOutputTool,
}

func builtinByName(name string) *builtin {
	for _, b := range builtins {
		if b.name == name {
			return b
		}
	}
	return nil
}

// Registry is the set of tools a dispatcher offers and a worker runs. It is immutable after NewRegistry and
// safe for concurrent use.
type Registry struct {
	byName map[string]*Tool
	order  []*Tool
}

// NewRegistry returns the built-in tools followed by the operator's custom tools, with every schema
// compiled. It fails, naming the tool, when a custom tool is invalid or reuses a name.
func NewRegistry(custom ...CustomTool) (*Registry, error) {
	r := &Registry{byName: make(map[string]*Tool)}
	for _, b := range builtins {
		t := &Tool{
			Name: b.name, Description: b.description, Kind: b.kind, Schema: json.RawMessage(b.schema),
			DefaultTimeout: b.timeout, DefaultOutputBytes: b.outputBytes, shell: !b.runner && !b.local, Local: b.local, spec: b,
		}
		if err := t.compile(); err != nil {
			return nil, fmt.Errorf("compile built-in tool %q: %w", b.name, err)
		}
		r.add(t)
	}
	for i := range custom {
		t, err := custom[i].tool()
		if err != nil {
			return nil, err
		}
		if _, dup := r.byName[t.Name]; dup {
			return nil, fmt.Errorf("add custom tool %q: a tool of that name already exists", t.Name)
		}
		r.add(t)
	}
	return r, nil
}

func (r *Registry) add(t *Tool) {
	r.byName[t.Name] = t
	r.order = append(r.order, t)
}

// Lookup returns the tool called name.
func (r *Registry) Lookup(name string) (*Tool, bool) {
	t, ok := r.byName[name]
	return t, ok
}

// List returns every tool: built-ins first, then custom tools in configuration order. The slice is the
// caller's; the tools are shared.
func (r *Registry) List() []*Tool { return slices.Clone(r.order) }

// Names returns every tool name, sorted.
func (r *Registry) Names() []string {
	names := make([]string, 0, len(r.order))
	for _, t := range r.order {
		names = append(names, t.Name)
	}
	sort.Strings(names)
	return names
}

// Validate checks args (a JSON object; empty means {}) against the named tool's schema and the checks the
// schema cannot express. Every failure is an *ArgsError whose message tells a model what to fix, listing
// every problem; an unknown tool is an *ArgsError with UnknownTool set that lists the known tools.
func (r *Registry) Validate(name string, args json.RawMessage) error {
	t, ok := r.byName[name]
	if !ok {
		return &ArgsError{Tool: name, UnknownTool: true, Problems: []string{
			fmt.Sprintf("unknown tool %q: available tools are %s", name, strings.Join(r.Names(), ", ")),
		}}
	}
	return t.Validate(args)
}

// Validate checks args against the tool's schema and the checks the schema cannot express; see
// Registry.Validate.
func (t *Tool) Validate(args json.RawMessage) error {
	problems := t.validateSchema(args)
	if len(problems) == 0 && t.spec != nil && t.spec.check != nil {
		problems = t.spec.check(incontainer.NormalArgs(args))
	}
	if len(problems) == 0 {
		return nil
	}
	return &ArgsError{Tool: t.Name, Problems: problems}
}

// Plan returns how a worker runs a call of this tool with args, which must have passed Validate. It fails
// with an *ArgsError when the arguments cannot be run.
func (t *Tool) Plan(args json.RawMessage) (Invocation, error) {
	args = incontainer.NormalArgs(args)
	switch {
	case t.Custom:
		return Invocation{
			Argv: slices.Clone(t.command), Stdin: args, Cwd: incontainer.WorkspaceDir, Image: t.Image,
		}, nil
	case t.spec.plan != nil:
		return t.spec.plan(args)
	}
	if t.spec.check != nil {
		if problems := t.spec.check(args); len(problems) > 0 {
			return Invocation{}, &ArgsError{Tool: t.Name, Problems: problems}
		}
	}
	return Invocation{
		Argv:   []string{incontainer.RunnerPath, incontainer.RunnerCommand, t.Name},
		Stdin:  args,
		Cwd:    incontainer.WorkspaceDir,
		Runner: true,
		Egress: t.spec.egress,
	}, nil
}

// Facts returns what policy needs to judge a call with args. Arguments that do not decode give empty Facts:
// call Validate first. Custom tools report no facts; policy judges them by name and kind.
func (t *Tool) Facts(args json.RawMessage) Facts {
	if t.Custom || t.spec.facts == nil {
		return Facts{}
	}
	return t.spec.facts(incontainer.NormalArgs(args))
}

// workspacePath returns p (relative to incontainer.WorkspaceDir, or absolute) as a cleaned absolute path,
// for Facts.
func workspacePath(p string) string {
	if p == "" {
		return incontainer.WorkspaceDir
	}
	if path.IsAbs(p) {
		return path.Clean(p)
	}
	return path.Join(incontainer.WorkspaceDir, p)
}

// pathProblem returns why the argument arg (value p) does not name a place inside the workspace, or "".
func pathProblem(arg, p string) string {
	if _, err := incontainer.RelPath(p); err != nil {
		return fmt.Sprintf("argument %q %s", arg, err.Error())
	}
	return ""
}

// pathFacts returns Facts naming the workspace paths in the string arguments fields; an absent or empty
// field names the workspace itself when orRoot is set.
func pathFacts(args json.RawMessage, orRoot bool, fields ...string) Facts {
	var m map[string]any
	if json.Unmarshal(args, &m) != nil {
		return Facts{}
	}
	var f Facts
	for _, field := range fields {
		p, _ := m[field].(string)
		if p == "" && !orRoot {
			continue
		}
		f.Paths = append(f.Paths, workspacePath(p))
	}
	return f
}

// pathChecks returns a check that every string argument among fields names a place inside the workspace.
func pathChecks(fields ...string) func(json.RawMessage) []string {
	return func(args json.RawMessage) []string {
		var m map[string]any
		if json.Unmarshal(args, &m) != nil {
			return []string{"arguments must be a JSON object"}
		}
		var problems []string
		for _, field := range fields {
			if p, ok := m[field].(string); ok {
				if msg := pathProblem(field, p); msg != "" {
					problems = append(problems, msg)
				}
			}
		}
		return problems
	}
}
