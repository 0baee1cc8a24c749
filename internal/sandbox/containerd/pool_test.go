package containerd_test

import (
	"context"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/sandbox"
	"github.com/toolpool/toolpool/internal/sandbox/containerd"
	"github.com/toolpool/toolpool/internal/sandbox/containerd/ctrtest"
)

// newPooledRuntime returns a runtime with a warm pool whose init is the probe, mounted at probePath.
func newPooledRuntime(t *testing.T, cfg containerd.Config) (*containerd.Runtime, *containerd.Daemon, string) {
	t.Helper()
	ctrtest.Require(t)
	probe := buildProbe(t)
	if cfg.Pool.MaxSize == 0 {
		cfg.Pool.MaxSize = 4
	}
	cfg.Pool.InitBinary, cfg.Pool.InitPath = probe, probePath
	rt, d := ctrtest.NewRuntime(t, cfg)
	return rt, d, probe
}

func TestPoolSmoke(t *testing.T) {
	rt, _, probe := newPooledRuntime(t, containerd.Config{})
	ws := workspace(t)
	spec := sandbox.Spec{ID: newID("w"), Argv: []string{"/bin/sh", "-c", "echo hi; pwd; id -u; ls /workspace; cat"}, WorkspaceDir: ws,
		Stdin: []byte("from stdin\n"), Mounts: []sandbox.Mount{{Source: probe, Destination: probePath}}, Limits: sandbox.Limits{Timeout: 20 * time.Second}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := rt.WaitWarm(ctx, spec); err != nil {
		t.Fatal(err)
	}
	out, err := rt.Run(ctx, spec)
	t.Logf("out %+v err %v stdout %q stderr %q", out, err, out.Stdout.String(), out.Stderr.String())
	t.Logf("stats %+v", rt.PoolStats())
}
