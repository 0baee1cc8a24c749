package containerd_test

import (
	"context"
	"errors"
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
	"github.com/toolpool/toolpool/internal/sandbox/containerd/ctrtest"
)

// requireGVisor fails (CI=true with TOOLPOOL_TEST_RUNTIME=gvisor) or skips the test unless runsc is
// installed.
func requireGVisor(t *testing.T) {
	t.Helper()
	ctrtest.Require(t)
	if _, err := exec.LookPath("runsc"); err != nil {
		if os.Getenv("CI") == "true" && ctrtest.Runtime() == containerd.GVisorRuntime {
			t.Fatal("the gVisor tier needs runsc (make gvisor), and CI must not skip it")
		}
		t.Skip("this test needs gVisor's runsc (make gvisor)")
	}
}

// errorList collects the errors Config.OnCleanup hears, from any goroutine.
type errorList struct {
	mu   sync.Mutex
	errs []error
}

func (l *errorList) observe(_ time.Duration, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.errs = append(l.errs, err)
}

func (l *errorList) err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return errors.Join(l.errs...)
}

// hostRelease is the host kernel's release, which runc calls see and gVisor calls do not.
func hostRelease(t *testing.T) string {
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

// TestRuntimeSelection runs calls under the runtime each Spec names on one Runtime that offers runc and
// gVisor, and refuses a runtime it does not offer before anything is created.
func TestRuntimeSelection(t *testing.T) {
	requireGVisor(t)
	var cleanupErrs errorList
	rt, _ := ctrtest.NewRuntime(t, containerd.Config{RuntimeName: containerd.RuncRuntime, GVisor: &containerd.GVisorConfig{},
		OnCleanup: cleanupErrs.observe})
	defer func() {
		rt.WaitCleanups()
		if err := cleanupErrs.err(); err != nil {
			t.Errorf("removing a container failed: %v", err)
		}
	}()
	ws := workspace(t)
	host := hostRelease(t)
	tests := []struct {
		runtime   string
		underHost bool // sees the host's kernel
	}{
		{runtime: "", underHost: true},
		{runtime: containerd.RuncRuntime, underHost: true},
		{runtime: containerd.GVisorRuntime, underHost: false},
	}
	for _, tt := range tests {
		t.Run("runtime "+tt.runtime, func(t *testing.T) {
			spec := shell(ws, "uname -r; id -u; echo data > f-"+tt.runtime+" && cat f-"+tt.runtime, 30*time.Second)
			spec.Runtime = tt.runtime
			out, err := rt.Run(context.Background(), spec)
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			got := strings.Split(strings.TrimSpace(out.Stdout.String()), "\n")
			if len(got) != 3 || got[1] != "65532" || got[2] != "data" {
				t.Fatalf("stdout %q stderr %q exit %d", out.Stdout.String(), out.Stderr.String(), out.ExitCode)
			}
			if (got[0] == host) != tt.underHost {
				t.Errorf("the call sees kernel %q, the host runs %q: wrong runtime", got[0], host)
			}
		})
	}
	t.Run("a runtime the worker lacks is refused, never replaced", func(t *testing.T) {
		spec := shell(ws, "touch /workspace/ran", 10*time.Second)
		spec.Runtime = "kata"
		_, err := rt.Run(context.Background(), spec)
		if !errors.Is(err, sandbox.ErrNoRuntime) || errors.Is(err, sandbox.ErrNotStarted) ||
			!strings.Contains(err.Error(), `runtime "kata"`) || !strings.Contains(err.Error(), "gvisor, runc") {
			t.Errorf("err %v; want ErrNoRuntime naming kata and what the worker offers", err)
		}
		if _, err := os.Stat(filepath.Join(ws, "ran")); err == nil {
			t.Error("the call ran")
		}
		rt.WaitCleanups()
		if ids, _ := rt.Containers(context.Background()); len(ids) != 0 {
			t.Errorf("containers left: %v", ids)
		}
	})
}

// TestGVisorMissing: a Runtime configured for gVisor without runsc does not start.
func TestGVisorMissing(t *testing.T) {
	ctrtest.Require(t)
	d := ctrtest.StartDaemon(t)
	_, err := containerd.New(context.Background(), containerd.Config{
		Address: d.Address(), Namespace: "toolpool-test", StateDir: filepath.Join(ctrtest.ShortTempDir(t), "state"),
		UID: ctrtest.SandboxUID, GID: ctrtest.SandboxGID, GVisor: &containerd.GVisorConfig{Runsc: "/nonexistent/runsc"},
	})
	if err == nil || !strings.Contains(err.Error(), "scripts/gvisor.sh") {
		t.Errorf("err %v; want a refusal that says how to install gVisor", err)
	}
}
