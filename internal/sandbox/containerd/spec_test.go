package containerd

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/containerd/containers"
	"github.com/containerd/containerd/contrib/seccomp"
	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/containerd/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/toolpool/toolpool/internal/sandbox"
)

// generate builds the OCI spec of a call the way Run does, without containerd.
func generate(t *testing.T, spec sandbox.Spec) *oci.Spec {
	t.Helper()
	r := &Runtime{cfg: Config{Namespace: "ns", UID: 65532, GID: 65532, Defaults: DefaultLimits}}
	lim := mergeLimits(spec.Limits, DefaultLimits)
	spec.WorkspaceDir = t.TempDir()
	mounts, err := callMounts([]specs.Mount{roBind("/usr", "/usr")}, spec, lim)
	if err != nil {
		t.Fatal(err)
	}
	cwd, err := checkCwd(spec.Cwd)
	if err != nil {
		t.Fatal(err)
	}
	argv, cwd, err := processArgs(spec.Argv, cwd, true)
	if err != nil {
		t.Fatal(err)
	}
	ctx := namespaces.WithNamespace(context.Background(), "ns")
	s, err := oci.GenerateSpec(ctx, nil, &containers.Container{ID: spec.ID}, r.hardenedSpec(argv, cwd, spec, lim, "/rootfs", mounts)...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestSpecHardening checks the generated spec for every hardened default (docs/security.md, "Layers: who
// enforces what": the sandbox user, no capabilities, no_new_privs, OOM score, read-only root, the working
// directory through the trampoline, rlimits, private namespaces, nosuid and nodev mounts, masked and
// read-only paths, no devices, cgroup limits, seccomp), for a call that asks for everything a call can ask
// for (extra writable mounts, environment, a working directory).
func TestSpecHardening(t *testing.T) {
	s := generate(t, sandbox.Spec{
		ID: "c1", Argv: []string{"/bin/true"}, Env: []string{"PATH=/evil", "LD_PRELOAD=/workspace/x.so"}, Cwd: "/workspace/sub",
		Mounts: []sandbox.Mount{{Source: "/srv/sock", Destination: "/.toolpool/egress", Writable: true}},
		Limits: sandbox.Limits{MemoryBytes: 1 << 20, PIDs: 10, NoFile: 32, WorkspaceBytes: 1 << 30},
	})
	p := s.Process
	if p.User.UID != 65532 || p.User.GID != 65532 {
		t.Errorf("user %d:%d", p.User.UID, p.User.GID)
	}
	c := p.Capabilities
	if n := len(c.Bounding) + len(c.Effective) + len(c.Permitted) + len(c.Inheritable) + len(c.Ambient); n != 0 {
		t.Errorf("capabilities left: %+v", c)
	}
	if !p.NoNewPrivileges {
		t.Error("no_new_privs is off")
	}
	if p.OOMScoreAdj == nil || *p.OOMScoreAdj != 1000 {
		t.Errorf("oom_score_adj %v", p.OOMScoreAdj)
	}
	if !s.Root.Readonly {
		t.Error("the root is writable")
	}
	if p.Cwd != "/workspace" || p.Args[0] != "/bin/sh" || p.Args[2] != cwdTrampoline || p.Args[4] != "/workspace/sub" || p.Args[5] != "/bin/true" {
		t.Errorf("runc would resolve the working directory itself: cwd %q args %q", p.Cwd, p.Args)
	}
	rl := map[string]uint64{}
	for _, r := range p.Rlimits {
		rl[r.Type] = r.Hard
	}
	if rl["RLIMIT_NOFILE"] != 32 || rl["RLIMIT_CORE"] != 0 || rl["RLIMIT_FSIZE"] != 1<<30 {
		t.Errorf("rlimits %v", rl)
	}
	var ns []specs.LinuxNamespaceType
	for _, n := range s.Linux.Namespaces {
		if n.Path != "" {
			t.Errorf("joins namespace %s at %s", n.Type, n.Path)
		}
		ns = append(ns, n.Type)
	}
	for _, want := range []specs.LinuxNamespaceType{specs.PIDNamespace, specs.IPCNamespace, specs.UTSNamespace, specs.MountNamespace, specs.NetworkNamespace} {
		if !slices.Contains(ns, want) {
			t.Errorf("no private %s namespace", want)
		}
	}
	for _, m := range s.Mounts {
		if !slices.Contains(m.Options, "nosuid") {
			t.Errorf("mount %s lacks nosuid", m.Destination)
		}
		if m.Destination != "/dev" && !slices.Contains(m.Options, "nodev") {
			t.Errorf("mount %s lacks nodev", m.Destination)
		}
		if m.Destination == "/sys" && !slices.Contains(m.Options, "ro") {
			t.Error("/sys is writable")
		}
	}
	for _, want := range []string{"/proc/kcore", "/proc/keys", "/proc/timer_list", "/sys/firmware", "/proc/sched_debug"} {
		if !slices.Contains(s.Linux.MaskedPaths, want) {
			t.Errorf("%s is not masked", want)
		}
	}
	for _, want := range []string{"/proc/sys", "/proc/sysrq-trigger", "/proc/bus", "/proc/fs", "/proc/irq"} {
		if !slices.Contains(s.Linux.ReadonlyPaths, want) {
			t.Errorf("%s is not read-only", want)
		}
	}
	if len(s.Linux.Devices) != 0 {
		t.Errorf("extra devices: %v", s.Linux.Devices)
	}
	r := s.Linux.Resources
	if len(r.Devices) != 1 || r.Devices[0].Allow || r.Devices[0].Access != "rwm" {
		t.Errorf("device cgroup %+v, want deny all", r.Devices)
	}
	if r.Memory == nil || *r.Memory.Limit != 1<<20 || *r.Memory.Swap != 1<<20 || r.Pids == nil || r.Pids.Limit != 10 || r.CPU == nil || *r.CPU.Quota != 100000 {
		t.Errorf("cgroup limits %+v", r)
	}
	if s.Linux.Seccomp == nil || s.Linux.Seccomp.DefaultAction != specs.ActErrno {
		t.Error("no seccomp profile with a deny-by-default action")
	}
}

// allowed reports whether profile allows syscall name when arg0 is v (v < 0: with no condition at all),
// evaluating the profile's rules the way libseccomp does for a single-argument comparison.
func allowed(p *specs.LinuxSeccomp, name string, v int64) bool {
	for _, r := range p.Syscalls {
		if r.Action != specs.ActAllow || !slices.Contains(r.Names, name) {
			continue
		}
		if len(r.Args) == 0 {
			return true
		}
		if v < 0 || len(r.Args) != 1 || r.Args[0].Index != 0 {
			continue
		}
		a, x := r.Args[0], uint64(v)
		switch a.Op {
		case specs.OpEqualTo:
			if x == a.Value {
				return true
			}
		case specs.OpNotEqual:
			if x != a.Value {
				return true
			}
		case specs.OpLessThan:
			if x < a.Value {
				return true
			}
		case specs.OpGreaterThan:
			if x > a.Value {
				return true
			}
		case specs.OpMaskedEqual:
			if x&a.Value == a.ValueTwo {
				return true
			}
		}
	}
	return false
}

// TestSeccompStricterThanDefault proves the profile the sandbox loads allows nothing that containerd's own
// default (of the vendored client) refuses, for the same capability set, and refuses the calls this
// sandbox removes on top.
func TestSeccompStricterThanDefault(t *testing.T) {
	s := &oci.Spec{Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{}}, Linux: &specs.Linux{}}
	ours, def := seccompProfile(s), seccomp.DefaultProfile(s)
	if ours.DefaultAction != def.DefaultAction {
		t.Fatalf("default action %s; containerd's %s", ours.DefaultAction, def.DefaultAction)
	}
	// Only the native ABI: the compat ABIs (x86 and x32 on amd64) are refused altogether.
	for _, a := range ours.Architectures {
		if !slices.Contains(def.Architectures, a) {
			t.Errorf("architecture %s is not in containerd's default", a)
		}
	}
	if native, ok := nativeArch[runtime.GOARCH]; ok && !slices.Equal(ours.Architectures, []specs.Arch{native}) {
		t.Errorf("architectures %v, want only %s", ours.Architectures, native)
	}
	for _, r := range ours.Syscalls {
		if r.Action != specs.ActAllow {
			continue
		}
		for _, name := range r.Names {
			switch {
			case len(r.Args) == 0 && !allowed(def, name, -1):
				t.Errorf("%s is allowed unconditionally; containerd's default does not allow it so", name)
			case len(r.Args) == 1 && r.Args[0].Op == specs.OpEqualTo && !allowed(def, name, int64(r.Args[0].Value)):
				t.Errorf("%s(%d) is allowed; containerd's default refuses it", name, r.Args[0].Value)
			case len(r.Args) > 0 && !slices.ContainsFunc(def.Syscalls, func(d specs.LinuxSyscall) bool {
				return d.Action == specs.ActAllow && slices.Contains(d.Names, name) && slices.Equal(d.Args, r.Args)
			}) && r.Args[0].Op != specs.OpEqualTo:
				t.Errorf("%s has a condition containerd's default lacks: %+v", name, r.Args)
			}
		}
	}
	// ptrace and process_vm_readv/writev stay allowed, as in containerd's default: without CAP_SYS_PTRACE
	// they reach only processes of the same uid in the call's own PID namespace (debuggers and strace work).
	for _, name := range []string{"io_uring_setup", "io_uring_enter", "io_uring_register", "socketcall", "keyctl", "add_key",
		"request_key", "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "bpf", "perf_event_open", "userfaultfd",
		"kexec_load", "init_module", "finit_module", "open_by_handle_at",
		"clone3", "reboot", "swapon", "acct", "lookup_dcookie", "fanotify_init", "iopl", "ioperm", "quotactl", "syslog"} {
		if allowed(ours, name, -1) {
			t.Errorf("%s is allowed", name)
		}
	}
	// clone is allowed only without namespace flags.
	const newUser = 0x10000000
	if allowed(ours, "clone", newUser) || !allowed(ours, "clone", 0x11) {
		t.Error("clone: namespace flags must be refused and plain forks allowed")
	}
	families := map[int64]bool{1: true, 2: true, 10: true, 16: true} // unix, inet, inet6, netlink
	for f := int64(0); f < 46; f++ {
		if allowed(ours, "socket", f) != families[f] {
			t.Errorf("socket family %d: allowed %v", f, allowed(ours, "socket", f))
		}
	}
}

func TestCallMounts(t *testing.T) {
	tests := []struct {
		name    string
		mounts  []sandbox.Mount
		wantErr string
	}{
		{name: "runner", mounts: []sandbox.Mount{{Source: "/usr/bin/worker", Destination: "/.toolpool/runner"}}},
		{name: "outside .toolpool", mounts: []sandbox.Mount{{Source: "/etc", Destination: "/etc"}}, wantErr: "must go under /.toolpool"},
		{name: "into the workspace", mounts: []sandbox.Mount{{Source: "/srv/x", Destination: "/workspace/x"}}, wantErr: "must go under /.toolpool"},
		{name: "dot-dot", mounts: []sandbox.Mount{{Source: "/srv/x", Destination: "/.toolpool/../etc"}}, wantErr: "clean path"},
		{name: "relative source", mounts: []sandbox.Mount{{Source: "x", Destination: "/.toolpool/x"}}, wantErr: "absolute host path"},
		{name: "inside a writable extra", mounts: []sandbox.Mount{
			{Source: "/srv/a", Destination: "/.toolpool/a", Writable: true}, {Source: "/srv/b", Destination: "/.toolpool/a/b"}},
			wantErr: "lands inside the writable mount /.toolpool/a"},
		{name: "beside a writable extra", mounts: []sandbox.Mount{
			{Source: "/srv/a", Destination: "/.toolpool/a", Writable: true}, {Source: "/srv/b", Destination: "/.toolpool/ab"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := callMounts(nil, sandbox.Spec{Mounts: tt.mounts}, DefaultLimits)
			if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Errorf("err %v, want %q", err, tt.wantErr)
			}
		})
	}
}

func TestCheckCwd(t *testing.T) {
	tests := []struct {
		cwd, want, wantErr string
	}{
		{cwd: "", want: "/workspace"},
		{cwd: "/workspace", want: "/workspace"},
		{cwd: "/workspace/a/b", want: "/workspace/a/b"},
		{cwd: "/workspace/../etc", wantErr: "clean"},
		{cwd: "/workspace/./a", wantErr: "clean"},
		{cwd: "workspace", wantErr: "clean absolute"},
		{cwd: "/etc", wantErr: "beneath"},
		{cwd: "/workspacex", wantErr: "beneath"},
		{cwd: "/proc/self/fd/7", wantErr: "beneath"},
	}
	for _, tt := range tests {
		got, err := checkCwd(tt.cwd)
		if got != tt.want || tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
			t.Errorf("checkCwd(%q) = %q, %v; want %q, %q", tt.cwd, got, err, tt.want, tt.wantErr)
		}
	}
	if _, _, err := processArgs([]string{"/x"}, "/workspace/a", false); err == nil {
		t.Error("an image root accepted a working directory below /workspace")
	}
}

func TestRuncTooOld(t *testing.T) {
	tests := []struct {
		version string
		old     bool
	}{
		{"1.1.5+ds1", true}, {"1.1.14", true}, {"1.2.0", true}, {"1.2.7", true}, {"1.2.8", false}, {"1.2.9", false},
		{"1.3.0", true}, {"1.3.2", true}, {"1.3.3", false}, {"1.3.4", false},
		{"1.4.0-rc.1", true}, {"1.4.0-rc.2", true}, {"1.4.0-rc.3", false}, {"1.4.0-rc.3+dev", false}, {"1.4.0", false},
		{"1.4.1", false}, {"1.5.0", false}, {"1.5.0-rc.1", false}, {"2.0.0", false}, {"0.9.0", true},
		// A pre-release of the first fixed release of a line predates the fix.
		{"1.2.8-rc.1", true}, {"1.3.3-rc.1", true}, {"1.2.8+ds1", false}, {"1.2.9-rc.1", false},
	}
	for _, tt := range tests {
		old, err := runcTooOld(tt.version)
		if err != nil || old != tt.old {
			t.Errorf("runcTooOld(%q) = %v, %v; want %v", tt.version, old, err, tt.old)
		}
	}
	if _, err := runcTooOld("garbage"); err == nil {
		t.Error("garbage parsed")
	}
}

func TestCapLimits(t *testing.T) {
	ceiling := sandbox.Limits{MemoryBytes: 1 << 30, PIDs: 100, NoFile: 512, WorkspaceBytes: 1 << 30}
	got := capLimits(sandbox.Limits{MemoryBytes: 1 << 40, PIDs: 10, NoFile: 1 << 20, WorkspaceBytes: -1, CPUMillis: 4000}, ceiling)
	want := sandbox.Limits{MemoryBytes: 1 << 30, PIDs: 10, NoFile: 512, WorkspaceBytes: 1 << 30, CPUMillis: 4000}
	if got != want {
		t.Errorf("capLimits = %+v, want %+v", got, want)
	}
}

func TestRuntimeWarnings(t *testing.T) {
	fake := func(out string) string {
		p := filepath.Join(t.TempDir(), "runc")
		if err := os.WriteFile(p, []byte("#!/bin/sh\nprintf '%s\\n' '"+out+"'\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tests := []struct {
		name, runtime, binary, want string
	}{
		{name: "debian bookworm", runtime: "io.containerd.runc.v2", binary: fake("runc version 1.1.5+ds1"), want: "runc 1.1.5+ds1 is too old (production needs 1.2.8 or later"},
		{name: "supported", runtime: "io.containerd.runc.v2", binary: fake("runc version 1.3.3\ncommit: v1.3.3")},
		{name: "unparsable", runtime: "io.containerd.runc.v2", binary: fake("what"), want: "cannot tell which runc"},
		{name: "missing", runtime: "io.containerd.runc.v2", binary: "/nonexistent/runc", want: "cannot tell which runc"},
		{name: "gvisor is not runc", runtime: "io.containerd.runsc.v1", binary: "/nonexistent/runc"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := runtimeWarnings(context.Background(), tt.runtime, tt.binary)
			if tt.want == "" && len(w) != 0 || tt.want != "" && (len(w) != 1 || !strings.Contains(w[0], tt.want)) {
				t.Errorf("warnings %q, want %q", w, tt.want)
			}
		})
	}
}
