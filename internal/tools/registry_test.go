package tools

import (
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/toolpool/toolpool/internal/tools/incontainer"
)

func mustRegistry(t *testing.T, custom ...CustomTool) *Registry {
	t.Helper()
	r, err := NewRegistry(custom...)
	if err != nil {
		t.Fatalf("NewRegistry: %v", err)
	}
	return r
}

func TestRegistryBuiltins(t *testing.T) {
	r := mustRegistry(t)
	want := []string{"read_file", "write_file", "edit_file", "list_files", "glob", "grep", "run_shell", "web_fetch", "read_output"}
	var got []string
	for _, tool := range r.List() {
		got = append(got, tool.Name)
		if tool.Description == "" || !tool.Kind.Valid() || tool.DefaultTimeout <= 0 || tool.DefaultOutputBytes <= 0 {
			t.Errorf("%s: incomplete: %+v", tool.Name, tool)
		}
		var schema map[string]any
		if err := json.Unmarshal(tool.Schema, &schema); err != nil {
			t.Fatalf("%s: schema: %v", tool.Name, err)
		}
		if schema["additionalProperties"] != false || schema["$schema"] != draft202012 {
			t.Errorf("%s: schema must be draft 2020-12 with additionalProperties false", tool.Name)
		}
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("List = %v, want %v", got, want)
	}
	if _, ok := r.Lookup("nope"); ok {
		t.Error("Lookup(nope) found a tool")
	}
	readOnly := map[string]bool{"read_output": true, "read_file": true, "list_files": true, "glob": true, "grep": true, "web_fetch": true}
	for _, tool := range r.List() {
		if tool.ReadOnly() != readOnly[tool.Name] {
			t.Errorf("%s: ReadOnly = %v", tool.Name, tool.ReadOnly())
		}
	}
}

// TestValidateMessages pins the exact messages a model reads for bad arguments.
// TestRunnerTools: the tools whose calls the registry plans as runner calls are exactly the tools the
// in-container runner implements, and each of them is planned as one.
func TestRunnerTools(t *testing.T) {
	r := mustRegistry(t)
	var planned []string
	for _, b := range builtins {
		if b.runner {
			planned = append(planned, b.name)
		}
	}
	slices.Sort(planned)
	if want := incontainer.RunnerTools(); !slices.Equal(planned, want) {
		t.Fatalf("the registry's runner tools are %q, the runner implements %q", planned, want)
	}
	for _, name := range planned {
		tool, _ := r.Lookup(name)
		if tool.Streams() {
			t.Errorf("%s: Streams() = true for a runner tool", name)
		}
	}
}

func TestValidateMessages(t *testing.T) {
	r := mustRegistry(t)
	tests := []struct {
		name, tool, args string
		want             string // "" means valid
	}{
		{"valid", "read_file", `{"path":"a.txt","offset":1,"limit":10}`, ""},
		{"integral float is an integer", "read_file", `{"path":"a.txt","limit":10.0}`, ""},
		{"absent args", "list_files", ``, ""},
		{"null args", "list_files", `null`, ""},
		{"missing required", "read_file", `{}`,
			`invalid arguments for read_file: argument "path" is required`},
		{"wrong type", "read_file", `{"path":"a","limit":"ten"}`,
			`invalid arguments for read_file: argument "limit" must be an integer between 1 and 10000, got "ten"`},
		{"below minimum", "read_file", `{"path":"a","offset":0}`,
			`invalid arguments for read_file: argument "offset" must be an integer >= 1, got 0`},
		{"not an integer", "read_file", `{"path":"a","offset":1.5}`,
			`invalid arguments for read_file: argument "offset" must be an integer >= 1, got 1.5`},
		{"empty string", "read_file", `{"path":""}`,
			`invalid arguments for read_file: argument "path" must be a non-empty string, got ""`},
		{"unknown argument", "read_file", `{"path":"a","file":"b"}`,
			`invalid arguments for read_file: unknown argument "file": the arguments are limit, offset, path`},
		{"every problem listed", "read_file", `{"limit":"ten","extra":true}`,
			"invalid arguments for read_file (3 problems):\n" +
				"- argument \"limit\" must be an integer between 1 and 10000, got \"ten\"\n" +
				"- argument \"path\" is required\n" +
				"- unknown argument \"extra\": the arguments are limit, offset, path"},
		{"not an object", "read_file", `["a"]`,
			`invalid arguments for read_file: arguments must be an object, got an array`},
		{"not JSON", "read_file", `{"path":`,
			`invalid arguments for read_file: arguments are not valid JSON (unexpected EOF): send a JSON object`},
		{"boolean", "edit_file", `{"path":"a","old_string":"x","new_string":"y","replace_all":"yes"}`,
			`invalid arguments for edit_file: argument "replace_all" must be true or false, got "yes"`},
		{"env value type", "run_shell", `{"command":"env","env":{"A":1}}`,
			`invalid arguments for run_shell: argument "env.A" must be a string, got 1`},
		{"env name", "run_shell", `{"command":"env","env":{"1A":"x"}}`,
			`invalid arguments for run_shell: argument "env" has an invalid key "1A": keys must match the pattern "^[A-Za-z_][A-Za-z0-9_]*$"`},
		{"timeout above maximum", "run_shell", `{"command":"sleep 1","timeout_ms":700000}`,
			`invalid arguments for run_shell: argument "timeout_ms" must be an integer between 1 and 600000, got 700000`},
		{"path climbing out", "read_file", `{"path":"../etc/passwd"}`,
			`invalid arguments for read_file: argument "path" is "../etc/passwd", which climbs out of the workspace with "..": use a path inside /workspace`},
		{"absolute path outside", "write_file", `{"path":"/etc/passwd","content":""}`,
			`invalid arguments for write_file: argument "path" is "/etc/passwd", outside the workspace: use a path relative to /workspace or under /workspace/`},
		{"absolute path inside", "write_file", `{"path":"/workspace/a/b.txt","content":""}`, ""},
		{"cwd climbing out", "run_shell", `{"command":"ls","cwd":"/workspace/../tmp"}`,
			`invalid arguments for run_shell: argument "cwd" is "/workspace/../tmp", outside the workspace: use a path relative to /workspace or under /workspace/`},
		{"url scheme", "web_fetch", `{"url":"file:///etc/passwd"}`,
			`invalid arguments for web_fetch: argument "url" must be an http:// or https:// URL, got "file:///etc/passwd"`},
		{"url without host", "web_fetch", `{"url":"https:///x"}`,
			`invalid arguments for web_fetch: argument "url" has no host: give an absolute URL such as https://example.com/page, got "https:///x"`},
		{"unknown tool", "read", `{}`,
			`unknown tool "read": available tools are edit_file, glob, grep, list_files, read_file, read_output, run_shell, web_fetch, write_file`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := r.Validate(tt.tool, json.RawMessage(tt.args))
			if tt.want == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			var ae *ArgsError
			if !errors.As(err, &ae) {
				t.Fatalf("Validate = %v (%T), want *ArgsError", err, err)
			}
			if ae.UnknownTool != strings.HasPrefix(tt.want, "unknown tool") {
				t.Errorf("UnknownTool = %v", ae.UnknownTool)
			}
			if err.Error() != tt.want {
				t.Errorf("message =\n%s\nwant\n%s", err.Error(), tt.want)
			}
		})
	}
}

func TestCustomTools(t *testing.T) {
	good := CustomTool{
		Name: "lint", Description: "Run the linter.", Command: []string{"/usr/bin/lint", "--json"},
		Schema: json.RawMessage(`{"type":"object","properties":{"fix":{"type":"boolean"}},"additionalProperties":false}`),
		Image:  "registry.example.com/lint:1", Kind: KindRead, Timeout: 5 * time.Second,
	}
	r := mustRegistry(t, good)
	tool, ok := r.Lookup("lint")
	if !ok || !tool.Custom || tool.DefaultTimeout != 5*time.Second || tool.DefaultOutputBytes != defaultCustomOutputBytes || !tool.ReadOnly() {
		t.Fatalf("lint = %+v", tool)
	}
	if err := r.Validate("lint", json.RawMessage(`{"fix":"yes"}`)); err == nil || err.Error() != `invalid arguments for lint: argument "fix" must be true or false, got "yes"` {
		t.Errorf("Validate = %v", err)
	}
	inv, err := tool.Plan(json.RawMessage(`{"fix":true}`))
	if err != nil {
		t.Fatal(err)
	}
	want := Invocation{Argv: []string{"/usr/bin/lint", "--json"}, Stdin: []byte(`{"fix":true}`), Cwd: "/workspace", Image: "registry.example.com/lint:1"}
	if !reflect.DeepEqual(inv, want) {
		t.Errorf("Plan = %+v, want %+v", inv, want)
	}
	if out := tool.Finish(Run{Stdout: []byte("2 problems\n"), ExitCode: 1}); out.Output != "2 problems\n[exit code 1]" {
		t.Errorf("Finish = %q", out.Output)
	}

	bad := []struct {
		name string
		tool CustomTool
		want string
	}{
		{"bad schema JSON", CustomTool{Name: "x", Description: "d", Command: []string{"x"}, Schema: json.RawMessage(`{`)}, `check custom tool "x": parse schema`},
		{"schema not an object schema", CustomTool{Name: "x", Description: "d", Command: []string{"x"}, Schema: json.RawMessage(`{"type":"string"}`)}, `check custom tool "x": check schema: its "type" must be "object"`},
		{"invalid schema", CustomTool{Name: "x", Description: "d", Command: []string{"x"}, Schema: json.RawMessage(`{"type":"object","properties":{"a":{"type":"strin"}}}`)}, `check custom tool "x": compile schema`},
		{"remote ref", CustomTool{Name: "x", Description: "d", Command: []string{"x"}, Schema: json.RawMessage(`{"type":"object","$ref":"https://example.com/s.json"}`)}, `remote references are not allowed`},
		{"bad name", CustomTool{Name: "9 x", Description: "d", Command: []string{"x"}}, `check custom tool "9 x": the name must match`},
		{"no command", CustomTool{Name: "x", Description: "d"}, `check custom tool "x": the command is empty`},
		{"no description", CustomTool{Name: "x", Command: []string{"x"}}, `check custom tool "x": the description is empty`},
		{"bad kind", CustomTool{Name: "x", Description: "d", Command: []string{"x"}, Kind: "nuke"}, `check custom tool "x": kind "nuke"`},
		{"builtin name", CustomTool{Name: "read_file", Description: "d", Command: []string{"x"}}, `add custom tool "read_file": a tool of that name already exists`},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewRegistry(tt.tool)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("NewRegistry = %v, want %q", err, tt.want)
			}
		})
	}
}

func TestCustomToolYAML(t *testing.T) {
	const doc = `
tools:
  custom:
    - name: jq
      description: Run a jq filter on a JSON file of the workspace.
      kind: read
      timeout: 20s
      image: ghcr.io/jqlang/jq:1.7
      command: ["/jq-runner"]
      schema:
        type: object
        properties:
          filter: {type: string, minLength: 1}
          file: {type: string}
        required: [filter, file]
        additionalProperties: false
`
	var cfg struct {
		Tools struct {
			Custom []CustomTool `yaml:"custom"`
		} `yaml:"tools"`
	}
	if err := yaml.Unmarshal([]byte(doc), &cfg); err != nil {
		t.Fatal(err)
	}
	r := mustRegistry(t, cfg.Tools.Custom...)
	jq, ok := r.Lookup("jq")
	if !ok || jq.DefaultTimeout != 20*time.Second || jq.Image != "ghcr.io/jqlang/jq:1.7" || jq.Kind != KindRead {
		t.Fatalf("jq = %+v", jq)
	}
	if err := r.Validate("jq", json.RawMessage(`{"filter":".a"}`)); err == nil || err.Error() != `invalid arguments for jq: argument "file" is required` {
		t.Errorf("Validate = %v", err)
	}
	var fromJSON CustomTool
	if err := json.Unmarshal([]byte(`{"name":"j","description":"d","command":["x"],"timeout":"1m","schema":{"type":"object"}}`), &fromJSON); err != nil {
		t.Fatal(err)
	}
	if fromJSON.Timeout != time.Minute || string(fromJSON.Schema) != `{"type":"object"}` {
		t.Errorf("from JSON: %+v", fromJSON)
	}
}

func TestPlan(t *testing.T) {
	r := mustRegistry(t)
	tests := []struct {
		name, tool, args string
		want             Invocation
	}{
		{"run_shell", "run_shell", `{"command":"make test","cwd":"src","timeout_ms":5000,"env":{"B":"2","A":"1"}}`, Invocation{
			Argv: []string{"/bin/sh", "-c", "make test"}, Cwd: "/workspace/src", Env: []string{"A=1", "B=2"}, Timeout: 5 * time.Second,
		}},
		{"run_shell defaults", "run_shell", `{"command":"ls"}`, Invocation{Argv: []string{"/bin/sh", "-c", "ls"}, Cwd: "/workspace"}},
		{"run_shell absolute cwd", "run_shell", `{"command":"ls","cwd":"/workspace/a/../b"}`, Invocation{Argv: []string{"/bin/sh", "-c", "ls"}, Cwd: "/workspace/b"}},
		{"read_file", "read_file", `{"path":"a"}`, Invocation{
			Argv: []string{incontainer.RunnerPath, incontainer.RunnerCommand, "read_file"}, Stdin: []byte(`{"path":"a"}`), Cwd: "/workspace", Runner: true,
		}},
		{"web_fetch needs egress", "web_fetch", `{"url":"https://example.com"}`, Invocation{
			Argv: []string{incontainer.RunnerPath, incontainer.RunnerCommand, "web_fetch"}, Stdin: []byte(`{"url":"https://example.com"}`), Cwd: "/workspace", Runner: true, Egress: true,
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tool, _ := r.Lookup(tt.tool)
			got, err := tool.Plan(json.RawMessage(tt.args))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Plan =\n%+v\nwant\n%+v", got, tt.want)
			}
		})
	}
	t.Run("refuses cwd outside", func(t *testing.T) {
		tool, _ := r.Lookup("run_shell")
		_, err := tool.Plan(json.RawMessage(`{"command":"ls","cwd":"../.."}`))
		var ae *ArgsError
		if !errors.As(err, &ae) {
			t.Errorf("Plan = %v, want *ArgsError", err)
		}
	})
}

func TestFacts(t *testing.T) {
	r := mustRegistry(t)
	tests := []struct {
		tool, args string
		want       Facts
	}{
		{"read_file", `{"path":"src/a.go"}`, Facts{Paths: []string{"/workspace/src/a.go"}}},
		{"read_file", `{"path":"/workspace/./src//a.go"}`, Facts{Paths: []string{"/workspace/src/a.go"}}},
		{"read_file", `{"path":"../../etc/passwd"}`, Facts{Paths: []string{"/etc/passwd"}}},
		{"write_file", `{"path":"b.txt","content":"x"}`, Facts{Paths: []string{"/workspace/b.txt"}}},
		{"edit_file", `{"path":"c","old_string":"a","new_string":"b"}`, Facts{Paths: []string{"/workspace/c"}}},
		{"list_files", `{}`, Facts{Paths: []string{"/workspace"}}},
		{"glob", `{"pattern":"**","path":"lib"}`, Facts{Paths: []string{"/workspace/lib"}}},
		{"grep", `{"pattern":"x"}`, Facts{Paths: []string{"/workspace"}}},
		{"run_shell", `{"command":"rm -rf /","cwd":"x"}`, Facts{Command: "rm -rf /", Cwd: "x", Paths: []string{"/workspace/x"}}},
		{"run_shell", `{"command":"git status","env":{"GIT_CONFIG_COUNT":"1"}}`, Facts{Command: "git status", Env: map[string]string{"GIT_CONFIG_COUNT": "1"}}},
		{"run_shell", `{"command":"ls"}`, Facts{Command: "ls"}},
		{"web_fetch", `{"url":"https://example.com/a"}`, Facts{URL: "https://example.com/a"}},
		{"read_file", `not json`, Facts{}},
	}
	for _, tt := range tests {
		t.Run(tt.tool+" "+tt.args, func(t *testing.T) {
			tool, _ := r.Lookup(tt.tool)
			if got := tool.Facts(json.RawMessage(tt.args)); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Facts = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestFormats(t *testing.T) {
	r := mustRegistry(t, CustomTool{Name: "deploy", Description: "Deploy.", Command: []string{"deploy"}, Kind: KindExecute})
	ts := r.List()
	encode := func(format string) []map[string]any {
		t.Helper()
		v, err := Render(format, ts)
		if err != nil {
			t.Fatal(err)
		}
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		var out []map[string]any
		if err := json.Unmarshal(b, &out); err != nil {
			t.Fatal(err)
		}
		if len(out) != len(ts) {
			t.Fatalf("%s: %d tools, want %d", format, len(out), len(ts))
		}
		return out
	}
	openai := encode(FormatOpenAI)[0]
	fn := openai["function"].(map[string]any)
	if openai["type"] != "function" || fn["name"] != "read_file" || fn["description"] == "" || fn["parameters"].(map[string]any)["type"] != "object" {
		t.Errorf("openai: %v", openai)
	}
	if _, ok := fn["parameters"].(map[string]any)["$schema"]; ok {
		t.Error("openai parameters keep $schema")
	}
	anthropic := encode(FormatAnthropic)[0]
	if anthropic["name"] != "read_file" || anthropic["input_schema"].(map[string]any)["required"] == nil {
		t.Errorf("anthropic: %v", anthropic)
	}
	mcp := encode(FormatMCP)
	ann := func(i int) map[string]any { return mcp[i]["annotations"].(map[string]any) }
	if mcp[0]["inputSchema"] == nil || ann(0)["readOnlyHint"] != true || ann(0)["destructiveHint"] != false {
		t.Errorf("mcp read_file: %v", mcp[0])
	}
	if mcp[1]["name"] != "write_file" || ann(1)["readOnlyHint"] != false || ann(1)["destructiveHint"] != true {
		t.Errorf("mcp write_file: %v", mcp[1])
	}
	native := encode(FormatNative)
	if native[6]["name"] != "run_shell" || native[6]["kind"] != "execute" || native[6]["default_timeout_ms"] != float64(120000) || native[6]["schema"] == nil {
		t.Errorf("native run_shell: %v", native[6])
	}
	if native[9]["custom"] != true {
		t.Errorf("native deploy: %v", native[9])
	}
	if _, err := Render("gemini", ts); err == nil {
		t.Error("Render(gemini) did not fail")
	}
}

func FuzzRelPath(f *testing.F) {
	for _, s := range []string{"", ".", "a/b", "../x", "/workspace", "/workspace/../etc", "/etc/passwd", "a/../../b", "a//b/./c", "/workspace/a/../../x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		rel, err := incontainer.RelPath(p)
		if err != nil {
			return
		}
		if rel == ".." || strings.HasPrefix(rel, "../") || strings.HasPrefix(rel, "/") || strings.IndexByte(rel, 0) >= 0 {
			t.Fatalf("RelPath(%q) = %q escapes", p, rel)
		}
		if abs := workspacePath(p); abs != incontainer.WorkspaceDir && !strings.HasPrefix(abs, incontainer.WorkspaceDir+"/") {
			t.Fatalf("RelPath(%q) accepted, but Facts path %q is outside the workspace", p, abs)
		}
	})
}

func FuzzValidate(f *testing.F) {
	r, err := NewRegistry()
	if err != nil {
		f.Fatal(err)
	}
	f.Add("read_file", `{"path":"a","limit":"ten"}`)
	f.Add("run_shell", `{"command":"x","env":{"1":2},"cwd":"../"}`)
	f.Add("web_fetch", `{"url":"http://[::1"}`)
	f.Add("grep", `[]`)
	f.Fuzz(func(t *testing.T, tool, args string) {
		err := r.Validate(tool, json.RawMessage(args))
		if err == nil {
			tl, _ := r.Lookup(tool)
			tl.Facts(json.RawMessage(args))
			if _, err := tl.Plan(json.RawMessage(args)); err != nil {
				t.Fatalf("Validate accepted %s %s but Plan failed: %v", tool, args, err)
			}
			return
		}
		var ae *ArgsError
		if !errors.As(err, &ae) || len(ae.Problems) == 0 || err.Error() == "" {
			t.Fatalf("Validate(%s, %s) = %v (%T)", tool, args, err, err)
		}
	})
}
