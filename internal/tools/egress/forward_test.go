package egress

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"testing"
	"time"
)

// TestForward: a client that knows only HTTP_PROXY=http://127.0.0.1:PORT reaches the proxy on its unix
// socket through Forward, refusals included; when ctx ends, Forward closes its listener and every open
// connection and returns.
func TestForward(t *testing.T) {
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "through the forwarder") }))
	defer origin.Close()
	originAP := netip.MustParseAddrPort(origin.Listener.Addr().String())
	p, err := New(Rules{AllowDomains: []string{"origin.test"}}, WithResolver(fakeResolver{"origin.test": {"127.0.0.1"}}),
		WithAllowAddr(func(ap netip.AddrPort) bool { return ap == originAP }))
	if err != nil {
		t.Fatal(err)
	}
	sock := serveOnSocket(t, p)

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Forward(ctx, l, sock) }()
	proxyURL := &url.URL{Scheme: "http", Host: l.Addr().String()}
	client := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(proxyURL)}, Timeout: 10 * time.Second}

	resp, err := client.Get(fmt.Sprintf("http://origin.test:%d/", originAP.Port()))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "through the forwarder" {
		t.Fatalf("allowed: %d %s", resp.StatusCode, body)
	}
	resp, err = client.Get(fmt.Sprintf("http://denied.test:%d/", originAP.Port()))
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(string(body), "rule domain-not-allowed") {
		t.Fatalf("denied: %d %s", resp.StatusCode, body)
	}
	// An idle keep-alive connection is open through the forwarder now; ending ctx must close it too.
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Forward = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Forward did not return after ctx ended")
	}
	if _, err := net.DialTimeout("tcp", l.Addr().String(), time.Second); err == nil {
		t.Fatal("the forwarder still listens")
	}
}
