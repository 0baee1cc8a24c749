package containerd

import (
	"context"
	"encoding/json"
	"reflect"
	"slices"
	"testing"

	"github.com/containerd/containerd/containers"
	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/containerd/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/toolpool/toolpool/internal/sandbox"
	"github.com/toolpool/toolpool/internal/sandbox/sandboxinit"
)

// TestSlotSpecMatchesCold generates the OCI spec of a pooled container and of a cold call that mounts the
// same init binary and runner, and checks that they differ only where the pool must: the process (the init, in /,
// with the base environment) and the workspace mount (the slot: read-only, a slave of the host's). Every
// hardened default (capabilities, seccomp, namespaces, masked paths, devices, limits, mount flags,
// propagation) is therefore the same.
func TestSlotSpecMatchesCold(t *testing.T) {
	init := sandbox.Mount{Source: "/usr/local/bin/toolpool-init", Destination: "/.toolpool/init"}
	runner := sandbox.Mount{Source: "/usr/local/bin/toolpool-runner", Destination: "/.toolpool/runner"}
	r := &Runtime{cfg: Config{Namespace: "ns", UID: 65532, GID: 65532, Defaults: DefaultLimits,
		Pool: PoolConfig{InitBinary: init.Source, InitPath: init.Destination, Mounts: []sandbox.Mount{runner}}}}
	r.backends, r.def, _ = backends(r.cfg)
	c := &containerSlots{r: r, ahead: r.cfg.Pool.aheadMounts(), initPath: r.cfg.Pool.InitPath}
	lim := c.limits(profileKey{tmp: DefaultLimits.TmpBytes})
	base := []specs.Mount{roBind("/usr", "/usr")}
	ctx := namespaces.WithNamespace(context.Background(), "ns")
	gen := func(opts []oci.SpecOpts) *oci.Spec {
		t.Helper()
		s, err := oci.GenerateSpec(ctx, nil, &containers.Container{ID: "c1"}, opts...)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}

	ws, slotDir := t.TempDir(), t.TempDir()
	spec := sandbox.Spec{ID: "c1", Argv: []string{"/bin/sh", "-c", "true"}, Env: []string{"A=1"}, Cwd: "/workspace/sub",
		WorkspaceDir: ws, Mounts: []sandbox.Mount{init, runner}}
	mounts, err := callMounts(base, spec, lim)
	if err != nil {
		t.Fatal(err)
	}
	argv, cwd, err := processArgs(spec.Argv, spec.Cwd, true)
	if err != nil {
		t.Fatal(err)
	}
	cold := gen(r.specOpts(r.backends[RuncRuntime], argv, cwd, spec, lim, "/rootfs", mounts))
	slotOpts, err := c.spec("c1", lim, "/rootfs", base, slotDir)
	if err != nil {
		t.Fatal(err)
	}
	warm := gen(slotOpts)

	if got := warm.Process.Args; !slices.Equal(got, []string{init.Destination, sandboxinit.Command}) || warm.Process.Cwd != "/" {
		t.Errorf("pooled process %q in %s, want the init in /", got, warm.Process.Cwd)
	}
	if !slices.Equal(warm.Process.Env, baseEnv) {
		t.Errorf("pooled environment %q, want only the base one", warm.Process.Env)
	}
	if warm.Linux.RootfsPropagation != "rslave" {
		t.Errorf("rootfs propagation %q, want rslave", warm.Linux.RootfsPropagation)
	}
	wsMount := func(s *oci.Spec) *specs.Mount {
		for i := range s.Mounts {
			if s.Mounts[i].Destination == workspaceDir {
				return &s.Mounts[i]
			}
		}
		t.Fatalf("no %s mount", workspaceDir)
		return nil
	}
	wm, cm := wsMount(warm), wsMount(cold)
	if wm.Source != slotDir || !slices.Equal(wm.Options, []string{"bind", "ro", "nosuid", "nodev", "rslave"}) {
		t.Errorf("slot mount %+v, want the slot dir, read-only, nosuid, nodev and rslave", *wm)
	}
	// Take out what differs by design, then nothing else may.
	warm.Process.Args, warm.Process.Cwd, warm.Process.Env = cold.Process.Args, cold.Process.Cwd, cold.Process.Env
	*wm = *cm
	if !reflect.DeepEqual(cold, warm) {
		c, _ := json.MarshalIndent(cold, "", " ")
		w, _ := json.MarshalIndent(warm, "", " ")
		t.Errorf("pooled spec differs from the cold one beyond process and slot:\ncold %s\nwarm %s", c, w)
	}
}
