package containerd_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/sandbox"
	"github.com/toolpool/toolpool/internal/sandbox/containerd"
	"github.com/toolpool/toolpool/internal/sandbox/containerd/ctrtest"
)

// workspace returns a host directory the sandbox user can write, as a worker prepares it.
func workspace(t testing.TB) string {
	t.Helper()
	dir := filepath.Join(ctrtest.ShortTempDir(t), "ws")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, ctrtest.SandboxUID, ctrtest.SandboxGID); err != nil {
		t.Fatal(err)
	}
	return dir
}

var seq struct {
	sync.Mutex
	n int
}

func newID(prefix string) string {
	seq.Lock()
	defer seq.Unlock()
	seq.n++
	return fmt.Sprintf("%s-%d-%d", prefix, os.Getpid(), seq.n)
}

func shell(ws, cmd string, timeout time.Duration) sandbox.Spec {
	return sandbox.Spec{ID: newID("t"), Argv: []string{"/bin/sh", "-c", cmd}, WorkspaceDir: ws,
		Limits: sandbox.Limits{Timeout: timeout}}
}

func TestRun(t *testing.T) {
	rt, _ := ctrtest.NewRuntime(t, containerd.Config{})
	ws := workspace(t)
	tests := []struct {
		name       string
		cmd        string
		timeout    time.Duration
		wantExit   int
		wantStdout string // substring
		wantStderr string // substring
		timedOut   bool
	}{
		{name: "echo", cmd: "echo hi", wantStdout: "hi\n"},
		{name: "exit code and stderr", cmd: "echo oops >&2; exit 3", wantExit: 3, wantStderr: "oops"},
		{name: "runs as the sandbox user", cmd: "id -u; id -g", wantStdout: "65532\n65532\n"},
		{name: "cwd is the workspace", cmd: "pwd", wantStdout: "/workspace\n"},
		{name: "workspace is writable", cmd: "echo data > f && cat f", wantStdout: "data\n"},
		{name: "root is read-only", cmd: "touch /usr/x || touch /x || echo ro", wantStdout: "ro\n"},
		{name: "tmp is writable", cmd: "echo t > /tmp/t && cat /tmp/t", wantStdout: "t\n"},
		{name: "no host secrets in etc", cmd: "ls /etc/shadow 2>&1; cat /etc/passwd | grep -c :", wantStdout: "No such file"},
		{name: "no capabilities and no_new_privs and seccomp", cmd: "grep -E '^(CapEff|CapPrm|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status",
			wantStdout: "CapPrm:\t0000000000000000\nCapEff:\t0000000000000000\nCapBnd:\t0000000000000000\nNoNewPrivs:\t1\nSeccomp:\t2"},
		{name: "loopback only", cmd: "cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' '", wantStdout: "lo\n"},
		{name: "host tools work", cmd: "ls / >/dev/null && awk 'BEGIN{print 1+1}'", wantStdout: "2\n"},
		{name: "timeout keeps output", cmd: "echo before; sleep 30", timeout: 300 * time.Millisecond, wantExit: 137, wantStdout: "before\n", timedOut: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			timeout := tt.timeout
			if timeout == 0 {
				timeout = 20 * time.Second
			}
			out, err := rt.Run(context.Background(), shell(ws, tt.cmd, timeout))
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			if out.ExitCode != tt.wantExit || out.TimedOut != tt.timedOut {
				t.Errorf("exit %d timedOut %v; want %d %v (stdout %q stderr %q)", out.ExitCode, out.TimedOut, tt.wantExit, tt.timedOut, out.Stdout.String(), out.Stderr.String())
			}
			if !strings.Contains(out.Stdout.String(), tt.wantStdout) {
				t.Errorf("stdout %q does not contain %q", out.Stdout.String(), tt.wantStdout)
			}
			if !strings.Contains(out.Stderr.String(), tt.wantStderr) {
				t.Errorf("stderr %q does not contain %q", out.Stderr.String(), tt.wantStderr)
			}
			if out.SandboxTime <= 0 || out.RunTime <= 0 {
				t.Errorf("timings not recorded: %+v", out)
			}
		})
	}
}

// TestOutputSurvivesKill proves that what a process printed comes back whole when it exits, is killed, or
// times out right after printing, many times over. containerd's own Task.Delete cancels the FIFO copy
// before waiting for it, so output still in flight at exit is lost unless the runtime drains it first.
func TestOutputSurvivesKill(t *testing.T) {
	rt, _ := ctrtest.NewRuntime(t, containerd.Config{})
	ws := workspace(t)
	// 1.5 MB, far more than a pipe and a FIFO hold, written in one go, then a marker.
	const flood = `head -c 1500000 /dev/zero | tr '\0' x; echo MARKER; echo ERRMARK >&2; `
	const want = 1500000 + len("MARKER\n")
	endings := []struct {
		name     string
		tail     string
		timeout  time.Duration
		timedOut bool
		exit     int
	}{
		{name: "exit", tail: "exit 0", timeout: 20 * time.Second},
		{name: "exit code", tail: "exit 9", timeout: 20 * time.Second, exit: 9},
		{name: "timeout", tail: "sleep 30", timeout: 1500 * time.Millisecond, timedOut: true, exit: 137},
	}
	const runs = 15
	for _, e := range endings {
		t.Run(e.name, func(t *testing.T) {
			for i := range runs {
				spec := shell(ws, flood+e.tail, e.timeout)
				spec.Limits.OutputBytes = 4 << 20
				out, err := rt.Run(context.Background(), spec)
				if err != nil {
					t.Fatalf("run %d: %v", i, err)
				}
				if out.TimedOut != e.timedOut || out.ExitCode != e.exit {
					t.Fatalf("run %d: timedOut %v exit %d", i, out.TimedOut, out.ExitCode)
				}
				got := out.Stdout.String()
				if out.Stdout.Total != int64(want) || len(got) != want || !strings.HasSuffix(got, "xMARKER\n") {
					t.Fatalf("run %d: lost output: got %d of %d bytes, ends %q", i, len(got), want, got[max(0, len(got)-20):])
				}
				if out.Stderr.String() != "ERRMARK\n" {
					t.Fatalf("run %d: stderr %q", i, out.Stderr.String())
				}
			}
		})
	}
}

// TestTimeoutKillsEverything: daemons, setsid and double-forked orphans die with the call.
func TestTimeoutKillsEverything(t *testing.T) {
	rt, _ := ctrtest.NewRuntime(t, containerd.Config{})
	ws := workspace(t)
	cmd := `(setsid sh -c 'while true; do date +%s%N > /workspace/alive; sleep 0.05; done' &) ; nohup sh -c 'sleep 1000' >/dev/null 2>&1 & echo started; sleep 1000`
	out, err := rt.Run(context.Background(), shell(ws, cmd, 500*time.Millisecond))
	if err != nil || !out.TimedOut {
		t.Fatalf("Run: %v, timedOut %v", err, out.TimedOut)
	}
	before, err := os.ReadFile(filepath.Join(ws, "alive"))
	if err != nil {
		t.Fatalf("the daemon never ran: %v", err)
	}
	time.Sleep(300 * time.Millisecond) // long enough for a survivor to write again
	after, _ := os.ReadFile(filepath.Join(ws, "alive"))
	if string(before) != string(after) {
		t.Fatalf("a background process outlived the call: %q then %q", before, after)
	}
}

// TestNoLeaks runs many calls, timeouts and failures among them, concurrently, and checks that no container,
// FIFO, cgroup or mount is left behind.
func TestNoLeaks(t *testing.T) {
	state := filepath.Join(ctrtest.ShortTempDir(t), "state")
	rt, d := ctrtest.NewRuntime(t, containerd.Config{StateDir: state})
	ws := workspace(t)
	cmds := []struct {
		cmd     string
		timeout time.Duration
	}{{"true", 0}, {"exit 7", 0}, {"echo x; sleep 10", 200 * time.Millisecond}, {"/nonexistent", 0}}
	n := 300 // hundreds of calls, a quarter of them timeouts and a quarter failures
	if ctrtest.Runtime() == containerd.GVisorRuntime {
		n = 60 // every gVisor call boots a kernel (half a CPU-second): fewer, to keep the gVisor tier in CI's budget
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, 4)
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			c := cmds[i%len(cmds)]
			timeout := c.timeout
			if timeout == 0 {
				timeout = 20 * time.Second
			}
			if _, err := rt.Run(context.Background(), shell(ws, c.cmd, timeout)); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("Run: %v", err)
	}
	rt.WaitCleanups()
	ids, err := rt.Containers(context.Background())
	if err != nil || len(ids) != 0 {
		t.Fatalf("containers left: %v %v", ids, err)
	}
	stateDir := filepath.Dir(filepath.Dir(d.Address()))
	mountinfo, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(mountinfo), "\n") {
		if strings.Contains(line, stateDir) {
			t.Errorf("mount left behind: %s", line)
		}
	}
	if entries, _ := os.ReadDir("/sys/fs/cgroup/memory/toolpool-test"); len(entries) > 0 {
		var names []string
		for _, e := range entries {
			if e.IsDir() {
				names = append(names, e.Name())
			}
		}
		if len(names) > 0 {
			t.Errorf("cgroups left behind: %v", names)
		}
	}
	shims, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range shims {
		b, _ := os.ReadFile(p)
		if strings.Contains(string(b), "containerd-shim") && strings.Contains(string(b), "toolpool-test") {
			t.Errorf("shim left running: %s", strings.ReplaceAll(string(b), "\x00", " "))
		}
		if strings.Contains(string(b), state) { // gVisor's sandbox and gofer processes name their state dir
			t.Errorf("sandbox process left running: %s", strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
	// gVisor's state (runsc --root) holds files per live container, and the network namespace its gofers
	// share, which stays mounted until the Runtime closes.
	left, _ := filepath.Glob(filepath.Join(state, "runsc", "state", "*", "*"))
	if left = slices.DeleteFunc(left, func(p string) bool { return filepath.Base(p) == "null-netns" }); len(left) > 0 {
		t.Errorf("runsc state left behind: %v", left)
	}
	rt.Close()
	mountinfo, _ = os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mountinfo), state) {
		t.Errorf("mounts left under %s after Close", state)
	}
}

// TestWarnings checks that New reports the runc this host runs when it predates MinRuncVersion.
func TestWarnings(t *testing.T) {
	rt, _ := ctrtest.NewRuntime(t, containerd.Config{})
	out, err := exec.Command("runc", "--version").Output()
	if err != nil {
		t.Fatal(err)
	}
	var major, minor, patch int
	if _, err := fmt.Sscanf(string(out), "runc version %d.%d.%d", &major, &minor, &patch); err != nil {
		t.Fatalf("parse %q: %v", out, err)
	}
	old := major < 1 || major == 1 && (minor < 2 || minor == 2 && patch < 8 || minor == 3 && patch < 3)
	w := rt.Warnings()
	if old != (len(w) == 1 && strings.Contains(w[0], "CVE-2025-31133")) {
		t.Errorf("runc %d.%d.%d: warnings %q", major, minor, patch, w)
	}
	t.Logf("warnings: %q", w)
}
