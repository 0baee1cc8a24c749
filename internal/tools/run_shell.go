package tools

import (
	"encoding/json"
	"fmt"
	"path"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/toolpool/toolpool/internal/tools/incontainer"
)

const (
	runShellDefaultTimeout = 2 * time.Minute
	runShellMaxTimeoutMS   = 600000
)

// envNameRE is what an environment variable name run_shell accepts looks like.
var envNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

var runShellTool = builtin{
	name: "run_shell",
	kind: KindExecute,
	description: `Run a shell command with /bin/sh -c in a fresh, isolated container whose working directory is ` +
		`the workspace (/workspace, the only writable place that persists between calls; /tmp is private to the ` +
		`call). There is no network access unless the operator's policy grants it; then HTTP_PROXY and HTTPS_PROXY ` +
		`are set, only the domains the policy allows can be reached, and a refused one answers 403 with the rule ` +
		`that refused it. Returns the command's stdout, then its stderr after a "[stderr]" line, ` +
		`then "[exit code N]" when it is not 0 (the call's status is then "error"). Long output keeps its head ` +
		`and tail with a note of what was cut and the exact read_output call that reads it.
Each call starts from scratch: no shell state (cd, variables, background processes) survives it; chain ` +
		`steps with "&&" in one command. Prefer read_file, write_file, edit_file, list_files, glob and grep for ` +
		`files: they are faster and their output is structured. Keep output small (pipe through head, tail or ` +
		`grep). Never start interactive programs (editors, pagers, prompts) or servers that do not exit: stdin is ` +
		`empty and the command is killed at its timeout ("timeout_ms", default 120000, at most 600000, within ` +
		`what policy allows). "cwd" runs the command in a subdirectory of the workspace; "env" adds environment ` +
		`variables.`,
	schema: `{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "properties": {
    "command": {"type": "string", "minLength": 1, "description": "The shell command to run with /bin/sh -c."},
    "cwd": {"type": "string", "description": "The working directory, relative to /workspace or absolute under /workspace. Default: /workspace."},
    "timeout_ms": {"type": "integer", "minimum": 1, "maximum": 600000, "description": "Kill the command after this many milliseconds. Default 120000."},
    "env": {
      "type": "object",
      "propertyNames": {"pattern": "^[A-Za-z_][A-Za-z0-9_]*$"},
      "additionalProperties": {"type": "string"},
      "description": "Environment variables to set, name to value."
    }
  },
  "required": ["command"],
  "additionalProperties": false
}`,
	timeout:     runShellDefaultTimeout,
	outputBytes: 128 << 10,
	facts:       runShellFacts,
	check:       runShellCheck,
	plan:        planRunShell,
}

type runShellArgs struct {
	Command   string             `json:"command"`
	Cwd       string             `json:"cwd"`
	TimeoutMS incontainer.IntArg `json:"timeout_ms"`
	Env       map[string]string  `json:"env"`
}

func runShellFacts(args json.RawMessage) Facts {
	var a runShellArgs
	if json.Unmarshal(args, &a) != nil {
		return Facts{}
	}
	f := Facts{Command: a.Command, Env: a.Env, Cwd: a.Cwd}
	if a.Cwd != "" {
		f.Paths = []string{workspacePath(a.Cwd)}
	}
	return f
}

func runShellCheck(args json.RawMessage) []string {
	var a runShellArgs
	if err := json.Unmarshal(args, &a); err != nil {
		return []string{fmt.Sprintf("arguments do not decode: %v", err)}
	}
	var problems []string
	if strings.IndexByte(a.Command, 0) >= 0 {
		problems = append(problems, `argument "command" contains a NUL byte`)
	}
	if msg := pathProblem("cwd", a.Cwd); msg != "" {
		problems = append(problems, msg)
	}
	for name, v := range a.Env {
		if !envNameRE.MatchString(name) {
			problems = append(problems, fmt.Sprintf("argument %q has an invalid key %q: keys must match the pattern %q", "env", name, envNameRE.String()))
		}
		if strings.IndexByte(v, 0) >= 0 {
			problems = append(problems, fmt.Sprintf("argument %q: the value of %s contains a NUL byte", "env", name))
		}
	}
	sort.Strings(problems)
	return problems
}

func planRunShell(args json.RawMessage) (Invocation, error) {
	if problems := runShellCheck(args); len(problems) > 0 {
		return Invocation{}, &ArgsError{Tool: "run_shell", Problems: problems}
	}
	var a runShellArgs
	if err := json.Unmarshal(args, &a); err != nil {
		return Invocation{}, &ArgsError{Tool: "run_shell", Problems: []string{err.Error()}}
	}
	rel, _ := incontainer.RelPath(a.Cwd) // checked above
	inv := Invocation{
		Argv: []string{"/bin/sh", "-c", a.Command},
		Cwd:  path.Join(incontainer.WorkspaceDir, rel),
	}
	names := make([]string, 0, len(a.Env))
	for name := range a.Env {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		inv.Env = append(inv.Env, name+"="+a.Env[name])
	}
	if a.TimeoutMS > 0 {
		inv.Timeout = time.Duration(min(int64(a.TimeoutMS), runShellMaxTimeoutMS)) * time.Millisecond
	}
	return inv, nil
}
