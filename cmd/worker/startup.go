package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/toolpool/toolpool/internal/sandbox/containerd"
)

// listenHealth opens the listener of /metrics, /healthz and /readyz before anything starts: a taken address
// fails the start at once, naming the setting to change.
func listenHealth(addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	switch {
	case errors.Is(err, syscall.EADDRINUSE):
		return nil, fmt.Errorf("address %s is in use by another process: change --listen (listen): %w", addr, err)
	case err != nil:
		return nil, fmt.Errorf("listen on %s: change --listen (listen): %w", addr, err)
	}
	return ln, nil
}

// checkHost checks, before anything starts, what the configuration names on this host: the sandbox
// configuration as containerd.New would refuse it, the programs mounted into the calls' containers (which
// it returns: sandboxBinaries), the OCI runtime binary, gVisor's runsc when a path is given, and the
// containerd socket when one is given. Each error names the setting to change.
func (c *config) checkHost() (runner, init string, err error) {
	if runner, init, err = c.sandboxBinaries(); err != nil {
		return "", "", err
	}
	address := c.ContainerdAddress
	if address == "" {
		address = filepath.Join(c.DataDir, "containerd", "containerd.sock") // the private one's (StartDaemon)
	}
	scfg := c.sandboxConfig(address, runner, init)
	if err := scfg.Validate(); err != nil {
		return "", "", fmt.Errorf("sandbox settings (runtime, runtimes, gvisor, pool): %w", err)
	}
	var errs []error
	if b := c.RuntimeBinary; b != "" && b != containerd.RuntimeBinaryAuto {
		if _, err := exec.LookPath(b); err != nil {
			errs = append(errs, fmt.Errorf("runtime_binary %q: %w: install it, or set --runtime-binary (runtime_binary) to runc, crun, a path or auto", b, err))
		}
	}
	if r := c.GVisor.Runsc; r != "" && !c.GVisor.Disabled {
		if _, err := exec.LookPath(r); err != nil {
			errs = append(errs, fmt.Errorf("gvisor.runsc %q: %w: install gVisor (make gvisor) or correct gvisor.runsc", r, err))
		}
	}
	if c.ContainerdAddress != "" {
		sock := strings.TrimPrefix(c.ContainerdAddress, "unix://")
		fi, err := os.Stat(sock)
		if err == nil && fi.Mode().Type() != os.ModeSocket {
			err = errors.New("not a socket")
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("containerd_address %q: %w: set --containerd-address (containerd_address) to containerd's socket, or leave it empty for a private containerd", c.ContainerdAddress, err))
		}
	}
	return runner, init, errors.Join(errs...)
}
