package containerd

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	runcoptions "github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/containerd/containers"
	"github.com/containerd/containerd/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/toolpool/toolpool/internal/sandbox"
)

// The containerd runtime handlers toolpool knows. containerd resolves a handler io.containerd.X.vN to the
// shim binary containerd-shim-X-vN on its PATH (or next to the containerd binary).
const (
	// RuncHandler is containerd's runc shim. It runs runc, or, given a BinaryName in its options, another
	// OCI runtime with runc's command line: that is how the "gvisor" runtime runs runsc.
	RuncHandler = "io.containerd.runc.v2"
	// RunscHandler is gVisor's own shim, containerd-shim-runsc-v1. toolpool's "gvisor" runtime does not use
	// it (see GVisorConfig); a worker on a node's containerd can name it in Config.Runtimes.
	RunscHandler = "io.containerd.runsc.v1"
)

// Runtime names every Runtime knows (sandbox.Spec.Runtime).
const (
	// RuncRuntime is runc: Linux namespaces, seccomp and cgroups on the host's kernel. Always offered.
	RuncRuntime = "runc"
	// GVisorRuntime is gVisor: a user-space kernel (the Sentry) between the call and the host's kernel.
	// Offered when Config.GVisor is set.
	GVisorRuntime = "gvisor"
)

// RunscPlatforms are the gVisor platforms GVisorConfig.Platform accepts: systrap (the default: seccomp
// traps, any x86-64 or arm64 host, no /dev/kvm), ptrace (slower, same needs) and kvm (faster, needs
// /dev/kvm: bare metal or nested virtualisation).
var RunscPlatforms = []string{"systrap", "ptrace", "kvm"}

// GVisorConfig offers gVisor as the runtime "gvisor": runsc, run by containerd's runc shim in place of runc
// (the way Docker runs it with --runtime=runsc), with the flags below.
//
// Why not gVisor's own shim (containerd-shim-runsc-v1, RunscHandler): when it starts, it sets the
// oom_score_adj of the shim process it forks to -999, and fails the task when it cannot. Lowering an
// oom_score_adj needs CAP_SYS_RESOURCE, which hosts that run containerd inside a restricted container or
// VM often lack in their bounding set (pkg/shim/v1/manager.go: "failed to set OOM Score on shim: write
// /proc/N/oom_score_adj: permission denied"). containerd's runc shim sets its own score to containerd's
// plus one, which needs no privilege, and reads the call's cgroup itself, so usage and OOM kills are
// reported the same way under both runtimes.
type GVisorConfig struct {
	// Runsc is gVisor's runsc binary; empty means "runsc" on PATH. It must be statically linked
	// (scripts/gvisor.sh builds it so): runsc re-executes itself inside an empty chroot.
	Runsc string
	// Platform is one of RunscPlatforms; empty means systrap.
	Platform string
}

// runscFlags are the runsc flags of every gVisor call. They are part of the sandbox's hardening, not
// options:
//   - network none: the Sentry's own network stack with loopback only, as the private network namespace
//     gives runc (web_fetch reaches the worker's egress proxy through a unix socket, as under runc);
//   - oci-seccomp: the spec's seccomp filter (io_uring, rare socket families, the compat ABIs, ...) is
//     enforced inside the sandbox as well; runsc ignores it otherwise and relies on the Sentry alone;
//   - directfs false: the gofer, not the Sentry, opens, renames and removes the workspace's files. The
//     Sentry runs in an empty mount namespace: with directfs it acts on host directory descriptors
//     where the masks of hidden paths (sandbox.Spec.Hidden) are no mount points, and renamed a masked
//     file to a name the next call could read. The gofer sees the call's view, where they are (EBUSY).
//
// runsc's other defaults already fit: no host unix sockets or FIFOs, no raw sockets, a read-only root stays
// read-only, and bind mounts (the workspace) are shared with the host, which measures them while calls run.
var runscFlags = []string{"--network=none", "--oci-seccomp", "--directfs=false"}

// runscWrapper is the OCI runtime binary the runc shim runs for gVisor calls: runsc with runscFlags. The
// runc shim has no option for runtime arguments (Docker writes the same kind of script for a runtime's
// runtimeArgs).
const runscWrapper = "#!/bin/sh\n# Written by toolpool's worker: gVisor's runsc with toolpool's flags, for containerd's runc shim.\nexec %s \"$@\"\n"

// gvisorSetup resolves runsc and writes the wrapper the runc shim runs under stateDir. It returns the runc
// shim's options for gVisor calls.
func gvisorSetup(stateDir string, g GVisorConfig) (*runcoptions.Options, error) {
	bin := cmp.Or(g.Runsc, "runsc")
	path, err := exec.LookPath(bin)
	if err != nil {
		return nil, fmt.Errorf("find gVisor's runsc %q (install it with scripts/gvisor.sh, or make gvisor): %w", bin, err)
	}
	if path, err = filepath.Abs(path); err != nil {
		return nil, fmt.Errorf("resolve runsc path: %w", err)
	}
	dir := filepath.Join(stateDir, "runsc")
	if err := os.MkdirAll(filepath.Join(dir, "state"), 0o700); err != nil {
		return nil, fmt.Errorf("create runsc state dir: %w", err)
	}
	args := append([]string{path, "--platform=" + cmp.Or(g.Platform, RunscPlatforms[0])}, runscFlags...)
	for i, a := range args {
		args[i] = shellQuote(a)
	}
	wrapper := filepath.Join(dir, "runsc")
	if err := os.WriteFile(wrapper, fmt.Appendf(nil, runscWrapper, strings.Join(args, " ")), 0o700); err != nil {
		return nil, fmt.Errorf("write runsc wrapper: %w", err)
	}
	return &runcoptions.Options{BinaryName: wrapper, Root: filepath.Join(dir, "state")}, nil
}

// releaseGVisor unmounts what runsc keeps mounted under stateDir between calls: the empty network namespace
// its gofers share, which runsc bind-mounts at <root>/null-netns when the first sandbox starts (and again
// whenever it is missing), so that a call need not create and tear down a network namespace of its own.
// Close calls it; the directory can then be removed.
func releaseGVisor(stateDir string) error {
	pins, err := filepath.Glob(filepath.Join(stateDir, "runsc", "state", "*", "null-netns"))
	if err != nil {
		return fmt.Errorf("find runsc's network namespace pins: %w", err)
	}
	for _, p := range pins {
		// Concurrent sandbox starts can stack the bind mount: unmount until none is left.
		for unix.Unmount(p, unix.MNT_DETACH) == nil {
		}
	}
	return nil
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// validateRuntimes checks Config's runtime fields.
func (c *Config) validateRuntimes() error {
	var errs []error
	for name, handler := range c.Runtimes {
		switch {
		case name == "":
			errs = append(errs, fmt.Errorf("runtime handler %s has an empty runtime name", handler))
		case handler == "":
			errs = append(errs, fmt.Errorf("runtime %s: the containerd runtime handler is empty", name))
		case name == RuncRuntime:
			errs = append(errs, fmt.Errorf("runtime %s: it is always %s and cannot be redefined", name, RuncHandler))
		case name == GVisorRuntime && c.GVisor != nil:
			errs = append(errs, fmt.Errorf("runtime %s is defined twice: by the gVisor settings and as handler %s", name, handler))
		}
	}
	if c.RuntimeName == GVisorRuntime && c.GVisor == nil && c.Runtimes[GVisorRuntime] == "" {
		errs = append(errs, errors.New("the default runtime is gvisor, but gVisor is not installed or configured (install runsc with make gvisor, or scripts/gvisor.sh)"))
	}
	if c.GVisor != nil && c.GVisor.Platform != "" && !slices.Contains(RunscPlatforms, c.GVisor.Platform) {
		errs = append(errs, fmt.Errorf("gVisor platform %q is not one of %s", c.GVisor.Platform, strings.Join(RunscPlatforms, ", ")))
	}
	return errors.Join(errs...)
}

// backend is how containerd runs one runtime: a runtime handler and its options (nil: the handler's own
// defaults).
type backend struct {
	handler string
	options any
	// gvisor marks toolpool's gVisor runtime, whose specs get withGVisor.
	gvisor bool
	// runc marks RuncRuntime: the runc shim running Config.RuntimeBinary. The warm pool and ShimGroups
	// apply to it only.
	runc bool
}

// gvisorHostThreads is the host threads a gVisor sandbox needs besides those of its processes: the Sentry's
// and the gofer's own (about 35 when idle, measured with runsc on systrap), with room to spare.
const gvisorHostThreads = 64

// hostUDSAnnotation sets runsc's --host-uds for one container; runsc lets a spec set it without
// --allow-flag-override (runsc/config/flags.go, overrideAllowlist).
const hostUDSAnnotation = "dev.gvisor.flag.host-uds"

// withGVisor adapts a gVisor call's spec; it comes after the hardened options.
//
// The pids limit moves into the Sentry. On the host, every thread of the sandbox counts against the pids
// cgroup: the Sentry's own threads, and one or two per process of the call (systrap's stub threads), so
// the call's limit there would keep a small sandbox from booting and would count gVisor's threads as the
// call's. Instead the Sentry enforces the limit itself, as RLIMIT_NPROC of the sandbox user (its kernel
// counts only this call's tasks: every call has its own), and the host's pids cgroup bounds the whole
// sandbox at twice the limit plus gvisorHostThreads. Under runc RLIMIT_NPROC would count every process of
// uid 65532 on the host, so only gVisor calls get it.
//
// A call given a host unix socket (the egress proxy's, bind-mounted for web_fetch) may connect to it:
// runsc refuses every host socket otherwise (--host-uds=none). "open" connects to sockets that exist in
// the call's mounts and never creates one on the host; the mounts are the read-only root, /tmp, the
// workspace and what the worker adds, as under runc.
func withGVisor(lim sandbox.Limits) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		if s.Process == nil || s.Linux == nil || s.Linux.Resources == nil || s.Linux.Resources.Pids == nil {
			return errors.New("gVisor limits: the spec has no process or pids limit to move")
		}
		n := uint64(lim.PIDs)
		s.Process.Rlimits = append(s.Process.Rlimits, specs.POSIXRlimit{Type: "RLIMIT_NPROC", Hard: n, Soft: n})
		if s.Linux.Seccomp != nil {
			gvisorENOSYS(s.Linux.Seccomp)
		}
		s.Linux.Resources.Pids.Limit = 2*lim.PIDs + gvisorHostThreads
		for _, m := range s.Mounts {
			if m.Type != "bind" {
				continue
			}
			if fi, err := os.Stat(m.Source); err == nil && fi.Mode()&os.ModeSocket != 0 {
				if s.Annotations == nil {
					s.Annotations = map[string]string{}
				}
				s.Annotations[hostUDSAnnotation] = "open"
			}
		}
		return nil
	}
}

// gvisorENOSYS keeps the profile's ENOSYS answers under gVisor. runsc's --oci-seccomp answers every
// SCMP_ACT_ERRNO rule with EPERM, whatever its errnoRet (runsc/specutils/seccomp), so clone3, which the
// profile refuses with ENOSYS because a filter cannot read its flags, would fail with EPERM, and glibc
// falls back to clone, whose flags the filter checks, only on ENOSYS: every pthread_create would fail
// (git over https, node and npm do). SCMP_ACT_TRACE answers ENOSYS when no tracer is attached (the Sentry
// does what Linux does), so those rules become trace rules. A process of the call that ptraces another
// with PTRACE_O_TRACESECCOMP could let such a call run; it then runs in the Sentry, which checks namespace
// flags against the caller's capabilities itself, and never reaches the host's kernel.
func gvisorENOSYS(sc *specs.LinuxSeccomp) {
	for i, r := range sc.Syscalls {
		if r.Action == specs.ActErrno && r.ErrnoRet != nil && *r.ErrnoRet == uint(unix.ENOSYS) {
			sc.Syscalls[i].Action, sc.Syscalls[i].ErrnoRet = specs.ActTrace, nil
		}
	}
}

// backends returns the runtimes cfg offers by name, and the default one (cfg.RuntimeName, which is a name
// offered or else a containerd runtime handler; RuncHandler itself is RuncRuntime). cfg.RuntimeBinary is
// already resolved (resolveRuntimeBinary).
func backends(cfg Config) (map[string]backend, backend, error) {
	runc := backend{handler: RuncHandler, runc: true}
	if cfg.RuntimeBinary != "" {
		runc.options = &runcoptions.Options{BinaryName: cfg.RuntimeBinary}
	}
	all := map[string]backend{RuncRuntime: runc}
	for name, h := range cfg.Runtimes {
		all[name] = backend{handler: h}
	}
	if cfg.GVisor != nil {
		opts, err := gvisorSetup(cfg.StateDir, *cfg.GVisor)
		if err != nil {
			return nil, backend{}, err
		}
		all[GVisorRuntime] = backend{handler: RuncHandler, options: opts, gvisor: true}
	}
	def, ok := all[cfg.RuntimeName]
	switch {
	case !ok && cfg.RuntimeName == RuncHandler:
		def = runc
	case !ok:
		def = backend{handler: cfg.RuntimeName}
	}
	return all, def, nil
}

// backendFor returns the backend of runtime name ("" is the default).
func (r *Runtime) backendFor(name string) (backend, error) {
	if name == "" {
		return r.def, nil
	}
	b, ok := r.backends[name]
	if !ok {
		return backend{}, fmt.Errorf("runtime %q: this worker offers only %s", name, r.offered())
	}
	return b, nil
}

// Runtimes returns the runtime names this Runtime offers (sandbox.Spec.Runtime), sorted.
func (r *Runtime) Runtimes() []string {
	names := make([]string, 0, len(r.backends))
	for n := range r.backends {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// offered lists the runtime names this Runtime offers, for messages.
func (r *Runtime) offered() string { return strings.Join(r.Runtimes(), ", ") }
