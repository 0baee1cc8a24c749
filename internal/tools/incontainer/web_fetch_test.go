package incontainer

import (
	"context"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/tools/egress"
)

// fakeResolver answers from a map.
type fakeResolver map[string]string

func (f fakeResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	a, ok := f[host]
	if !ok {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	return []netip.Addr{netip.MustParseAddr(a)}, nil
}

// serveEgress runs an egress proxy with rules on a unix socket until the test ends; the proxy may reach
// the listed test servers on loopback, and nothing else that is not public.
func serveEgress(t *testing.T, rules egress.Rules, servers ...*httptest.Server) string {
	t.Helper()
	var allowed []netip.AddrPort
	for _, s := range servers {
		allowed = append(allowed, netip.MustParseAddrPort(s.Listener.Addr().String()))
	}
	resolver := fakeResolver{"site.test": "127.0.0.1", "example.com": "127.0.0.1", "private.test": "10.20.30.40", "docs.allowed.test": "127.0.0.1"}
	p, err := egress.New(rules, egress.WithResolver(resolver), egress.WithAllowAddr(func(ap netip.AddrPort) bool {
		for _, a := range allowed {
			if a == ap {
				return true
			}
		}
		return false
	}))
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "egress.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Serve(ctx, l) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return sock
}

func TestWebFetch(t *testing.T) {
	long := strings.Repeat("0123456789 abcdefghij klmnopqrst\n", 150) // 4950 bytes
	mux := http.NewServeMux()
	mux.HandleFunc("/page", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprint(w, `<html><head><title>T</title><style>body{}</style><script>evil()</script></head>`+
			`<body><h1>Title</h1><p>Hello <b>world</b>, see <a href="/docs">the docs</a>.</p><ul><li>one</li><li>two</li></ul></body></html>`)
	})
	mux.HandleFunc("/text", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		fmt.Fprint(w, "just text\n")
	})
	mux.HandleFunc("/json", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"a":1}`)
	})
	mux.HandleFunc("/long", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		fmt.Fprint(w, long)
	})
	mux.HandleFunc("/image", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "image/png")
		w.Write([]byte("\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"))
	})
	mux.HandleFunc("/latin1", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=iso-8859-1")
		w.Write([]byte("caf\xe9\n"))
	})
	mux.HandleFunc("/missing", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprint(w, "<p>No such page</p>")
	})
	mux.HandleFunc("/hop", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/text", http.StatusFound) })
	mux.HandleFunc("/to-private", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "http://private.test:"+r.URL.Port()+"/secret", http.StatusFound)
	})
	mux.HandleFunc("/to-metadata", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "http://169.254.169.254/latest/meta-data/iam/", http.StatusMovedPermanently)
	})
	mux.HandleFunc("/to-loopback", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "http://127.0.0.1:1/admin", http.StatusFound)
	})
	mux.HandleFunc("/loop", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/loop", http.StatusFound) })
	srv := httptest.NewServer(mux)
	defer srv.Close()
	tlsSrv := httptest.NewTLSServer(mux)
	defer tlsSrv.Close()
	port := netip.MustParseAddrPort(srv.Listener.Addr().String()).Port()
	tlsPort := netip.MustParseAddrPort(tlsSrv.Listener.Addr().String()).Port()
	pool := x509.NewCertPool()
	pool.AddCert(tlsSrv.Certificate())

	sock := serveEgress(t, egress.Rules{}, srv, tlsSrv)
	site := fmt.Sprintf("http://site.test:%d", port)
	tests := []struct {
		name     string
		args     map[string]any
		wantType string
		want     []string
		not      []string
		trunc    bool
	}{
		{name: "HTML becomes Markdown", args: map[string]any{"url": site + "/page"},
			want: []string{"URL: " + site + "/page\nContent-Type: text/html, converted to Markdown\n", "# Title", "Hello **world**, see [the docs](" + site + "/docs).", "- one\n- two"},
			not:  []string{"evil", "body{}", "<p>"}},
		{name: "raw HTML", args: map[string]any{"url": site + "/page", "raw": true}, want: []string{"Content-Type: text/html\n", "<h1>Title</h1>"}},
		{name: "plain text as is", args: map[string]any{"url": site + "/text"}, want: []string{"Content-Type: text/plain\n\njust text\n"}},
		{name: "JSON as is", args: map[string]any{"url": site + "/json"}, want: []string{`{"a":1}`}},
		{name: "charset", args: map[string]any{"url": site + "/latin1"}, want: []string{"café"}},
		{name: "redirect followed", args: map[string]any{"url": site + "/hop"}, want: []string{"URL: " + site + "/text\n", "just text"}},
		{name: "https through CONNECT", args: map[string]any{"url": fmt.Sprintf("https://example.com:%d/page", tlsPort)}, want: []string{"# Title"}},
		{name: "page larger than the cap", args: map[string]any{"url": site + "/long", "max_bytes": 1000}, trunc: true,
			want: []string{"0123456789", "[page cut: showing bytes 0-990 of 4950; to read on, call web_fetch with the same url and offset=990]"}},
		{name: "reading on from offset", args: map[string]any{"url": site + "/long", "max_bytes": 1000, "offset": 990}, trunc: true,
			want: []string{"[starting at byte 990 of 4950]", "offset=1980]"}},
		{name: "last piece", args: map[string]any{"url": site + "/long", "offset": 4950 - 33}, want: []string{"\n0123456789 abcdefghij klmnopqrst\n"}},
		{name: "binary refused", args: map[string]any{"url": site + "/image"}, wantType: call.ErrInvalidParams,
			want: []string{"the response is binary (image/png, 16 bytes) and web_fetch returns only text"}},
		{name: "404", args: map[string]any{"url": site + "/missing"}, wantType: call.ErrNotFound, want: []string{"Status: 404 Not Found", "No such page"}},
		{name: "redirect to a private address", args: map[string]any{"url": site + "/to-private"}, wantType: call.ErrPolicyDenied,
			want: []string{"the egress proxy refused the destination", "it resolves to 10.20.30.40, a private address"}},
		{name: "redirect to the metadata IP", args: map[string]any{"url": site + "/to-metadata"}, wantType: call.ErrPolicyDenied,
			want: []string{"refuse 169.254.169.254: it is a cloud metadata address"}},
		{name: "redirect to loopback", args: map[string]any{"url": site + "/to-loopback"}, wantType: call.ErrPolicyDenied,
			want: []string{"refuse 127.0.0.1: it is a loopback address"}},
		{name: "metadata IP", args: map[string]any{"url": "http://169.254.169.254/latest/meta-data/"}, wantType: call.ErrPolicyDenied,
			want: []string{"a cloud metadata address"}},
		{name: "metadata IP over https", args: map[string]any{"url": "https://169.254.169.254/"}, wantType: call.ErrPolicyDenied,
			want: []string{"a cloud metadata address"}},
		{name: "private over https", args: map[string]any{"url": fmt.Sprintf("https://private.test:%d/", tlsPort)}, wantType: call.ErrPolicyDenied,
			want: []string{"10.20.30.40, a private address"}},
		{name: "redirect loop", args: map[string]any{"url": site + "/loop"}, wantType: call.ErrInvalidParams, want: []string{"stopped after 5 redirects"}},
		{name: "unknown host", args: map[string]any{"url": "http://nowhere.test/"}, wantType: "network_error", want: []string{"could not reach it", "no such host"}},
		{name: "not http", args: map[string]any{"url": "ftp://site.test/"}, wantType: call.ErrInvalidParams, want: []string{"must be an http:// or https:// URL"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := run(t, t.TempDir(), "web_fetch", tt.args, WithEgressSocket(sock), withRootCAs(pool))
			wantResult(t, r, tt.wantType, tt.want...)
			for _, n := range tt.not {
				if strings.Contains(r.Output, n) {
					t.Errorf("output has %q:\n%s", n, r.Output)
				}
			}
			if r.Truncated != tt.trunc {
				t.Errorf("truncated = %v, want %v", r.Truncated, tt.trunc)
			}
		})
	}
}

func TestWebFetchAllowlist(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "fine") }))
	defer srv.Close()
	port := netip.MustParseAddrPort(srv.Listener.Addr().String()).Port()
	sock := serveEgress(t, egress.Rules{AllowDomains: []string{"*.allowed.test"}}, srv)

	r := run(t, t.TempDir(), "web_fetch", map[string]any{"url": fmt.Sprintf("http://docs.allowed.test:%d/", port)}, WithEgressSocket(sock))
	wantResult(t, r, "", "fine")
	r = run(t, t.TempDir(), "web_fetch", map[string]any{"url": fmt.Sprintf("http://site.test:%d/", port)}, WithEgressSocket(sock))
	wantResult(t, r, call.ErrPolicyDenied, "site.test", "it is not among the allowed domains (*.allowed.test)")
	r = run(t, t.TempDir(), "web_fetch", map[string]any{"url": fmt.Sprintf("https://site.test:%d/", port)}, WithEgressSocket(sock))
	wantResult(t, r, call.ErrPolicyDenied, "it is not among the allowed domains")
}
