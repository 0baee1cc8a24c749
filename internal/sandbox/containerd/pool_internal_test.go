package containerd

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

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
	r.pool = &pool{cfg: r.cfg.Pool}
	r.backends, r.def, _ = backends(r.cfg)
	lim := r.slotLimits(profileKey{tmp: DefaultLimits.TmpBytes})
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
	slotOpts, err := r.slotSpec("c1", lim, "/rootfs", base, slotDir)
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

// TestProfileTarget checks how a profile sizes itself from its claims: its busiest second of the last
// demandWindow seconds, at least one while used within idleAfter, none after.
func TestProfileTarget(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	tests := []struct {
		name   string
		claims []time.Duration // offsets from t0
		at     time.Duration
		want   int
	}{
		{name: "never used", at: 0, want: 0},
		{name: "one claim", claims: []time.Duration{0}, at: time.Second, want: 1},
		{name: "a burst of six in one second", claims: ms(0, 100, 200, 300, 400, 500), at: 2 * time.Second, want: 6},
		{name: "the burst is remembered within the window", claims: ms(0, 100, 200), at: 29 * time.Second, want: 3},
		{name: "the burst is forgotten after the window", claims: ms(0, 100, 200), at: 40 * time.Second, want: 1},
		{name: "steady two per second", claims: ms(0, 500, 1000, 1500, 2000, 2500), at: 3 * time.Second, want: 2},
		{name: "idle profile keeps none", claims: []time.Duration{0}, at: idleAfter + time.Second, want: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var p profile
			for _, c := range tt.claims {
				p.note(t0.Add(c))
			}
			if got := p.target(t0.Add(tt.at)); got != tt.want {
				t.Errorf("target %d, want %d", got, tt.want)
			}
		})
	}
}

func ms(v ...int) []time.Duration {
	var d []time.Duration
	for _, n := range v {
		d = append(d, time.Duration(n)*time.Millisecond)
	}
	return d
}

// TestPlanBudget checks that the pool never plans more ready containers than its memory budget holds,
// keeps the most recently used profiles first, and discards what is past MaxAge or beyond the target.
func TestPlanBudget(t *testing.T) {
	now := time.Now()
	p := &pool{cfg: PoolConfig{MaxSize: 10, MemoryBytes: 3 * defaultSlotBytes, MaxAge: time.Minute, Fillers: 8, MaxProfiles: 4},
		slotBytes: defaultSlotBytes, profiles: map[profileKey]*profile{}, discarded: map[string]uint64{}}
	busy, quiet := &profile{key: profileKey{tmp: 1}}, &profile{key: profileKey{tmp: 2}}
	for range 5 {
		busy.note(now)
	}
	quiet.note(now.Add(-time.Minute))
	old := &slot{id: "old", created: now.Add(-2 * time.Minute)}
	quiet.ready = []*slot{old, {id: "q1", created: now}, {id: "q2", created: now}}
	p.profiles[busy.key], p.profiles[quiet.key] = busy, quiet

	discard := p.plan(now)
	if p.target != 3 {
		t.Errorf("target %d, want the budget's 3", p.target)
	}
	var ids []string
	for _, s := range discard {
		ids = append(ids, s.id)
	}
	// busy wants 5 and gets all 3 of the budget; quiet gets none: its old container goes for its age,
	// the two others because they are beyond its share.
	if !slices.Equal(ids, []string{"old", "q1", "q2"}) || p.discarded["max_age"] != 1 || p.discarded["shrink"] != 2 {
		t.Errorf("discarded %v (%v)", ids, p.discarded)
	}
	keys := p.toCreate(now)
	if len(keys) != 3 || slices.ContainsFunc(keys, func(k profileKey) bool { return k != busy.key }) {
		t.Errorf("creations %v, want three for the busy profile", keys)
	}
}

// TestPoolConfigValidate checks that the pool refuses ahead mounts it could not carry safely: each file
// is a regular file on the host, read-only, at its own clean path under /.toolpool.
func TestPoolConfigValidate(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "bin")
	if err := os.WriteFile(file, nil, 0o755); err != nil {
		t.Fatal(err)
	}
	base := func() PoolConfig { return PoolConfig{MaxSize: 1, InitBinary: file, InitPath: "/.toolpool/init"} }
	tests := []struct {
		name    string
		edit    func(*PoolConfig)
		wantErr string
	}{
		{name: "init only", edit: func(*PoolConfig) {}},
		{name: "init and runner", edit: func(c *PoolConfig) { c.Mounts = []sandbox.Mount{{Source: file, Destination: "/.toolpool/runner"}} }},
		{name: "pool off checks nothing", edit: func(c *PoolConfig) { c.MaxSize, c.InitBinary = 0, "" }},
		{name: "relative init", edit: func(c *PoolConfig) { c.InitBinary = "bin" }, wantErr: "init: binary \"bin\" must be an absolute path"},
		{name: "missing init", edit: func(c *PoolConfig) { c.InitBinary = filepath.Join(dir, "none") }, wantErr: "no such file"},
		{name: "directory", edit: func(c *PoolConfig) { c.Mounts = []sandbox.Mount{{Source: dir, Destination: "/.toolpool/runner"}} }, wantErr: "mount 1: " + dir + " is not a regular file"},
		{name: "outside /.toolpool", edit: func(c *PoolConfig) { c.Mounts = []sandbox.Mount{{Source: file, Destination: "/usr/bin/runner"}} }, wantErr: "clean path under /.toolpool"},
		{name: "not clean", edit: func(c *PoolConfig) { c.Mounts = []sandbox.Mount{{Source: file, Destination: "/.toolpool/../etc/x"}} }, wantErr: "clean path under /.toolpool"},
		{name: "writable", edit: func(c *PoolConfig) {
			c.Mounts = []sandbox.Mount{{Source: file, Destination: "/.toolpool/runner", Writable: true}}
		}, wantErr: "must be read-only"},
		{name: "two at one path", edit: func(c *PoolConfig) { c.Mounts = []sandbox.Mount{{Source: file, Destination: "/.toolpool/init"}} }, wantErr: "a second mount at /.toolpool/init"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := base()
			tt.edit(&c)
			err := c.validate()
			if (err == nil) != (tt.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("validate: %v, want %q", err, tt.wantErr)
			}
		})
	}
}

// TestAckFilter: the init's acknowledgement is taken off the head of standard error however the writes
// split it, and anything else at the head is passed on whole.
func TestAckFilter(t *testing.T) {
	const ack = "toolpool-init[abc]: request taken\n"
	for _, tt := range []struct {
		name   string
		writes []string
		want   string
		taken  bool
	}{
		{"alone", []string{ack}, "", true},
		{"with the program's output", []string{ack + "oops\n"}, "oops\n", true},
		{"split", []string{ack[:5], ack[5:20], ack[20:] + "x", "y"}, "xy", true},
		{"absent", []string{"toolpool-init: read request: EOF\n"}, "toolpool-init: read request: EOF\n", false},
		{"a partial match then other bytes", []string{ack[:10], "zz"}, ack[:10] + "zz", false},
		{"nothing written", nil, "", false},
		{"only later", []string{"a", ack}, "a" + ack, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var b strings.Builder
			f := &ackFilter{ack: []byte(ack), next: &b}
			for _, w := range tt.writes {
				if n, err := f.Write([]byte(w)); n != len(w) || err != nil {
					t.Fatalf("Write(%q) = %d, %v", w, n, err)
				}
			}
			if b.String() != tt.want || f.taken() != tt.taken {
				t.Fatalf("passed %q (want %q), taken %v (want %v)", b.String(), tt.want, f.taken(), tt.taken)
			}
		})
	}
}

// TestRefillWaitsForTheClaimedCall: a claim wakes the pool's manager only refillDelay later, so that the
// replacement's creation does not take the CPU the claimed call needs at once; the claim itself does not.
func TestRefillWaitsForTheClaimedCall(t *testing.T) {
	var delays []time.Duration
	var later []func()
	key := profileKey{tmp: 1}
	p := &pool{cfg: PoolConfig{MaxSize: 1, MaxAge: time.Minute, MaxProfiles: 1}, wake: make(chan struct{}, 1),
		profiles:  map[profileKey]*profile{key: {key: key, ready: []*slot{{id: "s1", created: time.Now()}}}},
		discarded: map[string]uint64{},
		after: func(d time.Duration, f func()) *time.Timer {
			delays, later = append(delays, d), append(later, f)
			return nil
		}}
	s, reason, _ := p.take(key, time.Now())
	if s == nil || s.id != "s1" || reason != "" {
		t.Fatalf("take: %v %q", s, reason)
	}
	select {
	case <-p.wake:
		t.Fatal("the claim woke the manager at once")
	default:
	}
	if len(delays) != 1 || delays[0] != refillDelay || refillDelay < 50*time.Millisecond {
		t.Fatalf("wake-ups scheduled after %v, want one after refillDelay (%s, at least 50ms)", delays, refillDelay)
	}
	later[0]()
	select {
	case <-p.wake:
	default:
		t.Fatal("the scheduled wake-up did not wake the manager")
	}
}
