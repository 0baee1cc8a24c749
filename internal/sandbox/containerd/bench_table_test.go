package containerd_test

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/sandbox"
	"github.com/toolpool/toolpool/internal/sandbox/containerd"
	"github.com/toolpool/toolpool/internal/sandbox/containerd/ctrtest"
)

// BenchmarkStartTable is the measurement table in one run: `true` through runc alone (`runc run`,
// no containerd: the OCI runtime's own floor), through plain containerd (no hardening), through
// Runtime.Run cold under runc and under crun, and warm (from the pool, under the
// runtime's default OCI runtime, which TOOLPOOL_TEST_RUNTIME_BINARY sets, and under crun), each at
// concurrency 1, 4 and 16. At concurrency 1 it also reports the p50 of each step of Run
// (sandbox.Outcome.Steps; a warm row mixes the steps of its cold calls in). It reports p50/p95 of one call (Run, or the plain client's create to delete) and calls/s over the
// whole batch, removal included; warm reports the share of calls that found a ready container and the
// memory the pool held at the end. Every runtime shares one containerd, so the rows compete alike for the
// host.
func BenchmarkStartTable(b *testing.B) {
	d := ctrtest.StartDaemon(b)
	probe := buildProbe(b)
	ws := workspace(b)
	newRT := func(name string, cfg containerd.Config) *containerd.Runtime {
		cfg.Address, cfg.Namespace, cfg.WorkerID = d.Address(), "bench-"+name, "bench-"+name
		cfg.StateDir = filepath.Join(ctrtest.ShortTempDir(b), "state")
		rt := ctrtest.NewRuntimeOn(b, cfg)
		if err := rt.EnsureMountPoint(probePath, false); err != nil {
			b.Fatal(err)
		}
		return rt
	}
	spec := func() sandbox.Spec {
		return sandbox.Spec{ID: newID("bench"), Argv: []string{"/bin/true"}, WorkspaceDir: ws,
			Mounts: []sandbox.Mount{{Source: probe, Destination: probePath}}, Limits: sandbox.Limits{Timeout: time.Minute}}
	}
	type mode struct {
		name   string
		direct func() error // runs one call without a Runtime (rt nil)
		rt     *containerd.Runtime
		warm   bool // rt has a pool
	}
	root := hostViewRoot(b, d)
	modes := []mode{{name: "runc-alone", direct: runcAloneRunner(b, root)}, {name: "plain", direct: plainRunner(b, d, root)},
		{name: "cold-runc", rt: newRT("runc", containerd.Config{RuntimeBinary: "runc"})}}
	crun := ""
	if _, err := exec.LookPath("crun"); err != nil {
		b.Log("crun is not installed: no crun rows (scripts/deps.sh installs it)")
	} else if why := containerd.CrunRefusal(context.Background(), "crun"); why != "" {
		b.Logf("no crun rows: %s", why)
	} else {
		crun = "crun"
		modes = append(modes, mode{name: "cold-crun", rt: newRT("crun", containerd.Config{RuntimeBinary: crun})})
	}
	pool := containerd.PoolConfig{MaxSize: 16, Fillers: 4, InitBinary: probe, InitPath: probePath}
	// No row with ShimGroups: containerd 1.6's runc shim loses a race when a group's last container goes
	// while the next one starts its task ("remove pre-existing socket", "dial unix ...: no such file"),
	// which failed calls in this benchmark (docs/deploy.md).
	modes = append(modes, mode{name: "warm", rt: newRT("warm", containerd.Config{Pool: pool}), warm: true})
	if crun != "" {
		modes = append(modes, mode{name: "warm-crun", rt: newRT("warm-crun", containerd.Config{Pool: pool, RuntimeBinary: crun}), warm: true})
	}
	for _, m := range modes {
		for _, conc := range []int{1, 4, 16} {
			b.Run(fmt.Sprintf("%s/c%d", m.name, conc), func(b *testing.B) {
				// one runs one call; it may run on any goroutine, so it reports a failure with Errorf.
				var mu sync.Mutex
				steps := map[string][]float64{}
				one := func() (time.Duration, bool) {
					began := time.Now()
					if m.direct != nil {
						if err := m.direct(); err != nil {
							b.Errorf("%s: %v", m.name, err)
						}
						return time.Since(began), false
					}
					out, err := m.rt.Run(context.Background(), spec())
					if err != nil || out.ExitCode != 0 {
						b.Errorf("Run: %v, exit %d", err, out.ExitCode)
					}
					took := time.Since(began)
					mu.Lock()
					for _, s := range out.Steps {
						steps[s.Name] = append(steps[s.Name], float64(s.Took.Microseconds())/1000)
					}
					mu.Unlock()
					return took, out.Warm
				}
				if m.warm {
					ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
					defer cancel()
					for range conc {
						m.rt.Prewarm(spec())
					}
					if err := m.rt.WaitWarm(ctx, spec()); err != nil {
						b.Fatal(err)
					}
				} else {
					one() // page in the binaries
				}
				mu.Lock()
				clear(steps)
				mu.Unlock()
				var ms []float64
				warmCalls := 0
				next := make(chan struct{})
				var wg sync.WaitGroup
				b.ResetTimer()
				began := time.Now()
				for range conc {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for range next {
							took, w := one()
							mu.Lock()
							ms = append(ms, float64(took.Microseconds())/1000)
							if w {
								warmCalls++
							}
							mu.Unlock()
						}
					}()
				}
				for range b.N {
					next <- struct{}{}
				}
				close(next)
				wg.Wait()
				if m.rt != nil {
					m.rt.WaitCleanups()
				}
				elapsed := time.Since(began)
				b.StopTimer()
				reportPercentiles(b, ms)
				b.ReportMetric(float64(b.N)/elapsed.Seconds(), "calls/s")
				if m.warm {
					m.rt.MeasurePool()
					b.ReportMetric(100*float64(warmCalls)/float64(b.N), "warm-%")
					b.ReportMetric(float64(m.rt.PoolStats().MemoryBytes)/(1<<20), "pool-MiB")
					b.ReportMetric(float64(m.rt.PoolStats().Ready), "pool-ready")
				}
				if conc == 1 {
					// Where a lone call's time goes: the p50 of each step of Run (sandbox.Outcome.Steps).
					for name, took := range steps {
						b.ReportMetric(percentile(took, 50), name+"-p50-ms")
					}
				}
			})
		}
	}
}
