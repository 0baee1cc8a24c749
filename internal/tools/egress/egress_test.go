package egress

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestCheckAddr(t *testing.T) {
	tests := []struct {
		addr string
		want string // "" means allowed
	}{
		{"8.8.8.8", ""},
		{"1.1.1.1", ""},
		{"2606:4700:4700::1111", ""},
		{"64:ff9b::808:808", ""},
		{"127.0.0.1", "a loopback address"},
		{"127.8.9.10", "a loopback address"},
		{"::1", "a loopback address"},
		{"10.1.2.3", "a private address"},
		{"172.16.0.1", "a private address"},
		{"172.31.255.255", "a private address"},
		{"192.168.1.1", "a private address"},
		{"fc00::1", "a private (unique local) address"},
		{"fd12:3456::1", "a private (unique local) address"},
		{"169.254.169.254", "a cloud metadata address"},
		{"fd00:ec2::254", "a cloud metadata address"},
		{"100.100.100.200", "a cloud metadata address"},
		{"169.254.1.1", "a link-local address"},
		{"fe80::1", "a link-local address"},
		{"fe80::1%eth0", "a link-local address"},
		{"100.64.0.1", "a carrier-grade NAT address"},
		{"100.127.255.254", "a carrier-grade NAT address"},
		{"0.0.0.0", "an unspecified (this network) address"},
		{"::", "an unspecified address"},
		{"224.0.0.1", "a multicast address"},
		{"ff02::1", "a multicast address"},
		{"255.255.255.255", "a reserved or broadcast address"},
		{"::ffff:10.0.0.1", "a private address"},
		{"::ffff:127.0.0.1", "a loopback address"},
		{"64:ff9b::a00:1", "an IPv6 address embedding 10.0.0.1, a private address"},
		{"2002:a9fe:a9fe::", "an IPv6 address embedding 169.254.169.254, a cloud metadata address"},
	}
	for _, tt := range tests {
		t.Run(tt.addr, func(t *testing.T) {
			err := CheckAddr(netip.MustParseAddr(tt.addr))
			got := ""
			if err != nil {
				got = err.Error()
			}
			if got != tt.want {
				t.Errorf("CheckAddr(%s) = %q, want %q", tt.addr, got, tt.want)
			}
		})
	}
}

func TestRules(t *testing.T) {
	tests := []struct {
		name  string
		rules Rules
		ok    bool
	}{
		{"empty", Rules{}, true},
		{"exact and suffix", Rules{AllowDomains: []string{"example.com", "*.example.org"}}, true},
		{"inner wildcard", Rules{AllowDomains: []string{"a.*.com"}}, false},
		{"url", Rules{AllowDomains: []string{"https://example.com"}}, false},
		{"bare wildcard", Rules{DenyDomains: []string{"*."}}, false},
		{"bad port", Rules{AllowPorts: []int{0}}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.rules.Validate(); (err == nil) != tt.ok {
				t.Errorf("Validate = %v", err)
			}
		})
	}
	match := []struct {
		pattern, host string
		want          bool
	}{
		{"example.com", "example.com", true},
		{"example.com", "www.example.com", false},
		{"*.example.com", "www.example.com", true},
		{"*.example.com", "a.b.example.com", true},
		{"*.example.com", "example.com", false},
		{"*.example.com", "badexample.com", false},
		{"Example.COM.", "example.com", true},
	}
	for _, m := range match {
		if got := matchDomain(m.pattern, m.host); got != m.want {
			t.Errorf("matchDomain(%q, %q) = %v", m.pattern, m.host, got)
		}
	}
}

// fakeResolver answers from a map, and fails the test for names it does not know.
type fakeResolver map[string][]string

func (f fakeResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	addrs, ok := f[host]
	if !ok {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	var out []netip.Addr
	for _, a := range addrs {
		out = append(out, netip.MustParseAddr(a))
	}
	return out, nil
}

// serveOnSocket serves p on a unix socket until the test ends and returns the socket's path.
func serveOnSocket(t *testing.T, p *Proxy) string {
	t.Helper()
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

// startProxy serves a proxy on a unix socket until the test ends and returns a client that uses it.
func startProxy(t *testing.T, p *Proxy) *http.Client {
	t.Helper()
	sock := serveOnSocket(t, p)
	return &http.Client{
		Transport: &http.Transport{
			Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: "proxy"}),
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "unix", sock)
			},
			OnProxyConnectResponse: func(_ context.Context, _ *url.URL, _ *http.Request, resp *http.Response) error {
				if r := resp.Header.Get(RefusedHeader); r != "" {
					return errors.New("refused: " + r)
				}
				return nil
			},
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		Timeout:       10 * time.Second,
	}
}

func TestProxy(t *testing.T) {
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Proxy-Authorization") != "" {
			t.Errorf("hop-by-hop header reached the origin")
		}
		w.Header().Set(RefusedHeader, "forged by the origin")
		fmt.Fprintf(w, "hello from %s", r.URL.Path)
	}))
	defer origin.Close()
	secure := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "secure hello")
	}))
	defer secure.Close()
	originAP := netip.MustParseAddrPort(origin.Listener.Addr().String())
	secureAP := netip.MustParseAddrPort(secure.Listener.Addr().String())
	port, securePort := originAP.Port(), secureAP.Port()

	resolver := fakeResolver{
		"origin.test":      {"127.0.0.1"},
		"example.com":      {"127.0.0.1"}, // httptest's certificate is for example.com
		"private.test":     {"10.0.0.1"},
		"mixed.test":       {"127.0.0.1", "192.168.0.7"},
		"meta.test":        {"169.254.169.254"},
		"sub.allowed.test": {"127.0.0.1"},
	}
	allow := func(ap netip.AddrPort) bool { return ap == originAP || ap == secureAP }
	p, err := New(Rules{}, WithResolver(resolver), WithAllowAddr(allow))
	if err != nil {
		t.Fatal(err)
	}
	client := startProxy(t, p)
	client.Transport.(*http.Transport).TLSClientConfig = &tls.Config{RootCAs: secure.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs}

	tests := []struct {
		name       string
		url        string
		wantStatus int
		wantBody   string
		wantRefuse string // a fragment of RefusedHeader, or of the error for https
	}{
		{"plain http", fmt.Sprintf("http://origin.test:%d/a", port), 200, "hello from /a", ""},
		{"https through CONNECT", fmt.Sprintf("https://example.com:%d/", securePort), 200, "secure hello", ""},
		{"private address", fmt.Sprintf("http://private.test:%d/", port), 403, "", "it resolves to 10.0.0.1, a private address"},
		{"private address over CONNECT", fmt.Sprintf("https://private.test:%d/", securePort), 0, "", "it resolves to 10.0.0.1, a private address"},
		{"one private address among public ones", fmt.Sprintf("http://mixed.test:%d/", port), 403, "", "192.168.0.7, a private address"},
		{"metadata IP", "http://169.254.169.254/latest/meta-data/", 403, "", "refuse 169.254.169.254: it is a cloud metadata address"},
		{"metadata name", "http://metadata.google.internal/computeMetadata/v1/", 403, "", "a local or cloud metadata name"},
		{"name resolving to metadata", "http://meta.test/", 403, "", "a cloud metadata address"},
		{"IPv6 metadata", "http://[fd00:ec2::254]/", 403, "", "a cloud metadata address"},
		{"loopback other port", fmt.Sprintf("http://127.0.0.1:%d/", port+1), 403, "", "refuse 127.0.0.1: it is a loopback address"},
		{"localhost", fmt.Sprintf("http://localhost:%d/", port), 403, "", "a local or cloud metadata name"},
		{"unresolvable", "http://nowhere.test/", 502, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := client.Get(tt.url)
			if tt.wantStatus == 0 {
				if err == nil || !strings.Contains(err.Error(), tt.wantRefuse) {
					t.Fatalf("Get = %v, want an error with %q", err, tt.wantRefuse)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tt.wantStatus {
				t.Fatalf("status %d, want %d (%s)", resp.StatusCode, tt.wantStatus, body)
			}
			if tt.wantBody != "" && string(body) != tt.wantBody {
				t.Errorf("body %q, want %q", body, tt.wantBody)
			}
			if got := resp.Header.Get(RefusedHeader); !strings.Contains(got, tt.wantRefuse) || (tt.wantRefuse == "" && got != "") {
				t.Errorf("%s = %q, want %q", RefusedHeader, got, tt.wantRefuse)
			}
			if tt.wantStatus == 502 && resp.Header.Get(ErrorHeader) == "" {
				t.Errorf("502 without %s", ErrorHeader)
			}
		})
	}
}

func TestProxyAllowlist(t *testing.T) {
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "ok") }))
	defer origin.Close()
	originAP := netip.MustParseAddrPort(origin.Listener.Addr().String())
	resolver := fakeResolver{"origin.test": {"127.0.0.1"}, "sub.allowed.test": {"127.0.0.1"}, "bad.allowed.test": {"127.0.0.1"}}
	p, err := New(Rules{AllowDomains: []string{"*.allowed.test"}, DenyDomains: []string{"bad.allowed.test"}},
		WithResolver(resolver), WithAllowAddr(func(ap netip.AddrPort) bool { return ap == originAP }))
	if err != nil {
		t.Fatal(err)
	}
	client := startProxy(t, p)
	tests := []struct {
		host       string
		wantStatus int
		wantRefuse string
	}{
		{"sub.allowed.test", 200, ""},
		{"origin.test", 403, "it is not among the allowed domains (*.allowed.test)"},
		{"allowed.test", 403, "it is not among the allowed domains"},
		{"bad.allowed.test", 403, `it matches the denied domain "bad.allowed.test"`},
		{"127.0.0.1", 403, "it is not among the allowed domains"},
	}
	for _, tt := range tests {
		t.Run(tt.host, func(t *testing.T) {
			resp, err := client.Get(fmt.Sprintf("http://%s:%d/", tt.host, originAP.Port()))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tt.wantStatus || !strings.Contains(resp.Header.Get(RefusedHeader), tt.wantRefuse) {
				t.Errorf("status %d refused %q, want %d %q", resp.StatusCode, resp.Header.Get(RefusedHeader), tt.wantStatus, tt.wantRefuse)
			}
		})
	}
}

func TestProxyPorts(t *testing.T) {
	p, err := New(Rules{AllowPorts: []int{443}}, WithResolver(fakeResolver{"x.test": {"8.8.8.8"}}))
	if err != nil {
		t.Fatal(err)
	}
	_, err = p.DialContext(context.Background(), "tcp", "x.test:80")
	var re *RefusedError
	if !errors.As(err, &re) || !strings.Contains(re.Reason, "port 80 is not among the allowed ports") {
		t.Errorf("DialContext = %v", err)
	}
}

func TestProxyRejectsOriginForm(t *testing.T) {
	p, err := New(Rules{})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	p.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/relative", nil))
	if rec.Code != http.StatusBadRequest {
		t.Errorf("status %d", rec.Code)
	}
}
