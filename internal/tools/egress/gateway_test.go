package egress

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/call"
)

// testCA issues certificates for test upstreams.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "upstream test CA"}, IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

func (ca *testCA) serverCert(t *testing.T, names ...string) tls.Certificate {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), DNSNames: names, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// upstream is a TLS origin that records what it receives.
type upstream struct {
	*httptest.Server
	ap   netip.AddrPort
	mu   sync.Mutex
	got  []*http.Request
	hits atomic.Int64
}

func startUpstream(t *testing.T, cert tls.Certificate) *upstream {
	t.Helper()
	u := &upstream{}
	u.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.hits.Add(1)
		u.mu.Lock()
		u.got = append(u.got, r.Clone(context.Background()))
		u.mu.Unlock()
		fmt.Fprintf(w, "upstream saw %s %s", r.Method, r.URL.Path)
	}))
	u.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	u.StartTLS()
	t.Cleanup(u.Close)
	u.ap = netip.MustParseAddrPort(u.Listener.Addr().String())
	return u
}

// last returns the last request the upstream received.
func (u *upstream) last() *http.Request {
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.got) == 0 {
		return nil
	}
	return u.got[len(u.got)-1]
}

// gatewayFixture is a gateway with a credential for api.test (GET under /acme/, tenant acme), in front of
// an upstream whose certificate a test CA signed.
type gatewayFixture struct {
	gw       *Gateway
	up       *upstream
	ca       *testCA
	secret   string
	resolver *countingResolver
}

type countingResolver struct {
	mu      sync.Mutex
	answers map[string][]string // each lookup of a name takes the next answer; the last one repeats
	lookups map[string]int
}

func (r *countingResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	answers, ok := r.answers[host]
	if !ok {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	n := r.lookups[host]
	r.lookups[host]++
	return []netip.Addr{netip.MustParseAddr(answers[min(n, len(answers)-1)])}, nil
}

func newGatewayFixture(t *testing.T, trustUpstream bool) *gatewayFixture {
	t.Helper()
	ca := newTestCA(t)
	up := startUpstream(t, ca.serverCert(t, "api.test", "other.test"))
	dir := t.TempDir()
	secret := "s3cr3t-" + t.Name()
	secretFile := filepath.Join(dir, "token")
	if err := os.WriteFile(secretFile, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := Config{Credentials: []Credential{{Name: "acme-api", Host: "api.test", Port: int(up.ap.Port()), Methods: []string{"get"},
		PathPrefix: "/acme", Tenants: []string{"acme"}, SecretFile: secretFile}}}
	if trustUpstream {
		caFile := filepath.Join(dir, "ca.pem")
		if err := os.WriteFile(caFile, ca.pem, 0o644); err != nil {
			t.Fatal(err)
		}
		cfg.Test.CAFiles = []string{caFile}
	}
	res := &countingResolver{answers: map[string][]string{"api.test": {"127.0.0.1"}, "other.test": {"127.0.0.1"}}, lookups: map[string]int{}}
	gw, err := NewGateway(cfg, WithResolver(res), WithAllowAddr(func(ap netip.AddrPort) bool { return ap == up.ap }))
	if err != nil {
		t.Fatal(err)
	}
	return &gatewayFixture{gw: gw, up: up, ca: ca, secret: secret, resolver: res}
}

// client returns a client of a proxy of the gateway for tenant, trusting roots, and the proxy.
func (f *gatewayFixture) client(t *testing.T, tenant string, roots []byte) (*http.Client, *Proxy) {
	t.Helper()
	p, err := f.gw.Proxy(tenant, Rules{})
	if err != nil {
		t.Fatal(err)
	}
	c := startProxy(t, p)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(roots)
	tr := c.Transport.(*http.Transport)
	tr.TLSClientConfig = &tls.Config{RootCAs: pool}
	tr.OnProxyConnectResponse = func(_ context.Context, _ *url.URL, _ *http.Request, resp *http.Response) error {
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("CONNECT: %s: %s %s", resp.Status, resp.Header.Get(RuleHeader), resp.Header.Get(ErrorHeader))
		}
		return nil
	}
	return c, p
}

func TestCredentialInjection(t *testing.T) {
	f := newGatewayFixture(t, true)
	client, proxy := f.client(t, "acme", f.gw.TrustedCAs())
	base := fmt.Sprintf("https://api.test:%d", f.up.ap.Port())
	want := "Bearer " + f.secret
	tests := []struct {
		name     string
		method   string
		path     string // sent as is
		header   string // the client's own Authorization
		host     string // the client's own Host header
		wantAuth string // what the upstream receives
	}{
		{name: "in scope", method: "GET", path: "/acme/repo", wantAuth: want},
		{name: "the prefix itself", method: "GET", path: "/acme", wantAuth: want},
		{name: "the client's own header is replaced", method: "GET", path: "/acme/x", header: "Bearer forged", wantAuth: want},
		{name: "a sibling of the prefix", method: "GET", path: "/acmeevil/x"},
		{name: "another path", method: "GET", path: "/other"},
		{name: "another method", method: "POST", path: "/acme/repo"},
		{name: "dot segments", method: "GET", path: "/acme/../other"},
		{name: "encoded slash", method: "GET", path: "/acme%2F..%2Fother"},
		{name: "encoded dot", method: "GET", path: "/acme/%2e%2e/other"},
		{name: "doubled slash", method: "GET", path: "/acme//x"},
		{name: "out of scope keeps the client's header", method: "GET", path: "/other", header: "Bearer mine", wantAuth: "Bearer mine"},
		{name: "Host is the CONNECT target", method: "GET", path: "/acme/x", host: "other.test", wantAuth: want},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := http.NewRequest(tt.method, base+"/", nil)
			if err != nil {
				t.Fatal(err)
			}
			req.URL.Opaque = tt.path // exactly this request target, uncleaned
			if tt.header != "" {
				req.Header.Set("Authorization", tt.header)
			}
			if tt.host != "" {
				req.Host = tt.host
			}
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			got := f.up.last()
			if resp.StatusCode != http.StatusOK || got == nil {
				t.Fatalf("status %d", resp.StatusCode)
			}
			if a := got.Header.Get("Authorization"); a != tt.wantAuth {
				t.Errorf("upstream got Authorization %q, want %q", a, tt.wantAuth)
			}
			if got.Host != fmt.Sprintf("api.test:%d", f.up.ap.Port()) {
				t.Errorf("upstream got Host %q", got.Host)
			}
		})
	}
	client.CloseIdleConnections()
	// The proxy's log names the binding, never the secret.
	waitFor(t, func() bool { return len(proxy.Log()) > 0 })
	log, _ := json.Marshal(proxy.Log())
	if !strings.Contains(string(log), `"credential":"acme-api"`) || strings.Contains(string(log), f.secret) {
		t.Errorf("log %s: want the binding's name and never its secret", log)
	}
}

// waitFor polls cond for up to 10 seconds.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestCredentialOnlyForItsTenantsAndHosts(t *testing.T) {
	f := newGatewayFixture(t, true)
	// Another tenant's calls are tunnelled untouched: the client sees the upstream's own certificate.
	client, _ := f.client(t, "globex", f.ca.pem)
	resp, err := client.Get(fmt.Sprintf("https://api.test:%d/acme/repo", f.up.ap.Port()))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.TLS == nil || resp.TLS.PeerCertificates[0].Issuer.CommonName != "upstream test CA" {
		t.Fatalf("not tunnelled: issuer %v", resp.TLS)
	}
	if a := f.up.last().Header.Get("Authorization"); a != "" {
		t.Fatalf("another tenant's request got Authorization %q", a)
	}
	// The tenant's calls to another host are tunnelled too.
	client, _ = f.client(t, "acme", f.ca.pem)
	resp, err = client.Get(fmt.Sprintf("https://other.test:%d/acme/repo", f.up.ap.Port()))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if a := f.up.last().Header.Get("Authorization"); a != "" || resp.TLS.PeerCertificates[0].Issuer.CommonName != "upstream test CA" {
		t.Fatalf("another host was intercepted (Authorization %q)", a)
	}
}

func TestCredentialPlainHTTPNeverInjected(t *testing.T) {
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "auth=%q", r.Header.Get("Authorization"))
	}))
	defer origin.Close()
	ap := netip.MustParseAddrPort(origin.Listener.Addr().String())
	gw, err := NewGateway(Config{Credentials: []Credential{{Name: "plain", Host: "plain.test", Port: int(ap.Port()), SecretEnv: "X"}}},
		WithLookupEnv(func(string) (string, bool) { return "tok", true }),
		WithResolver(fakeResolver{"plain.test": {"127.0.0.1"}}), WithAllowAddr(func(a netip.AddrPort) bool { return a == ap }))
	if err != nil {
		t.Fatal(err)
	}
	p, _ := gw.Proxy("acme", Rules{})
	resp, err := startProxy(t, p).Get(fmt.Sprintf("http://plain.test:%d/", ap.Port()))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != `auth=""` {
		t.Fatalf("plain http got %s", body)
	}
}

func TestCredentialUpstreamMustVerify(t *testing.T) {
	f := newGatewayFixture(t, false) // the upstream's CA is not among the proxy's roots
	client, proxy := f.client(t, "acme", f.gw.TrustedCAs())
	_, err := client.Get(fmt.Sprintf("https://api.test:%d/acme/repo", f.up.ap.Port()))
	if err == nil || !strings.Contains(err.Error(), "502") || !strings.Contains(err.Error(), FailUpstreamTLS) {
		t.Fatalf("Get = %v, want a 502 naming %s", err, FailUpstreamTLS)
	}
	if n := f.up.hits.Load(); n != 0 {
		t.Fatalf("the unverified upstream got %d requests", n)
	}
	waitFor(t, func() bool { return len(proxy.Log()) > 0 })
	if e := proxy.Log()[0]; e.Decision != call.EgressFailed || e.Rule != FailUpstreamTLS {
		t.Fatalf("log %+v", e)
	}
}

// TestCANameConstraints: the CA's certificates are only good for the bound hosts, so a leaked key could not
// impersonate any other site to the containers that trust it.
func TestCANameConstraints(t *testing.T) {
	a, err := newAuthority([]string{"api.test"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(a.cert)
	for _, tc := range []struct {
		host string
		ok   bool
	}{{"api.test", true}, {"www.api.test", true}, {"evil.test", false}, {"api.test.evil", false}} {
		leaf, err := a.leaf(tc.host, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		_, err = leaf.Leaf.Verify(x509.VerifyOptions{DNSName: tc.host, Roots: roots})
		if (err == nil) != tc.ok {
			t.Errorf("verify a leaf for %s: %v, want ok=%v", tc.host, err, tc.ok)
		}
	}
	first, _ := a.leaf("api.test", time.Now())
	if again, _ := a.leaf("api.test", time.Now()); again != first {
		t.Error("leaf not cached")
	}
	if later, _ := a.leaf("api.test", time.Now().Add(leafValidity-time.Hour)); later == first || !later.Leaf.NotAfter.After(first.Leaf.NotAfter) {
		t.Error("leaf not renewed near its expiry")
	}
}

// TestRebindingPinned: the address the proxy checked is the one it dials; a name that resolves to a public
// address for the check and to loopback afterwards never reaches loopback.
func TestRebindingPinned(t *testing.T) {
	public, err := net.Listen("tcp", "127.0.0.2:0") // stands in for a public address
	if err != nil {
		t.Fatal(err)
	}
	defer public.Close()
	port := public.Addr().(*net.TCPAddr).Port
	victim, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Skipf("127.0.0.1:%d is taken: %v", port, err) // rare: the port is free on one loopback address only
	}
	defer victim.Close()
	var victimHits atomic.Int64
	go func() {
		for {
			c, err := victim.Accept()
			if err != nil {
				return
			}
			victimHits.Add(1)
			c.Close()
		}
	}()
	go func() {
		for {
			c, err := public.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	res := &countingResolver{answers: map[string][]string{"rebind.test": {"127.0.0.2", "127.0.0.1"}}, lookups: map[string]int{}}
	publicAP := netip.MustParseAddrPort(public.Addr().String())
	p, err := New(Rules{}, WithResolver(res), WithAllowAddr(func(ap netip.AddrPort) bool { return ap == publicAP }))
	if err != nil {
		t.Fatal(err)
	}
	target := fmt.Sprintf("rebind.test:%d", port)
	conn, err := p.DialContext(context.Background(), "tcp", target)
	if err != nil {
		t.Fatalf("first dial: %v", err)
	}
	if got := conn.RemoteAddr().String(); got != publicAP.String() {
		t.Errorf("first dial reached %s, want the checked %s", got, publicAP)
	}
	conn.Close()
	if n := res.lookups["rebind.test"]; n != 1 {
		t.Errorf("the first dial looked the name up %d times, want once", n)
	}
	_, err = p.DialContext(context.Background(), "tcp", target)
	var re *RefusedError
	if !errors.As(err, &re) || re.Rule != RuleNonPublicAddress || !strings.Contains(re.Reason, "127.0.0.1, a loopback address") {
		t.Fatalf("second dial = %v, want a non-public-address refusal", err)
	}
	if n := victimHits.Load(); n != 0 {
		t.Fatalf("loopback got %d connections", n)
	}
}

func TestNonPublicLiterals(t *testing.T) {
	p, err := New(Rules{})
	if err != nil {
		t.Fatal(err)
	}
	for _, target := range []string{"[::1]:443", "[::ffff:127.0.0.1]:443", "[::ffff:169.254.169.254]:80", "100.64.1.2:443",
		"[fe80::1%25eth0]:443", "[fd00::1]:443", "[64:ff9b::a9fe:a9fe]:80", "0.0.0.0:80", "10.1.2.3:443"} {
		_, err := p.DialContext(context.Background(), "tcp", target)
		var re *RefusedError
		if !errors.As(err, &re) || re.Rule != RuleNonPublicAddress {
			t.Errorf("DialContext(%s) = %v, want %s", target, err, RuleNonPublicAddress)
		}
	}
}

func TestGatewayConfigErrors(t *testing.T) {
	dir := t.TempDir()
	secret := filepath.Join(dir, "secret")
	os.WriteFile(secret, []byte("hunter2-secret\n"), 0o600)
	multiline := filepath.Join(dir, "multiline")
	os.WriteFile(multiline, []byte("hunter2\nsecret"), 0o600)
	empty := filepath.Join(dir, "empty")
	os.WriteFile(empty, []byte("\n"), 0o600)
	ok := Credential{Name: "c", Host: "api.test", SecretFile: secret}
	with := func(f func(*Credential)) Config {
		c := ok
		f(&c)
		return Config{Credentials: []Credential{c}}
	}
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{"no secret", with(func(c *Credential) { c.SecretFile = "" }), "exactly one of secret_file and secret_env"},
		{"two secrets", with(func(c *Credential) { c.SecretEnv = "X" }), "exactly one of secret_file and secret_env"},
		{"missing file", with(func(c *Credential) { c.SecretFile = filepath.Join(dir, "nope") }), "read secret_file"},
		{"unset variable", with(func(c *Credential) { c.SecretFile, c.SecretEnv = "", "TOOLPOOL_NOPE" }), "TOOLPOOL_NOPE is not set"},
		{"empty secret", with(func(c *Credential) { c.SecretFile = empty }), "the secret is empty"},
		{"line break", with(func(c *Credential) { c.SecretFile = multiline }), "line break"},
		{"basic without user", with(func(c *Credential) { c.Scheme = "basic" }), `"user:password"`},
		{"bad scheme", with(func(c *Credential) { c.Scheme = "digest" }), `scheme "digest"`},
		{"wildcard host", with(func(c *Credential) { c.Host = "*.api.test" }), "exact host name"},
		{"IP host", with(func(c *Credential) { c.Host = "10.0.0.1" }), "exact host name"},
		{"bad port", with(func(c *Credential) { c.Port = 70000 }), "port 70000"},
		{"Host header", with(func(c *Credential) { c.Header = "Host" }), `header "Host"`},
		{"bad header", with(func(c *Credential) { c.Header = "X Key" }), `header "X Key"`},
		{"relative prefix", with(func(c *Credential) { c.PathPrefix = "acme/" }), "path_prefix"},
		{"unclean prefix", with(func(c *Credential) { c.PathPrefix = "/a/../b/" }), "path_prefix"},
		{"bad name", with(func(c *Credential) { c.Name = "Has Space" }), "name"},
		{"bad tenant", with(func(c *Credential) { c.Tenants = []string{"a.b"} }), "tenants"},
		{"bad method", with(func(c *Credential) { c.Methods = []string{"GET /"} }), "method"},
		{"same name twice", Config{Credentials: []Credential{ok, ok}}, "used twice"},
		{"bad dns server", Config{DNSServer: "dns.test:53"}, "ip:port"},
		{"bad public addr", Config{Test: TestConfig{PublicAddrs: []string{"lo"}}}, "public_addrs"},
		{"bad CA file", Config{Test: TestConfig{CAFiles: []string{secret}}}, "no PEM certificate"},
		{"bad rules", Config{Rules: Rules{AllowPorts: []int{0}}}, "between 1 and 65535"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewGateway(tt.cfg, WithLookupEnv(func(string) (string, bool) { return "", false }))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("NewGateway = %v, want an error with %q", err, tt.want)
			}
			if strings.Contains(err.Error(), "hunter2") {
				t.Fatalf("the error shows the secret: %v", err)
			}
		})
	}
	g, err := NewGateway(Config{})
	if err != nil || g.TrustedCAs() != nil {
		t.Fatalf("a gateway without credentials: %v, trusted %q", err, g.TrustedCAs())
	}
}
