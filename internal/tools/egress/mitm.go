package egress

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/toolpool/toolpool/internal/call"
)

// interception is what a proxy needs to terminate TLS for the hosts with a credential binding.
type interception struct {
	ca       *authority
	roots    *x509.CertPool // verifies the real upstreams
	bindings []*binding     // those the call's tenant may use
}

// binds reports whether a CONNECT to host:port is intercepted: some binding of the call names it.
func (ic *interception) binds(host string, port int) bool {
	if ic == nil {
		return false
	}
	for _, b := range ic.bindings {
		if b.host == host && b.port == port {
			return true
		}
	}
	return false
}

// match returns the first binding for host:port whose scope covers r, or nil.
func (ic *interception) match(host string, port int, r *http.Request) *binding {
	for _, b := range ic.bindings {
		if b.host == host && b.port == port && b.applies(r) {
			return b
		}
	}
	return nil
}

// binding is a loaded Credential: where its header goes and the header's value. The value holds the
// secret; nothing prints a binding.
type binding struct {
	name       string
	host       string
	port       int
	methods    []string
	pathPrefix string // "" or a clean path ending in "/"
	tenants    []string
	header     string
	value      string
}

// applies reports whether r is in the binding's scope: its method is listed (or none is), and its path is
// under the path prefix (or there is none). A path with dot segments, encoded slashes, backslashes or dots,
// or doubled slashes is never in a path-prefixed scope, because the origin may read it as another path
// than the prefix check did.
func (b *binding) applies(r *http.Request) bool {
	if len(b.methods) > 0 && !containsFold(b.methods, r.Method) {
		return false
	}
	if b.pathPrefix == "" {
		return true
	}
	raw := r.URL.EscapedPath()
	lower := strings.ToLower(raw)
	if strings.Contains(lower, "%2f") || strings.Contains(lower, "%5c") || strings.Contains(lower, "%2e") ||
		strings.Contains(raw, "\\") || strings.Contains(raw, "//") {
		return false
	}
	for _, seg := range strings.Split(raw, "/") {
		if seg == "." || seg == ".." {
			return false
		}
	}
	p := r.URL.Path
	return p == strings.TrimSuffix(b.pathPrefix, "/") || strings.HasPrefix(p, b.pathPrefix) // pathPrefix ends in "/"
}

func containsFold(list []string, s string) bool {
	for _, v := range list {
		if strings.EqualFold(v, s) {
			return true
		}
	}
	return false
}

// discardLog keeps the HTTP machinery inside an intercepted session from logging anything: what happens
// there is reported through the proxy's Log, and nothing of a request may reach the worker's log.
var discardLog = log.New(io.Discard, "", 0)

// intercept serves a CONNECT to a host with a credential binding. It first connects to the upstream (the
// Rules, the address checks and the pinning of DialContext apply as for any tunnel) and verifies its
// certificate against the upstream roots; then it answers the CONNECT, terminates the client's TLS with a
// certificate of the worker's CA for host, and forwards each request the client sends to the upstream,
// adding the binding's header to those in its scope and forcing Host to the CONNECT target. It returns when
// the client's connection or the proxy's context ends.
func (p *Proxy) intercept(w http.ResponseWriter, r *http.Request, host string, port int) {
	ctx := r.Context()
	addr := net.JoinHostPort(host, strconv.Itoa(port))
	first, err := p.dialTLS(ctx, addr, host)
	if err != nil {
		p.fail(w, host, port, err, 0)
		return
	}
	leaf, err := p.ic.ca.leaf(host, time.Now())
	if err != nil {
		first.Close()
		p.fail(w, host, port, &FailedError{Host: host, Rule: FailUpstream, Err: err}, 0)
		return
	}
	conn, buffered, err := hijack(w)
	if err != nil {
		first.Close()
		p.fail(w, host, port, &FailedError{Host: host, Rule: FailUpstream, Err: err}, 0)
		return
	}
	client := &countingConn{Conn: conn, pending: buffered}
	tlsConn := tls.Server(client, &tls.Config{
		Certificates: []tls.Certificate{*leaf}, NextProtos: []string{"http/1.1"}, MinVersion: tls.VersionTLS12,
	})

	var handoff atomic.Pointer[net.Conn]
	handoff.Store(&first)
	transport := &http.Transport{
		// Every upstream connection of this session goes to the CONNECT target, checked and pinned again;
		// the first one is the connection made before the CONNECT was answered.
		DialTLSContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			if c := handoff.Swap(nil); c != nil {
				return *c, nil
			}
			return p.dialTLS(ctx, addr, host)
		},
		TLSNextProto:           map[string]func(string, *tls.Conn) http.RoundTripper{}, // HTTP/1.1 only
		DisableCompression:     true,
		MaxIdleConnsPerHost:    4,
		IdleConnTimeout:        30 * time.Second,
		ResponseHeaderTimeout:  60 * time.Second,
		MaxResponseHeaderBytes: 1 << 20,
	}
	authority := addr
	if port == 443 {
		authority = host
	}
	var injected atomic.Pointer[string]
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host, pr.Out.Host = "https", addr, authority
			if b := p.ic.match(host, port, pr.In); b != nil {
				pr.Out.Header.Set(b.header, b.value)
				injected.Store(&b.name)
			}
		},
		Transport: transport,
		ErrorLog:  discardLog,
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			p.fail(w, host, port, err, 0)
		},
	}
	l := &connListener{conn: tlsConn, done: make(chan struct{})}
	srv := &http.Server{
		Handler:           rp,
		ErrorLog:          discardLog,
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		BaseContext:       func(net.Listener) context.Context { return ctx },
		ConnState: func(_ net.Conn, s http.ConnState) {
			if s == http.StateClosed || s == http.StateHijacked {
				l.Close()
			}
		},
	}
	stop := context.AfterFunc(ctx, func() { srv.Close() })
	_ = srv.Serve(l) // returns once the client's connection is gone
	stop()
	srv.Close()
	transport.CloseIdleConnections()
	if c := handoff.Swap(nil); c != nil {
		(*c).Close()
	}
	e := call.EgressConn{Host: host, Port: port, Decision: call.EgressAllowed, BytesUp: client.up.Load(), BytesDown: client.down.Load()}
	if name := injected.Load(); name != nil {
		e.Credential = *name
	}
	p.log.record(e)
}

// dialTLS connects to addr through DialContext and verifies the upstream's certificate for host against
// the interception's roots.
func (p *Proxy) dialTLS(ctx context.Context, addr, host string) (net.Conn, error) {
	raw, err := p.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	tc := tls.Client(raw, &tls.Config{ServerName: host, RootCAs: p.ic.roots, NextProtos: []string{"http/1.1"}, MinVersion: tls.VersionTLS12})
	hctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := tc.HandshakeContext(hctx); err != nil {
		raw.Close()
		return nil, &FailedError{Host: host, Rule: FailUpstreamTLS, Err: fmt.Errorf("verify the certificate of %s: %w", host, err)}
	}
	return tc, nil
}

// connListener hands out one connection, then blocks until closed. An http.Server serving it returns
// once the connection is done.
type connListener struct {
	conn      net.Conn
	handedOut atomic.Bool
	done      chan struct{}
	closeOnce sync.Once
}

func (l *connListener) Accept() (net.Conn, error) {
	if !l.handedOut.Swap(true) {
		return l.conn, nil
	}
	<-l.done
	return nil, net.ErrClosed
}

func (l *connListener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return nil
}

func (l *connListener) Addr() net.Addr { return l.conn.LocalAddr() }

// countingConn counts the bytes read from (up) and written to (down) a client connection; pending is what
// the client sent that was read before the connection was handed over, returned first.
type countingConn struct {
	net.Conn
	pending  []byte
	up, down atomic.Int64
}

func (c *countingConn) Read(b []byte) (int, error) {
	if len(c.pending) > 0 {
		n := copy(b, c.pending)
		c.pending = c.pending[n:]
		c.up.Add(int64(n))
		return n, nil
	}
	n, err := c.Conn.Read(b)
	c.up.Add(int64(n))
	if errors.Is(err, net.ErrClosed) {
		err = io.EOF
	}
	return n, err
}

func (c *countingConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.down.Add(int64(n))
	return n, err
}
