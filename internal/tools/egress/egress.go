// Package egress is the worker's egress proxy: the only way a call's container (which has no network of its
// own) reaches the internet, through a unix socket mounted into it. It is an HTTP forward proxy: plain http
// as absolute-URI requests, https (or anything else over TCP) as CONNECT tunnels.
//
// Every connection is checked where it is dialled: the host must pass the Rules (a domain allowlist when
// one is set), then it is resolved, and every address it resolves to must be public: loopback, private
// (RFC 1918, unique local), link-local, carrier-grade NAT, unspecified, multicast, reserved and cloud
// metadata addresses are refused. The proxy then dials exactly the addresses it checked, so a second DNS
// answer cannot point the connection elsewhere (DNS rebinding). Redirects are the client's to follow: each
// hop is a new request through the proxy and is checked again.
package egress

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Response headers by which the proxy explains a failure of its own, so a client can tell it from the
// origin's answer. The proxy strips them from origin responses.
const (
	// RefusedHeader carries why the proxy refused a destination (status 403).
	RefusedHeader = "X-Toolpool-Egress-Refused"
	// ErrorHeader carries why the proxy could not reach an allowed destination (status 502).
	ErrorHeader = "X-Toolpool-Egress-Error"
)

// Rules says which destinations the proxy may reach on top of the address checks, which always apply.
type Rules struct {
	// AllowDomains, when non-empty, lists the only hosts that may be reached: an exact name
	// ("example.com") or a suffix pattern ("*.example.com", which matches every subdomain of example.com
	// but not example.com itself). An IP address host must be listed exactly.
	AllowDomains []string `json:"allow_domains,omitempty" yaml:"allow_domains,omitempty"`
	// DenyDomains lists hosts that may never be reached, in the same syntax; it wins over AllowDomains.
	DenyDomains []string `json:"deny_domains,omitempty" yaml:"deny_domains,omitempty"`
	// AllowPorts, when non-empty, lists the only destination ports allowed.
	AllowPorts []int `json:"allow_ports,omitempty" yaml:"allow_ports,omitempty"`
}

// Validate checks the domain patterns and ports.
func (r Rules) Validate() error {
	for _, list := range [][]string{r.AllowDomains, r.DenyDomains} {
		for _, d := range list {
			name := strings.TrimPrefix(d, "*.")
			if name == "" || strings.ContainsAny(name, "*/:@ ") || strings.HasPrefix(name, ".") {
				return fmt.Errorf("check egress domain %q: write a host name (\"example.com\") or a suffix pattern (\"*.example.com\")", d)
			}
		}
	}
	for _, p := range r.AllowPorts {
		if p < 1 || p > 65535 {
			return fmt.Errorf("check egress port %d: it must be between 1 and 65535", p)
		}
	}
	return nil
}

// blockedNames are host names refused before any lookup: cloud metadata services and localhost.
var blockedNames = []string{
	"localhost", "*.localhost", "metadata.google.internal", "metadata.goog", "metadata", "instance-data",
	"instance-data.ec2.internal", "metadata.azure.com",
}

// matchDomain reports whether host matches pattern ("example.com" or "*.example.com").
func matchDomain(pattern, host string) bool {
	pattern = strings.ToLower(strings.TrimSuffix(pattern, "."))
	if suffix, ok := strings.CutPrefix(pattern, "*."); ok {
		return strings.HasSuffix(host, "."+suffix)
	}
	return host == pattern
}

// RefusedError is a destination the proxy will not reach.
type RefusedError struct {
	Host   string
	Reason string
}

func (e *RefusedError) Error() string { return fmt.Sprintf("refuse %s: %s", e.Host, e.Reason) }

// Resolver looks up a host's addresses; *net.Resolver implements it.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Option changes a Proxy.
type Option func(*Proxy)

// WithResolver replaces the system resolver.
func WithResolver(r Resolver) Option { return func(p *Proxy) { p.resolver = r } }

// WithAllowAddr makes addresses for which allow returns true exempt from the address checks (but not from
// the Rules). It exists for tests that serve on loopback; production must not set it.
func WithAllowAddr(allow func(netip.AddrPort) bool) Option {
	return func(p *Proxy) { p.allowAddr = allow }
}

// Proxy is the egress proxy. It is an http.Handler; Serve runs it on a listener. Safe for concurrent use.
type Proxy struct {
	rules       Rules
	resolver    Resolver
	dialTimeout time.Duration
	allowAddr   func(netip.AddrPort) bool
	transport   *http.Transport
}

// New returns a proxy enforcing rules, which must be valid.
func New(rules Rules, opts ...Option) (*Proxy, error) {
	if err := rules.Validate(); err != nil {
		return nil, fmt.Errorf("create egress proxy: %w", err)
	}
	p := &Proxy{rules: rules, resolver: net.DefaultResolver, dialTimeout: 10 * time.Second}
	for _, o := range opts {
		o(p)
	}
	p.transport = &http.Transport{
		Proxy:                  nil, // never chain to a proxy from the environment
		DialContext:            p.DialContext,
		DisableCompression:     true,
		MaxIdleConns:           32,
		IdleConnTimeout:        30 * time.Second,
		ResponseHeaderTimeout:  60 * time.Second,
		MaxResponseHeaderBytes: 1 << 20,
	}
	return p, nil
}

// Serve answers proxy requests on l until ctx is cancelled (then it closes l and every open tunnel, and
// returns nil) or l fails (then it returns the error). It blocks.
func (p *Proxy) Serve(ctx context.Context, l net.Listener) error {
	srv := &http.Server{
		Handler:           p,
		BaseContext:       func(net.Listener) context.Context { return ctx },
		ReadHeaderTimeout: 10 * time.Second,
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(l) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve egress proxy: %w", err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	err := srv.Shutdown(shutdownCtx)
	<-errc
	p.transport.CloseIdleConnections()
	if err != nil {
		return fmt.Errorf("shut down egress proxy: %w", err)
	}
	return nil
}

// ServeHTTP proxies one request: CONNECT opens a tunnel, an absolute http:// URI is forwarded.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodConnect {
		p.connect(w, r)
		return
	}
	if !r.URL.IsAbs() || r.URL.Scheme != "http" || r.URL.Host == "" {
		http.Error(w, "egress proxy: send an absolute http:// URI, or CONNECT for https", http.StatusBadRequest)
		return
	}
	p.forward(w, r)
}

// hopHeaders are connection-level headers a proxy must not pass on.
var hopHeaders = []string{
	"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Te",
	"Trailer", "Transfer-Encoding", "Upgrade",
}

func removeHopHeaders(h http.Header) {
	for _, f := range h.Values("Connection") {
		for _, name := range strings.Split(f, ",") {
			h.Del(strings.TrimSpace(name))
		}
	}
	for _, name := range hopHeaders {
		h.Del(name)
	}
}

func (p *Proxy) forward(w http.ResponseWriter, r *http.Request) {
	out := r.Clone(r.Context())
	out.RequestURI = ""
	out.Close = false
	removeHopHeaders(out.Header)
	resp, err := p.transport.RoundTrip(out)
	if err != nil {
		p.fail(w, err)
		return
	}
	defer resp.Body.Close()
	removeHopHeaders(resp.Header)
	resp.Header.Del(RefusedHeader)
	resp.Header.Del(ErrorHeader)
	for name, vals := range resp.Header {
		w.Header()[name] = vals
	}
	w.WriteHeader(resp.StatusCode)
	io.Copy(w, resp.Body) // the client sees a short body when the origin fails mid-way
}

func (p *Proxy) connect(w http.ResponseWriter, r *http.Request) {
	upstream, err := p.DialContext(r.Context(), "tcp", r.Host)
	if err != nil {
		p.fail(w, err)
		return
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		upstream.Close()
		http.Error(w, "egress proxy: this connection cannot be tunnelled", http.StatusInternalServerError)
		return
	}
	conn, brw, err := hj.Hijack()
	if err != nil {
		upstream.Close()
		return
	}
	var once sync.Once
	closeBoth := func() {
		once.Do(func() {
			conn.Close()
			upstream.Close()
		})
	}
	defer closeBoth()
	stop := context.AfterFunc(r.Context(), closeBoth)
	defer stop()
	if _, err := conn.Write([]byte("HTTP/1.1 200 Connection established\r\n\r\n")); err != nil {
		return
	}
	if n := brw.Reader.Buffered(); n > 0 {
		buffered, _ := brw.Reader.Peek(n)
		if _, err := upstream.Write(buffered); err != nil {
			return
		}
	}
	done := make(chan struct{}, 2)
	go func() {
		io.Copy(upstream, conn)
		if tc, ok := upstream.(interface{ CloseWrite() error }); ok {
			tc.CloseWrite()
		}
		done <- struct{}{}
	}()
	go func() {
		io.Copy(conn, upstream)
		closeBoth() // the origin is done: nothing more can reach the client
		done <- struct{}{}
	}()
	<-done
	<-done
}

// fail answers a request the proxy could not serve, explaining why in a header the client can read.
func (p *Proxy) fail(w http.ResponseWriter, err error) {
	var refused *RefusedError
	msg := strings.NewReplacer("\r", " ", "\n", " ").Replace(err.Error())
	if errors.As(err, &refused) {
		w.Header().Set(RefusedHeader, msg)
		http.Error(w, "egress proxy: "+msg, http.StatusForbidden)
		return
	}
	w.Header().Set(ErrorHeader, msg)
	http.Error(w, "egress proxy: "+msg, http.StatusBadGateway)
}

// DialContext connects to addr ("host:port") after checking the host against the Rules and every address
// it resolves to against CheckAddr; it dials only the addresses it checked. A refusal is a *RefusedError.
func (p *Proxy) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	if network != "tcp" && network != "tcp4" && network != "tcp6" {
		return nil, &RefusedError{Host: addr, Reason: "only TCP is proxied"}
	}
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, &RefusedError{Host: addr, Reason: "the destination must be host:port"}
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil || port == 0 {
		return nil, &RefusedError{Host: addr, Reason: fmt.Sprintf("port %q is not a valid port", portStr)}
	}
	if len(p.rules.AllowPorts) > 0 && !slices.Contains(p.rules.AllowPorts, int(port)) {
		return nil, &RefusedError{Host: addr, Reason: fmt.Sprintf("port %d is not among the allowed ports %v", port, p.rules.AllowPorts)}
	}
	addrs, err := p.resolve(ctx, host)
	if err != nil {
		return nil, err
	}
	_, literalErr := netip.ParseAddr(host)
	literal := literalErr == nil
	var checked []netip.AddrPort
	for _, a := range addrs {
		ap := netip.AddrPortFrom(a, uint16(port))
		if p.allowAddr != nil && p.allowAddr(ap) {
			checked = append(checked, ap)
			continue
		}
		if err := CheckAddr(a); err != nil {
			if literal {
				return nil, &RefusedError{Host: host, Reason: "it is " + err.Error()}
			}
			return nil, &RefusedError{Host: host, Reason: fmt.Sprintf("it resolves to %s, %s", a, err.Error())}
		}
		checked = append(checked, ap)
	}
	d := net.Dialer{Timeout: p.dialTimeout}
	var firstErr error
	for _, ap := range checked {
		conn, err := d.DialContext(ctx, "tcp", ap.String())
		if err == nil {
			return conn, nil
		}
		if firstErr == nil {
			firstErr = err
		}
	}
	return nil, fmt.Errorf("dial %s: %w", addr, firstErr)
}

// resolve checks host against the Rules and returns its addresses.
func (p *Proxy) resolve(ctx context.Context, host string) ([]netip.Addr, error) {
	name := strings.ToLower(strings.TrimSuffix(host, "."))
	if name == "" {
		return nil, &RefusedError{Host: host, Reason: "the host is empty"}
	}
	for _, pat := range blockedNames {
		if matchDomain(pat, name) {
			return nil, &RefusedError{Host: host, Reason: "it is a local or cloud metadata name"}
		}
	}
	for _, pat := range p.rules.DenyDomains {
		if matchDomain(pat, name) {
			return nil, &RefusedError{Host: host, Reason: fmt.Sprintf("it matches the denied domain %q", pat)}
		}
	}
	if len(p.rules.AllowDomains) > 0 && !slices.ContainsFunc(p.rules.AllowDomains, func(pat string) bool { return matchDomain(pat, name) }) {
		return nil, &RefusedError{Host: host, Reason: fmt.Sprintf("it is not among the allowed domains (%s)", strings.Join(p.rules.AllowDomains, ", "))}
	}
	if a, err := netip.ParseAddr(name); err == nil {
		return []netip.Addr{a.WithZone("")}, nil
	}
	addrs, err := p.resolver.LookupNetIP(ctx, "ip", name)
	if err != nil {
		return nil, fmt.Errorf("resolve %s: %w", host, err)
	}
	if len(addrs) == 0 {
		return nil, fmt.Errorf("resolve %s: no addresses", host)
	}
	return addrs, nil
}

type blockedRange struct {
	prefix netip.Prefix
	what   string
}

// blockedRanges are the non-public address ranges, most specific first.
var blockedRanges = func() []blockedRange {
	var out []blockedRange
	for _, r := range []struct{ cidr, what string }{
		{"169.254.169.254/32", "a cloud metadata address"},
		{"169.254.170.2/32", "a cloud metadata address"},
		{"100.100.100.200/32", "a cloud metadata address"},
		{"fd00:ec2::254/128", "a cloud metadata address"},
		{"0.0.0.0/8", "an unspecified (this network) address"},
		{"10.0.0.0/8", "a private address"},
		{"100.64.0.0/10", "a carrier-grade NAT address"},
		{"127.0.0.0/8", "a loopback address"},
		{"169.254.0.0/16", "a link-local address"},
		{"172.16.0.0/12", "a private address"},
		{"192.0.0.0/24", "a reserved (IETF protocol) address"},
		{"192.0.2.0/24", "a documentation address"},
		{"192.88.99.0/24", "a reserved (6to4 relay) address"},
		{"192.168.0.0/16", "a private address"},
		{"198.18.0.0/15", "a reserved (benchmarking) address"},
		{"198.51.100.0/24", "a documentation address"},
		{"203.0.113.0/24", "a documentation address"},
		{"224.0.0.0/4", "a multicast address"},
		{"240.0.0.0/4", "a reserved or broadcast address"},
		{"::/128", "an unspecified address"},
		{"::1/128", "a loopback address"},
		{"::/96", "a reserved (IPv4-compatible) address"},
		{"64:ff9b:1::/48", "a local NAT64 address"},
		{"100::/64", "a discard-only address"},
		{"2001::/32", "a Teredo tunnel address"},
		{"2001:db8::/32", "a documentation address"},
		{"fc00::/7", "a private (unique local) address"},
		{"fe80::/10", "a link-local address"},
		{"fec0::/10", "a site-local address"},
		{"ff00::/8", "a multicast address"},
	} {
		out = append(out, blockedRange{netip.MustParsePrefix(r.cidr), r.what})
	}
	return out
}()

var (
	nat64     = netip.MustParsePrefix("64:ff9b::/96")
	sixToFour = netip.MustParsePrefix("2002::/16")
)

// CheckAddr returns an error saying what kind of address a is when it is not a public unicast address.
func CheckAddr(a netip.Addr) error {
	if !a.IsValid() {
		return errors.New("an invalid address")
	}
	a = a.WithZone("").Unmap()
	for _, r := range blockedRanges {
		if r.prefix.Contains(a) {
			return errors.New(r.what)
		}
	}
	// IPv6 forms that embed an IPv4 address reach that address: check it.
	if nat64.Contains(a) || sixToFour.Contains(a) {
		b := a.As16()
		var v4 [4]byte
		if nat64.Contains(a) {
			copy(v4[:], b[12:16])
		} else {
			copy(v4[:], b[2:6])
		}
		if err := CheckAddr(netip.AddrFrom4(v4)); err != nil {
			return fmt.Errorf("an IPv6 address embedding %s, %w", netip.AddrFrom4(v4), err)
		}
	}
	return nil
}
