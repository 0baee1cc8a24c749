package executor

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/sandbox"
	"github.com/toolpool/toolpool/internal/tools"
	"github.com/toolpool/toolpool/internal/tools/egress"
	"github.com/toolpool/toolpool/internal/tools/incontainer"
)

// withEgress gives the call its egress, when it has any: tools that fetch (web_fetch) always, and commands
// (run_shell, custom tools) when policy granted the call network. It serves the call's own proxy on a
// unix socket mounted into that container only, under the call's rules (egressRules), and makes spec trust
// the proxy's CA. A command runs behind the in-container forwarder: spec's argv is wrapped in the runner's
// ForwardCommand and its environment gets the proxy variables. finish stops the proxy and returns what it
// did; call it once the container is gone. A call without egress gets a finish that returns nil.
func (e *Executor) withEgress(ctx context.Context, c *call.Call, inv tools.Invocation, spec *sandbox.Spec) (finish func() []call.EgressConn, err error) {
	command := !inv.Runner
	if !inv.Egress && !(command && c.Limits.Network) {
		return func() []call.EgressConn { return nil }, nil
	}
	socket, proxy, stop, err := e.serveEgress(ctx, c)
	if err != nil {
		return nil, err
	}
	spec.Mounts = append(spec.Mounts, sandbox.Mount{Source: socket, Destination: incontainer.EgressSocket})
	spec.TrustedCAs = e.cfg.Egress.TrustedCAs()
	if command {
		spec.Argv = append([]string{incontainer.RunnerPath, incontainer.ForwardCommand, "--"}, spec.Argv...)
		spec.Env = append(incontainer.ProxyEnv(), spec.Env...) // the call's own env may override them: it only loses network
		spec.Mounts = append(spec.Mounts, sandbox.Mount{Source: e.cfg.RunnerBinary, Destination: incontainer.RunnerPath})
	}
	return func() []call.EgressConn {
		stop()
		return proxy.Log()
	}, nil
}

// egressRules are the rules the call's limits add to the operator's base rules: policy's domain allowlist
// and ports, already intersected over the policy's layers. nil lists add nothing; empty ones allow nothing.
func egressRules(l call.Limits) egress.Rules {
	return egress.Rules{AllowDomains: l.AllowedDomains, AllowPorts: l.AllowedPorts}
}

// serveEgress starts the egress proxy of one call on a unix socket of its own, under the operator's base
// rules narrowed by the call's (egressRules). The socket is mounted into that call's container only; the
// container has no other way out. stop shuts the proxy down (closing its tunnels), waits until every
// connection is logged, and removes the socket.
func (e *Executor) serveEgress(ctx context.Context, c *call.Call) (socket string, proxy *egress.Proxy, stop func(), err error) {
	if e.cfg.EgressDir == "" || e.cfg.Egress == nil {
		return "", nil, nil, fmt.Errorf("serve egress for call %s: no egress configured", c.ID)
	}
	if err := os.MkdirAll(e.cfg.EgressDir, 0o711); err != nil {
		return "", nil, nil, fmt.Errorf("create egress dir: %w", err)
	}
	proxy, err = e.cfg.Egress.Proxy(c.Tenant, egressRules(c.Limits))
	if err != nil {
		return "", nil, nil, fmt.Errorf("create egress proxy for call %s: %w", c.ID, err)
	}
	socket = filepath.Join(e.cfg.EgressDir, c.ID+".sock")
	_ = os.Remove(socket)
	l, err := net.Listen("unix", socket)
	if err != nil {
		return "", nil, nil, fmt.Errorf("listen for egress of call %s: %w", c.ID, err)
	}
	// The sandbox user must be able to connect; nobody else can reach the directory's entries by name
	// without knowing the call id, and the socket lives only as long as the call.
	if err := os.Chmod(socket, 0o666); err != nil {
		l.Close()
		return "", nil, nil, fmt.Errorf("chmod egress socket: %w", err)
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = proxy.Serve(ctx, l)
	}()
	return socket, proxy, func() {
		cancel()
		<-done
		_ = os.Remove(socket)
	}, nil
}

// egressNote is what the model reads at the end of a call's output about destinations the proxy refused:
// a client may swallow the proxy's 403 (curl and git only say the CONNECT failed), so the rule and how to
// ask for the destination are repeated here. Empty when nothing was refused.
func egressNote(conns []call.EgressConn) string {
	var b strings.Builder
	n := 0
	for _, e := range conns {
		if e.Decision != call.EgressRefused {
			continue
		}
		if n++; n <= maxEgressNotes {
			b.WriteString("\n[egress] " + strings.TrimSpace(egress.Explain(e)))
		}
	}
	if n > maxEgressNotes {
		fmt.Fprintf(&b, "\n[egress] %d more destinations were refused: the result's egress field lists them", n-maxEgressNotes)
	}
	return b.String()
}

// maxEgressNotes bounds the refusals explained in a call's output.
const maxEgressNotes = 5
