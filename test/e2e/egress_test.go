package e2e

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/sandbox/containerd"
	"github.com/toolpool/toolpool/internal/sandbox/containerd/ctrtest"
)

// egressStack is a whole stack whose worker's egress proxy reaches the test's origin, with credentials
// bound to the corp hosts.
type egressStack struct {
	*stack
	origin  *origin
	victim  *victim // 127.0.0.1 at the origin's port: no call may ever connect to it
	dns     *dnsServer
	port    int // the origin's port, the only one policy allows
	otherP  int // a port the worker allows but policy does not
	secrets map[string]string
	headers map[string]string // corp host -> the Authorization value it needs
}

// secretEnv is the worker's environment variable holding the files.corp.test token (secret_env); the
// others come from files (secret_file).
const secretEnv = "TOOLPOOL_E2E_FILES_TOKEN"

func newSecret() string {
	b := make([]byte, 16)
	rand.Read(b)
	return "tpsecret" + hex.EncodeToString(b)
}

// startEgressStack starts the origin, a DNS server for the test names, and a stack whose policy grants
// run_shell network to tenant dev (only to the test names, only on the origin's port), and workspace_clone
// network to the git hosts, and refuses both to tenant beta.
func startEgressStack(t testing.TB) *egressStack {
	t.Helper()
	requireClients(t)
	hosts := []string{"git.test", "files.test", "goproxy.test", "npm.test", "pypi.test", "denied.test", "rebind.test", "internal.test"}
	for _, svc := range []string{"git", "files", "goproxy", "npm", "pypi"} {
		hosts = append(hosts, svc+corpSuffix)
	}
	pki := newTestPKI(t, hosts...)
	secrets := map[string]string{}
	headers := map[string]string{}
	basic := func(host, user string) {
		secrets[host] = user + ":" + newSecret()
		headers[host] = "Basic " + base64.StdEncoding.EncodeToString([]byte(secrets[host]))
	}
	bearer := func(host string) {
		secrets[host] = newSecret()
		headers[host] = "Bearer " + secrets[host]
	}
	basic("git.corp.test", "git")
	bearer("files.corp.test")
	basic("goproxy.corp.test", "gomod")
	bearer("npm.corp.test")
	basic("pypi.corp.test", "pip")
	o, v := startOrigin(t, pki, headers)
	other, err := startVictim(t, publicTestAddr+":0")
	if err != nil {
		t.Fatal(err)
	}
	dns := startDNS(t, func(name string, nth int) (netip.Addr, bool) {
		switch {
		case name == "rebind.test" && nth > 0: // the first answer is public, every later one loopback
			return netip.MustParseAddr("127.0.0.1"), true
		case name == "internal.test":
			return netip.MustParseAddr("127.0.0.1"), true
		case slices.Contains(hosts, name):
			return netip.MustParseAddr(publicTestAddr), true
		}
		return netip.Addr{}, false
	})

	dir := t.TempDir()
	caFile := filepath.Join(dir, "test-ca.pem")
	if err := os.WriteFile(caFile, pki.caPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	secretFile := func(host string) string {
		f := filepath.Join(dir, host+".secret")
		if err := os.WriteFile(f, []byte(secrets[host]+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return f
	}
	// The harness passes its own environment to the worker.
	os.Setenv(secretEnv, secrets["files.corp.test"])
	t.Cleanup(func() { os.Unsetenv(secretEnv) })
	port := o.port
	otherPort := other.l.Addr().(interface{ AddrPort() netip.AddrPort }).AddrPort().Port()
	workerConfig := strings.NewReplacer("DNS", dns.addr, "PORT", fmt.Sprint(port), "OTHER", fmt.Sprint(otherPort),
		"GITSECRET", secretFile("git.corp.test"), "GOSECRET", secretFile("goproxy.corp.test"), "NPMSECRET", secretFile("npm.corp.test"),
		"PIPSECRET", secretFile("pypi.corp.test"), "ENVNAME", secretEnv, "PUBLIC", publicTestAddr, "CAFILE", caFile).Replace(`
egress:
  dns_server: DNS
  deny_domains: ["*.internal"]
  allow_ports: [PORT, OTHER]
  credentials:
    - {name: corp-git, host: git.corp.test, port: PORT, scheme: basic, secret_file: GITSECRET}
    - {name: corp-files, host: files.corp.test, port: PORT, methods: [GET], path_prefix: /hello.txt, secret_env: ENVNAME}
    - {name: corp-goproxy, host: goproxy.corp.test, port: PORT, scheme: basic, secret_file: GOSECRET}
    - {name: corp-npm, host: npm.corp.test, port: PORT, secret_file: NPMSECRET}
    - {name: corp-pypi, host: pypi.corp.test, port: PORT, scheme: basic, secret_file: PIPSECRET}
  test:
    public_addrs: [PUBLIC]
    ca_files: [CAFILE]
`)
	policy := fmt.Sprintf(`
version: 1
default_action: allow
paths:
  allowed_roots: [/]
# The package managers are pointed at the test's origin by GOPROXY, GOFLAGS, GIT_* and npm_config_*,
# which policy otherwise asks about (they can make a program run other code): this test is of egress.
builtin_asks:
  code-injection-env: allow
tools:
  run_shell:
    network: true
    allowed_domains: [git.test, files.test, goproxy.test, npm.test, pypi.test, "*.corp.test", rebind.test, internal.test]
    allowed_ports: [%d]
  # Workspaces seeded from git (TestWorkspaceGit): the git hosts only.
  workspace_clone:
    network: true
    allowed_domains: [git.test, "*.corp.test"]
    allowed_ports: [%d]
tenants:
  beta:
    tools:
      run_shell: {network: false}
      workspace_clone: {network: false}
`, port, port)
	s := startStackWith(t, stackOptions{policy: policy, workerConfig: workerConfig})
	return &egressStack{stack: s, origin: o, victim: v, dns: dns, port: port, otherP: int(otherPort), secrets: secrets, headers: headers}
}

// run runs command with run_shell for tenant token in a workspace of its own, with env, and returns the
// final result.
func (s *egressStack) run(t testing.TB, token, ws, command string, env map[string]string) (*call.Result, []byte) {
	t.Helper()
	args := map[string]any{"command": command, "timeout_ms": 180000}
	if env != nil {
		args["env"] = env
	}
	r := s.do(t, http.MethodPost, "/v1/calls", token, map[string]any{"tool": "run_shell", "workspace": ws, "args": args})
	if r.code != http.StatusOK {
		t.Fatalf("HTTP %d: %s", r.code, r.body)
	}
	return r.result(t), r.body
}

// egressEntry returns the result's egress entry for host with decision, or nil.
func egressEntry(res *call.Result, host, decision string) *call.EgressConn {
	for i, e := range res.Egress {
		if e.Host == host && e.Decision == decision {
			return &res.Egress[i]
		}
	}
	return nil
}

// TestEgress runs real clients (curl, git, go, npm, pip) in real containers against servers on the test's
// loopback through the worker's egress proxy: each allowed, denied, and with a credential the proxy
// injects; then DNS rebinding, a redirect to a private address, a port policy does not allow, a tenant
// without network, and the secrets' absence from containers, results, logs and the audit stream.
func TestEgress(t *testing.T) {
	s := startEgressStack(t)
	p := s.port
	goEnv := func(proxyHost string) map[string]string {
		return map[string]string{"GOPROXY": fmt.Sprintf("https://%s:%d", proxyHost, p), "GOSUMDB": "off", "GOTOOLCHAIN": "local",
			"GOPATH": "/workspace/gopath", "GOCACHE": "/tmp/gocache", "GOFLAGS": "-modcacherw"}
	}
	gitEnv := map[string]string{"GIT_TERMINAL_PROMPT": "0"}
	clients := []struct {
		name    string
		command func(host string) string
		env     func(host string) map[string]string
		want    string // in stdout when allowed or injected
	}{
		{"curl", func(h string) string { return fmt.Sprintf("curl -fsS https://%s:%d/hello.txt", h, p) }, nil, filesBody},
		{"git", func(h string) string {
			return fmt.Sprintf("git clone -q https://%s:%d/repo.git r && cat r/README", h, p)
		},
			func(string) map[string]string { return gitEnv }, gitFile},
		{"go", func(string) string {
			return "go mod download -json " + goModule + "@v1.0.0 && cat gopath/pkg/mod/" + goModule + "@v1.0.0/hello.go"
		}, goEnv, goSource},
		{"npm", func(h string) string {
			return fmt.Sprintf("npm install --registry=https://%s:%d/ --no-audit --no-fund --cache /tmp/npm-cache %s@1.0.0 && cat node_modules/%s/index.js", h, p, npmPackage, npmPackage)
		}, func(string) map[string]string { return map[string]string{"npm_config_update_notifier": "false"} }, npmIndexJS},
		{"pip", func(h string) string {
			return fmt.Sprintf("python3 -m pip download --retries 0 --no-deps --no-cache-dir --disable-pip-version-check --index-url https://%s:%d/simple/ -d dl %s==1.0.0 && ls dl", h, p, pyPackage)
		}, nil, pyWheelName},
	}
	svc := map[string]string{"curl": "files", "git": "git", "go": "goproxy", "npm": "npm", "pip": "pypi"}
	var injected [][]byte // the injected calls' results, checked for secrets below
	t.Run("matrix", func(t *testing.T) {
		for _, c := range clients {
			for _, cell := range []string{"allowed", "denied", "injected"} {
				t.Run(c.name+"/"+cell, func(t *testing.T) {
					host := map[string]string{"allowed": svc[c.name] + ".test", "denied": "denied.test", "injected": svc[c.name] + corpSuffix}[cell]
					var env map[string]string
					if c.env != nil {
						env = c.env(host)
					}
					res, body := s.run(t, "dev-token", "egress-"+c.name+"-"+cell, c.command(host), env)
					switch cell {
					case "allowed", "injected":
						e := egressEntry(res, host, call.EgressAllowed)
						if res.Status != call.StatusOK || !strings.Contains(res.Stdout, c.want) || e == nil || e.BytesDown == 0 {
							t.Fatalf("want ok with %q and an allowed egress entry for %s: %s", c.want, host, body)
						}
						if cell == "injected" {
							if e.Credential == "" || !slices.Contains(s.origin.seen(host), s.headers[host]) {
								t.Fatalf("the origin did not get the credential (it got %d Authorization values) or the entry does not name it: %s",
									len(s.origin.seen(host)), body)
							}
							injected = append(injected, body)
						}
					case "denied":
						e := egressEntry(res, host, call.EgressRefused)
						note := fmt.Sprintf("[egress] toolpool egress proxy: refused %s:%d (rule domain-not-allowed)", host, p)
						if res.Status != call.StatusError || e == nil || e.Rule != "domain-not-allowed" || !strings.Contains(res.Output, note) {
							t.Fatalf("want an error, a refused egress entry and the note %q: %s", note, body)
						}
					}
				})
			}
		}
	})
	if n := s.origin.requests("denied.test"); n != 0 {
		t.Errorf("denied.test got %d requests through the proxy", n)
	}
	for host, want := range s.headers {
		for _, got := range s.origin.seen(host) {
			if got != "" && got != want {
				t.Errorf("%s got an Authorization that is not its credential", host)
			}
		}
	}

	t.Run("a refusal reaches the program as a 403 that names the rule and how to ask", func(t *testing.T) {
		res, body := s.run(t, "dev-token", "egress-misc", fmt.Sprintf("curl -sS -i http://denied.test:%d/hello.txt", p), nil)
		for _, want := range []string{"403 Forbidden", "X-Toolpool-Egress-Rule: domain-not-allowed", "rule domain-not-allowed",
			"ask the operator to add it to the tool's allowed_domains"} {
			if !strings.Contains(res.Stdout, want) {
				t.Fatalf("stdout lacks %q: %s", want, body)
			}
		}
	})

	t.Run("the worker's ports and policy's intersect", func(t *testing.T) {
		res, body := s.run(t, "dev-token", "egress-misc", fmt.Sprintf("curl -fsS https://files.test:%d/hello.txt", s.otherP), nil)
		e := egressEntry(res, "files.test", call.EgressRefused)
		if res.Status != call.StatusError || e == nil || e.Rule != "port-not-allowed" || e.Port != s.otherP {
			t.Fatalf("want port-not-allowed: %s", body)
		}
	})

	t.Run("DNS rebinding: the checked address is the one dialled, and the next lookup is checked again", func(t *testing.T) {
		res, body := s.run(t, "dev-token", "egress-misc", fmt.Sprintf("curl -fsS https://rebind.test:%d/; curl -fsS https://rebind.test:%d/", p, p), nil)
		allowed, refused := egressEntry(res, "rebind.test", call.EgressAllowed), egressEntry(res, "rebind.test", call.EgressRefused)
		if !strings.Contains(res.Stdout, "served by the public address") || allowed == nil || refused == nil ||
			refused.Rule != "non-public-address" || !strings.Contains(refused.Reason, "127.0.0.1") {
			t.Fatalf("want the first request served by the first answer and the second refused: %s", body)
		}
		if n := s.dns.aQueries("rebind.test"); n < 2 {
			t.Fatalf("the proxy asked DNS for rebind.test %d times, want once per connection", n)
		}
		if n := s.victim.accepted.Load(); n != 0 {
			t.Fatalf("loopback got %d connections", n)
		}
	})

	t.Run("a redirect to a private address is refused", func(t *testing.T) {
		to := fmt.Sprintf("http://internal.test:%d/", p)
		res, body := s.run(t, "dev-token", "egress-misc", fmt.Sprintf("curl -fsSL 'https://files.test:%d/redirect?to=%s'", p, to), nil)
		e := egressEntry(res, "internal.test", call.EgressRefused)
		if res.Status != call.StatusError || egressEntry(res, "files.test", call.EgressAllowed) == nil || e == nil ||
			e.Rule != "non-public-address" || !strings.Contains(e.Reason, "127.0.0.1, a loopback address") {
			t.Fatalf("want the redirect followed to a refusal: %s", body)
		}
		if n := s.victim.accepted.Load(); n != 0 {
			t.Fatalf("loopback got %d connections", n)
		}
	})

	t.Run("the forwarder cannot be bypassed: it cannot be killed, the socket enforces the same rules, and there is no other route", func(t *testing.T) {
		kill := `kill -KILL 1; echo "pid1=$?"; `
		wants := []string{"pid1=", "rule domain-not-allowed", "no-route", filesBody}
		if ctrtest.Runtime() == containerd.GVisorRuntime {
			// gVisor's kernel delivers a SIGKILL to the namespace's init from inside it, which Linux ignores:
			// the forwarder dies, and with it the whole call. Nothing got past it; the rest is tried without.
			res, body := s.run(t, "dev-token", "egress-misc", kill, nil)
			if !strings.Contains(res.Stdout, "pid1=") && (res.Status != call.StatusError || res.Usage.Signal != "SIGKILL") {
				t.Fatalf("want the forwarder alive or the call killed with it: %s", body)
			}
			kill, wants = "", wants[1:]
		}
		res, body := s.run(t, "dev-token", "egress-misc", kill+fmt.Sprintf(
			`curl -sS --unix-socket /.toolpool/egress.sock --request-target http://denied.test:%d/hello.txt http://denied.test/; `+
				`env -u https_proxy -u HTTPS_PROXY curl -fsS --max-time 5 https://files.test:%d/hello.txt || echo no-route; `+
				`curl -fsS https://files.test:%d/hello.txt`, p, p, p), nil)
		for _, want := range wants {
			if !strings.Contains(res.Stdout, want) {
				t.Fatalf("stdout lacks %q: %s", want, body)
			}
		}
	})

	t.Run("a tenant without network has no proxy and no route", func(t *testing.T) {
		res, body := s.run(t, "beta-token", "egress-beta", fmt.Sprintf("env | grep -ci _proxy; curl -fsS --max-time 5 https://files.test:%d/hello.txt", p), nil)
		if res.Status != call.StatusError || !strings.HasPrefix(res.Stdout, "0\n") || len(res.Egress) != 0 || strings.Contains(res.Stdout, filesBody) {
			t.Fatalf("want no proxy variables, a failed curl and no egress: %s", body)
		}
	})

	t.Run("the secrets never enter a container, a result, a log or the audit stream", func(t *testing.T) {
		// Inside a container that has network and the same bindings: the environment of every process, the
		// files under /etc, /.toolpool, /tmp and the workspace. The patterns match the secrets without
		// containing them, and any Basic credential.
		res, body := s.run(t, "dev-token", "egress-curl-injected",
			`env; cat /proc/[0-9]*/environ | tr '\0' '\n' | grep -Eo -e 'tpsecret[0-9a-f]{32}' -e 'Basic [A-Za-z0-9+/=]{16,}'; `+
				`grep -rIEoh -D skip -e 'tpsecret[0-9a-f]{32}' -e 'Basic [A-Za-z0-9+/=]{16,}' /etc /.toolpool /tmp /workspace; echo scanned`, nil)
		if res.Status != call.StatusOK || !strings.Contains(res.Stdout, "scanned") || !strings.Contains(res.Stdout, "HTTPS_PROXY=") ||
			!strings.Contains(res.Stdout, "SSL_CERT_FILE=") {
			t.Fatalf("scan did not run as expected: %s", body)
		}
		if strings.Contains(res.Stdout, "tpsecret") || strings.Contains(res.Stdout, "Basic ") {
			t.Fatalf("a secret is visible inside the container: %s", body)
		}
		audit := s.do(t, http.MethodGet, "/v1/audit?since=1h", "dev-token", nil)
		defer func() { // after the leak checks, which would explain a missing entry better
			if audit.code != http.StatusOK || !strings.Contains(string(audit.body), `"credential":"corp-`) {
				t.Errorf("the audit stream lacks the egress entries: HTTP %d %s", audit.code, audit.body)
			}
		}()
		places := map[string]string{"worker log": s.worker.Output(), "dispatcher log": s.dispatcher.Output(), "audit": string(audit.body)}
		for i, b := range injected {
			places[fmt.Sprintf("injected result %d", i)] = string(b)
		}
		if len(injected) == 0 {
			t.Error("no injected result to check: run the matrix's injected cells with this test")
		}
		for where, text := range places {
			for host, secret := range s.secrets {
				if strings.Contains(text, secret) || strings.Contains(text, s.headers[host]) {
					t.Errorf("the %s holds the credential of %s", where, host)
				}
			}
		}
	})

}
