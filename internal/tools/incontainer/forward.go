package incontainer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"syscall"

	"github.com/toolpool/toolpool/internal/tools/egress"
)

const (
	// ForwardCommand is the runner's sub-command that runs a command behind the egress forwarder:
	// RunnerPath ForwardCommand -- ARGV...
	ForwardCommand = "egress-forward"
	// ForwarderAddr is where the forwarder listens inside a call's container: its own loopback, so the
	// fixed port conflicts with nothing outside the container.
	ForwarderAddr = "127.0.0.1:3128"
)

// ProxyEnv is the environment that makes programs in a call's container use the forwarder: the upper- and
// lower-case proxy variables (curl and git read only the lower-case http_proxy; Go, npm and pip read
// either), and NO_PROXY for the container's own loopback.
func ProxyEnv() []string {
	u := "http://" + ForwarderAddr
	no := "localhost,127.0.0.1,::1"
	return []string{"HTTP_PROXY=" + u, "HTTPS_PROXY=" + u, "http_proxy=" + u, "https_proxy=" + u, "NO_PROXY=" + no, "no_proxy=" + no}
}

// ForwardMain is the process a command with egress starts as (its argv is RunnerPath, ForwardCommand,
// "--" and the command): it listens on addr (ForwarderAddr in a container), starts the command as its child with the same
// environment, standard streams and working directory, and forwards each connection to the egress proxy at
// socket (egress.Forward) until the command exits; then it exits with the command's status (128+N when a
// signal N killed it). It is the container's first process, so the forwarder cannot outlive the call: when
// it exits, the kernel kills every process left in the container. It reaps every orphan meanwhile, and
// passes SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 on to the command. It blocks; cancelling ctx
// stops forwarding (the command keeps running without network).
func ForwardMain(ctx context.Context, args []string, addr, socket string, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "--" {
		args = args[1:]
	}
	if len(args) == 0 {
		fmt.Fprintln(stderr, "usage: runner "+ForwardCommand+" -- COMMAND [ARG...]")
		return 2
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintf(stderr, "toolpool: start the egress forwarder: %v\n", err)
		return 126
	}
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go egress.Forward(fctx, l, socket) //nolint:errcheck // it fails only with its listener, which only ctx closes
	program, err := exec.LookPath(args[0])
	if err != nil {
		fmt.Fprintf(stderr, "toolpool: run %s: %v\n", args[0], err)
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			return 127
		}
		return 126
	}
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2)
	defer signal.Stop(sigs)
	proc, err := os.StartProcess(program, args, &os.ProcAttr{Env: os.Environ(), Files: []*os.File{os.Stdin, os.Stdout, os.Stderr}})
	if err != nil {
		fmt.Fprintf(stderr, "toolpool: run %s: %v\n", args[0], err)
		return 126
	}
	go func() {
		for s := range sigs {
			_ = proc.Signal(s)
		}
	}()
	return reap(proc.Pid)
}

// reap waits for every child, the orphans a first process inherits included, until child exits, and
// returns child's exit status.
func reap(child int) int {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, 0, nil)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			return 126 // ECHILD: the child is gone without a status we could read
		}
		if pid != child {
			continue
		}
		if ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ws.ExitStatus()
	}
}
