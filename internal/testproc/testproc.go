// Package testproc builds toolpool's binaries and runs them for the tests that drive the real processes
// (test/e2e, test/mcp, test/cluster, test/clients): it keeps each process's output, collects its JSON log
// lines, waits for a line, and stops the process cleanly when the test ends; and it says what a test lacks
// (Lack, RequireNode). It is for tests only.
package testproc

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

// Binaries builds pkgs (import paths) with CGO_ENABLED=0 into a temporary directory, once per test
// process (the first call's pkgs), and returns the directory. Call Cleanup from TestMain.
func Binaries(t testing.TB, pkgs ...string) string {
	t.Helper()
	buildOnce.Do(func() {
		if binDir, buildErr = os.MkdirTemp("", "tpbin"); buildErr != nil {
			return
		}
		cmd := exec.Command("go", append([]string{"build", "-trimpath", "-o", binDir + "/"}, pkgs...)...)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %w\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binDir
}

// Stack lists the packages of the binaries a dispatcher and a worker need: the two, and the programs the
// worker mounts into the calls' containers (toolpool-runner, toolpool-init), which it finds beside itself.
var Stack = []string{"github.com/toolpool/toolpool/cmd/dispatcher", "github.com/toolpool/toolpool/cmd/worker",
	"github.com/toolpool/toolpool/cmd/toolpool-runner", "github.com/toolpool/toolpool/cmd/toolpool-init"}

// All builds toolpool's binaries (Stack and the toolpool CLI) and nats-server from the module's
// dependency, once per test process, and returns the directory that holds them.
func All(t testing.TB) string {
	t.Helper()
	return Binaries(t, append(Stack, "github.com/toolpool/toolpool/cmd/toolpool", "github.com/nats-io/nats-server/v2")...)
}

// ProcessesWith lists the pids of the processes whose command line contains s.
func ProcessesWith(s string) []string {
	var pids []string
	paths, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err == nil && strings.Contains(strings.ReplaceAll(string(b), "\x00", " "), s) {
			pids = append(pids, filepath.Base(filepath.Dir(p)))
		}
	}
	return pids
}

// Cleanup removes what Binaries built.
func Cleanup() {
	if binDir != "" {
		os.RemoveAll(binDir)
	}
}

// Proc is a started binary whose output (stderr and stdout, one stream) is kept and whose JSON log lines
// are collected. Safe for concurrent use.
type Proc struct {
	name string
	cmd  *exec.Cmd
	mu   sync.Mutex
	logs []map[string]any
	raw  bytes.Buffer
	done chan struct{} // closed when the output ends

	waitOnce sync.Once
	exited   chan struct{} // closed when the process has exited and been waited for
	waitErr  error
}

// Start starts the binary at path with args and the environment plus env, and stops it (Stop) when the
// test ends; it is StartNamed with the binary's name.
func Start(t testing.TB, path string, env []string, args ...string) *Proc {
	t.Helper()
	return StartNamed(t, filepath.Base(path), path, env, args...)
}

// StartNamed is Start for a process that the test's messages call name (one of several started from the
// same binary). When the test ends it stops the process (Stop); when the test failed, it writes the
// process's whole output to a file in the temporary directory and the last 30 lines to the test's log.
func StartNamed(t testing.TB, name, path string, env []string, args ...string) *Proc {
	t.Helper()
	p := &Proc{name: name, cmd: exec.Command(path, args...), done: make(chan struct{}), exited: make(chan struct{})}
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	p.cmd.Stdout = p.cmd.Stderr
	p.cmd.Env = append(os.Environ(), env...)
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", p.name, err)
	}
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var m map[string]any
			p.mu.Lock()
			p.raw.WriteString(sc.Text() + "\n")
			if json.Unmarshal(sc.Bytes(), &m) == nil {
				p.logs = append(p.logs, m)
			}
			p.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		p.Stop(t)
		if t.Failed() {
			path := filepath.Join(os.TempDir(), fmt.Sprintf("toolpool-%s-%d.log", p.name, p.Pid()))
			_ = os.WriteFile(path, []byte(p.Output()), 0o644)
			t.Logf("--- %s output (tail; all of it in %s):\n%s", p.name, path, p.Tail(30))
		}
	})
	return p
}

// WaitLog returns the first log line whose msg is msg, waiting up to timeout; it fails the test when the
// process exits first or the time runs out.
func (p *Proc) WaitLog(t testing.TB, msg string, timeout time.Duration) map[string]any {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		p.mu.Lock()
		for _, l := range p.logs {
			if l["msg"] == msg {
				p.mu.Unlock()
				return l
			}
		}
		p.mu.Unlock()
		select {
		case <-p.done:
			t.Fatalf("%s exited before logging %q:\n%s", p.name, msg, p.Tail(40))
		case <-time.After(20 * time.Millisecond):
		}
	}
	t.Fatalf("%s did not log %q within %s:\n%s", p.name, msg, timeout, p.Tail(40))
	return nil
}

// Pid is the process's id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Signal sends sig to the process (SIGSTOP and SIGCONT freeze and thaw it).
func (p *Proc) Signal(sig os.Signal) error { return p.cmd.Process.Signal(sig) }

// Done is closed when the process's output ends, which is when it exits.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Exited reports whether the process has been stopped or killed (Stop, Kill9) and waited for.
func (p *Proc) Exited() bool {
	select {
	case <-p.exited:
		return true
	default:
		return false
	}
}

// Output is everything the process wrote to stderr and stdout so far.
func (p *Proc) Output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.raw.String()
}

// Tail is the last n lines of Output.
func (p *Proc) Tail(n int) string {
	lines := strings.Split(strings.TrimRight(p.Output(), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// wait waits for the process once, for every caller, and returns how it exited.
func (p *Proc) wait() error {
	p.waitOnce.Do(func() {
		p.waitErr = p.cmd.Wait()
		close(p.exited)
	})
	return p.waitErr
}

// Kill9 kills the process with SIGKILL, as a crash would, and waits for it.
func (p *Proc) Kill9(t testing.TB) {
	t.Helper()
	_ = p.cmd.Process.Kill()
	_ = p.wait()
	<-p.done
}

// Stop sends SIGCONT (should the test have frozen it) and SIGTERM, and waits up to 60 s for a clean exit;
// a process that exits with an error or does not stop fails the test. Stopping a process that was stopped
// or killed does nothing.
func (p *Proc) Stop(t testing.TB) {
	t.Helper()
	if p.Exited() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGCONT)
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	go p.wait()
	select {
	case <-p.exited:
		if p.waitErr != nil {
			t.Errorf("%s exited with %v:\n%s", p.name, p.waitErr, p.Tail(40))
		}
	case <-time.After(60 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
		t.Errorf("%s did not stop within 60s of SIGTERM", p.name)
	}
}

// Exit is how a process that was expected to stop on its own ended: its whole output, how long it ran, and
// its exit error (nil for status 0).
type Exit struct {
	Output  string
	Elapsed time.Duration
	Err     error
}

// RefusalWithin is how long a command started with bad input may take to refuse it: at once, within a
// second, with one line that names what to fix.
const RefusalWithin = time.Second

// HoldPort listens on a free port of 127.0.0.1 until the test ends and returns its address: an address
// that is in use, for the tests of a start on a taken port.
func HoldPort(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln.Addr().String()
}

// FreeAddr returns an address of 127.0.0.1 whose port was free a moment ago (listened on, then closed):
// for a process that must be told its address before it starts. Another process may take the port in
// between; the process then refuses to start, saying so.
func FreeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// RunToExit runs the binary at path with args and the environment plus env, and waits up to timeout for it
// to exit on its own: for the tests of bad input, which must fail the start at once. A process still
// running at timeout is killed and fails the test.
func RunToExit(t testing.TB, path string, env []string, timeout time.Duration, args ...string) Exit {
	t.Helper()
	cmd := exec.Command(path, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.Env = append(os.Environ(), env...)
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", filepath.Base(path), err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return Exit{Output: out.String(), Elapsed: time.Since(start), Err: err}
	case <-time.After(timeout):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("%s %s still ran %s after it started:\n%s", filepath.Base(path), strings.Join(args, " "), timeout, out.String())
		return Exit{}
	}
}

// CommandLine is the command line of process pid, its arguments separated by spaces ("" once it is gone).
func CommandLine(pid string) string {
	b, _ := os.ReadFile(filepath.Join("/proc", pid, "cmdline"))
	return strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " "))
}

// CheckRefused fails t unless the process refused to start: a non-zero exit within `within` of its start,
// and an output of one line holding every one of want (the bad input and the setting to change).
func (e Exit) CheckRefused(t testing.TB, within time.Duration, want ...string) {
	t.Helper()
	out := strings.TrimSpace(e.Output)
	if e.Err == nil {
		t.Fatalf("exited 0; want a failed start:\n%s", out)
	}
	if e.Elapsed > within {
		t.Errorf("took %s to fail; want at most %s", e.Elapsed.Round(time.Millisecond), within)
	}
	if strings.Contains(out, "\n") {
		t.Errorf("output is %d lines; want one:\n%s", strings.Count(out, "\n")+1, out)
	}
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
}
