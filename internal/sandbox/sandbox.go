// Package sandbox declares what a worker needs from a container runtime: run one process in a fresh,
// hardened container and report how it ended. sandbox/containerd implements it; nothing else in toolpool
// knows which runtime is underneath.
package sandbox

import (
	"context"
	"errors"
	"io"
	"time"
)

// ErrNotStarted marks a Run error that came before the process started: nothing of the call ran, so it may
// be retried elsewhere.
var ErrNotStarted = errors.New("process not started")

// ErrNoProgram marks a Run error for a program that does not exist in the container's root filesystem:
// nothing ran, and running it again elsewhere would fail the same way.
var ErrNoProgram = errors.New("program not found in the sandbox")

// ErrNoRuntime marks a Run error for a Spec whose Runtime this sandbox does not offer: nothing ran, and the
// call must not run under another runtime instead (its tenant was given a stronger boundary on purpose).
var ErrNoRuntime = errors.New("sandbox runtime not available")

// ErrImagePull marks a Run error for an image the runtime could not bring in: the registry was down,
// refused the worker's credentials, had no such image, or sent content that did not verify. Nothing ran;
// the error's text says what to fix.
var ErrImagePull = errors.New("image pull failed")

// ErrImageRefused marks a Run error for an image the runtime will not run: a reference that does not parse,
// an image over the size limit, or a layer with content no sandbox root may hold (device nodes, paths
// outside the root). Nothing ran, and nothing of the image is kept.
var ErrImageRefused = errors.New("image refused")

// Mount is an extra bind mount from the host into the container, always read-only unless Writable.
type Mount struct {
	Source      string // host path
	Destination string // absolute path in the container
	Writable    bool
}

// Spec describes one process to run in one fresh container. The runtime adds its hardened defaults (non-root
// user, no capabilities, no_new_privs, seccomp, read-only root, masked /proc and /sys paths, private
// namespaces, the standard devices only; docs/security.md); nothing in a Spec can remove them.
type Spec struct {
	// ID names the container; it must be unique among running containers (the call id is).
	ID   string
	Argv []string
	Env  []string // KEY=VALUE, added to the runtime's base environment
	// Cwd is a clean absolute path, /workspace or beneath it; empty means /workspace. The runtime never lets
	// the OCI runtime resolve it (the workspace is shared and writable): the process starts in /workspace
	// and enters Cwd itself, as the sandbox user.
	Cwd   string
	Stdin []byte
	// WorkspaceDir is the host directory mounted read-write at /workspace: a clean absolute path to a real
	// directory (a symlink there is refused, not followed).
	WorkspaceDir string
	// WorkspaceReadOnly mounts the workspace read-only: nothing in the container can create, change or
	// remove a file in it (EROFS), whatever the process runs. A warm container honours it as a cold one.
	WorkspaceReadOnly bool
	// Hidden are paths in the workspace, relative to it ("a/.env", ".ssh"), that the container must not
	// see: each shows as an empty read-only directory (for a directory) or an empty read-only file, to
	// every program of the container, whatever it runs. A path that is gone when the container is made,
	// or whose last component is a symbolic link, is skipped; one that leads through a symbolic link is
	// an error, and the call does not run. The workspace itself is left as it is.
	Hidden []string
	// ReadOnlyPaths are paths in the workspace, relative to it, that the container sees but cannot
	// change: each is bound read-only onto itself, with everything beneath it (git's control files). A
	// directory named .git is left writable (only a gitfile, a regular file named .git, is bound); a path
	// that is gone is skipped, and a symbolic link is an error (the call does not run). The directories
	// above a hidden or read-only path cannot be renamed in the container.
	ReadOnlyPaths []string
	// Mounts land under /.toolpool only, and never inside another writable mount.
	Mounts []Mount
	Limits Limits
	// Image, when set, is an OCI image reference (registry/repository:tag or @digest) to use as the root
	// filesystem instead of the read-only view of the host's system directories. A runtime that pulls
	// images brings it in from its registry when its store lacks it.
	Image string
	// Tenant is the tenant whose call this is: a runtime that pulls Image uses the registry credentials
	// bound to it (docs/images.md). Empty is a call of no tenant (the worker's own).
	Tenant string
	// OnPull, when set, is told how a pull of Image is going while the call waits for it: from one
	// goroutine, at most every PullReportEvery and when the phase changes, with Done never going back,
	// and a last report of phase PullDone when the image is ready. It is never called for an image the
	// runtime has already. It must return at once.
	OnPull func(PullProgress)
	// Runtime names the sandbox runtime the process must run under ("runc", "gvisor"); empty means the
	// sandbox's default. A name the sandbox does not offer is refused with ErrNoRuntime, never replaced by
	// another runtime. The hardened defaults are the same under every runtime.
	Runtime string
	// TrustedCAs, when set, are PEM certificates the container's programs trust on top of the system's
	// roots (the egress proxy's CA). The runtime adds them to the system bundle the container sees
	// (/etc/ssl/certs/ca-certificates.crt on the host-view root) and points the usual variables at the
	// bundle (SSL_CERT_FILE, CURL_CA_BUNDLE, GIT_SSL_CAINFO, REQUESTS_CA_BUNDLE, PIP_CERT) and at the extra
	// certificates alone (NODE_EXTRA_CA_CERTS). Only certificates enter the container, never a key.
	TrustedCAs []byte
	// Stdout and Stderr, when set, receive every byte the process prints on that stream, in order, as it is
	// printed, besides the capped capture in the Outcome. They are called from the runtime's output copy:
	// one that blocks holds up the process's output, so they must return at once and never fail.
	Stdout, Stderr io.Writer
}

// PullProgress is how far a pull of a call's image is: Done of Total bytes of its content (the config
// and layers, compressed, as the manifest gives them) are in the runtime's store. Total is zero until the
// manifest is read.
type PullProgress struct {
	Image       string
	Done, Total int64
	Phase       string // PullFetching, PullUnpacking or PullDone
}

// The phases of a pull.
const (
	PullFetching  = "fetching"
	PullUnpacking = "unpacking"
	PullDone      = "done"
)

// PullReportEvery is how often, at most, Spec.OnPull is told of a pull's bytes.
const PullReportEvery = 250 * time.Millisecond

// Limits bound the container. Zero values mean the runtime's configured default.
type Limits struct {
	Timeout     time.Duration
	OutputBytes int64 // cap on each of stdout and stderr
	MemoryBytes int64
	PIDs        int64
	CPUMillis   int64 // thousandths of a CPU
	NoFile      uint64
	TmpBytes    int64 // size of the tmpfs at /tmp
	// WorkspaceBytes is the workspace's quota: the disk space (allocated blocks, as du counts them) the whole
	// tree under WorkspaceDir may use. The runtime caps any one file at it (RLIMIT_FSIZE, SIGXFSZ), measures
	// the tree while the call runs and kills the call when it grows past the quota (QuotaExceeded), and
	// reports the final size. A running call can overshoot by what it writes in one measuring interval. Zero
	// means the runtime's default; a negative value turns the quota off (measuring and capping alike).
	WorkspaceBytes int64
	// Network records that egress was granted. The container's network namespace keeps loopback only
	// either way: egress goes through the egress proxy's socket, which the caller mounts.
	Network bool
}

// Outcome is how the process ended and what it printed.
type Outcome struct {
	ExitCode int
	Signal   string // the signal that ended the process, if one did ("SIGKILL")
	TimedOut bool
	// OOMKilled reports that the kernel's OOM killer killed a process of the call because the container
	// reached its memory limit (the process that died need not be the first one).
	OOMKilled bool
	// QuotaExceeded reports that the workspace grew past Limits.WorkspaceBytes while the call ran (the call
	// was then killed) or was over it when the call ended. A single file stops at the quota: its writer gets
	// SIGXFSZ, which is Signal when the writer was the call's own process.
	QuotaExceeded bool
	Stdout        Captured
	Stderr        Captured
	// MaxRSSBytes is the peak memory of the container's cgroup (on cgroup v2 before Linux 5.19, which keeps
	// no peak, its usage at the end); CPUTime its CPU time.
	MaxRSSBytes int64
	CPUTime     time.Duration
	// WorkspaceBytes is the workspace's size on disk when the call ended, measured without following
	// symlinks; -1 when there is no workspace, no quota to measure it for, or it could not be measured.
	WorkspaceBytes int64
	// Warm reports that the call ran in a container created ahead of it (a runtime's pool) rather than one
	// created for it; either way the container was fresh and served this call only. ColdReason says why a
	// runtime with a pool ran the call cold ("empty", "mounts", ...); empty without a pool.
	Warm       bool
	ColdReason string
	// Image names the image the call ran on by digest (registry/repository@sha256:...), empty on the
	// host view.
	Image string
	// ContainerID names the container the call ran in: the call's ID when cold, a pooled container's own
	// ID when warm.
	ContainerID string
	// SandboxTime covers creating (or, when warm, claiming) and starting the container, RunTime the
	// process's life and CleanupTime the teardown.
	SandboxTime time.Duration
	RunTime     time.Duration
	CleanupTime time.Duration
	// Steps are the steps of this Run as the runtime timed them, in the order they ran (a call on an
	// image starts with image: finding it in the store, or pulling it; then a warm call:
	// claim, bind_workspace, hide (with Hidden), limits, request, then run, drain_io, usage, workspace_size; a cold one:
	// create_container, create_task, wait, start, then the same). They account for Run's time between its
	// start and its return; removal after Run returns is not among them. A runtime that does not time its
	// steps leaves it empty.
	Steps []Step
}

// Step is one timed step of a Run.
type Step struct {
	Name string
	Took time.Duration
}

// Runtime runs processes in fresh containers.
type Runtime interface {
	// Run creates a container for spec, runs its process to completion or until the spec's timeout (which
	// kills every process of the container and sets TimedOut), and returns once the process is gone and
	// its output and usage are collected. Removing the container may finish after Run returns; the
	// runtime owns that and completes it before it closes.
	// A non-zero exit is not an error: err reports only that the runtime itself failed. Cancelling ctx kills
	// the container, like a timeout, and Run returns ctx's error with whatever was captured. Safe for
	// concurrent use.
	Run(ctx context.Context, spec Spec) (Outcome, error)
}
