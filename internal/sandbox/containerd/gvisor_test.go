package containerd_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/sandbox"
	"github.com/toolpool/toolpool/internal/sandbox/containerd"
	"github.com/toolpool/toolpool/internal/sandbox/containerd/ctrtest"
)

// TestRuntimeSelection runs calls under the runtime each Spec names on one Runtime that offers runc and
// gVisor, and refuses a runtime it does not offer before anything is created. With a warm pool, runc's calls
// run warm and gVisor's run cold (ColdRuntime), exactly as without one: the pool holds runc containers only.
func TestRuntimeSelection(t *testing.T) {
	ctrtest.RequireGVisor(t)
	for _, pooled := range []bool{false, true} {
		name := "cold"
		if pooled {
			name = "pooled"
		}
		t.Run(name, func(t *testing.T) { testRuntimeSelection(t, pooled) })
	}
}

func testRuntimeSelection(t *testing.T, pooled bool) {
	cfg := containerd.Config{RuntimeName: containerd.RuncRuntime, GVisor: &containerd.GVisorConfig{}}
	if pooled {
		cfg.Pool = containerd.PoolConfig{MaxSize: 2, InitBinary: buildProbe(t), InitPath: probePath}
	}
	// A failed removal fails the test (ctrtest.NewRuntimeOn).
	rt, _ := ctrtest.NewRuntime(t, cfg)
	ws := workspace(t)
	host := ctrtest.HostRelease(t)
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
			if pooled && tt.underHost {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				err := rt.WaitWarm(ctx, spec)
				cancel()
				if err != nil {
					t.Fatal(err)
				}
			}
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
			switch {
			case !pooled:
			case tt.underHost && !out.Warm:
				t.Errorf("a runc call ran cold (%q) although a container was ready", out.ColdReason)
			case !tt.underHost && (out.Warm || out.ColdReason != containerd.ColdRuntime):
				t.Errorf("a gVisor call: warm %v, cold reason %q; want cold, %q", out.Warm, out.ColdReason, containerd.ColdRuntime)
			}
		})
	}
	t.Run("a runtime the worker lacks is refused, never replaced", func(t *testing.T) {
		spec := shell(ws, "touch /workspace/ran", 10*time.Second)
		spec.Runtime = "kata"
		out, err := rt.Run(context.Background(), spec)
		if !errors.Is(err, sandbox.ErrNoRuntime) || errors.Is(err, sandbox.ErrNotStarted) ||
			!strings.Contains(err.Error(), `runtime "kata"`) || !strings.Contains(err.Error(), "gvisor, runc") {
			t.Errorf("err %v; want ErrNoRuntime naming kata and what the worker offers", err)
		}
		if out.Warm || out.ColdReason != "" {
			t.Errorf("refused call: warm %v, cold reason %q", out.Warm, out.ColdReason)
		}
		if _, err := os.Stat(filepath.Join(ws, "ran")); err == nil {
			t.Error("the call ran")
		}
		rt.WaitCleanups()
		ids, _ := rt.Containers(context.Background())
		if !pooled && len(ids) != 0 || slices.Contains(ids, spec.ID) {
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

// BenchmarkRuntimes runs `true` under runc and under gVisor on one Runtime, alternating, so that both see
// the same machine and the same load, and reports the p50/p95 of each whole call (create, start, wait and
// cleanup, as BenchmarkSandbox) and of its start alone (Outcome.SandboxTime): gVisor's cost per call.
func BenchmarkRuntimes(b *testing.B) {
	ctrtest.RequireGVisor(b)
	rt, _ := ctrtest.NewRuntime(b, containerd.Config{RuntimeName: containerd.RuncRuntime, GVisor: &containerd.GVisorConfig{}})
	ws := workspace(b)
	runtimes := []string{containerd.RuncRuntime, containerd.GVisorRuntime}
	total := map[string][]float64{}
	start := map[string][]float64{}
	run := func(runtime string) {
		began := time.Now()
		out, err := rt.Run(context.Background(), sandbox.Spec{ID: newID("bench"), Argv: []string{"/bin/true"}, WorkspaceDir: ws,
			Runtime: runtime, Limits: sandbox.Limits{Timeout: 60 * time.Second}})
		if err != nil || out.ExitCode != 0 {
			b.Fatalf("Run under %s: %v, exit %d", runtime, err, out.ExitCode)
		}
		rt.WaitCleanups()
		total[runtime] = append(total[runtime], float64(time.Since(began).Microseconds())/1000)
		start[runtime] = append(start[runtime], float64(out.SandboxTime.Microseconds())/1000)
	}
	for _, r := range runtimes {
		run(r) // warm up: page in runc, runsc, the shim and the binaries
	}
	clear(total)
	clear(start)
	b.ResetTimer()
	for range b.N {
		for _, r := range runtimes {
			run(r)
		}
	}
	b.StopTimer()
	for _, r := range runtimes {
		b.ReportMetric(percentile(total[r], 50), r+"-p50-ms")
		b.ReportMetric(percentile(total[r], 95), r+"-p95-ms")
		b.ReportMetric(percentile(start[r], 50), r+"-start-p50-ms")
		b.ReportMetric(percentile(start[r], 95), r+"-start-p95-ms")
	}
}
