package worker

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/policy"
	"github.com/toolpool/toolpool/internal/tools/egress"
)

// serveEgress starts the egress proxy of one call on a unix socket of its own, under the call's rules: the
// operator's base rules, narrowed to the domains policy allowed (egressRules). The socket is mounted into that call's
// container only; the container has no other way out. stop shuts the proxy down and removes the socket.
func (w *Worker) serveEgress(ctx context.Context, c *call.Call) (socket string, stop func(), err error) {
	if w.cfg.EgressDir == "" {
		return "", nil, fmt.Errorf("serve egress for call %s: no egress dir configured", c.ID)
	}
	if err := os.MkdirAll(w.cfg.EgressDir, 0o711); err != nil {
		return "", nil, fmt.Errorf("create egress dir: %w", err)
	}
	proxy, err := egress.New(egressRules(w.cfg.EgressRules, c.Limits.AllowedDomains))
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

// egressRules narrows the worker's base rules for one call: its allowlist becomes the intersection of
// the base allowlist and every list that applies to the call (policy's decision, and the call's own
// when calls carry one). Deny lists and ports stay the base's. When the lists have no domain in common,
// the rules refuse every destination.
func egressRules(base egress.Rules, lists ...[]string) egress.Rules {
	out := base
	out.AllowDomains, out.AllowNone = intersectAllow(base.AllowDomains, lists...)
	out.AllowNone = out.AllowNone || base.AllowNone
	return out
}

// intersectAllow intersects domain allowlists. An empty base allows every domain (egress.Rules); in
// lists, nil is "no list" and an empty list is "no domain". none reports that the lists that apply leave
// no domain at all.
func intersectAllow(base []string, lists ...[]string) (allow []string, none bool) {
	norm := func(l []string) []string {
		out := make([]string, 0, len(l))
		for _, d := range l {
			out = append(out, strings.ToLower(strings.TrimSuffix(d, ".")))
		}
		return out
	}
	restricted := len(base) > 0
	if restricted {
		allow = norm(base)
	}
	for _, l := range lists {
		if l == nil {
			continue
		}
		if !restricted {
			allow, restricted = norm(l), true
			continue
		}
		allow = policy.IntersectDomains(allow, norm(l))
	}
	return allow, restricted && len(allow) == 0
}
