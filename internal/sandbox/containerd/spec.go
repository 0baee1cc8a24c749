package containerd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"

	"github.com/containerd/containerd/containers"
	"github.com/containerd/containerd/contrib/seccomp"
	"github.com/containerd/containerd/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/toolpool/toolpool/internal/sandbox"
)

// baseEnv is every sandbox process's environment before the call's own variables.
var baseEnv = []string{
	"PATH=/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	"HOME=/tmp",
	"LANG=C.UTF-8",
	"TMPDIR=/tmp",
}

// deniedSyscalls are removed from the runtime's default seccomp allow list. containerd 1.6 and 1.7 let
// io_uring through, and io_uring has been the source of many kernel escalations (containerd 2.x and Docker
// block it too). socketcall is the 32-bit x86 multiplexer whose arguments seccomp cannot see, so it would
// bypass the socket family filter below; 32-bit programs on kernels since 4.3 use the direct calls.
var deniedSyscalls = []string{"io_uring_setup", "io_uring_enter", "io_uring_register", "socketcall"}

// nativeArch is the only system call ABI a sandboxed process may use. containerd's default also admits
// the 32-bit compat ABIs (x86 and x32 on amd64, arm on arm64): the compat layer is a large, separate body of
// kernel code that has carried exploitable bugs of its own (CVE-2021-22555 came in through a compat
// setsockopt), and the syscall-argument filters below would need their compat twins (socketcall). A
// 32-bit binary is refused, not emulated. Fewer ABIs also make the filter smaller and runc faster to load it.
var nativeArch = map[string]specs.Arch{"amd64": specs.ArchX86_64, "arm64": specs.ArchAARCH64}

// allowedSocketFamilies are the only address families socket(2) may create: local, IPv4, IPv6 and netlink
// (getifaddrs). Everything else is refused with EPERM, above all AF_VSOCK, which is not isolated by the
// network namespace and reaches the host (or hypervisor) directly, and the rarely used, module-loaded
// families (AF_TIPC, AF_RDS, AF_ALG, ...) that have carried unprivileged kernel exploits. AF_PACKET and
// raw sockets are refused as well; without CAP_NET_RAW the kernel would refuse them anyway.
var allowedSocketFamilies = []uint64{syscall.AF_UNIX, syscall.AF_INET, syscall.AF_INET6, syscall.AF_NETLINK}

// maskedPaths are covered (files with /dev/null, directories with an empty read-only tmpfs) whatever the
// base spec said: the kernel's memory, keys, timers and hardware details that leak host state.
var maskedPaths = []string{
	"/proc/acpi", "/proc/asound", "/proc/interrupts", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
	"/proc/sched_debug", "/proc/scsi", "/proc/timer_list", "/proc/timer_stats",
	"/sys/devices/virtual/powercap", "/sys/firmware",
}

// readonlyPaths are remounted read-only inside /proc: the kernel's knobs (/proc/sys), the magic SysRq
// trigger and the bus, fs and irq views.
var readonlyPaths = []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"}

// sandboxOOMScoreAdj makes the kernel's OOM killer, when the whole host runs out of memory, pick a
// sandbox process before the worker, containerd or anything else on the host.
const sandboxOOMScoreAdj = 1000

// cwdTrampoline enters the call's working directory from inside the container, as the sandbox user, after
// runc has handed over: runc itself only ever changes into /workspace, the root of a mount that no call can
// replace. A working directory below it lives in the shared, writable workspace, where an earlier or a
// concurrent call may have planted a symlink; runc resolving such a path while it still holds host
// descriptors is how CVE-2024-21626 escaped, and creating it is the CVE-2024-45310 pattern. The shell
// resolves it with no host descriptor open and no privilege, so a symlink leads only to another place in
// the container. $1 is the directory and the rest is the call's argv.
const cwdTrampoline = `cd -- "$1" 2>/dev/null || { echo "toolpool: cannot change to the working directory $1: it does not exist or is not a directory" >&2; exit 126; }; shift; exec "$@"`

// processArgs returns the argv and working directory runc starts, for a call whose clean working
// directory is cwd. hostRoot reports whether the root is the host view, which has /bin/sh.
func processArgs(argv []string, cwd string, hostRoot bool) ([]string, string, error) {
	if cwd == workspaceDir {
		return argv, cwd, nil
	}
	if !hostRoot {
		return nil, "", fmt.Errorf("working directory %s: an image root runs only in %s, because an image may have no shell to enter a directory of the shared workspace safely", cwd, workspaceDir)
	}
	return append([]string{"/bin/sh", "-c", cwdTrampoline, "toolpool-cwd", cwd}, argv...), workspaceDir, nil
}

// checkCwd returns the call's clean working directory: /workspace (for an empty cwd) or a directory beneath
// it, given as a clean absolute path.
func checkCwd(cwd string) (string, error) {
	if cwd == "" {
		return workspaceDir, nil
	}
	if !path.IsAbs(cwd) || path.Clean(cwd) != cwd {
		return "", fmt.Errorf("working directory %q: it must be a clean absolute path", cwd)
	}
	if cwd != workspaceDir && !strings.HasPrefix(cwd, workspaceDir+"/") {
		return "", fmt.Errorf("working directory %s: it must be %s or beneath it", cwd, workspaceDir)
	}
	return cwd, nil
}

// hardenedSpec returns the spec options for one call. The hardened options come last so that nothing the
// call contributes (arguments, environment, mounts) can undo them.
func (r *Runtime) hardenedSpec(argv []string, cwd string, spec sandbox.Spec, lim sandbox.Limits, rootPath string, mounts []specs.Mount) []oci.SpecOpts {
	opts := []oci.SpecOpts{
		oci.WithProcessArgs(argv...),
		oci.WithProcessCwd(cwd),
		oci.WithEnv(append(slices.Clone(baseEnv), spec.Env...)),
		oci.WithHostname("toolpool"),
		oci.WithMounts(mounts),
	}
	if rootPath != "" {
		opts = append(opts, oci.WithRootFSPath(rootPath))
	}
	opts = append(opts,
		oci.WithRootFSReadonly(),
		oci.WithUIDGID(r.cfg.UID, r.cfg.GID),
		withoutCapabilities,
		oci.WithNoNewPrivileges,
		withSeccomp,
		oci.WithCgroup(r.cgroupsPath(spec.ID)),
		oci.WithMemoryLimit(uint64(lim.MemoryBytes)),
		oci.WithMemorySwap(lim.MemoryBytes), // no swap beyond the memory limit
		oci.WithPidsLimit(lim.PIDs),
		oci.WithCPUCFS(lim.CPUMillis*100, 100000), // quota per 100ms period
		withRlimits(lim),
		withPrivateNamespaces,
		withRootfsPropagation,
		withMaskedPaths,
		withDefaultDevicesOnly,
		withHardenedMounts,
		withOOMScoreAdj,
	)
	return opts
}

// withoutCapabilities drops every capability from every set.
func withoutCapabilities(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
	if s.Process == nil {
		s.Process = &specs.Process{}
	}
	s.Process.Capabilities = &specs.LinuxCapabilities{}
	return nil
}

// withSeccomp installs containerd's default profile for the spec (computed after the capabilities are
// dropped, so none of the rules that only CAP_SYS_ADMIN, CAP_SYS_PTRACE and the like unlock are present),
// minus deniedSyscalls, with socket(2) and socketpair(2) restricted to allowedSocketFamilies. The result is
// stricter than the default of every containerd release; seccompProfile is the same profile, for tests.
func withSeccomp(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
	if s.Linux == nil {
		s.Linux = &specs.Linux{}
	}
	s.Linux.Seccomp = seccompProfile(s)
	return nil
}

func seccompProfile(s *oci.Spec) *specs.LinuxSeccomp {
	profile := seccomp.DefaultProfile(s)
	if native, ok := nativeArch[runtime.GOARCH]; ok && slices.Contains(profile.Architectures, native) {
		profile.Architectures = []specs.Arch{native}
	}
	restricted := []string{"socket", "socketpair"}
	for i := range profile.Syscalls {
		if profile.Syscalls[i].Action != specs.ActAllow {
			continue
		}
		profile.Syscalls[i].Names = slices.DeleteFunc(profile.Syscalls[i].Names, func(n string) bool {
			return slices.Contains(deniedSyscalls, n) || slices.Contains(restricted, n)
		})
	}
	profile.Syscalls = slices.DeleteFunc(profile.Syscalls, func(sc specs.LinuxSyscall) bool { return len(sc.Names) == 0 })
	// One rule per family: libseccomp allows the call when any rule matches.
	for _, family := range allowedSocketFamilies {
		profile.Syscalls = append(profile.Syscalls, specs.LinuxSyscall{
			Names:  []string{"socket"},
			Action: specs.ActAllow,
			Args:   []specs.LinuxSeccompArg{{Index: 0, Value: family, Op: specs.OpEqualTo}},
		})
	}
	profile.Syscalls = append(profile.Syscalls, specs.LinuxSyscall{
		Names:  []string{"socketpair"},
		Action: specs.ActAllow,
		Args:   []specs.LinuxSeccompArg{{Index: 0, Value: syscall.AF_UNIX, Op: specs.OpEqualTo}},
	})
	return profile
}

// withRlimits caps open files and, when the workspace has a quota, the size of any one file; it forbids
// core dumps.
func withRlimits(lim sandbox.Limits) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		s.Process.Rlimits = []specs.POSIXRlimit{
			{Type: "RLIMIT_NOFILE", Hard: lim.NoFile, Soft: lim.NoFile},
			{Type: "RLIMIT_CORE", Hard: 0, Soft: 0},
		}
		if lim.WorkspaceBytes > 0 {
			n := uint64(lim.WorkspaceBytes)
			s.Process.Rlimits = append(s.Process.Rlimits, specs.POSIXRlimit{Type: "RLIMIT_FSIZE", Hard: n, Soft: n})
		}
		return nil
	}
}

// withMaskedPaths masks and write-protects the /proc and /sys paths that leak or change host state.
func withMaskedPaths(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
	if s.Linux == nil {
		s.Linux = &specs.Linux{}
	}
	s.Linux.MaskedPaths = slices.Clone(maskedPaths)
	s.Linux.ReadonlyPaths = slices.Clone(readonlyPaths)
	return nil
}

// withDefaultDevicesOnly leaves the container the devices runc always creates (null, zero, full, random,
// urandom, tty, and ptmx with its private devpts) and nothing else: no device nodes in the spec, and a
// device cgroup that denies every other device, so that a node planted in a mount cannot be opened either.
func withDefaultDevicesOnly(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
	if s.Linux == nil {
		s.Linux = &specs.Linux{}
	}
	s.Linux.Devices = nil
	if s.Linux.Resources == nil {
		s.Linux.Resources = &specs.LinuxResources{}
	}
	s.Linux.Resources.Devices = []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}}
	return nil
}

// withHardenedMounts makes every mount nosuid, and every mount but /dev itself (whose device nodes runc
// creates) nodev, whatever the base spec or the call asked for.
func withHardenedMounts(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
	for i := range s.Mounts {
		m := &s.Mounts[i]
		m.Options = slices.DeleteFunc(slices.Clone(m.Options), func(o string) bool { return o == "suid" || o == "dev" })
		if !slices.Contains(m.Options, "nosuid") {
			m.Options = append(m.Options, "nosuid")
		}
		if m.Destination != "/dev" && !slices.Contains(m.Options, "nodev") {
			m.Options = append(m.Options, "nodev")
		}
	}
	return nil
}

// withOOMScoreAdj makes sandbox processes the host OOM killer's first choice.
func withOOMScoreAdj(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
	adj := sandboxOOMScoreAdj
	s.Process.OOMScoreAdj = &adj
	return nil
}

// withRootfsPropagation makes every mount of the container a slave of the host's (rslave): mounts the host
// makes under a bind source reach the container, nothing the container mounts reaches the host. It is
// runc's default, set explicitly so that crun (whose default is rprivate) behaves the same; the pool's
// workspace slot relies on it.
func withRootfsPropagation(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
	if s.Linux == nil {
		s.Linux = &specs.Linux{}
	}
	s.Linux.RootfsPropagation = "rslave"
	return nil
}

// withPrivateNamespaces makes sure the container has its own PID, IPC, UTS, mount and network (loopback
// only) namespaces, whatever the base spec said, and joins no existing one.
func withPrivateNamespaces(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
	if s.Linux == nil {
		s.Linux = &specs.Linux{}
	}
	for _, t := range []specs.LinuxNamespaceType{specs.PIDNamespace, specs.IPCNamespace, specs.UTSNamespace, specs.MountNamespace, specs.NetworkNamespace} {
		found := false
		for i, ns := range s.Linux.Namespaces {
			if ns.Type == t {
				s.Linux.Namespaces[i].Path = "" // never join an existing one
				found = true
			}
		}
		if !found {
			s.Linux.Namespaces = append(s.Linux.Namespaces, specs.LinuxNamespace{Type: t})
		}
	}
	return nil
}

// callMounts returns the mounts of one call: the root's own binds, /tmp, the workspace and the extras. Extra
// mounts go under /.toolpool only, and no mount may land inside another writable mount: runc resolving a
// mount destination inside a directory that another, running container can change is the race of
// CVE-2024-45310 and of the 2025 mount CVEs, so the shared workspace is only ever a mount's source, never
// the place one lands.
func callMounts(base []specs.Mount, spec sandbox.Spec, lim sandbox.Limits) ([]specs.Mount, error) {
	mounts := slices.Clone(base)
	mounts = append(mounts, specs.Mount{
		Type: "tmpfs", Source: "tmpfs", Destination: "/tmp",
		Options: []string{"nosuid", "nodev", "mode=1777", fmt.Sprintf("size=%d", lim.TmpBytes)},
	})
	if spec.WorkspaceDir != "" {
		if err := checkWorkspaceDir(spec.WorkspaceDir); err != nil {
			return nil, err
		}
		mode, bind := "rw", "bind"
		if spec.WorkspaceReadOnly {
			mode = "ro"
		}
		if needsMasks(spec) {
			bind = "rbind" // WorkspaceDir is the call's view: the workspace with its masks (makeView)
		}
		mounts = append(mounts, specs.Mount{
			Type: "bind", Source: spec.WorkspaceDir, Destination: workspaceDir,
			Options: []string{bind, mode, "nosuid", "nodev"},
		})
	}
	for _, m := range spec.Mounts {
		if !strings.HasPrefix(m.Destination, toolpoolDir+"/") || path.Clean(m.Destination) != m.Destination {
			return nil, fmt.Errorf("mount %s: extra mounts must go under %s, as a clean path", m.Destination, toolpoolDir)
		}
		if !path.IsAbs(m.Source) {
			return nil, fmt.Errorf("mount %s: source %q must be an absolute host path", m.Destination, m.Source)
		}
		mode := "ro"
		if m.Writable {
			mode = "rw"
		}
		mounts = append(mounts, specs.Mount{Type: "bind", Source: m.Source, Destination: m.Destination,
			Options: []string{"bind", mode, "nosuid", "nodev"}})
	}
	if err := checkMountNesting(mounts); err != nil {
		return nil, err
	}
	return mounts, nil
}

// checkWorkspaceDir checks a workspace's host directory before it is mounted: the OCI runtime resolves a
// bind source on the host, following symlinks, so it must be a real directory named by a clean absolute
// path.
func checkWorkspaceDir(dir string) error {
	if !filepath.IsAbs(dir) || filepath.Clean(dir) != dir {
		return fmt.Errorf("workspace %q: it must be a clean absolute path", dir)
	}
	if fi, err := os.Lstat(dir); err != nil {
		return fmt.Errorf("workspace %s: %w", dir, err)
	} else if !fi.IsDir() {
		return fmt.Errorf("workspace %s: it is not a directory (a symlink is not followed)", dir)
	}
	return nil
}

// checkMountNesting refuses a mount whose destination lies inside a writable mount's destination.
func checkMountNesting(mounts []specs.Mount) error {
	var errs []error
	for _, w := range mounts {
		if slices.Contains(w.Options, "ro") {
			continue
		}
		for _, m := range mounts {
			if strings.HasPrefix(m.Destination, strings.TrimSuffix(w.Destination, "/")+"/") {
				errs = append(errs, fmt.Errorf("mount %s: it lands inside the writable mount %s", m.Destination, w.Destination))
			}
		}
	}
	return errors.Join(errs...)
}

// signalName names the signal behind a 128+N exit status, or "" when the status is an ordinary exit.
func signalName(exitCode uint32) string {
	if exitCode <= 128 || exitCode > 128+64 {
		return ""
	}
	sig := syscall.Signal(exitCode - 128)
	switch sig {
	case syscall.SIGKILL:
		return "SIGKILL"
	case syscall.SIGTERM:
		return "SIGTERM"
	case syscall.SIGSEGV:
		return "SIGSEGV"
	case syscall.SIGABRT:
		return "SIGABRT"
	case syscall.SIGINT:
		return "SIGINT"
	case syscall.SIGPIPE:
		return "SIGPIPE"
	case syscall.SIGBUS:
		return "SIGBUS"
	case syscall.SIGXCPU:
		return "SIGXCPU"
	case syscall.SIGXFSZ:
		return "SIGXFSZ"
	}
	return fmt.Sprintf("signal %d", int(sig))
}
