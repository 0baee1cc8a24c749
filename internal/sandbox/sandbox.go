// Package sandbox declares what a worker needs from a container runtime: run one process in a fresh,
// hardened container and report how it ended. sandbox/containerd implements it; nothing else in toolpool
// knows which runtime is underneath.
package sandbox

import (
	"context"
	"errors"
	"time"
)

// ErrNotStarted marks a Run error that came before the process started: nothing of the call ran, so it may
// be retried elsewhere.
var ErrNotStarted = errors.New("process not started")

// Mount is an extra bind mount from the host into the container, always read-only unless Writable.
type Mount struct {
	Source      string // host path
	Destination string // absolute path in the container
	Writable    bool
}

// Spec describes one process to run in one fresh container. The runtime adds its hardened defaults (non-root
// user, no capabilities, no_new_privs, seccomp, read-only root, private namespaces); nothing in a Spec can
// remove them.
type Spec struct {
	// ID names the container; it must be unique among running containers (the call id is).
	ID   string
	Argv []string
	Env  []string // KEY=VALUE, added to the runtime's base environment
	// Cwd is an absolute path inside the container; empty means /workspace.
	Cwd   string
	Stdin []byte
	// WorkspaceDir is the host directory mounted read-write at /workspace.
	WorkspaceDir string
	Mounts       []Mount
	Limits       Limits
	// Image, when set, names an OCI image in the runtime's store to use as the root filesystem instead of
	// the read-only view of the host's system directories.
	Image string
}

// Limits bound the container. Zero values mean the runtime's configured default.
type Limits struct {
	Timeout     time.Duration
	OutputBytes int64 // cap on each of stdout and stderr
	MemoryBytes int64
	PIDs        int64
	CPUMillis   int64 // thousandths of a CPU
	NoFile      uint64
	TmpBytes    int64 // size of the tmpfs at /tmp
	Network     bool  // egress granted: the container shares no network, this only keeps loopback today
}

// Outcome is how the process ended and what it printed.
type Outcome struct {
	ExitCode  int
	Signal    string // the signal that ended the process, if one did ("SIGKILL")
	TimedOut  bool
	OOMKilled bool
	Stdout    Captured
	Stderr    Captured
	// MaxRSSBytes is the peak memory of the container's cgroup; CPUTime its CPU time.
	MaxRSSBytes int64
	CPUTime     time.Duration
	// SandboxTime covers creating and starting the container, RunTime the process's life and CleanupTime
	// the teardown.
	SandboxTime time.Duration
	RunTime     time.Duration
	CleanupTime time.Duration
}

// Runtime runs processes in fresh containers.
type Runtime interface {
	// Run creates a container for spec, runs its process to completion or until the spec's timeout (which
	// kills every process of the container and sets TimedOut), and removes the container before returning.
	// A non-zero exit is not an error: err reports only that the runtime itself failed. Cancelling ctx kills
	// the container, like a timeout, and Run returns ctx's error with whatever was captured. Safe for
	// concurrent use.
	Run(ctx context.Context, spec Spec) (Outcome, error)
}
