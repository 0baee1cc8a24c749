// Package testproc builds toolpool's binaries and runs them for the tests that drive the real processes
// (test/e2e, test/mcp): it collects each process's JSON log lines, waits for a line, and stops the process
// cleanly when the test ends. It is for tests only.
package testproc

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
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

// All builds toolpool's three binaries (dispatcher, worker, toolpool) and nats-server from the module's
// dependency, once per test process, and returns the directory that holds them.
func All(t testing.TB) string {
	t.Helper()
	return Binaries(t, "github.com/toolpool/toolpool/cmd/dispatcher", "github.com/toolpool/toolpool/cmd/worker",
		"github.com/toolpool/toolpool/cmd/toolpool", "github.com/nats-io/nats-server/v2")
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

// Proc is a started binary whose JSON log lines (on stderr) are collected. Safe for concurrent use.
type Proc struct {
	name string
	cmd  *exec.Cmd
	mu   sync.Mutex
	logs []map[string]any
	raw  bytes.Buffer
	done chan struct{}
}

// Start starts the binary at path with args and the environment plus env, and stops it (Stop) when the
// test ends.
func Start(t testing.TB, path string, env []string, args ...string) *Proc {
	t.Helper()
	p := &Proc{name: filepath.Base(path), cmd: exec.Command(path, args...), done: make(chan struct{})}
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
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
	t.Cleanup(func() { p.Stop(t) })
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
			t.Fatalf("%s exited before logging %q:\n%s", p.name, msg, p.Output())
		case <-time.After(20 * time.Millisecond):
		}
	}
	t.Fatalf("%s did not log %q within %s:\n%s", p.name, msg, timeout, p.Output())
	return nil
}

// Pid is the process's id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Output is everything the process wrote to stderr so far.
func (p *Proc) Output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.raw.String()
}

// Kill9 kills the process with SIGKILL, as a crash would, and waits for it.
func (p *Proc) Kill9(t testing.TB) {
	t.Helper()
	_ = p.cmd.Process.Kill()
	_ = p.cmd.Wait()
	<-p.done
}

// Stop sends SIGTERM and waits up to 60 s for a clean exit; a process that exits with an error or does
// not stop fails the test. Stopping a stopped process does nothing.
func (p *Proc) Stop(t testing.TB) {
	if p.cmd.ProcessState != nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	waited := make(chan error, 1)
	go func() { waited <- p.cmd.Wait() }()
	select {
	case err := <-waited:
		if err != nil {
			t.Errorf("%s exited with %v:\n%s", p.name, err, p.Output())
		}
	case <-time.After(60 * time.Second):
		_ = p.cmd.Process.Kill()
		<-waited
		t.Errorf("%s did not stop within 60s of SIGTERM", p.name)
	}
}
