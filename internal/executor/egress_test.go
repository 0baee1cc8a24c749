package executor

import (
	"bufio"
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/sandbox"
	"github.com/toolpool/toolpool/internal/tools"
	"github.com/toolpool/toolpool/internal/tools/egress"
	"github.com/toolpool/toolpool/internal/tools/incontainer"
)

// TestWithEgress: which calls get egress, and how the spec of each is shaped.
func TestWithEgress(t *testing.T) {
	dir := t.TempDir()
	secret := filepath.Join(dir, "secret")
	if err := os.WriteFile(secret, []byte("token"), 0o600); err != nil {
		t.Fatal(err)
	}
	gw, err := egress.NewGateway(egress.Config{Credentials: []egress.Credential{{Name: "c", Host: "api.test", SecretFile: secret}}})
	if err != nil {
		t.Fatal(err)
	}
	e := &Executor{cfg: Config{EgressDir: filepath.Join(dir, "egress"), Egress: gw, RunnerBinary: "/host/worker"}}
	shell := tools.Invocation{Argv: []string{"/bin/sh", "-c", "curl x"}, Env: []string{"A=1"}}
	fetch := tools.Invocation{Argv: []string{incontainer.RunnerPath, incontainer.RunnerCommand, "web_fetch"}, Runner: true, Egress: true}
	tests := []struct {
		name      string
		inv       tools.Invocation
		limits    call.Limits
		wantProxy bool
		wantArgv  []string
	}{
		{"a command without network", shell, call.Limits{}, false, shell.Argv},
		{"a command with network runs behind the forwarder", shell, call.Limits{Network: true}, true,
			append([]string{incontainer.RunnerPath, incontainer.ForwardCommand, "--"}, shell.Argv...)},
		{"web_fetch talks to the socket itself", fetch, call.Limits{}, true, fetch.Argv},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &call.Call{ID: call.NewID(), Tenant: "acme", Limits: tt.limits}
			spec := sandbox.Spec{Argv: slices.Clone(tt.inv.Argv), Env: slices.Clone(tt.inv.Env)}
			finish, err := e.withEgress(context.Background(), c, tt.inv, &spec)
			if err != nil {
				t.Fatal(err)
			}
			defer finish()
			if !slices.Equal(spec.Argv, tt.wantArgv) {
				t.Errorf("argv %q, want %q", spec.Argv, tt.wantArgv)
			}
			hasSocket := slices.ContainsFunc(spec.Mounts, func(m sandbox.Mount) bool { return m.Destination == incontainer.EgressSocket })
			if hasSocket != tt.wantProxy || (len(spec.TrustedCAs) > 0) != tt.wantProxy {
				t.Errorf("socket mounted %v, CAs %d bytes; want proxy %v", hasSocket, len(spec.TrustedCAs), tt.wantProxy)
			}
			wrapped := !tt.inv.Runner && tt.wantProxy
			hasRunner := slices.Contains(spec.Mounts, sandbox.Mount{Source: "/host/worker", Destination: incontainer.RunnerPath})
			if hasRunner != wrapped || slices.Contains(spec.Env, "HTTPS_PROXY=http://"+incontainer.ForwarderAddr) != wrapped {
				t.Errorf("runner mounted %v, env %q; want the forwarder %v", hasRunner, spec.Env, wrapped)
			}
			if wrapped && spec.Env[len(spec.Env)-1] != "A=1" {
				t.Errorf("the call's own env must come last, to override: %q", spec.Env)
			}
		})
	}
}

// TestWithEgressNarrowsToTheCallsLimits: an empty allowlist in the call's limits (policy's "allowed_domains:
// []") allows nothing, though the operator's base rules allow everything public.
func TestWithEgressNarrowsToTheCallsLimits(t *testing.T) {
	gw, err := egress.NewGateway(egress.Config{})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	e := &Executor{cfg: Config{EgressDir: dir, Egress: gw}}
	c := &call.Call{ID: call.NewID(), Tenant: "acme", Limits: call.Limits{Network: true, AllowedDomains: []string{}}}
	spec := sandbox.Spec{Argv: []string{"/bin/true"}}
	finish, err := e.withEgress(context.Background(), c, tools.Invocation{Argv: spec.Argv}, &spec)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("unix", filepath.Join(dir, c.ID+".sock"))
	if err != nil {
		t.Fatal(err)
	}
	conn.Write([]byte("CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n"))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	conn.Close()
	log := finish()
	if resp.StatusCode != http.StatusForbidden || len(log) != 1 || log[0].Rule != egress.RuleDomainNotAllowed ||
		!strings.Contains(log[0].Reason, "(none)") {
		t.Fatalf("status %d, log %+v", resp.StatusCode, log)
	}
	if _, err := os.Stat(filepath.Join(dir, c.ID+".sock")); !os.IsNotExist(err) {
		t.Errorf("the socket outlived the call: %v", err)
	}
}

func TestEgressNote(t *testing.T) {
	var conns []call.EgressConn
	for i := range 8 {
		conns = append(conns, call.EgressConn{Host: "ok.test", Port: 443, Decision: call.EgressAllowed},
			call.EgressConn{Host: "x" + string(rune('a'+i)) + ".test", Port: 443, Decision: call.EgressRefused, Rule: egress.RuleDomainNotAllowed, Reason: "no"})
	}
	note := egressNote(conns)
	if strings.Count(note, "\n[egress] toolpool egress proxy: refused") != maxEgressNotes || !strings.Contains(note, "3 more destinations were refused") {
		t.Fatalf("note:\n%s", note)
	}
	if egressNote(conns[:1]) != "" {
		t.Error("a note without refusals")
	}
}

// TestEgressStoppedWhenNoCapture: a call granted network whose output capture cannot be made (a full
// spool disk) does not run, and its egress proxy is stopped and its socket removed: nothing of the call
// is left serving.
func TestEgressStoppedWhenNoCapture(t *testing.T) {
	gw, err := egress.NewGateway(egress.Config{})
	if err != nil {
		t.Fatal(err)
	}
	rt := &fakeRuntime{}
	e, _ := newTestExecutor(t, rt, 0, nil)
	e.cfg.EgressDir, e.cfg.Egress, e.cfg.RunnerBinary = filepath.Join(t.TempDir(), "egress"), gw, "/host/worker"
	c := newCall("run_shell", shellArgs)
	c.Limits.Network = true
	_, err = e.Run(context.Background(), c, func() (Capture, error) { return nil, errors.New("create spool: no space left on device") }, nil)
	if !errors.Is(err, sandbox.ErrNotStarted) {
		t.Fatalf("Run = %v, want an error wrapping sandbox.ErrNotStarted", err)
	}
	if rt.count() != 0 {
		t.Fatalf("%d runs, want none", rt.count())
	}
	if _, err := os.Stat(filepath.Join(e.cfg.EgressDir, c.ID+".sock")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the call's egress socket is still there (%v): its proxy was left serving", err)
	}
}
