package containerd_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	ctdclient "github.com/containerd/containerd"
	"github.com/containerd/containerd/cio"
	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/containerd/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/toolpool/toolpool/internal/sandbox"
	"github.com/toolpool/toolpool/internal/sandbox/containerd"
	"github.com/toolpool/toolpool/internal/sandbox/containerd/ctrtest"
)

// BenchmarkSandbox runs `true` through Runtime.Run with every hardened default (and the workspace quota's
// measurement), one call after another, and reports the p50/p95 of a whole call: create, start, wait and
// cleanup. Compare with BenchmarkPlainContainerd in the same run.
func BenchmarkSandbox(b *testing.B) {
	rt, _ := ctrtest.NewRuntime(b, containerd.Config{})
	ws := workspace(b)
	run := func() {
		out, err := rt.Run(context.Background(), sandbox.Spec{ID: newID("bench"), Argv: []string{"/bin/true"}, WorkspaceDir: ws,
			Limits: sandbox.Limits{Timeout: 30 * time.Second}})
		if err != nil || out.ExitCode != 0 {
			b.Fatalf("Run: %v, exit %d", err, out.ExitCode)
		}
		rt.WaitCleanups() // the whole cycle, removal included, as the plain client does it
	}
	run() // warm up: page in runc, the shim and the binaries
	measureCalls(b, run)
}

// measureCalls runs run b.N times, one after another, and reports the p50/p95 of one run.
func measureCalls(b *testing.B, run func()) {
	var ms []float64
	b.ResetTimer()
	for range b.N {
		began := time.Now()
		run()
		ms = append(ms, float64(time.Since(began).Microseconds())/1000)
	}
	b.StopTimer()
	reportPercentiles(b, ms)
}

// BenchmarkPlainContainerd does what BenchmarkSandbox does with the plain containerd client and none of
// the hardening: a container with containerd's default spec on the same host-view root (bind-mounting /usr
// so that /bin/true exists), a task with no IO, Wait, Start, the exit, and Delete with the container.
func BenchmarkPlainContainerd(b *testing.B) {
	d := ctrtest.StartDaemon(b)
	run := plainRunner(b, d, hostViewRoot(b, d))
	if err := run(); err != nil {
		b.Fatal(err)
	}
	var ms []float64
	b.ResetTimer()
	for range b.N {
		began := time.Now()
		if err := run(); err != nil {
			b.Fatal(err)
		}
		ms = append(ms, float64(time.Since(began).Microseconds())/1000)
	}
	b.StopTimer()
	reportPercentiles(b, ms)
}

// hostViewRoot returns the host-view root a call's container gets, prepared by a Runtime on d.
func hostViewRoot(b *testing.B, d *containerd.Daemon) string {
	stateDir := filepath.Join(ctrtest.ShortTempDir(b), "state")
	ctrtest.NewRuntimeOn(b, containerd.Config{Address: d.Address(), StateDir: stateDir, Namespace: "toolpool-bench-root"})
	roots, _ := filepath.Glob(filepath.Join(stateDir, "rootfs.*"))
	if len(roots) != 1 {
		b.Fatalf("host-view roots: %v", roots)
	}
	return roots[0]
}

// plainRunner returns a func that runs one `true` through the plain containerd client on d, on root (from
// hostViewRoot), as BenchmarkPlainContainerd describes. It is safe for concurrent use.
func plainRunner(b *testing.B, d *containerd.Daemon, root string) func() error {
	client, err := ctdclient.New(d.Address())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { client.Close() })
	ctx := namespaces.WithNamespace(context.Background(), "toolpool-bench-plain")
	return func() error {
		id := newID("plain")
		c, err := client.NewContainer(ctx, id, ctdclient.WithNewSpec(
			oci.WithRootFSPath(root),
			oci.WithProcessArgs("/bin/true"),
			oci.WithMounts([]specs.Mount{{Type: "bind", Source: "/usr", Destination: "/usr", Options: []string{"rbind", "ro"}}}),
		))
		if err != nil {
			return err
		}
		task, err := c.NewTask(ctx, cio.NullIO)
		if err != nil {
			return err
		}
		exit, err := task.Wait(ctx)
		if err != nil {
			return err
		}
		if err := task.Start(ctx); err != nil {
			return err
		}
		if st := <-exit; st.ExitCode() != 0 {
			return fmt.Errorf("exit %d", st.ExitCode())
		}
		if _, err := task.Delete(ctx); err != nil {
			return err
		}
		return c.Delete(ctx)
	}
}

// runcAloneRunner returns a func that runs one `true` with `runc run` and no containerd: runc's default
// spec (its namespaces, masked paths and capabilities; no seccomp) on root (from hostViewRoot), /usr
// bind-mounted read-only. It is the floor of the OCI runtime itself, which containerd and its shim add
// to (BenchmarkStartTable's runc-alone row). It is safe for concurrent use.
func runcAloneRunner(b *testing.B, root string) func() error {
	dir := ctrtest.ShortTempDir(b)
	bundle, state := filepath.Join(dir, "bundle"), filepath.Join(dir, "runc")
	for _, p := range []string{bundle, state} {
		if err := os.MkdirAll(p, 0o700); err != nil {
			b.Fatal(err)
		}
	}
	if out, err := exec.Command("runc", "spec", "--bundle", bundle).CombinedOutput(); err != nil {
		b.Fatalf("runc spec: %v: %s", err, out)
	}
	raw, err := os.ReadFile(filepath.Join(bundle, "config.json"))
	if err != nil {
		b.Fatal(err)
	}
	var spec specs.Spec
	if err := json.Unmarshal(raw, &spec); err != nil {
		b.Fatal(err)
	}
	spec.Root = &specs.Root{Path: root, Readonly: true}
	spec.Process.Args, spec.Process.Terminal = []string{"/bin/true"}, false
	spec.Mounts = append(spec.Mounts, specs.Mount{Type: "bind", Source: "/usr", Destination: "/usr", Options: []string{"rbind", "ro"}})
	if raw, err = json.Marshal(&spec); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), raw, 0o600); err != nil {
		b.Fatal(err)
	}
	return func() error {
		if out, err := exec.Command("runc", "--root", state, "run", "--bundle", bundle, newID("runc")).CombinedOutput(); err != nil {
			return fmt.Errorf("runc run: %w: %s", err, out)
		}
		return nil
	}
}

func reportPercentiles(b *testing.B, ms []float64) {
	b.ReportMetric(percentile(ms, 50), "p50-ms")
	b.ReportMetric(percentile(ms, 95), "p95-ms")
}

// percentile returns the p-th percentile (nearest rank) of xs.
func percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(float64(len(s))*p/100+0.5) - 1
	return s[max(0, min(i, len(s)-1))]
}
