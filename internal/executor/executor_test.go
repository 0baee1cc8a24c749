package executor

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/sandbox"
	"github.com/toolpool/toolpool/internal/tools"
	"github.com/toolpool/toolpool/internal/workspace"
)

// fakeRuntime runs nothing: it records each Spec and returns outcome (a successful run printing "done"
// when nil).
type fakeRuntime struct {
	mu      sync.Mutex
	specs   []sandbox.Spec
	outcome *sandbox.Outcome
}

func (f *fakeRuntime) Run(_ context.Context, spec sandbox.Spec) (sandbox.Outcome, error) {
	f.mu.Lock()
	f.specs = append(f.specs, spec)
	f.mu.Unlock()
	if f.outcome != nil {
		return *f.outcome, nil
	}
	w := sandbox.NewCapWriter(1 << 10)
	io.WriteString(w, "done\n")
	return sandbox.Outcome{SandboxTime: time.Millisecond, RunTime: time.Millisecond, WorkspaceBytes: -1, Stdout: w.Captured()}, nil
}

func (f *fakeRuntime) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.specs)
}

// newTestExecutor is an executor on rt with the built-in tools, over a fresh workspaces directory with
// quota (0: none), logging to log (nil: nowhere). It returns the workspace manager too.
func newTestExecutor(t *testing.T, rt sandbox.Runtime, quota int64, log *slog.Logger) (*Executor, *workspace.Manager) {
	t.Helper()
	reg, err := tools.NewRegistry()
	if err != nil {
		t.Fatal(err)
	}
	wsm, err := workspace.New(workspace.Config{Dir: t.TempDir(), UID: os.Getuid(), GID: os.Getgid(), Quota: quota})
	if err != nil {
		t.Fatal(err)
	}
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return New(Config{Worker: "w1"}, rt, reg, wsm, log), wsm
}

func newCall(tool string, args string) *call.Call {
	return &call.Call{ID: call.NewID(), Tenant: "t", Workspace: "ws", Tool: tool, Args: json.RawMessage(args),
		CreatedAt: time.Now(), Limits: call.Limits{TimeoutMS: 10000}}
}

const shellArgs = `{"command":"echo hi"}`

// runCall runs c and returns its result as Finish makes it.
func runCall(e *Executor, c *call.Call) *call.Result {
	r := call.NewResult(c, call.StatusRunning)
	x, err := e.Run(context.Background(), c, nil, nil)
	e.Finish(r, c, x, err, nil)
	return r
}

// TestOutcomes: how a run ended becomes the call's status and error, in words a model can act on.
func TestOutcomes(t *testing.T) {
	captured := func(s string, limit int64) sandbox.Captured {
		w := sandbox.NewCapWriter(limit)
		io.WriteString(w, s)
		return w.Captured()
	}
	tests := []struct {
		name    string
		out     sandbox.Outcome
		status  call.Status
		errType string
		msg     string
		check   func(t *testing.T, r *call.Result)
	}{
		{name: "exit 0 is ok", out: sandbox.Outcome{Stdout: captured("hi\n", 1024), WorkspaceBytes: -1},
			status: call.StatusOK, check: func(t *testing.T, r *call.Result) {
				if r.Stdout != "hi\n" || r.ExitCode == nil || *r.ExitCode != 0 {
					t.Errorf("stdout %q exit %v", r.Stdout, r.ExitCode)
				}
			}},
		{name: "a non-zero exit is a tool error", out: sandbox.Outcome{ExitCode: 3, WorkspaceBytes: -1},
			status: call.StatusError, errType: call.ErrExitCode},
		{name: "a timeout keeps what was printed", out: sandbox.Outcome{ExitCode: 137, Signal: "SIGKILL", TimedOut: true, Stdout: captured("started\n", 1024), WorkspaceBytes: -1},
			status: call.StatusTimeout, errType: call.ErrTimeout, msg: "ran past its timeout of 10s",
			check: func(t *testing.T, r *call.Result) {
				if !strings.Contains(r.Output, "started") || !strings.Contains(r.Output, "[timed out:") || r.Usage.Signal != "SIGKILL" {
					t.Errorf("output %q signal %q", r.Output, r.Usage.Signal)
				}
			}},
		{name: "an OOM kill names the peak", out: sandbox.Outcome{ExitCode: 137, OOMKilled: true, MaxRSSBytes: 512 << 20, WorkspaceBytes: -1},
			status: call.StatusError, errType: call.ErrOOM, msg: "ran out of memory (peak 512 MiB)"},
		{name: "a workspace grown past its quota", out: sandbox.Outcome{ExitCode: 137, QuotaExceeded: true, WorkspaceBytes: 3 << 20},
			status: call.StatusError, errType: call.ErrQuota, msg: "grew past its quota of 1.0 MiB (it uses 3.0 MiB)",
			check: func(t *testing.T, r *call.Result) {
				if r.Usage.WorkspaceBytes != 3<<20 {
					t.Errorf("usage workspace bytes %d", r.Usage.WorkspaceBytes)
				}
			}},
		{name: "output over the cap is marked truncated", out: sandbox.Outcome{Stdout: captured(strings.Repeat("x", 5000), 100), WorkspaceBytes: -1},
			status: call.StatusOK, check: func(t *testing.T, r *call.Result) {
				if !r.Truncated {
					t.Error("not marked truncated")
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := tt.out
			out.SandboxTime, out.RunTime, out.CPUTime = 40*time.Millisecond, 250*time.Millisecond, 30*time.Millisecond
			e, _ := newTestExecutor(t, &fakeRuntime{outcome: &out}, 1<<20, nil)
			c := newCall("run_shell", shellArgs)
			r := runCall(e, c)
			if r.Status != tt.status || (tt.errType == "") != (r.Error == nil) || (r.Error != nil && r.Error.Type != tt.errType) {
				t.Fatalf("status %s error %+v, want %s %s", r.Status, r.Error, tt.status, tt.errType)
			}
			if tt.msg != "" && !strings.Contains(r.Error.Message, tt.msg) {
				t.Errorf("message %q lacks %q", r.Error.Message, tt.msg)
			}
			if r.Timing.SandboxMS != 40 || r.Timing.RunMS != 250 || r.Usage.CPUMS != 30 || r.Usage.WallMS != 250 {
				t.Errorf("timing %+v usage %+v", r.Timing, r.Usage)
			}
			if tt.check != nil {
				tt.check(t, r)
			}
		})
	}
}

// TestOverQuota: the executor refuses a call that can only add to a workspace over its quota, without starting
// a container, and runs one that may free space with the quota set so that the call cannot grow it.
func TestOverQuota(t *testing.T) {
	const quota = 64 << 10
	tests := []struct {
		name, tool, args string
		wantRun          bool
	}{
		{"write_file is refused", "write_file", `{"path":"b","content":"x"}`, false},
		{"edit_file is refused", "edit_file", `{"path":"big","old_string":"a","new_string":"b"}`, false},
		{"run_shell runs (to delete files)", "run_shell", `{"command":"rm big"}`, true},
		{"read_file runs", "read_file", `{"path":"big"}`, true},
		{"grep runs", "grep", `{"pattern":"x"}`, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rt := &fakeRuntime{}
			e, wsm := newTestExecutor(t, rt, quota, nil)
			ws, err := wsm.Prepare("t", "ws")
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(ws.Dir, "big"), make([]byte, 4*quota), 0o644); err != nil {
				t.Fatal(err)
			}
			c := newCall(tt.tool, tt.args)
			got := runCall(e, c)
			if !tt.wantRun {
				if rt.count() != 0 || got.Status != call.StatusError || got.Error.Type != call.ErrQuota ||
					!strings.Contains(got.Error.Message, "over its quota") || !strings.Contains(got.Error.Message, "run_shell (for rm) still work") {
					t.Fatalf("runs %d, status %s %+v; want refused over quota", rt.count(), got.Status, got.Error)
				}
				return
			}
			if rt.count() != 1 {
				t.Fatalf("runs %d, status %s %+v; want it run", rt.count(), got.Status, got.Error)
			}
			if lim := rt.specs[0].Limits.WorkspaceBytes; lim < 4*quota || lim > 8*quota {
				t.Errorf("the call runs with a workspace quota of %d bytes, want the workspace's size (about %d) so that it cannot grow", lim, 4*quota)
			}
		})
	}
}

// TestDeniedGlobsReachTheRunner: the call's denied globs (call.Limits, set by policy) reach the runner of a
// file tool in its input, and the tools that read no files get their arguments as sent.
func TestDeniedGlobsReachTheRunner(t *testing.T) {
	for _, tt := range []struct {
		tool, args string
		want       string // a fragment the container's stdin must hold
		dontWant   string
	}{
		{"grep", `{"pattern":"SECRET"}`, `"_policy":{"denied_globs":["**/.env"]}`, ""},
		{"run_shell", shellArgs, "", "_policy"},
	} {
		t.Run(tt.tool, func(t *testing.T) {
			rt := &fakeRuntime{}
			e, _ := newTestExecutor(t, rt, 0, nil)
			c := newCall(tt.tool, tt.args)
			c.Limits.DeniedGlobs = []string{"**/.env"}
			r := runCall(e, c)
			if rt.count() != 1 {
				t.Fatalf("%d runs, want 1: %+v", rt.count(), r)
			}
			rt.mu.Lock()
			stdin := string(rt.specs[0].Stdin)
			rt.mu.Unlock()
			if !strings.Contains(stdin, tt.want) || (tt.dontWant != "" && strings.Contains(stdin, tt.dontWant)) {
				t.Errorf("the runner's stdin is %s: want %q in it, and not %q", stdin, tt.want, tt.dontWant)
			}
		})
	}
}

// TestLogsSandboxSteps checks that the steps the runtime timed reach the executor's debug log, named and in
// milliseconds, with the call's id.
func TestLogsSandboxSteps(t *testing.T) {
	rt := &fakeRuntime{outcome: &sandbox.Outcome{Warm: true, WorkspaceBytes: -1,
		Steps: []sandbox.Step{{Name: "claim", Took: 250 * time.Microsecond}, {Name: "start", Took: 3 * time.Millisecond}}}}
	logs := &recordingHandler{}
	e, _ := newTestExecutor(t, rt, 0, slog.New(logs))
	c := newCall("run_shell", shellArgs)
	runCall(e, c)
	want := fmt.Sprintf("call_id=%s warm=true steps=[claim_ms=0.25 start_ms=3]", c.ID)
	got := logs.find("sandbox steps")
	if got != want {
		t.Fatalf("the log's sandbox steps are %q, want %q", got, want)
	}
}

// recordingHandler keeps what is logged at any level, as message and attributes.
type recordingHandler struct {
	mu      sync.Mutex
	records []slog.Record
}

func (h *recordingHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *recordingHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.records = append(h.records, r.Clone())
	return nil
}

func (h *recordingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *recordingHandler) WithGroup(string) slog.Handler      { return h }

// find returns the attributes of the first record with message msg, "" when there is none.
func (h *recordingHandler) find(msg string) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, r := range h.records {
		if r.Message != msg {
			continue
		}
		var attrs []string
		r.Attrs(func(a slog.Attr) bool {
			attrs = append(attrs, a.String())
			return true
		})
		return strings.Join(attrs, " ")
	}
	return ""
}

// TestReadOnlyWorkspaceReachesTheSandbox: a call whose limits ask for a read-only workspace (the read-only
// posture) runs with it mounted read-only, whatever its tool; the others with it writable.
func TestReadOnlyWorkspaceReachesTheSandbox(t *testing.T) {
	for _, ro := range []bool{true, false} {
		for _, tc := range []struct{ tool, args string }{{"run_shell", shellArgs}, {"read_file", `{"path":"a"}`}} {
			rt := &fakeRuntime{}
			e, _ := newTestExecutor(t, rt, 0, nil)
			c := newCall(tc.tool, tc.args)
			c.Limits.ReadOnlyWorkspace = ro
			runCall(e, c)
			if rt.count() != 1 {
				t.Fatalf("%s: %d runs, want 1", tc.tool, rt.count())
			}
			if got := rt.specs[0].WorkspaceReadOnly; got != ro {
				t.Errorf("%s with limits.read_only_workspace %v: spec.WorkspaceReadOnly %v", tc.tool, ro, got)
			}
		}
	}
}

// TestHiddenPathsReachTheSandbox: what the call's denied globs match in its workspace is hidden from a
// run_shell container (spec.Hidden), with every other name of their files; a file tool, whose runner checks
// each path by name, hides only the other names; a workspace with too many matches is refused, unrun, with
// what to do.
func TestHiddenPathsReachTheSandbox(t *testing.T) {
	rt := &fakeRuntime{}
	e, wsm := newTestExecutor(t, rt, 0, nil)
	ws, err := wsm.Prepare("t", "ws")
	if err != nil {
		t.Fatal(err)
	}
	writeFiles(t, ws.Dir, ".env", "a/b/.env", ".ssh/id_rsa", "src/main.go")
	if err := os.Link(filepath.Join(ws.Dir, ".ssh/id_rsa"), filepath.Join(ws.Dir, "src/key.txt")); err != nil {
		t.Fatal(err)
	}
	globs := []string{"**/.env", "~/.ssh/**"}
	for _, tc := range []struct {
		tool, args string
		want       []string
	}{{"run_shell", shellArgs, []string{".env", ".ssh", "a/b/.env", "src/key.txt"}}, {"read_file", `{"path":"src/main.go"}`, []string{"src/key.txt"}}} {
		c := newCall(tc.tool, tc.args)
		c.Limits.DeniedGlobs = globs
		runCall(e, c)
		got := slices.Sorted(slices.Values(rt.specs[len(rt.specs)-1].Hidden))
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: spec.Hidden %q, want %q", tc.tool, got, tc.want)
		}
	}
	for i := range maxHidden + 1 {
		if err := os.WriteFile(filepath.Join(ws.Dir, fmt.Sprintf("k%d.pem", i)), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	runs := rt.count()
	c := newCall("run_shell", shellArgs)
	c.Limits.DeniedGlobs = []string{"**/*.pem"}
	r := runCall(e, c)
	if rt.count() != runs || r.Error == nil || r.Error.Type != call.ErrPermissionDenied || !strings.Contains(r.Error.Message, "Remove them") {
		t.Errorf("a workspace with %d denied files: ran %v, error %+v", maxHidden+1, rt.count() != runs, r.Error)
	}
}

// TestGitControlReachesTheSandbox: git's control files of every repository in the workspace (config,
// hooks, commondir, gitfiles, a submodule's) are read-only paths of every call's container, and a .git
// without hooks, config or commondir gets an empty hooks directory, an empty config and a commondir of
// "." (what their absence meant) to make read-only; a call whose policy lets it write them gets none.
func TestGitControlReachesTheSandbox(t *testing.T) {
	rt := &fakeRuntime{}
	e, wsm := newTestExecutor(t, rt, 0, nil)
	ws, err := wsm.Prepare("t", "ws")
	if err != nil {
		t.Fatal(err)
	}
	writeFiles(t, ws.Dir, ".git/config", ".git/HEAD", ".git/hooks/pre-commit.sample", ".git/modules/lib/config",
		".git/modules/lib/hooks/x", "lib/.git", "nested/repo/.git/config", "bare/.git/HEAD", "src/main.go")
	want := []string{".git", ".git/commondir", ".git/config", ".git/hooks", ".git/modules/lib/config", ".git/modules/lib/hooks",
		"bare/.git", "bare/.git/commondir", "bare/.git/config", "bare/.git/hooks", "lib/.git",
		"nested/repo/.git", "nested/repo/.git/commondir", "nested/repo/.git/config", "nested/repo/.git/hooks"}
	for _, tool := range []string{"run_shell", "read_file"} {
		args := map[string]string{"run_shell": shellArgs, "read_file": `{"path":"src/main.go"}`}[tool]
		runCall(e, newCall(tool, args))
		got := slices.Sorted(slices.Values(rt.specs[len(rt.specs)-1].ReadOnlyPaths))
		if !slices.Equal(got, want) {
			t.Errorf("%s: spec.ReadOnlyPaths %q, want %q", tool, got, want)
		}
	}
	if fi, err := os.Lstat(filepath.Join(ws.Dir, "nested/repo/.git/hooks")); err != nil || !fi.IsDir() {
		t.Errorf("the hooks directory a .git lacked was not made: %v", err)
	}
	for f, want := range map[string]string{".git/commondir": ".\n", "bare/.git/config": "", "bare/.git/commondir": ".\n",
		".git/config": "x", "lib/.git": "x"} {
		if b, err := os.ReadFile(filepath.Join(ws.Dir, f)); err != nil || string(b) != want {
			t.Errorf("%s: %q (%v), want %q", f, b, err, want)
		}
	}
	// A read-only workspace can create nothing: a repository's missing control files are not made for it.
	writeFiles(t, ws.Dir, "ro/.git/HEAD")
	c := newCall("run_shell", shellArgs)
	c.Limits.ReadOnlyWorkspace = true
	runCall(e, c)
	for _, f := range []string{"ro/.git/hooks", "ro/.git/config", "ro/.git/commondir"} {
		if _, err := os.Lstat(filepath.Join(ws.Dir, f)); !os.IsNotExist(err) {
			t.Errorf("a read-only call's workspace gained %s (%v)", f, err)
		}
	}
	c = newCall("run_shell", shellArgs)
	c.Limits.WriteGitControl = true
	runCall(e, c)
	if got := rt.specs[len(rt.specs)-1].ReadOnlyPaths; got != nil {
		t.Errorf("with write_git_control, spec.ReadOnlyPaths %q", got)
	}
}

// writeFiles writes each file (a path relative to dir) with some content, making its directories.
func writeFiles(t *testing.T, dir string, files ...string) {
	t.Helper()
	for _, f := range files {
		p := filepath.Join(dir, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
