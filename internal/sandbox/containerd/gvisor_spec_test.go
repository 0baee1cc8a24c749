package containerd

import (
	"context"
	"encoding/json"
	"net"
	"path/filepath"
	"slices"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/toolpool/toolpool/internal/sandbox"
)

// TestGVisorSpec checks what withGVisor changes in a hardened spec, and that it changes nothing else: the
// pids limit moves into the Sentry (RLIMIT_NPROC, with the host cgroup bounding the sandbox's own
// threads), and only a call given a host socket may connect to host sockets.
func TestGVisorSpec(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "egress.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	tests := []struct {
		name    string
		spec    sandbox.Spec
		pids    int64
		hostUDS string
	}{
		{name: "default limits", spec: sandbox.Spec{ID: "c1", Argv: []string{"true"}}, pids: DefaultLimits.PIDs},
		{name: "small pids limit", spec: sandbox.Spec{ID: "c2", Argv: []string{"true"}, Limits: sandbox.Limits{PIDs: 32}}, pids: 32},
		{name: "a host socket mounted", spec: sandbox.Spec{ID: "c3", Argv: []string{"true"},
			Mounts: []sandbox.Mount{{Source: sock, Destination: "/.toolpool/egress.sock"}}}, pids: DefaultLimits.PIDs, hostUDS: "open"},
		{name: "a host file mounted", spec: sandbox.Spec{ID: "c4", Argv: []string{"true"},
			Mounts: []sandbox.Mount{{Source: "/etc/hostname", Destination: "/.toolpool/f"}}}, pids: DefaultLimits.PIDs},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			runc := generate(t, tt.spec)
			var gv *specs.Spec
			if b, err := json.Marshal(runc); err != nil || json.Unmarshal(b, &gv) != nil {
				t.Fatalf("copy spec: %v", err)
			}
			lim := mergeLimits(tt.spec.Limits, DefaultLimits)
			if err := withGVisor(lim)(context.Background(), nil, nil, gv); err != nil {
				t.Fatal(err)
			}
			want := specs.POSIXRlimit{Type: "RLIMIT_NPROC", Hard: uint64(tt.pids), Soft: uint64(tt.pids)}
			if !slices.Contains(gv.Process.Rlimits, want) {
				t.Errorf("rlimits %+v lack %+v", gv.Process.Rlimits, want)
			}
			if got := gv.Linux.Resources.Pids.Limit; got != 2*tt.pids+gvisorHostThreads {
				t.Errorf("host pids limit %d, want %d", got, 2*tt.pids+gvisorHostThreads)
			}
			if got := gv.Annotations[hostUDSAnnotation]; got != tt.hostUDS {
				t.Errorf("host-uds %q, want %q", got, tt.hostUDS)
			}
			// The rules that answer ENOSYS (clone3) trace instead, which answers ENOSYS under gVisor.
			var traced []string
			for i, r := range gv.Linux.Seccomp.Syscalls {
				if r.Action == specs.ActTrace {
					traced = append(traced, r.Names...)
					gv.Linux.Seccomp.Syscalls[i] = runc.Linux.Seccomp.Syscalls[i]
				}
			}
			if !slices.Contains(traced, "clone3") {
				t.Errorf("the traced system calls %q lack clone3", traced)
			}
			// Nothing else differs from the runc spec: the hardened defaults stay as they are.
			gv.Process.Rlimits = slices.DeleteFunc(gv.Process.Rlimits, func(r specs.POSIXRlimit) bool { return r == want })
			gv.Linux.Resources.Pids.Limit = runc.Linux.Resources.Pids.Limit
			delete(gv.Annotations, hostUDSAnnotation)
			a, _ := json.Marshal(runc)
			b, _ := json.Marshal(gv)
			if string(a) != string(b) {
				t.Errorf("withGVisor changed more than the pids limit, host-uds and ENOSYS rules:\n%s\n%s", a, b)
			}
		})
	}
}
