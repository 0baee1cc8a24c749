package egress

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path"
	"regexp"
	"slices"
	"strings"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/toolpool/toolpool/internal/call"
)

// Config is the worker's egress configuration (the worker config's "egress" key): the operator's base
// rules, which every call's rules narrow, where the proxy resolves names, and the credentials it injects.
type Config struct {
	Rules `yaml:",inline"`
	// DNSServer, when set, is the "ip:port" of the DNS server the proxy asks (over UDP, then TCP); empty
	// means the worker's system resolver. The address checks apply to its answers as to any other.
	DNSServer string `json:"dns_server,omitempty" yaml:"dns_server,omitempty"`
	// Credentials bind secrets to hosts; see Credential.
	Credentials []Credential `json:"credentials,omitempty" yaml:"credentials,omitempty"`
	// Test holds settings that exist only for tests. Leave it out in production.
	Test TestConfig `json:"test,omitzero" yaml:"test,omitempty"`
}

// TestConfig loosens the proxy so that tests can serve on loopback. Every field is off by default, and a
// worker with any of them set says so in its log at start.
type TestConfig struct {
	// PublicAddrs are addresses or prefixes ("127.0.0.2", "127.0.0.0/8") that the address checks treat as
	// public. The Rules still apply.
	PublicAddrs []string `json:"public_addrs,omitempty" yaml:"public_addrs,omitempty"`
	// CAFiles are PEM files of extra roots: the proxy trusts them when it verifies the upstream of a
	// credential host, and the calls' containers trust them too.
	CAFiles []string `json:"ca_files,omitempty" yaml:"ca_files,omitempty"`
}

// Enabled reports whether any test setting is set.
func (t TestConfig) Enabled() bool { return len(t.PublicAddrs) > 0 || len(t.CAFiles) > 0 }

// Credential binds a secret to a host: on HTTPS requests to Host (and Port) in its scope (Methods,
// PathPrefix, Tenants), the proxy sets Header to the secret in Scheme's format. The secret comes from
// SecretFile or SecretEnv, never from the policy file; it never enters a container, a result, a log or the
// audit stream. Plain http requests never get it.
type Credential struct {
	// Name identifies the binding in results, logs and the audit stream.
	Name string `json:"name" yaml:"name"`
	// Host is the exact host name (no wildcard, no IP address).
	Host string `json:"host" yaml:"host"`
	// Port defaults to 443.
	Port int `json:"port,omitempty" yaml:"port,omitempty"`
	// Methods, when set, limits the binding to these HTTP methods.
	Methods []string `json:"methods,omitempty" yaml:"methods,omitempty"`
	// PathPrefix, when set, limits the binding to paths under it ("/acme/" covers /acme and /acme/x).
	PathPrefix string `json:"path_prefix,omitempty" yaml:"path_prefix,omitempty"`
	// Tenants, when set, limits the binding to these tenants' calls; empty means every tenant's.
	Tenants []string `json:"tenants,omitempty" yaml:"tenants,omitempty"`
	// Header defaults to Authorization.
	Header string `json:"header,omitempty" yaml:"header,omitempty"`
	// Scheme is how the secret becomes the header's value: "bearer" (default: "Bearer SECRET"), "basic"
	// (the secret is "user:password": "Basic " and its base64), or "raw" (the secret as is).
	Scheme string `json:"scheme,omitempty" yaml:"scheme,omitempty"`
	// SecretFile is a file holding the secret (a final newline is dropped).
	SecretFile string `json:"secret_file,omitempty" yaml:"secret_file,omitempty"`
	// SecretEnv is an environment variable of the worker holding the secret.
	SecretEnv string `json:"secret_env,omitempty" yaml:"secret_env,omitempty"`
}

// WithLookupEnv gives NewGateway the worker's environment, for Credential.SecretEnv (cmd/worker passes
// os.LookupEnv; nothing below cmd reads the environment itself).
func WithLookupEnv(lookup func(string) (string, bool)) Option {
	return func(s *settings) { s.lookupEnv = lookup }
}

// Gateway is the worker's egress: the base rules, the credential bindings with their secrets and the CA
// that terminates TLS for their hosts. It makes one Proxy per call. Safe for concurrent use.
type Gateway struct {
	base     Rules
	set      settings
	bindings []*binding
	ca       *authority
	roots    *x509.CertPool
	trusted  []byte
}

var credentialNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,63}$`)

// NewGateway checks cfg, loads the credentials' secrets and, when there are any, generates the CA (its key
// stays in memory). Options (WithResolver, WithAllowAddr, WithLookupEnv) apply to every Proxy and win over
// cfg's DNSServer and Test.PublicAddrs. Every error names the setting at fault, never a secret.
func NewGateway(cfg Config, opts ...Option) (*Gateway, error) {
	if err := cfg.Rules.Validate(); err != nil {
		return nil, fmt.Errorf("check egress rules: %w", err)
	}
	s := defaultSettings()
	if cfg.DNSServer != "" {
		ap, err := netip.ParseAddrPort(cfg.DNSServer)
		if err != nil {
			return nil, fmt.Errorf("check egress dns_server %q: write ip:port, such as 10.0.0.2:53", cfg.DNSServer)
		}
		s.resolver = &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, ap.String())
		}}
	}
	if len(cfg.Test.PublicAddrs) > 0 {
		var prefixes []netip.Prefix
		for _, a := range cfg.Test.PublicAddrs {
			pfx, err := netip.ParsePrefix(a)
			if err != nil {
				addr, aerr := netip.ParseAddr(a)
				if aerr != nil {
					return nil, fmt.Errorf("check egress test.public_addrs %q: write an address or a prefix such as 127.0.0.2/32", a)
				}
				pfx = netip.PrefixFrom(addr, addr.BitLen())
			}
			prefixes = append(prefixes, pfx)
		}
		s.allowAddr = func(ap netip.AddrPort) bool {
			return slices.ContainsFunc(prefixes, func(p netip.Prefix) bool { return p.Contains(ap.Addr().Unmap()) })
		}
	}
	for _, o := range opts {
		o(&s)
	}
	g := &Gateway{base: Intersect(cfg.Rules), set: s}
	var extra []byte
	for _, f := range cfg.Test.CAFiles {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("read egress test.ca_files: %w", err)
		}
		if !x509.NewCertPool().AppendCertsFromPEM(data) {
			return nil, fmt.Errorf("read egress test.ca_files %s: no PEM certificate in it", f)
		}
		extra = append(append(extra, bytes.TrimSpace(data)...), '\n')
	}
	var hosts []string
	for i, c := range cfg.Credentials {
		b, err := c.load(s.lookupEnv)
		if err != nil {
			return nil, fmt.Errorf("check egress credentials[%d] (%s): %w", i, c.Name, err)
		}
		for _, o := range g.bindings {
			if o.name == b.name {
				return nil, fmt.Errorf("check egress credentials[%d]: the name %q is used twice", i, b.name)
			}
		}
		g.bindings = append(g.bindings, b)
		if !slices.Contains(hosts, b.host) {
			hosts = append(hosts, b.host)
		}
	}
	var err error
	if g.roots, err = upstreamRoots(extra); err != nil {
		return nil, err
	}
	if len(hosts) > 0 {
		if g.ca, err = newAuthority(hosts, time.Now()); err != nil {
			return nil, err
		}
		g.trusted = append(g.trusted, g.ca.pem...)
	}
	g.trusted = append(g.trusted, extra...)
	return g, nil
}

// Rules returns the operator's base rules.
func (g *Gateway) Rules() Rules { return g.base }

// TrustedCAs returns the PEM certificates a call's container must trust on top of the system's roots: the
// CA's when there are credential bindings, and Test.CAFiles; nil when there are none.
func (g *Gateway) TrustedCAs() []byte { return bytes.Clone(g.trusted) }

// Proxy returns the egress proxy of one call of tenant: the base rules intersected with narrow (the
// policy's and the call's), and the credential bindings tenant may use.
func (g *Gateway) Proxy(tenant string, narrow Rules) (*Proxy, error) {
	var ic *interception
	for _, b := range g.bindings {
		if len(b.tenants) == 0 || slices.Contains(b.tenants, tenant) {
			if ic == nil {
				ic = &interception{ca: g.ca, roots: g.roots}
			}
			ic.bindings = append(ic.bindings, b)
		}
	}
	return newProxy(Intersect(g.base, narrow), g.set, ic)
}

// load checks the credential and reads its secret.
func (c Credential) load(lookupEnv func(string) (string, bool)) (*binding, error) {
	b := &binding{name: c.Name, host: strings.ToLower(strings.TrimSuffix(c.Host, ".")), port: c.Port,
		header: c.Header, tenants: c.Tenants}
	if !credentialNameRE.MatchString(c.Name) {
		return nil, fmt.Errorf("name %q: use 1 to 64 lowercase letters, digits, '.', '_' or '-'", c.Name)
	}
	if _, err := netip.ParseAddr(b.host); err == nil || b.host == "" || strings.ContainsAny(b.host, "*/:@ ") {
		return nil, fmt.Errorf("host %q: write the exact host name, such as api.github.com (no wildcard, port or IP address)", c.Host)
	}
	if b.port == 0 {
		b.port = 443
	}
	if b.port < 1 || b.port > 65535 {
		return nil, fmt.Errorf("port %d: it must be between 1 and 65535", c.Port)
	}
	for _, m := range c.Methods {
		if !httpguts.ValidHeaderFieldName(m) { // a method is a token, like a header name
			return nil, fmt.Errorf("method %q is not an HTTP method", m)
		}
		b.methods = append(b.methods, strings.ToUpper(m))
	}
	if c.PathPrefix != "" {
		if !strings.HasPrefix(c.PathPrefix, "/") || path.Clean(c.PathPrefix) != strings.TrimSuffix(c.PathPrefix, "/") && c.PathPrefix != "/" {
			return nil, fmt.Errorf("path_prefix %q: write a clean absolute path such as /acme/", c.PathPrefix)
		}
		b.pathPrefix = strings.TrimSuffix(c.PathPrefix, "/") + "/"
	}
	for _, t := range c.Tenants {
		if err := call.ValidateTenant(t); err != nil {
			return nil, fmt.Errorf("tenants: %w", err)
		}
	}
	if b.header == "" {
		b.header = "Authorization"
	}
	if !httpguts.ValidHeaderFieldName(b.header) || slices.ContainsFunc(append(slices.Clone(hopHeaders), "Host", "Content-Length"),
		func(h string) bool { return strings.EqualFold(h, b.header) }) {
		return nil, fmt.Errorf("header %q: name a request header such as Authorization or X-Api-Key", c.Header)
	}
	secret, err := c.secret(lookupEnv)
	if err != nil {
		return nil, err
	}
	switch c.Scheme {
	case "", "bearer":
		b.value = "Bearer " + secret
	case "basic":
		if !strings.Contains(secret, ":") {
			return nil, errors.New(`scheme basic: the secret must be "user:password"`)
		}
		b.value = "Basic " + base64.StdEncoding.EncodeToString([]byte(secret))
	case "raw":
		b.value = secret
	default:
		return nil, fmt.Errorf("scheme %q: use bearer, basic or raw", c.Scheme)
	}
	return b, nil
}

// secret reads the credential's secret from its file or environment variable.
func (c Credential) secret(lookupEnv func(string) (string, bool)) (string, error) {
	var s string
	switch {
	case (c.SecretFile == "") == (c.SecretEnv == ""):
		return "", errors.New("give exactly one of secret_file and secret_env")
	case c.SecretFile != "":
		data, err := os.ReadFile(c.SecretFile)
		if err != nil {
			return "", fmt.Errorf("read secret_file: %w", err)
		}
		s = string(data)
	default:
		var ok bool
		if lookupEnv != nil {
			s, ok = lookupEnv(c.SecretEnv)
		}
		if !ok {
			return "", fmt.Errorf("secret_env: the variable %s is not set in the worker's environment", c.SecretEnv)
		}
	}
	s = strings.TrimSuffix(strings.TrimSuffix(s, "\n"), "\r")
	switch {
	case s == "":
		return "", errors.New("the secret is empty")
	case strings.ContainsAny(s, "\r\n\x00"):
		return "", errors.New("the secret has a line break or NUL byte: a header value cannot hold one")
	}
	return s, nil
}
