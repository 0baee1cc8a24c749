// Package egress is the worker's egress proxy: the only way a call's container (which has no network of its
// own) reaches the internet, through a unix socket mounted into it. It is an HTTP forward proxy: plain http
// as absolute-URI requests, https (or anything else over TCP) as CONNECT tunnels. Commands reach it through
// the in-container forwarder (Forward), web_fetch directly.
//
// Every connection is checked where it is dialled: the host and port must pass the Rules (the operator's,
// the policy's and the call's, intersected), then the host is resolved by the proxy itself, and every
// address it resolves to must be public: loopback, private (RFC 1918, unique local), link-local,
// carrier-grade NAT, unspecified, multicast, reserved and cloud metadata addresses are refused, in IPv4,
// IPv6 and the IPv6 forms that embed an IPv4 address. The proxy then dials exactly the addresses it
// checked, so a second DNS answer cannot point the connection elsewhere (DNS rebinding). Redirects are the
// client's to follow: each hop is a new request or CONNECT through the proxy and is checked again.
//
// A refusal is a 403 whose body names the rule and says how to ask for the destination; a destination
// that is allowed but unreachable is a 502. Each connection's destination, outcome and bytes go to the
// proxy's Log, which becomes the call's result field "egress".
//
// For the hosts an operator bound a credential to (Gateway, Credential), and only for them, the proxy
// terminates the client's TLS with a certificate of its own certificate authority, verifies the real
// upstream's certificate, and adds the credential's header to the requests in the binding's scope. Every
// other CONNECT is a byte-for-byte tunnel the proxy never looks into.
package egress

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/toolpool/toolpool/internal/call"
)

// Response headers by which the proxy explains a failure of its own, so a client can tell it from the
// origin's answer. The proxy strips them from origin responses.
const (
	// RefusedHeader carries why the proxy refused a destination (status 403).
	RefusedHeader = "X-Toolpool-Egress-Refused"
	// ErrorHeader carries why the proxy could not reach an allowed destination (status 502).
	ErrorHeader = "X-Toolpool-Egress-Error"
	// RuleHeader names the rule of a refusal or the kind of failure (RuleNames).
	RuleHeader = "X-Toolpool-Egress-Rule"
)

// RefusedError is a destination the proxy will not reach, and the rule that refuses it.
type RefusedError struct {
	Host   string
	Port   int
	Rule   string // one of RuleNames
	Reason string
}

func (e *RefusedError) Error() string { return fmt.Sprintf("refuse %s: %s", e.Host, e.Reason) }

// FailedError is an allowed destination the proxy could not reach.
type FailedError struct {
	Host string
	Rule string // FailResolve, FailDial, FailUpstreamTLS or FailUpstream
	Err  error
}

func (e *FailedError) Error() string { return e.Err.Error() }
func (e *FailedError) Unwrap() error { return e.Err }

// Resolver looks up a host's addresses; *net.Resolver implements it.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// settings are what a Proxy (or every Proxy of a Gateway) runs with besides its rules.
type settings struct {
	resolver    Resolver
	allowAddr   func(netip.AddrPort) bool
	dialTimeout time.Duration
	lookupEnv   func(string) (string, bool)
}

func defaultSettings() settings {
	return settings{resolver: net.DefaultResolver, dialTimeout: 10 * time.Second}
}

// Option changes a Proxy, or every Proxy of a Gateway.
type Option func(*settings)

// WithResolver replaces the system resolver.
func WithResolver(r Resolver) Option { return func(s *settings) { s.resolver = r } }

// WithAllowAddr makes addresses for which allow returns true exempt from the address checks (but not from
// the Rules). It exists for tests that serve on loopback; production must not set it.
func WithAllowAddr(allow func(netip.AddrPort) bool) Option {
	return func(s *settings) { s.allowAddr = allow }
}

// Proxy is the egress proxy of one call. It is an http.Handler; Serve runs it on a listener. Safe for
// concurrent use.
type Proxy struct {
	rules     Rules
	set       settings
	transport *http.Transport
	log       Log
	ic        *interception // nil: no credential bindings, every CONNECT is a tunnel
	handlers  sync.WaitGroup
}

// New returns a proxy enforcing rules, which must be valid. It injects no credentials (see Gateway).
func New(rules Rules, opts ...Option) (*Proxy, error) {
	s := defaultSettings()
	for _, o := range opts {
		o(&s)
	}
	return newProxy(rules, s, nil)
}

func newProxy(rules Rules, s settings, ic *interception) (*Proxy, error) {
	if err := rules.Validate(); err != nil {
		return nil, fmt.Errorf("create egress proxy: %w", err)
	}
	rules = Intersect(rules) // normalized
	p := &Proxy{rules: rules, set: s, ic: ic}
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

// Rules returns the rules the proxy enforces.
func (p *Proxy) Rules() Rules { return p.rules }

// Log returns what the proxy did with each connection so far; after Serve returned, everything it did.
func (p *Proxy) Log() []call.EgressConn { return p.log.Entries() }

// Serve answers proxy requests on l until ctx is cancelled (then it closes l and every open tunnel, waits
// for every connection to be logged, and returns nil) or l fails (then it returns the error). It blocks.
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
	p.handlers.Wait() // hijacked tunnels end with ctx; they log when they do
	p.transport.CloseIdleConnections()
	if err != nil {
		return fmt.Errorf("shut down egress proxy: %w", err)
	}
	return nil
}

// ServeHTTP proxies one request: CONNECT opens a tunnel (or, for a host with a credential binding, an
// intercepted TLS session), an absolute http:// URI is forwarded.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.handlers.Add(1)
	defer p.handlers.Done()
	if r.Method == http.MethodConnect {
		p.connect(w, r)
		return
	}
	if !r.URL.IsAbs() || r.URL.Scheme != "http" || r.URL.Host == "" {
		host, port, _ := splitTarget(r.Host, 80)
		p.fail(w, host, port, &RefusedError{Host: r.Host, Rule: RuleBadRequest,
			Reason: "the proxy takes absolute http:// URIs, and CONNECT host:port for https"}, 0)
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
	host, port, err := splitTarget(r.URL.Host, 80)
	if err != nil {
		p.fail(w, r.URL.Host, 0, err, 0)
		return
	}
	out := r.Clone(r.Context())
	out.RequestURI = ""
	out.Close = false
	removeHopHeaders(out.Header)
	body := &countingReader{r: r.Body}
	if r.Body != nil && r.Body != http.NoBody {
		out.Body = body
	}
	resp, err := p.transport.RoundTrip(out)
	if err != nil {
		p.fail(w, host, port, err, body.n.Load())
		return
	}
	defer resp.Body.Close()
	removeHopHeaders(resp.Header)
	for _, h := range []string{RefusedHeader, ErrorHeader, RuleHeader} {
		resp.Header.Del(h)
	}
	for name, vals := range resp.Header {
		w.Header()[name] = vals
	}
	w.WriteHeader(resp.StatusCode)
	down, _ := io.Copy(w, resp.Body) // the client sees a short body when the origin fails mid-way
	p.log.record(call.EgressConn{Host: host, Port: port, Decision: call.EgressAllowed, BytesUp: body.n.Load(), BytesDown: down})
}

func (p *Proxy) connect(w http.ResponseWriter, r *http.Request) {
	host, port, err := splitTarget(r.Host, 0)
	if err != nil {
		p.fail(w, r.Host, 0, err, 0)
		return
	}
	if p.ic.binds(host, port) {
		p.intercept(w, r, host, port)
		return
	}
	upstream, err := p.DialContext(r.Context(), "tcp", r.Host)
	if err != nil {
		p.fail(w, host, port, err, 0)
		return
	}
	conn, buffered, err := hijack(w)
	if err != nil {
		upstream.Close()
		p.fail(w, host, port, &FailedError{Host: host, Rule: FailUpstream, Err: err}, 0)
		return
	}
	up, down := tunnel(r.Context(), conn, buffered, upstream)
	p.log.record(call.EgressConn{Host: host, Port: port, Decision: call.EgressAllowed, BytesUp: up, BytesDown: down})
}

// hijack takes over the client's connection and tells it the tunnel is open. buffered is what the client
// sent after its CONNECT request that the server had read already.
func hijack(w http.ResponseWriter) (conn net.Conn, buffered []byte, err error) {
	hj, ok := w.(http.Hijacker)
	if !ok {
		return nil, nil, errors.New("hijack connection: this connection cannot be tunnelled")
	}
	conn, brw, err := hj.Hijack()
	if err != nil {
		return nil, nil, fmt.Errorf("hijack connection: %w", err)
	}
	if n := brw.Reader.Buffered(); n > 0 {
		buffered, _ = brw.Reader.Peek(n)
	}
	if _, err := conn.Write([]byte("HTTP/1.1 200 Connection established\r\n\r\n")); err != nil {
		conn.Close()
		return nil, nil, fmt.Errorf("answer CONNECT: %w", err)
	}
	return conn, buffered, nil
}

// tunnel copies between the client and upstream until both directions are done or ctx ends, closes both
// and returns the bytes the client sent (up) and received (down).
func tunnel(ctx context.Context, conn net.Conn, buffered []byte, upstream net.Conn) (up, down int64) {
	var once sync.Once
	closeBoth := func() {
		once.Do(func() {
			conn.Close()
			upstream.Close()
		})
	}
	defer closeBoth()
	stop := context.AfterFunc(ctx, closeBoth)
	defer stop()
	if len(buffered) > 0 {
		if _, err := upstream.Write(buffered); err != nil {
			return 0, 0
		}
	}
	var upN, downN atomic.Int64
	done := make(chan struct{}, 2)
	go func() {
		n, _ := io.Copy(upstream, conn)
		upN.Store(n)
		if tc, ok := upstream.(interface{ CloseWrite() error }); ok {
			tc.CloseWrite()
		}
		done <- struct{}{}
	}()
	go func() {
		n, _ := io.Copy(conn, upstream)
		downN.Store(n)
		closeBoth() // the origin is done: nothing more can reach the client
		done <- struct{}{}
	}()
	<-done
	<-done
	return int64(len(buffered)) + upN.Load(), downN.Load()
}

// fail answers a request the proxy could not serve and logs it: a refusal is a 403 (400 for a request it
// does not serve at all), anything else a 502,
// each with a body that says what happened and what to do, and headers a client can read.
func (p *Proxy) fail(w http.ResponseWriter, host string, port int, err error, bytesUp int64) {
	e := outcome(host, port, err)
	e.BytesUp = bytesUp
	p.log.record(e)
	msg := strings.NewReplacer("\r", " ", "\n", " ").Replace(err.Error())
	status := http.StatusBadGateway
	if e.Decision == call.EgressRefused {
		status = http.StatusForbidden
		if e.Rule == RuleBadRequest {
			status = http.StatusBadRequest
		}
		w.Header().Set(RefusedHeader, msg)
	} else {
		w.Header().Set(ErrorHeader, msg)
	}
	w.Header().Set(RuleHeader, e.Rule)
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	io.WriteString(w, Explain(e))
}

// outcome classifies err for the log.
func outcome(host string, port int, err error) call.EgressConn {
	e := call.EgressConn{Host: host, Port: port, Decision: call.EgressFailed, Rule: FailUpstream, Reason: err.Error()}
	var refused *RefusedError
	var failed *FailedError
	switch {
	case errors.As(err, &refused):
		e.Decision, e.Rule, e.Reason = call.EgressRefused, refused.Rule, refused.Reason
	case errors.As(err, &failed):
		e.Rule = failed.Rule
	}
	return e
}

// Explain says, for the program and the model that reads its output, what the proxy did with a refused or
// failed destination and what to do about it.
func Explain(e call.EgressConn) string {
	target := e.Host
	if e.Port > 0 {
		target = net.JoinHostPort(e.Host, strconv.Itoa(e.Port))
	}
	if e.Decision != call.EgressRefused {
		return fmt.Sprintf("toolpool egress proxy: could not reach %s (%s): %s\n", target, e.Rule, e.Reason)
	}
	var hint string
	switch e.Rule {
	case RuleDomainNotAllowed:
		hint = fmt.Sprintf("Only the domains that the operator and the policy allow for this tool can be reached from the sandbox. If the task needs %s, ask the operator to add it to the tool's allowed_domains (or an egress preset) in the policy.", e.Host)
	case RulePortNotAllowed:
		hint = fmt.Sprintf("Use an allowed port, or ask the operator to add port %d to the tool's allowed_ports.", e.Port)
	case RuleDomainDenied:
		hint = "The operator denies this domain for every call; policy cannot allow it."
	case RuleBlockedName, RuleNonPublicAddress:
		hint = "Local, private, link-local, carrier-grade NAT and cloud metadata addresses can never be reached from a sandbox, whatever the policy says."
	default:
		hint = "Send an absolute http:// URI, or CONNECT host:port for https; HTTP_PROXY and HTTPS_PROXY are set for this."
	}
	return fmt.Sprintf("toolpool egress proxy: refused %s (rule %s): %s.\n%s\n", target, e.Rule, e.Reason, hint)
}

// splitTarget splits "host:port" (a bare host takes defaultPort when it is not 0) into a lower-case host
// without a trailing dot and a port.
func splitTarget(addr string, defaultPort int) (string, int, error) {
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		if defaultPort == 0 || strings.Contains(addr, "]:") {
			return addr, 0, &RefusedError{Host: addr, Rule: RuleBadRequest, Reason: "the destination must be host:port"}
		}
		host, portStr = strings.TrimSuffix(strings.TrimPrefix(addr, "["), "]"), strconv.Itoa(defaultPort)
	}
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	if portStr == "" && defaultPort > 0 { // "http://host:/" is the default port
		portStr = strconv.Itoa(defaultPort)
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil || port == 0 {
		return host, 0, &RefusedError{Host: host, Rule: RuleBadRequest, Reason: fmt.Sprintf("port %q is not a valid port", portStr)}
	}
	return host, int(port), nil
}

// DialContext connects to addr ("host:port") after checking the host and port against the Rules and every
// address the host resolves to against CheckAddr; it dials only the addresses it checked. A refusal is a
// *RefusedError, a failure a *FailedError.
func (p *Proxy) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	if network != "tcp" && network != "tcp4" && network != "tcp6" {
		return nil, &RefusedError{Host: addr, Rule: RuleBadRequest, Reason: "only TCP is proxied"}
	}
	host, port, err := splitTarget(addr, 0)
	if err != nil {
		return nil, err
	}
	addrs, err := p.resolve(ctx, host, port)
	if err != nil {
		return nil, err
	}
	_, literalErr := netip.ParseAddr(host)
	literal := literalErr == nil
	var checked []netip.AddrPort
	for _, a := range addrs {
		ap := netip.AddrPortFrom(a, uint16(port))
		if p.set.allowAddr != nil && p.set.allowAddr(ap) {
			checked = append(checked, ap)
			continue
		}
		if err := CheckAddr(a); err != nil {
			reason := fmt.Sprintf("it resolves to %s, %s", a, err.Error())
			if literal {
				reason = "it is " + err.Error()
			}
			return nil, &RefusedError{Host: host, Port: port, Rule: RuleNonPublicAddress, Reason: reason}
		}
		checked = append(checked, ap)
	}
	d := net.Dialer{Timeout: p.set.dialTimeout}
	var firstErr error
	for _, ap := range checked {
		conn, err := d.DialContext(ctx, "tcp", ap.String()) // the checked address, never the name again
		if err == nil {
			return conn, nil
		}
		if firstErr == nil {
			firstErr = err
		}
	}
	return nil, &FailedError{Host: host, Rule: FailDial, Err: fmt.Errorf("dial %s: %w", addr, firstErr)}
}

// resolve checks host and port against the Rules and returns the host's addresses.
func (p *Proxy) resolve(ctx context.Context, host string, port int) ([]netip.Addr, error) {
	if refused := p.rules.checkHost(host, port); refused != nil {
		return nil, refused
	}
	if a, err := netip.ParseAddr(host); err == nil {
		return []netip.Addr{a.WithZone("")}, nil
	}
	addrs, err := p.set.resolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return nil, &FailedError{Host: host, Rule: FailResolve, Err: fmt.Errorf("resolve %s: %w", host, err)}
	}
	if len(addrs) == 0 {
		return nil, &FailedError{Host: host, Rule: FailResolve, Err: fmt.Errorf("resolve %s: no addresses", host)}
	}
	return addrs, nil
}

// countingReader counts what is read through it.
type countingReader struct {
	r io.Reader
	n atomic.Int64
}

func (c *countingReader) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	c.n.Add(int64(n))
	return n, err
}

func (c *countingReader) Close() error {
	if rc, ok := c.r.(io.Closer); ok {
		return rc.Close()
	}
	return nil
}

// upstreamRoots returns the system's roots plus the PEM certificates of extra.
func upstreamRoots(extra []byte) (*x509.CertPool, error) {
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	if len(extra) > 0 && !pool.AppendCertsFromPEM(extra) {
		return nil, errors.New("load extra upstream roots: no PEM certificate in them")
	}
	return pool, nil
}
