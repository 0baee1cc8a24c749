package worker

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/tools/egress"
)

// serveEgress starts the egress proxy of one call on a unix socket of its own, under the call's rules: the
// operator's base rules, narrowed to the domains policy allowed. The socket is mounted into that call's
// container only; the container has no other way out. stop shuts the proxy down and removes the socket.
func (w *Worker) serveEgress(ctx context.Context, c *call.Call) (socket string, stop func(), err error) {
	if w.cfg.EgressDir == "" {
		return "", nil, fmt.Errorf("serve egress for call %s: no egress dir configured", c.ID)
	}
	if err := os.MkdirAll(w.cfg.EgressDir, 0o711); err != nil {
		return "", nil, fmt.Errorf("create egress dir: %w", err)
	}
	rules := w.cfg.EgressRules
	if len(c.Limits.AllowedDomains) > 0 {
		rules.AllowDomains = c.Limits.AllowedDomains
	}
	proxy, err := egress.New(rules)
	if err != nil {
		return "", nil, fmt.Errorf("create egress proxy for call %s: %w", c.ID, err)
	}
	socket = filepath.Join(w.cfg.EgressDir, c.ID+".sock")
	_ = os.Remove(socket)
	l, err := net.Listen("unix", socket)
	if err != nil {
		return "", nil, fmt.Errorf("listen for egress of call %s: %w", c.ID, err)
	}
	// The sandbox user must be able to connect; nobody else can reach the directory's entries by name
	// without knowing the call id, and the socket lives only as long as the call.
	if err := os.Chmod(socket, 0o666); err != nil {
		l.Close()
		return "", nil, fmt.Errorf("chmod egress socket: %w", err)
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = proxy.Serve(ctx, l)
	}()
	return socket, func() {
		cancel()
		<-done
		_ = os.Remove(socket)
	}, nil
}
