package incontainer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/policy/deniedpath"
)

// Secrets stay out of the file tools' reach inside the container too. The dispatcher's policy decides
// the denied globs of a call (policy.Limits.DeniedGlobs, carried as call.Limits.DeniedGlobs); the worker
// adds them to the arguments it hands the in-container runner, under PolicyArg (tools.Tool.WithPolicy). A model
// cannot send that field, because every built-in schema refuses unknown fields. The runner takes them out
// before the tool reads its arguments, and then:
//   - grep, glob and list_files neither enter nor report a path that matches a denied glob;
//   - every file a tool opens is checked where the kernel says it is (/proc/self/fd), after every link
//     was followed, so a symlink (or a directory link, or a race that swaps one in) cannot lead to a
//     denied file.
// Hard links are the limit: a second name of a denied file is a different path.

// PolicyArg is the argument that carries the dispatcher's policy to the in-container runner.
const PolicyArg = "_policy"

// CallPolicy is what PolicyArg holds.
type CallPolicy struct {
	DeniedGlobs []string `json:"denied_globs,omitempty"`
}

// splitPolicy takes PolicyArg out of a call's arguments.
func splitPolicy(args json.RawMessage) (json.RawMessage, CallPolicy, error) {
	if !bytes.Contains(args, []byte(PolicyArg)) {
		return args, CallPolicy{}, nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(args, &m); err != nil {
		return args, CallPolicy{}, nil // the tool's own decoding reports it
	}
	raw, ok := m[PolicyArg]
	if !ok {
		return args, CallPolicy{}, nil
	}
	var p CallPolicy
	if err := json.Unmarshal(raw, &p); err != nil {
		return nil, CallPolicy{}, fmt.Errorf("decode %s: %w", PolicyArg, err)
	}
	delete(m, PolicyArg)
	rest, err := json.Marshal(m)
	if err != nil {
		return nil, CallPolicy{}, fmt.Errorf("decode %s: %w", PolicyArg, err)
	}
	return rest, p, nil
}

// deniedRel reports whether the workspace-relative path rel matches a denied glob, and which.
func (e *runEnv) deniedRel(rel string) (string, bool) {
	return e.denied.Match(path.Join(WorkspaceDir, rel))
}

// realPath returns where an open file is, by the kernel's account, as a path in the container: every
// link followed, whatever raced with the open.
func (e *runEnv) realPath(f *os.File) (string, error) {
	target, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", f.Fd()))
	if err != nil {
		return "", fmt.Errorf("find where the file is: %w", err)
	}
	if rest, ok := strings.CutPrefix(target, e.wsReal); ok && (rest == "" || rest[0] == '/') {
		return WorkspaceDir + rest, nil
	}
	return target, nil
}

// guard refuses an open file that is, after links, at a denied path. verb and rel name the call for the
// message.
func (e *runEnv) guard(f *os.File, verb, rel string) error {
	if e.denied == nil {
		return nil
	}
	real, err := e.realPath(f)
	if err != nil {
		return toolErr(call.ErrPermissionDenied, "%s %s: policy cannot tell where the path leads (%v), so it is refused", verb, showPath(rel), err)
	}
	return e.deniedAt(real, verb, rel)
}

// deniedAt refuses the container path p when it matches a denied glob.
func (e *runEnv) deniedAt(p, verb, rel string) error {
	if pattern, ok := e.denied.Match(p); ok {
		shown := strings.TrimPrefix(strings.TrimPrefix(p, WorkspaceDir), "/")
		if shown == showPath(rel) {
			return toolErr(call.ErrPolicyDenied, "%s %s: it matches the denied pattern %q (secrets and keys stay out of reach); do not read or write it", verb, showPath(rel), pattern)
		}
		return toolErr(call.ErrPolicyDenied, "%s %s: it leads to %s, which matches the denied pattern %q (secrets and keys stay out of reach); do not read or write it", verb, showPath(rel), shown, pattern)
	}
	return nil
}

// workspaceReal is the workspace's path with links resolved, for realPath.
func workspaceReal(workspace string) string {
	if r, err := filepath.EvalSymlinks(workspace); err == nil {
		return r
	}
	return workspace
}

// compileCallPolicy compiles the denied globs a call carries.
func compileCallPolicy(p CallPolicy) (*deniedpath.Set, error) {
	d, err := deniedpath.Compile(p.DeniedGlobs)
	if err != nil {
		return nil, fmt.Errorf("compile the call's policy: %w", err)
	}
	return d, nil
}

// readGuarded reads the whole file at rel, refusing it when it is, after links, at a denied path.
func (e *runEnv) readGuarded(rel, verb string) ([]byte, error) {
	f, err := e.root.Open(rel)
	if err != nil {
		return nil, pathErr(err, verb, rel)
	}
	defer f.Close()
	if err := e.guard(f, verb, rel); err != nil {
		return nil, err
	}
	data, err := io.ReadAll(f)
	if err != nil {
		return nil, pathErr(err, verb, rel)
	}
	return data, nil
}
