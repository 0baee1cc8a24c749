package containerd_test

import (
	"context"
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
