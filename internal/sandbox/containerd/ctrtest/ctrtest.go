// Package ctrtest starts a private containerd for tests, the same way a worker does, and finds what a
// container leaves on the host. Under -short every test that needs root or containerd is skipped (that is
// make test-unit). Otherwise a machine without root or containerd skips the test, unless CI=true, which fails
// it, because a green run that skipped the sandbox tests proves nothing.
package ctrtest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/sandbox/containerd"
)

// SandboxUID and SandboxGID run test sandboxes.
const (
	SandboxUID = 65532
	SandboxGID = 65532
)

// Require skips the test under -short; otherwise it fails (CI=true) or skips the test unless this process
// is root and containerd and runc are installed.
func Require(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("this test needs root and containerd: skipped under -short")
	}
	missing := ""
	switch {
	case os.Geteuid() != 0:
		missing = "root"
	case !onPath("containerd"):
		missing = "containerd (apt-get install containerd)"
	case !onPath("runc"):
		missing = "runc (apt-get install runc)"
	case !onPath("containerd-shim-runc-v2"):
		missing = "containerd-shim-runc-v2 (apt-get install containerd)"
	}
	lack(t, missing)
}

// RequirePrograms is Require, and also the programs named (such as ctr, which comes with containerd) on
// PATH: a test checks them up front rather than failing later on an unclear error.
func RequirePrograms(t testing.TB, names ...string) {
	t.Helper()
	Require(t)
	for _, name := range names {
		if !onPath(name) {
			lack(t, name+" on PATH")
			return
		}
	}
}

// lack fails (CI=true) or skips the test for want of missing; it does nothing when missing is empty.
func lack(t testing.TB, missing string) {
	t.Helper()
	if missing == "" {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("this test needs %s, and CI must not skip it", missing)
	}
	t.Skipf("this test needs %s", missing)
}

func onPath(name string) bool {
	_, err := exec.LookPath(name)
	return err == nil
}

// ShortTempDir returns a fresh directory with a short path (unix socket paths are limited to about 100
// bytes, and t.TempDir paths can be long), removed when the test ends.
func ShortTempDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "tp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// StartDaemon starts a private containerd under a fresh directory and stops it when the test ends.
func StartDaemon(t testing.TB) *containerd.Daemon {
	t.Helper()
	return StartDaemonIn(t, filepath.Join(ShortTempDir(t), "ctd"))
}

// StartDaemonIn starts a private containerd in dir (which may hold an earlier daemon's state, to test
// recovery after a crash) and stops it when the test ends.
func StartDaemonIn(t testing.TB, dir string) *containerd.Daemon {
	t.Helper()
	Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d, err := containerd.StartDaemon(ctx, containerd.DaemonConfig{Dir: dir})
	if err != nil {
		t.Fatalf("start containerd: %v", err)
	}
	t.Cleanup(func() { d.Stop(context.Background()) })
	return d
}

// NewRuntime starts a private containerd and returns a Runtime on it, closed when the test ends. cfg's
// Address, StateDir, Namespace, UID, GID and WorkerID are filled in when empty.
func NewRuntime(t testing.TB, cfg containerd.Config) (*containerd.Runtime, *containerd.Daemon) {
	t.Helper()
	d := StartDaemon(t)
	if cfg.Address == "" {
		cfg.Address = d.Address()
	}
	return NewRuntimeOn(t, cfg), d
}

// NewRuntimeOn returns a Runtime on the containerd at cfg.Address, closed when the test ends, with the
// same defaults as NewRuntime. An empty cfg.RuntimeName is taken from TOOLPOOL_TEST_RUNTIME when set, so
// that the sandbox suite can be run against another runtime handler (io.containerd.runsc.v1), and an empty
// cfg.RuntimeBinary from TOOLPOOL_TEST_RUNTIME_BINARY (crun), the OCI runtime the runc shim runs.
func NewRuntimeOn(t testing.TB, cfg containerd.Config) *containerd.Runtime {
	t.Helper()
	if cfg.RuntimeName == "" {
		cfg.RuntimeName = os.Getenv("TOOLPOOL_TEST_RUNTIME")
	}
	if cfg.RuntimeBinary == "" {
		cfg.RuntimeBinary = os.Getenv("TOOLPOOL_TEST_RUNTIME_BINARY")
	}
	if cfg.StateDir == "" {
		cfg.StateDir = filepath.Join(ShortTempDir(t), "state")
	}
	if cfg.Namespace == "" {
		cfg.Namespace = "toolpool-test"
	}
	if cfg.UID == 0 {
		cfg.UID, cfg.GID = SandboxUID, SandboxGID
	}
	if cfg.WorkerID == "" {
		cfg.WorkerID = "test-worker"
	}
	rt, err := containerd.New(context.Background(), cfg)
	if err != nil {
		t.Fatalf("new runtime: %v", err)
	}
	t.Cleanup(func() { rt.Close() })
	return rt
}
