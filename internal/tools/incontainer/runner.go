// Package incontainer is what runs inside a call's container, as the toolpool-runner binary: the built-in
// tools' implementations (RunnerMain), one file per tool, and the egress forwarder a command with network
// starts behind (ForwardMain), with the paths, commands and result format the worker and the registry
// (package tools) share with them.
//
// RunnerMain reaches files only through an os.Root opened on the workspace, and the network only through
// the worker's egress proxy (package egress). It trusts its arguments to have passed the dispatcher's
// schema (package tools) but still decodes them strictly. It imports nothing that only the dispatcher or
// the worker needs: every import adds to the start of every tool call.
package incontainer

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"slices"
	"strings"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/policy/deniedpath"
)

// Paths inside a call's container.
const (
	// WorkspaceDir is where the tenant's workspace is mounted read-write; it is every call's working directory.
	WorkspaceDir = "/workspace"
	// RunnerPath is the in-container runner: the toolpool-runner binary, mounted read-only.
	RunnerPath = "/.toolpool/runner"
	// RunnerCommand is the runner's first argument; the tool name follows it and the JSON arguments are its
	// stdin.
	RunnerCommand = "tool-runner"
	// EgressSocket is the worker's egress proxy, mounted into calls whose tools.Invocation has Egress set.
	EgressSocket = "/.toolpool/egress.sock"
)

// NormalArgs maps absent arguments (empty, blank or null) to an empty object.
func NormalArgs(args json.RawMessage) json.RawMessage {
	if len(strings.TrimSpace(string(args))) == 0 || string(args) == "null" {
		return json.RawMessage(`{}`)
	}
	return args
}

// maxRunnerStdin bounds the JSON arguments the runner reads (write_file content is the largest).
const maxRunnerStdin = 64 << 20

// Exit codes of RunnerMain.
const (
	// RunnerExitOK: a RunnerResult was written; the tool ran, and may have reported its own failure in it.
	RunnerExitOK = 0
	// RunnerExitWrite: the RunnerResult could not be written to stdout.
	RunnerExitWrite = 1
	// RunnerExitUsage: the invocation was wrong (unknown tool, unreadable stdin or workspace); a RunnerResult
	// with an internal error was written.
	RunnerExitUsage = 2
)

// RunnerResult is what the in-container runner writes to stdout: one JSON object.
type RunnerResult struct {
	// Output is what the model should read, with a hint when it was cut.
	Output string `json:"output"`
	// Error is the tool's own failure (not_found, invalid_params, ...); nil on success.
	Error *call.ErrorInfo `json:"error,omitempty"`
	// Truncated is true when Output does not hold everything the tool found.
	Truncated bool `json:"truncated,omitempty"`
	// OutputBytes is the full size of what the tool found, when Truncated; otherwise len(Output).
	OutputBytes int64 `json:"output_bytes,omitempty"`
}

// RunnerOption changes how RunnerMain runs.
type RunnerOption func(*runnerConfig)

type runnerConfig struct {
	egressSocket string
	rootCAs      *x509.CertPool // nil: the system's
}

// WithEgressSocket makes web_fetch reach the egress proxy at path instead of EgressSocket (tests).
func WithEgressSocket(path string) RunnerOption {
	return func(c *runnerConfig) { c.egressSocket = path }
}

// runEnv is what one tool implementation runs with.
type runEnv struct {
	ctx  context.Context
	root *os.Root
	cfg  runnerConfig
	// denied are the call's denied globs (nil: none); wsReal is the workspace's real path, to name an
	// open file by the kernel's account (see secrets.go).
	denied *deniedpath.Set
	wsReal string
}

// implementations are the built-in tools RunnerMain runs, by name. Each decodes its arguments strictly
// (they passed the dispatcher's schema) and reaches files only through env.root.
var implementations = map[string]func(env *runEnv, args json.RawMessage) (RunnerResult, error){
	"read_file":  runReadFile,
	"write_file": runWriteFile,
	"edit_file":  runEditFile,
	"list_files": runListFiles,
	"glob":       runGlob,
	"grep":       runGrep,
	"web_fetch":  runWebFetch,
}

// RunnerTools returns the names of the tools RunnerMain runs, sorted: the registry's tools whose calls run
// RunnerPath.
func RunnerTools() []string {
	return slices.Sorted(maps.Keys(implementations))
}

// RunnerMain runs the built-in tool named tool inside the call's container: it reads the JSON arguments
// from stdin, reaches files only through an os.Root on workspace (WorkspaceDir in production), and writes
// exactly one RunnerResult as JSON to stdout. It blocks until the tool is done; cancelling ctx stops the
// tool at its next check and yields a result with a cancelled error. It returns one of the RunnerExit codes.
func RunnerMain(ctx context.Context, tool, workspace string, stdin io.Reader, stdout io.Writer, opts ...RunnerOption) int {
	cfg := runnerConfig{egressSocket: EgressSocket}
	for _, o := range opts {
		o(&cfg)
	}
	res, code := runTool(ctx, tool, workspace, stdin, cfg)
	if res.Error == nil && res.OutputBytes == 0 {
		res.OutputBytes = int64(len(res.Output))
	}
	if res.Error != nil && res.Output == "" {
		res.Output = res.Error.Message
	}
	res.Output = strings.ToValidUTF8(res.Output, "\uFFFD")
	if err := json.NewEncoder(stdout).Encode(res); err != nil {
		return RunnerExitWrite
	}
	return code
}

func runTool(ctx context.Context, tool, workspace string, stdin io.Reader, cfg runnerConfig) (RunnerResult, int) {
	impl, ok := implementations[tool]
	if !ok {
		return failResult(call.ErrInternal, "run tool runner: unknown tool %q: the runner runs %s", tool, strings.Join(RunnerTools(), ", ")), RunnerExitUsage
	}
	args, err := io.ReadAll(io.LimitReader(stdin, maxRunnerStdin+1))
	if err != nil {
		return failResult(call.ErrInternal, "read arguments: %v", err), RunnerExitUsage
	}
	if len(args) > maxRunnerStdin {
		return failResult(call.ErrInvalidParams, "arguments are larger than %d bytes: send less content per call", maxRunnerStdin), RunnerExitOK
	}
	args, cp, err := splitPolicy(NormalArgs(args))
	if err != nil {
		return failResult(call.ErrInternal, "read the call's policy: %v", err), RunnerExitUsage
	}
	denied, err := compileCallPolicy(cp)
	if err != nil {
		return failResult(call.ErrInternal, "%v", err), RunnerExitUsage
	}
	root, err := os.OpenRoot(workspace)
	if err != nil {
		return failResult(call.ErrInternal, "open workspace: %v", err), RunnerExitUsage
	}
	defer root.Close()
	res, err := impl(&runEnv{ctx: ctx, root: root, cfg: cfg, denied: denied, wsReal: workspaceReal(workspace)}, args)
	if err != nil {
		if ctx.Err() != nil {
			return failResult(call.ErrCancelled, "%s stopped: %v", tool, context.Cause(ctx)), RunnerExitOK
		}
		return RunnerResult{Error: classify(err)}, RunnerExitOK
	}
	return res, RunnerExitOK
}

func failResult(typ, format string, a ...any) RunnerResult {
	return RunnerResult{Error: &call.ErrorInfo{Type: typ, Message: fmt.Sprintf(format, a...)}}
}

// toolError is a failure of the tool itself, with its error type and a message for the model.
type toolError struct {
	typ string
	msg string
}

func (e *toolError) Error() string { return e.msg }

func toolErr(typ, format string, a ...any) error {
	return &toolError{typ: typ, msg: fmt.Sprintf(format, a...)}
}

// classify turns an implementation's error into the ErrorInfo the model reads.
func classify(err error) *call.ErrorInfo {
	var te *toolError
	if errors.As(err, &te) {
		return &call.ErrorInfo{Type: te.typ, Message: te.msg}
	}
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return &call.ErrorInfo{Type: call.ErrNotFound, Message: err.Error()}
	case errors.Is(err, fs.ErrPermission):
		return &call.ErrorInfo{Type: call.ErrPermissionDenied, Message: err.Error()}
	}
	return &call.ErrorInfo{Type: call.ErrInternal, Message: err.Error()}
}

// decodeArgs decodes args strictly into v; unknown fields are an invalid_params error.
func decodeArgs(args json.RawMessage, v any) error {
	dec := json.NewDecoder(bytes.NewReader(args))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return toolErr(call.ErrInvalidParams, "decode arguments: %v", err)
	}
	return nil
}

// IntArg is an integer argument that also accepts an integral JSON number written as a float ("10.0"),
// which the schema accepts as an integer.
type IntArg int64

// Or returns n as an int, def when n is not positive (the argument was left out), and at most max.
func (n IntArg) Or(def, max int) int {
	if n < 1 {
		return def
	}
	return int(min(int64(n), int64(max)))
}

// UnmarshalJSON accepts an integer, or a float with no fractional part.
func (n *IntArg) UnmarshalJSON(b []byte) error {
	var f json.Number
	if err := json.Unmarshal(b, &f); err != nil {
		return err
	}
	if i, err := f.Int64(); err == nil {
		*n = IntArg(i)
		return nil
	}
	x, err := f.Float64()
	if err != nil || x != float64(int64(x)) {
		return fmt.Errorf("%s is not an integer", f)
	}
	*n = IntArg(x)
	return nil
}
