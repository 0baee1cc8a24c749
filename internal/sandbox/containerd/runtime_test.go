package containerd_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
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

// assertGone checks that nothing of container id is left on the host once the runtime has removed it: no
// container record, no FIFO directory in stateDir, no cgroup directory in any hierarchy the host mounts
// (v1, v2 or both) and no process in its cgroup. The cgroup is given a few seconds to go: the kernel
// removes a killed process's cgroup membership when the process is reaped.
func assertGone(t testing.TB, rt *containerd.Runtime, stateDir, namespace, id string) {
	t.Helper()
	rt.WaitCleanups() // containers are removed after Run returns
	if ids, err := rt.Containers(context.Background()); err != nil || slices.Contains(ids, id) {
		t.Errorf("the container %s is left: %v %v", id, ids, err)
	}
	if _, err := os.Lstat(filepath.Join(stateDir, "fifo", id)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the FIFO directory of %s is left (%v)", id, err)
	}
	var cg ctrtest.Cgroup
	var err error
	if !eventually(5*time.Second, func() bool {
		cg, err = ctrtest.ContainerCgroup(namespace, id)
		return err == nil && cg.Empty()
	}) {
		t.Errorf("left behind by %s (%v): %s", id, err, cg)
	}
}

// aliveFIFO is a FIFO in a workspace that a call's background processes hold open for writing, and that
// the host holds open for reading. Through it the host sees, without waiting for something not to happen,
// that they ran (they wrote) and that every one of them is dead (end of file: no writer left).
//
// Under gVisor it is a regular file: gVisor opens no host FIFO (runsc's --host-fifo stays none, as the
// sandbox has it). The file shows that the processes ran; that they are gone is shown by the call's cgroup,
// which the caller checks empty (assertGone): every process of a gVisor call is a task of its Sentry, and
// the Sentry and its systrap stubs are in that cgroup (TestLeakCheckSeesALiveCall runs under gVisor too).
type aliveFIFO struct {
	name string
	path string
	fd   int // -1 under gVisor
}

// newAliveFIFO creates the FIFO name in workspace ws and opens it for reading without blocking; a process
// in the container opens it for writing with >/workspace/name.
func newAliveFIFO(t testing.TB, ws, name string) *aliveFIFO {
	t.Helper()
	p := filepath.Join(ws, name)
	gvisor := ctrtest.Runtime() == containerd.GVisorRuntime
	mk := func() error { return syscall.Mkfifo(p, 0o600) }
	if gvisor {
		mk = func() error { return os.WriteFile(p, nil, 0o600) }
	}
	if err := mk(); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(p, ctrtest.SandboxUID, ctrtest.SandboxGID); err != nil {
		t.Fatal(err)
	}
	if gvisor {
		return &aliveFIFO{name: name, path: p, fd: -1}
	}
	fd, err := syscall.Open(p, syscall.O_RDONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	return &aliveFIFO{name: name, path: p, fd: fd}
}

// assertWritersGone reads the FIFO until every writer has closed it, for at most within, and fails the test
// if no writer ever wrote (the check would prove nothing) or if one still holds it at the deadline.
func (a *aliveFIFO) assertWritersGone(t testing.TB, within time.Duration) {
	t.Helper()
	if a.fd < 0 { // gVisor: a regular file
		if fi, err := os.Stat(a.path); err != nil || fi.Size() == 0 {
			t.Errorf("no background process ever wrote to %s (%v): the test did not run what it checks", a.name, err)
		}
		return
	}
	buf := make([]byte, 4096)
	got := 0
	deadline := time.Now().Add(within)
	for {
		n, err := syscall.Read(a.fd, buf)
		switch {
		case n > 0:
			got += n
		case errors.Is(err, syscall.EAGAIN): // a writer still holds it open
			if time.Now().After(deadline) {
				t.Errorf("a background process outlived the call: %s still has a writer %s after the call ended (read %d bytes)", a.name, within, got)
				return
			}
			time.Sleep(20 * time.Millisecond)
		case err == nil: // end of file: no writer is left
			if got == 0 {
				t.Errorf("no background process ever wrote to %s: the test did not run what it checks", a.name)
			}
			return
		default:
			t.Fatalf("read %s: %v", a.name, err)
		}
	}
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
		// The timeout leaves a loaded host time to start the shell and print.
		{name: "timeout keeps output", cmd: "echo before; sleep 30", timeout: 2 * time.Second, wantExit: 137, wantStdout: "before\n", timedOut: true},
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
	// 1.5 MB, far more than a pipe and a FIFO hold, written in one go, then a marker; then a file that says
	// every write returned (the output is in the pipes or read), so that a timeout that came first (a host
	// too slow to print 1.5 MB within it) is told apart from output the runtime lost.
	const flood = `head -c 1500000 /dev/zero | tr '\0' x; echo MARKER; echo ERRMARK >&2; touch /workspace/printed-$RUN; `
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
			timeout := e.timeout
			for i := 0; i < runs; i++ {
				spec := shell(ws, flood+e.tail, timeout)
				run := fmt.Sprintf("%s-%d", spec.ID, i)
				spec.Env = []string{"RUN=" + run}
				spec.Limits.OutputBytes = 4 << 20
				out, err := rt.Run(context.Background(), spec)
				if err != nil {
					t.Fatalf("run %d: %v", i, err)
				}
				if _, err := os.Stat(filepath.Join(ws, "printed-"+run)); err != nil && e.timedOut {
					// The timeout struck before the command had printed everything: nothing was tried.
					if timeout >= 20*time.Second {
						t.Fatalf("run %d: the host did not print 1.5 MB within %s", i, timeout)
					}
					t.Logf("run %d: the host did not print 1.5 MB within %s; trying again with %s", i, timeout, 2*timeout)
					timeout *= 2
					i--
					continue
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

// TestTimeoutKillsEverything: daemons, setsid and double-forked orphans die with the call. Each holds a FIFO
// of the workspace open, so the host sees them run and sees them all gone; the call's cgroup is empty.
func TestTimeoutKillsEverything(t *testing.T) {
	stateDir := filepath.Join(ctrtest.ShortTempDir(t), "state")
	rt, _ := ctrtest.NewRuntime(t, containerd.Config{StateDir: stateDir})
	ws := workspace(t)
	alive := newAliveFIFO(t, ws, "alive")
	cmd := `(setsid sh -c 'while true; do echo x; sleep 0.05; done' >/workspace/alive &) ; ` +
		`nohup sh -c 'echo y; sleep 1000' >/workspace/alive 2>&1 & echo started; sleep 1000`
	spec := shell(ws, cmd, 5*time.Second)
	out, err := rt.Run(context.Background(), spec)
	if err != nil || !out.TimedOut {
		t.Fatalf("Run: %v, timedOut %v", err, out.TimedOut)
	}
	alive.assertWritersGone(t, 10*time.Second)
	assertGone(t, rt, stateDir, "toolpool-test", spec.ID)
}

// TestNoLeaks runs many calls, timeouts and failures among them, concurrently, and checks that none leaves a
// container, FIFO, cgroup, process, mount or shim behind: with containers created for each call, and with
// the warm pool (whose calls run in pooled containers, and whose ready containers the runtime's Close
// destroys). Every check is scoped to this test's own daemon and calls: other tests on the host may share
// the containerd namespace.
func TestNoLeaks(t *testing.T) {
	cold := 300 // hundreds of calls, a quarter of them timeouts and a quarter failures
	if ctrtest.Runtime() == containerd.GVisorRuntime {
		cold = 60 // every gVisor call boots a kernel (half a CPU-second): fewer, to keep the gVisor tier in CI's budget
	}
	type leakCase struct {
		name string
		n    int
		pool bool
	}
	cases := []leakCase{{name: "cold", n: cold}}
	// The pool's containers are runc's, whatever the suite's runtime: under another runtime the pooled case
	// would only repeat the runc tier's run (46 s of the gVisor tier's budget).
	if ctrtest.Runtime() == containerd.RuncRuntime {
		cases = append(cases, leakCase{name: "pooled", n: 80, pool: true})
	} else {
		t.Logf("pooled: left to the runc tier (the pool holds %s containers only)", containerd.RuncRuntime)
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { testNoLeaks(t, tc.n, tc.pool) })
	}
}

func testNoLeaks(t *testing.T, n int, pooled bool) {
	stateDir := filepath.Join(ctrtest.ShortTempDir(t), "state")
	cfg := containerd.Config{StateDir: stateDir}
	if pooled {
		cfg.RuntimeName = containerd.RuncRuntime
		cfg.Pool = containerd.PoolConfig{MaxSize: 4, InitBinary: buildProbe(t), InitPath: probePath}
	}
	rt, d := ctrtest.NewRuntime(t, cfg)
	ws := workspace(t)
	cmds := []struct {
		cmd     string
		timeout time.Duration
	}{{"true", 0}, {"exit 7", 0}, {"echo x; sleep 10", 200 * time.Millisecond}, {"/nonexistent", 0}}
	var wg sync.WaitGroup
	sem := make(chan struct{}, 4)
	errs := make(chan error, n)
	ids := make([]string, n)
	var warm atomic.Int64
	for i := range n {
		c := cmds[i%len(cmds)]
		timeout := c.timeout
		if timeout == 0 {
			timeout = 20 * time.Second
		}
		spec := shell(ws, c.cmd, timeout)
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			out, err := rt.Run(context.Background(), spec)
			if err != nil {
				errs <- err
			}
			ids[i] = cmp.Or(out.ContainerID, spec.ID) // a warm call ran in a pooled container of its own id
			if out.Warm {
				warm.Add(1)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("Run: %v", err)
	}
	if pooled {
		if warm.Load() == 0 {
			t.Fatal("no call ran warm: the pooled case proves nothing")
		}
		t.Logf("%d of %d calls ran warm", warm.Load(), n)
		// The ready containers are the pool's until it is drained; Close removes the slots' mount too.
		rt.DrainPool()
	}
	rt.WaitCleanups()
	if got, err := rt.Containers(context.Background()); err != nil || len(got) != 0 {
		t.Fatalf("containers left: %v %v", got, err)
	}
	for _, id := range ids {
		assertGone(t, rt, stateDir, "toolpool-test", id)
	}
	if pooled {
		if err := rt.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}
	// No FIFO anywhere in the runtime's state: each call's FIFOs are in a directory of its own.
	if entries, err := os.ReadDir(filepath.Join(stateDir, "fifo")); err != nil || len(entries) != 0 {
		t.Errorf("FIFO directories left: %d (%v)", len(entries), err)
	}
	filepath.WalkDir(stateDir, func(p string, e os.DirEntry, err error) error {
		if err == nil && e.Type()&os.ModeNamedPipe != 0 {
			t.Errorf("FIFO left: %s", p)
		}
		return nil
	})
	// gVisor's sandbox and gofer processes name their state dir (runsc --root) in their command line.
	waitFor(t, 10*time.Second, "every gVisor sandbox process of this test to exit", func() bool {
		return !processWith(stateDir)
	})
	// gVisor's state holds files per live container, and the network namespace its gofers share, which
	// stays mounted until the Runtime closes.
	left, _ := filepath.Glob(filepath.Join(stateDir, "runsc", "state", "*", "*"))
	if left = slices.DeleteFunc(left, func(p string) bool { return filepath.Base(p) == "null-netns" }); len(left) > 0 {
		t.Errorf("runsc state left behind: %v", left)
	}
	daemonDir := filepath.Dir(d.Address())
	mountinfo, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(mountinfo), "\n") {
		if strings.Contains(line, daemonDir) || strings.Contains(line, stateDir) && !strings.Contains(line, "/null-netns ") {
			t.Errorf("mount left behind: %s", line)
		}
	}
	waitFor(t, 10*time.Second, "every shim of this test's containerd to exit", func() bool {
		return !processWith("containerd-shim", "-address "+d.Address()+" ")
	})
	if err := rt.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if mountinfo, _ = os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(mountinfo), stateDir) {
		t.Errorf("mounts left under %s after Close", stateDir)
	}
}

// TestLeakCheckSeesALiveCall proves that the leak checks look where this host keeps a container's cgroups
// and processes: a running call is seen, by cgroup directory and by process, and is gone once it ends. A
// check that looks in the wrong place (a cgroup v1 path on a v2 host) would see nothing either way.
func TestLeakCheckSeesALiveCall(t *testing.T) {
	stateDir := filepath.Join(ctrtest.ShortTempDir(t), "state")
	rt, _ := ctrtest.NewRuntime(t, containerd.Config{StateDir: stateDir})
	ws := workspace(t)
	spec := shell(ws, "echo started > /workspace/started; exec sleep 600", 60*time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := rt.Run(ctx, spec)
		done <- err
	}()
	waitFor(t, 30*time.Second, "the call to start", func() bool {
		_, err := os.Stat(filepath.Join(ws, "started"))
		return err == nil
	})
	cg, err := ctrtest.ContainerCgroup("toolpool-test", spec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(cg.Existing) == 0 || len(cg.PIDs) == 0 {
		t.Errorf("the running call is not seen: %s", cg)
	}
	if _, err := os.Stat(filepath.Join(stateDir, "fifo", spec.ID)); err != nil {
		t.Errorf("the running call's FIFO directory is not where the check looks: %v", err)
	}
	t.Logf("while it runs: %s", cg)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("Run: %v, want cancelled", err)
	}
	assertGone(t, rt, stateDir, "toolpool-test", spec.ID)
}

// TestWarnings checks that New reports the runc this host runs exactly when the version check finds it
// older than MinRuncVersion.
func TestWarnings(t *testing.T) {
	rt, _ := ctrtest.NewRuntime(t, containerd.Config{})
	v, err := containerd.RuncVersion(context.Background(), "runc")
	if err != nil {
		t.Fatal(err)
	}
	old, err := containerd.RuncTooOld(v)
	if err != nil {
		t.Fatal(err)
	}
	w := rt.Warnings()
	if old != (len(w) == 1 && strings.Contains(w[0], "CVE-2025-31133")) || !old && len(w) != 0 {
		t.Errorf("runc %s (too old: %v): warnings %q", v, old, w)
	}
	t.Logf("runc %s: warnings %q", v, w)
}

// liveBuffer watches Spec.Stdout and Spec.Stderr, and signals each write.
type liveBuffer struct {
	mu    sync.Mutex
	buf   strings.Builder
	wrote chan struct{}
}

func (l *liveBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	l.buf.Write(p)
	l.mu.Unlock()
	select {
	case l.wrote <- struct{}{}:
	default:
	}
	return len(p), nil
}

func (l *liveBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// TestLiveOutput: Spec.Stdout and Spec.Stderr see what the process prints while it still runs (the process waits for a
// file that the test creates only after it saw the first line), and in the end all of both streams, even
// past the output cap.
func TestLiveOutput(t *testing.T) {
	rt, _ := ctrtest.NewRuntime(t, containerd.Config{})
	ws := workspace(t)
	live := &liveBuffer{wrote: make(chan struct{}, 1)}
	spec := shell(ws, `echo first; while [ ! -e /workspace/go-on ]; do sleep 0.05; done; head -c 3000 /dev/zero | tr '\0' y; echo; echo err >&2`, 2*time.Minute)
	spec.Limits.OutputBytes = 1000
	spec.Stdout, spec.Stderr = live, live
	type result struct {
		out sandbox.Outcome
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := rt.Run(context.Background(), spec)
		done <- result{out, err}
	}()
	deadline := time.After(2 * time.Minute)
	for !strings.Contains(live.String(), "first\n") {
		select {
		case <-live.wrote:
		case r := <-done:
			t.Fatalf("the call ended (%v, stdout %q) before Live saw its first line: %q", r.err, r.out.Stdout.String(), live.String())
		case <-deadline:
			t.Fatalf("Live saw %q in 2 minutes, want the first line while the call runs", live.String())
		}
	}
	if err := os.WriteFile(filepath.Join(ws, "go-on"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || r.out.ExitCode != 0 {
		t.Fatalf("run: exit %d, %v", r.out.ExitCode, r.err)
	}
	got := live.String()
	if strings.Count(got, "y") != 3000 || !strings.Contains(got, "err\n") || !r.out.Stdout.Truncated() {
		t.Errorf("Live got %d bytes (%d y, stderr %v); stdout truncated %v; want every byte in Live and stdout capped",
			len(got), strings.Count(got, "y"), strings.Contains(got, "err\n"), r.out.Stdout.Truncated())
	}
}

// TestCrunWhereItRuns: a Runtime told to run crun where crun cannot start containers (crun before 1.9 on a
// host whose cgroup v2 hierarchy holds a controller beside v1's) is refused at New with the reason and the
// fix, not at every call with crun's own "cgroups in hybrid mode not supported"; "auto" then picks runc
// and says why, as it does for a crun older than MinCrunVersion. Where crun can run, an explicit crun runs
// calls, and auto runs them under whichever it picked.
func TestCrunWhereItRuns(t *testing.T) {
	ctrtest.RequirePrograms(t, "crun")
	ctx := context.Background()
	why := containerd.CrunRefusal(ctx, "crun")
	t.Logf("crun refusal on this host: %q", why)
	d := ctrtest.StartDaemon(t)
	newRT := func(binary string) (*containerd.Runtime, error) {
		return containerd.New(ctx, containerd.Config{Address: d.Address(), Namespace: "crun-" + binary, WorkerID: "crun-" + binary,
			StateDir: filepath.Join(ctrtest.ShortTempDir(t), "state"), UID: ctrtest.SandboxUID, GID: ctrtest.SandboxGID,
			RuntimeBinary: binary})
	}
	explicit, err := newRT("crun")
	if why != "" {
		if err == nil || !strings.Contains(err.Error(), why) {
			t.Fatalf("New with crun on a host that refuses it: %v, want the refusal %q", err, why)
		}
	} else {
		if err != nil {
			t.Fatalf("New with crun: %v", err)
		}
		t.Cleanup(func() { explicit.Close() })
		out, err := explicit.Run(ctx, sandbox.Spec{ID: newID("crun"), Argv: []string{"/bin/true"}, WorkspaceDir: workspace(t),
			Limits: sandbox.Limits{Timeout: time.Minute}})
		if err != nil || out.ExitCode != 0 {
			t.Fatalf("Run under crun: %v, exit %d", err, out.ExitCode)
		}
	}
	auto, err := newRT(containerd.RuntimeBinaryAuto)
	if err != nil {
		t.Fatalf("New with auto: %v", err)
	}
	t.Cleanup(func() { auto.Close() })
	old := containerd.CrunTooOld(ctx, "crun")
	w := strings.Join(auto.Warnings(), "\n")
	if (why != "" || old) != strings.Contains(w, "using runc, not crun") {
		t.Fatalf("auto on a host where crun is too old: %v, refusal %q: warnings %q", old, why, w)
	}
	out, err := auto.Run(ctx, sandbox.Spec{ID: newID("auto"), Argv: []string{"/bin/true"}, WorkspaceDir: workspace(t),
		Limits: sandbox.Limits{Timeout: time.Minute}})
	if err != nil || out.ExitCode != 0 {
		t.Fatalf("Run under auto: %v, exit %d", err, out.ExitCode)
	}
}

// cancelOnWrite cancels its call the moment the call's program first prints.
type cancelOnWrite struct {
	once   sync.Once
	cancel context.CancelFunc
}

func (c *cancelOnWrite) Write(p []byte) (int, error) {
	c.once.Do(c.cancel)
	return len(p), nil
}

// TestCancelAsTheProgramStarts: a call cancelled the moment its program prints, which may be before
// containerd has answered the Start that started it, ends killed with what it printed, and as cancelled,
// never as "not started" with its output dropped (the program did run). Cold and warm alike.
func TestCancelAsTheProgramStarts(t *testing.T) {
	ctrtest.Require(t)
	for _, warm := range []bool{false, true} {
		t.Run(fmt.Sprintf("warm=%v", warm), func(t *testing.T) {
			cfg := containerd.Config{}
			if warm {
				if ctrtest.Runtime() != containerd.RuncRuntime {
					t.Skipf("the pool holds %s containers only", containerd.RuncRuntime)
				}
				cfg.Pool = containerd.PoolConfig{MaxSize: 2, InitBinary: buildProbe(t), InitPath: probePath}
			}
			rt, _ := ctrtest.NewRuntime(t, cfg)
			if err := rt.EnsureMountPoint(probePath, false); err != nil {
				t.Fatal(err)
			}
			ws := workspace(t)
			for i := range 8 {
				ctx, cancel := context.WithCancel(context.Background())
				spec := shell(ws, "echo started; sleep 60", time.Minute)
				spec.Stdout = &cancelOnWrite{cancel: cancel}
				if warm {
					spec.Mounts = []sandbox.Mount{{Source: cfg.Pool.InitBinary, Destination: probePath}}
					rt.Prewarm(spec)
					waitCtx, stop := context.WithTimeout(context.Background(), time.Minute)
					if err := rt.WaitWarm(waitCtx, spec); err != nil {
						t.Fatal(err)
					}
					stop()
				}
				began := time.Now()
				out, err := rt.Run(ctx, spec)
				cancel()
				if errors.Is(err, sandbox.ErrNotStarted) || !errors.Is(err, context.Canceled) {
					t.Fatalf("run %d: %v, want the call cancelled after its start", i, err)
				}
				if got := out.Stdout.String(); got != "started\n" || out.Warm != warm {
					t.Fatalf("run %d: stdout %q, warm %v: want what the program printed before it was killed", i, got, out.Warm)
				}
				if took := time.Since(began); took > 30*time.Second {
					t.Fatalf("run %d: took %s: the program was not killed when the call was cancelled", i, took)
				}
			}
		})
	}
}
