package containerd_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/sandbox"
	"github.com/toolpool/toolpool/internal/sandbox/containerd"
	"github.com/toolpool/toolpool/internal/sandbox/containerd/ctrtest"
)

// safeCheck asserts that a case's outcome proves the boundary held.
type safeCheck = func(t *testing.T, s *suite, ws string, out sandbox.Outcome)

// runtimeSafe returns, by case name, the safe outcomes of the runtime under test where they differ from
// runc's (each case's own safe). Under gVisor the call talks to the Sentry, gVisor's kernel, not to the
// host's, so some answers differ while the boundary holds: a file the Sentry does not implement is absent
// instead of masked, a 32-bit binary does not execute at all, the pids limit is the Sentry's. Every entry
// says why its answer is safe, and names no case that does not exist (a renamed case fails here rather
// than losing its gVisor check).
func runtimeSafe(t *testing.T, cases []escapeCase) map[string]safeCheck {
	t.Helper()
	if ctrtest.Runtime() != containerd.GVisorRuntime {
		return nil
	}
	for name := range gvisorSafe {
		if !slices.ContainsFunc(cases, func(c escapeCase) bool { return c.name == name }) {
			t.Fatalf("gvisorSafe names case %q, which the suite does not have", name)
		}
	}
	return gvisorSafe
}

// gvisorSafe are the safe outcomes under gVisor of the cases whose answer differs from runc's.
var gvisorSafe = map[string]safeCheck{
	// gVisor runs only 64-bit x86 programs: a 32-bit ELF is not executed at all (ENOEXEC, the shell's exit
	// 126), and an x32 system call number is an error returned by the Sentry's or the OCI seccomp filter,
	// never a call that runs.
	"32-bit and x32 system calls": func(t *testing.T, _ *suite, _ string, out sandbox.Outcome) {
		got := strings.Split(strings.TrimSpace(out.Stdout.String()), "\n")
		if len(got) != 3 || got[0] != "rc=126" || !strings.Contains(out.Stderr.String(), "Exec format error") {
			t.Errorf("stdout %q stderr %q; want the 32-bit program refused (exit 126, Exec format error)", out.Stdout.String(), out.Stderr.String())
		}
		if len(got) == 3 && !slices.Contains([]string{"EPERM", "ENOSYS"}, got[1]) {
			t.Errorf("x32 getpid answered %q; want EPERM or ENOSYS", got[1])
		}
	},
	// The Sentry enforces the pids limit (withGVisor). The call's own shell execs its last command, so it
	// never needs a pid the bomb holds, and the call ends by its timeout; the sandbox's ending reports the
	// timeout with the shell's exit status rather than the kill's signal. What must hold is what follows:
	// run has checked that the call's cgroup is empty and gone, and the next call runs.
	"fork bomb": func(t *testing.T, s *suite, ws string, out sandbox.Outcome) {
		if !out.TimedOut {
			t.Errorf("timedOut %v signal %q exit %d stderr %q; the bomb should end by the timeout's kill", out.TimedOut, out.Signal, out.ExitCode, out.Stderr.String())
		}
		began := time.Now()
		if after := s.run(t, ws, "echo fine", sandbox.Limits{}); after.Stdout.String() != "fine\n" {
			t.Errorf("the next call printed %q", after.Stdout.String())
		}
		t.Logf("the bomb ended with timedOut %v signal %q exit %d; the next call took %s", out.TimedOut, out.Signal, out.ExitCode, time.Since(began))
	},
	// The Sentry and gofer run inside the call's cgroup, so the CPU quota throttles the sandbox's boot as
	// well as the call, and the cgroup's CPU time includes that boot. The quota's share is of the whole
	// time since the sandbox was created.
	"cpu quota": func(t *testing.T, _ *suite, _ string, out sandbox.Outcome) {
		wall := out.SandboxTime + out.RunTime
		if out.CPUTime <= 0 || out.CPUTime > time.Duration(float64(wall)*0.3) {
			t.Errorf("cpu %s over %s of sandbox and run time; want at most 0.2 of it (plus slack)", out.CPUTime, wall)
		}
	},
	// Output crosses the Sentry on its way to the host FIFO, several times slower than under runc, so 2 GiB
	// may not pass within the case's timeout. What must hold is the same: the writer never blocks on the
	// cap (far more than the cap went through), the head and tail are kept at the cap, and the worker's
	// heap stays flat.
	"output flood": func(t *testing.T, s *suite, _ string, out sandbox.Outcome) {
		const drained = 64 << 20 // a thousand times the cap
		switch {
		case out.ExitCode == 0 && !out.TimedOut:
			if want := int64(2<<30 + len("\nEND\n")); out.Stdout.Total != want {
				t.Errorf("total %d, want %d", out.Stdout.Total, want)
			}
		case out.TimedOut && out.Stdout.Total >= drained:
		default:
			t.Errorf("exit %d timedOut %v total %d: the flood was not drained", out.ExitCode, out.TimedOut, out.Stdout.Total)
		}
		if s.heapGrowth > 16<<20 {
			t.Errorf("the heap grew by %d MiB while the call printed %d MiB", s.heapGrowth>>20, out.Stdout.Total>>20)
		}
		if !out.Stdout.Truncated() || len(out.Stdout.Head)+len(out.Stdout.Tail) != 64<<10 {
			t.Errorf("truncated %v, kept %d+%d bytes; want the 64 KiB cap", out.Stdout.Truncated(), len(out.Stdout.Head), len(out.Stdout.Tail))
		}
	},
	// /proc/sys is the Sentry's, not the host kernel's: the few files it has are refused to the sandbox
	// user (hostname: EACCES), the rest do not exist (drop_caches: ENOENT), and gVisor mounts no separate
	// read-only /proc/sys (nothing written there could reach the host's kernel anyway).
	"write /proc/sys": func(t *testing.T, _ *suite, _ string, out sandbox.Outcome) {
		got := strings.Split(strings.TrimSpace(out.Stdout.String()), "\n")
		if len(got) < 2 || len(got) > 3 || len(got) == 3 && got[2] != "ro" {
			t.Fatalf("stdout %q (stderr %q)", got, out.Stderr.String())
		}
		for _, g := range got[:2] {
			if !slices.Contains([]string{"EACCES", "ENOENT", "EROFS", "EPERM"}, g) {
				t.Errorf("writing /proc/sys answered %q, want a refusal", g)
			}
		}
	},
	// The masked files are the host kernel's (interrupts, keys, timers, kcore, sched_debug, ACPI, firmware):
	// gVisor's /proc and /sys are the Sentry's and do not have them. Whatever of them exists must be empty;
	// a file absent here is absent from the Sentry, not unchecked.
	"masked /proc and /sys paths": func(t *testing.T, _ *suite, _ string, out sandbox.Outcome) {
		for _, l := range strings.Split(strings.TrimSpace(out.Stdout.String()), "\n") {
			if name, n, _ := strings.Cut(l, " "); l != "" && n != "0" {
				t.Errorf("%s is not empty: %s bytes or entries", name, n)
			}
		}
	},
	// The Sentry refuses the write to / by permission (EACCES) before the read-only mount would (EROFS); both
	// layers are checked: the write fails and creates nothing, and /, /usr and /sys are read-only mounts.
	// gVisor has no separate /proc/sys mount (see "write /proc/sys").
	"root, /usr, /sys and /proc/sys are read-only mounts": func(t *testing.T, s *suite, ws string, out sandbox.Outcome) {
		got := strings.Split(strings.TrimSpace(out.Stdout.String()), "\n")
		if want := s.rootMounts("/ ro", "/sys ro", "/tmp rw", "/usr ro", "/workspace rw"); len(got) < 1 || !slices.Equal(got[1:], want) {
			t.Errorf("mounts %q, want %q", got[min(1, len(got)):], want)
		}
		again := s.run(t, ws, `touch /x /usr/x 2>&1 | grep -c -e 'Permission denied' -e 'Read-only'; ls /x /usr/x 2>&1 | grep -c 'No such file'`, sandbox.Limits{})
		lines("2", "2")(t, s, ws, again)
	},
	// gVisor's /dev is the Sentry's own: the standard devices, plus /dev/net/tun (creating an interface
	// needs CAP_NET_ADMIN) and /dev/fuse (mounting it needs CAP_SYS_ADMIN; mount is refused, see "mount"),
	// and no mqueue mount. None is a host device node.
	"only the standard devices": lines("char fd full fuse net null ptmx pts random shm stderr stdin stdout tty urandom zero "),
}
