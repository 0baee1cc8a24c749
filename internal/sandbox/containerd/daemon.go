package containerd

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// DaemonConfig configures a private containerd.
type DaemonConfig struct {
	// Dir holds the daemon's root, state, socket, config and log; the daemon owns nothing outside it.
	Dir string
	// Binary is the containerd executable; empty means "containerd" on PATH.
	Binary string
	// StartTimeout bounds how long StartDaemon waits for the socket to answer.
	StartTimeout time.Duration
}

// Daemon is a containerd process that a worker (or a test) started and owns.
type Daemon struct {
	cmd     *exec.Cmd
	address string
	logPath string
	done    chan struct{}
	waitErr error
	once    sync.Once
}

// Address is the daemon's gRPC socket.
func (d *Daemon) Address() string { return d.address }

// daemonConfigTOML disables the plugins a per-call runtime never uses (CRI above all) so the daemon starts in
// milliseconds and listens only on its own socket.
const daemonConfigTOML = `version = 2
root = %q
state = %q
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.internal.v1.tracing", "io.containerd.tracing.processor.v1.otlp"]

[grpc]
  address = %q

[ttrpc]
  address = %q

[debug]
  level = "warn"
`

// StartDaemon starts a private containerd under cfg.Dir and waits until its socket answers. The daemon is
// killed if this process dies (Pdeathsig), so a crashed worker never leaves one running; the caller must
// Stop it. A previous daemon's socket under the same Dir is removed first.
func StartDaemon(ctx context.Context, cfg DaemonConfig) (_ *Daemon, retErr error) {
	if cfg.Binary == "" {
		cfg.Binary = "containerd"
	}
	if cfg.StartTimeout == 0 {
		cfg.StartTimeout = 20 * time.Second
	}
	bin, err := exec.LookPath(cfg.Binary)
	if err != nil {
		return nil, fmt.Errorf("find containerd binary %q (install it with 'apt-get install containerd runc'): %w", cfg.Binary, err)
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("resolve containerd dir: %w", err)
	}
	for _, d := range []string{"root", "state"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			return nil, fmt.Errorf("create containerd dir: %w", err)
		}
	}
	address := filepath.Join(dir, "containerd.sock")
	if len(address) > 100 {
		return nil, fmt.Errorf("containerd socket path %s is %d bytes: unix sockets allow about 100, choose a shorter data dir", address, len(address))
	}
	_ = os.Remove(address)
	_ = os.Remove(address + ".ttrpc")
	configPath := filepath.Join(dir, "config.toml")
	conf := fmt.Sprintf(daemonConfigTOML, filepath.Join(dir, "root"), filepath.Join(dir, "state"), address, address+".ttrpc")
	if err := os.WriteFile(configPath, []byte(conf), 0o600); err != nil {
		return nil, fmt.Errorf("write containerd config: %w", err)
	}
	logPath := filepath.Join(dir, "containerd.log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open containerd log: %w", err)
	}
	defer logFile.Close()

	cmd := exec.Command(bin, "--config", configPath)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start containerd: %w", err)
	}
	d := &Daemon{cmd: cmd, address: address, logPath: logPath, done: make(chan struct{})}
	go func() {
		d.waitErr = cmd.Wait()
		close(d.done)
	}()
	defer func() {
		if retErr != nil {
			d.Stop(context.WithoutCancel(ctx))
		}
	}()

	deadline := time.NewTimer(cfg.StartTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if c, err := net.DialTimeout("unix", address, time.Second); err == nil {
			c.Close()
			return d, nil
		}
		select {
		case <-d.done:
			return nil, fmt.Errorf("start containerd: exited early (%v); see %s", d.waitErr, logPath)
		case <-deadline.C:
			return nil, fmt.Errorf("start containerd: socket %s not ready after %s; see %s", address, cfg.StartTimeout, logPath)
		case <-ctx.Done():
			return nil, fmt.Errorf("start containerd: %w", ctx.Err())
		case <-tick.C:
		}
	}
}

// Stop terminates the daemon: SIGTERM, then SIGKILL when ctx ends or after 10 seconds. It is idempotent and
// safe to call concurrently. Shims of tasks that still run are left to their own exit; delete tasks first.
func (d *Daemon) Stop(ctx context.Context) error {
	d.once.Do(func() {
		_ = d.cmd.Process.Signal(syscall.SIGTERM)
		t := time.NewTimer(10 * time.Second)
		defer t.Stop()
		select {
		case <-d.done:
		case <-t.C:
			_ = d.cmd.Process.Kill()
			<-d.done
		case <-ctx.Done():
			_ = d.cmd.Process.Kill()
			<-d.done
		}
	})
	var exitErr *exec.ExitError
	if d.waitErr != nil && !errors.As(d.waitErr, &exitErr) {
		return fmt.Errorf("stop containerd: %w", d.waitErr)
	}
	return nil
}

// Done is closed when the daemon process has exited.
func (d *Daemon) Done() <-chan struct{} { return d.done }
