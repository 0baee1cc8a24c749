package containerd

import (
	"context"
	"fmt"
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

// deniedSyscalls are removed from the runtime's default seccomp allow list: containerd 1.6 and 1.7 let
// io_uring through, and io_uring has been the source of many kernel escalations.
var deniedSyscalls = []string{"io_uring_setup", "io_uring_enter", "io_uring_register"}

// hardenedSpec returns the spec options for one call. The hardened options come last so that nothing the
// call contributes (arguments, environment, mounts) can undo them.
func (r *Runtime) hardenedSpec(spec sandbox.Spec, lim sandbox.Limits, rootPath string, mounts []specs.Mount) []oci.SpecOpts {
	cwd := spec.Cwd
	if cwd == "" {
		cwd = workspaceDir
	}
	opts := []oci.SpecOpts{
		oci.WithProcessArgs(spec.Argv...),
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
		oci.WithCgroup("/"+r.cfg.Namespace+"/"+spec.ID),
		oci.WithMemoryLimit(uint64(lim.MemoryBytes)),
		oci.WithMemorySwap(lim.MemoryBytes), // no swap beyond the memory limit
		oci.WithPidsLimit(lim.PIDs),
		oci.WithCPUCFS(lim.CPUMillis*100, 100000), // quota per 100ms period
		withRlimits(lim.NoFile),
		withPrivateNetwork,
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

// withSeccomp installs containerd's default profile for the spec, minus deniedSyscalls.
func withSeccomp(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
	profile := seccomp.DefaultProfile(s)
	for i := range profile.Syscalls {
		if profile.Syscalls[i].Action != specs.ActAllow {
			continue
		}
		profile.Syscalls[i].Names = slices.DeleteFunc(profile.Syscalls[i].Names, func(n string) bool {
			return slices.Contains(deniedSyscalls, n)
		})
	}
	profile.Syscalls = slices.DeleteFunc(profile.Syscalls, func(sc specs.LinuxSyscall) bool { return len(sc.Names) == 0 })
	if s.Linux == nil {
		s.Linux = &specs.Linux{}
	}
	s.Linux.Seccomp = profile
	return nil
}

// withRlimits caps open files and forbids core dumps.
func withRlimits(nofile uint64) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		s.Process.Rlimits = []specs.POSIXRlimit{
			{Type: "RLIMIT_NOFILE", Hard: nofile, Soft: nofile},
			{Type: "RLIMIT_CORE", Hard: 0, Soft: 0},
		}
		return nil
	}
}

// withPrivateNetwork makes sure the container has its own network namespace (loopback only), whatever the
// base spec said.
func withPrivateNetwork(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
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

// callMounts returns the mounts of one call: the root's own binds, /tmp, the workspace and the extras.
func callMounts(base []specs.Mount, spec sandbox.Spec, lim sandbox.Limits) ([]specs.Mount, error) {
	mounts := slices.Clone(base)
	mounts = append(mounts, specs.Mount{
		Type: "tmpfs", Source: "tmpfs", Destination: "/tmp",
		Options: []string{"nosuid", "nodev", "mode=1777", fmt.Sprintf("size=%d", lim.TmpBytes)},
	})
	if spec.WorkspaceDir != "" {
		mounts = append(mounts, specs.Mount{
			Type: "bind", Source: spec.WorkspaceDir, Destination: workspaceDir,
			Options: []string{"bind", "rw", "nosuid", "nodev"},
		})
	}
	for _, m := range spec.Mounts {
		if !strings.HasPrefix(m.Destination, toolpoolDir+"/") {
			return nil, fmt.Errorf("mount %s: extra mounts must go under %s", m.Destination, toolpoolDir)
		}
		mode := "ro"
		if m.Writable {
			mode = "rw"
		}
		mounts = append(mounts, specs.Mount{Type: "bind", Source: m.Source, Destination: m.Destination,
			Options: []string{"bind", mode, "nosuid", "nodev"}})
	}
	return mounts, nil
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
