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
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/sandbox"
	"github.com/toolpool/toolpool/internal/sandbox/containerd"
	"github.com/toolpool/toolpool/internal/testproc"
)

// SandboxUID and SandboxGID run test sandboxes.
const (
	SandboxUID = 65532
	SandboxGID = 65532
)

// Runtime is the sandbox runtime the tests run under, from TOOLPOOL_TEST_RUNTIME: containerd.RuncRuntime
// (the default), containerd.GVisorRuntime, or any other containerd runtime handler (io.containerd.kata.v2),
// returned as it is.
func Runtime() string {
	switch v := os.Getenv("TOOLPOOL_TEST_RUNTIME"); v {
	case "", containerd.RuncHandler:
		return containerd.RuncRuntime
	case "runsc":
		return containerd.GVisorRuntime
	default:
		return v
	}
}

// Require skips the test under -short; otherwise it fails (CI=true) or skips the test unless this process
// is root and containerd and runc are installed, and, when the tests run under gVisor, runsc.
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
	case Runtime() == containerd.GVisorRuntime && !onPath("runsc"):
		missing = "gVisor's runsc (make gvisor)"
	}
	testproc.Lack(t, missing)
}

// RequirePrograms is Require, and also the programs named (such as ctr, which comes with containerd) on
// PATH: a test checks them up front rather than failing later on an unclear error.
func RequirePrograms(t testing.TB, names ...string) {
	t.Helper()
	Require(t)
	for _, name := range names {
		if !onPath(name) {
			testproc.Lack(t, name+" on PATH")
			return
		}
	}
}

// RequireGVisor is Require, and gVisor's runsc on PATH. Like every program a test needs, a missing runsc
// fails the test under CI=true and skips it elsewhere: make test builds gVisor before its tests, so only a
// developer's run that opted out (TOOLPOOL_GVISOR=0 make test, refused under CI=true) skips these tests.
func RequireGVisor(t testing.TB) {
	t.Helper()
	Require(t)
	if !onPath("runsc") {
		testproc.Lack(t, "gVisor's runsc (make gvisor)")
	}
}

// HostRelease is the host kernel's release (uname -r), which a call under runc sees and one under gVisor
// does not: the tests tell the runtime a call ran under by it.
func HostRelease(t testing.TB) string {
	t.Helper()
	var u syscall.Utsname
	if err := syscall.Uname(&u); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, c := range u.Release {
		if c == 0 {
			break
		}
		b.WriteByte(byte(c))
	}
	return b.String()
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

// ChownToSandbox gives the tree at dir to the sandbox user (SandboxUID, SandboxGID), as the worker's
// workspaces belong to it, without following a symlink.
func ChownToSandbox(t testing.TB, dir string) {
	t.Helper()
	if err := filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, SandboxUID, SandboxGID)
	}); err != nil {
		t.Fatal(err)
	}
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
// same defaults as NewRuntime. An empty cfg.RuntimeName is Runtime, so that the sandbox suite runs under
// the runtime TOOLPOOL_TEST_RUNTIME names; gVisor (runsc on PATH) is offered whenever it is the one. An
// empty cfg.RuntimeBinary is TOOLPOOL_TEST_RUNTIME_BINARY (crun), the OCI runtime the runc shim runs.
// Unless cfg.OnCleanup is set, a container whose removal fails fails the test when it ends: a container
// left behind is a leak.
func NewRuntimeOn(t testing.TB, cfg containerd.Config) *containerd.Runtime {
	t.Helper()
	if cfg.RuntimeName == "" {
		cfg.RuntimeName = Runtime()
	}
	if cfg.RuntimeName == containerd.GVisorRuntime && cfg.GVisor == nil {
		cfg.GVisor = &containerd.GVisorConfig{}
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
	var removal struct {
		sync.Mutex
		errs []error
	}
	if cfg.OnCleanup == nil {
		cfg.OnCleanup = func(_ time.Duration, _ []sandbox.Step, err error) {
			if err != nil {
				removal.Lock()
				removal.errs = append(removal.errs, err)
				removal.Unlock()
			}
		}
		t.Cleanup(func() { // runs after Close, which waits for every removal
			removal.Lock()
			defer removal.Unlock()
			for _, err := range removal.errs {
				t.Errorf("remove a finished call's container: %v", err)
			}
		})
	}
	rt, err := containerd.New(context.Background(), cfg)
	if err != nil {
		t.Fatalf("new runtime: %v", err)
	}
	t.Cleanup(func() { rt.Close() })
	return rt
}
