package containerd_test

import (
	"context"
	"sync"
	"testing"
	"time"

	ctdclient "github.com/containerd/containerd"
	"github.com/containerd/containerd/images"
	"github.com/containerd/containerd/namespaces"

	"github.com/toolpool/toolpool/internal/sandbox"
	"github.com/toolpool/toolpool/internal/sandbox/containerd"
	"github.com/toolpool/toolpool/internal/sandbox/containerd/ctrtest"
)

// BenchmarkImageCall runs `sh -c :` cold (no pool), one call after another, removal included, on the host
// view and on a pulled image already in the store, and reports each one's p50/p95: what an image root
// costs a call once it is cached.
func BenchmarkImageCall(b *testing.B) {
	reg := ctrtest.StartRegistry(b)
	ref := ctrtest.PushShellImage(b, reg, "bench/shell:1")
	rt, _ := ctrtest.NewRuntime(b, containerd.Config{Pull: containerd.PullConfig{Registries: []containerd.RegistryConfig{{Host: reg.Host, PlainHTTP: true}}}})
	ws := workspace(b)
	for _, root := range []struct{ name, image string }{{"host", ""}, {"image", ref}} {
		b.Run(root.name, func(b *testing.B) {
			run := func() {
				out, err := rt.Run(context.Background(), sandbox.Spec{ID: newID("bench"), Image: root.image, Argv: []string{"/bin/sh", "-c", ":"},
					WorkspaceDir: ws, Limits: sandbox.Limits{Timeout: 30 * time.Second}})
				if err != nil || out.ExitCode != 0 {
					b.Fatalf("Run: %v, exit %d", err, out.ExitCode)
				}
				rt.WaitCleanups()
			}
			run() // the image's pull, and paging in runc and the shim
			measureCalls(b, run)
		})
	}
}

// BenchmarkImageFirstCall measures a call on an image the worker lacks, pull and unpack included, for the
// shell image (5.4 MiB) and the python image (24.7 MiB), both uncompressed from a loopback registry;
// the image is deleted (synchronously, with its content) before each call.
func BenchmarkImageFirstCall(b *testing.B) {
	reg := ctrtest.StartRegistry(b)
	rt, d := ctrtest.NewRuntime(b, containerd.Config{Pull: containerd.PullConfig{Registries: []containerd.RegistryConfig{{Host: reg.Host, PlainHTTP: true}}}})
	client, err := ctdclient.New(d.Address())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { client.Close() })
	ws := workspace(b)
	for _, img := range []struct {
		name string
		ref  string
	}{{"shell", ctrtest.PushShellImage(b, reg, "bench/shell:1")}, {"python", ctrtest.PushPythonImage(b, reg, "bench/python:1")}} {
		b.Run(img.name, func(b *testing.B) {
			name, err := containerd.ParseImageRef(img.ref)
			if err != nil {
				b.Fatal(err)
			}
			ctx := namespaces.WithNamespace(context.Background(), "toolpool-test")
			var ms []float64
			for range b.N {
				began := time.Now()
				out, err := rt.Run(ctx, sandbox.Spec{ID: newID("bench"), Image: img.ref, Argv: []string{"/bin/sh", "-c", ":"},
					WorkspaceDir: ws, Limits: sandbox.Limits{Timeout: 30 * time.Second}})
				if err != nil || out.ExitCode != 0 {
					b.Fatalf("Run: %v, exit %d", err, out.ExitCode)
				}
				ms = append(ms, float64(time.Since(began).Microseconds())/1000)
				b.StopTimer()
				rt.WaitCleanups()
				if err := client.ImageService().Delete(ctx, name, images.SynchronousDelete()); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			reportPercentiles(b, ms)
		})
	}
}

// BenchmarkWarmImageCall is the warm pool on a pulled image against the host view, in one run: `sh -c :`
// (the probe mounted as the pool's init) on each root, paced (each call waits, untimed, until the pool
// has a container ready for it: an agent's pace, a model's turn between two calls) with its p50/p95, and
// back to back at concurrency 8 with its calls/s; both with the share of calls that ran warm. The goals
// (issue 26): a warm call on the image within 1.2 times the host view's p50, and calls/s at concurrency 8
// within 10% of the host view's.
func BenchmarkWarmImageCall(b *testing.B) {
	reg := ctrtest.StartRegistry(b)
	ref := ctrtest.PushShellImage(b, reg, "bench/shell:1")
	probe := buildProbe(b)
	rt, _ := ctrtest.NewRuntime(b, containerd.Config{
		Pull: containerd.PullConfig{Registries: []containerd.RegistryConfig{{Host: reg.Host, PlainHTTP: true}}},
		Pool: containerd.PoolConfig{MaxSize: 16, InitBinary: probe, InitPath: probePath}})
	ws := workspace(b)
	for _, root := range []struct{ name, image string }{{"host", ""}, {"image", ref}} {
		spec := func() sandbox.Spec {
			return sandbox.Spec{ID: newID("bench"), Image: root.image, Argv: []string{"/bin/sh", "-c", ":"}, WorkspaceDir: ws,
				Mounts: []sandbox.Mount{{Source: probe, Destination: probePath}}, Limits: sandbox.Limits{Timeout: time.Minute}}
		}
		var mu sync.Mutex
		var ms []float64
		steps := map[string][]float64{}
		warm := 0
		one := func() {
			began := time.Now()
			out, err := rt.Run(context.Background(), spec())
			if err != nil || out.ExitCode != 0 {
				b.Errorf("Run: %v, exit %d", err, out.ExitCode)
			}
			mu.Lock()
			ms = append(ms, float64(time.Since(began).Microseconds())/1000)
			if out.Warm {
				warm++
			}
			for _, s := range out.Steps {
				steps[s.Name] = append(steps[s.Name], float64(s.Took.Microseconds())/1000)
			}
			mu.Unlock()
		}
		waitWarm := func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			if err := rt.WaitWarm(ctx, spec()); err != nil {
				b.Fatal(err)
			}
		}
		report := func(b *testing.B) {
			reportPercentiles(b, ms)
			b.ReportMetric(float64(warm)/float64(max(len(ms), 1)), "warm-share")
			for name, took := range steps {
				b.ReportMetric(percentile(took, 50), name+"-p50-ms")
			}
			ms, warm = nil, 0
			clear(steps)
		}
		one() // the image's pull, and paging in runc and the shim
		ms, warm = nil, 0
		clear(steps)
		b.Run(root.name+"/paced", func(b *testing.B) {
			for range b.N {
				b.StopTimer()
				waitWarm()
				b.StartTimer()
				one()
			}
			b.StopTimer()
			report(b)
		})
		b.Run(root.name+"/c8", func(b *testing.B) {
			for range 8 {
				rt.Prewarm(spec())
			}
			waitWarm()
			ms, warm = nil, 0
			clear(steps)
			next := make(chan struct{})
			var wg sync.WaitGroup
			b.ResetTimer()
			began := time.Now()
			for range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range next {
						one()
					}
				}()
			}
			for range b.N {
				next <- struct{}{}
			}
			close(next)
			wg.Wait()
			b.StopTimer()
			b.ReportMetric(float64(b.N)/time.Since(began).Seconds(), "calls/s")
			report(b)
		})
		rt.WaitCleanups()
	}
}
