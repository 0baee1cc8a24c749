package ctrtest

import (
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/go-containerregistry/pkg/registry"
)

// Fault is how a test Registry misbehaves when serving image content.
type Fault int32

// Faults a Registry can be switched to (Registry.SetFault).
const (
	// NoFault serves the registry as it is.
	NoFault Fault = iota
	// CutBlobs sends half of every layer blob and then drops the connection, as a registry or proxy that
	// fails midway does.
	CutBlobs
	// CorruptBlobs sends every layer blob in full with one byte changed, so that its digest no longer
	// matches the manifest's.
	CorruptBlobs
	// StallBlobs sends the headers of every layer blob and then nothing until the client gives up, as a
	// registry that hangs does.
	StallBlobs
)

// Registry is an OCI distribution (API v2) registry on a loopback port, holding its content in memory,
// optionally behind HTTP basic auth. It is go-containerregistry's registry, the same code ggcr's own
// clients test against.
type Registry struct {
	// Host is the registry's host:port, as an image reference names it (127.0.0.1:PORT).
	Host string
	// Username and Password are its basic-auth credentials; empty when it needs none.
	Username, Password string
	srv                *httptest.Server
	fault              atomic.Int32
	manifestHeads      atomic.Int64
	closed             chan struct{} // closed by Close: stalled answers end
	closeOnce          sync.Once
}

// ManifestResolves counts the HEAD requests for manifests the registry has answered: containerd resolves
// a reference with one at the start of every pull (it fetches the manifest itself only when no pull under
// way has it).
func (r *Registry) ManifestResolves() int64 { return r.manifestHeads.Load() }

// StartRegistry starts a registry without auth, closed when the test ends.
func StartRegistry(t testing.TB) *Registry {
	t.Helper()
	return startRegistry(t, "", "")
}

// StartPrivateRegistry starts a registry that answers 401 to any request without the basic-auth
// credentials user:password, closed when the test ends.
func StartPrivateRegistry(t testing.TB, user, password string) *Registry {
	t.Helper()
	return startRegistry(t, user, password)
}

func startRegistry(t testing.TB, user, password string) *Registry {
	r := &Registry{Username: user, Password: password, closed: make(chan struct{})}
	inner := registry.New(registry.Logger(discardLogger()))
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if user != "" {
			u, p, ok := req.BasicAuth()
			if !ok || u != user || p != password {
				w.Header().Set("WWW-Authenticate", `Basic realm="toolpool-test"`)
				http.Error(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`, http.StatusUnauthorized)
				return
			}
		}
		if req.Method == http.MethodHead && strings.Contains(req.URL.Path, "/manifests/") {
			r.manifestHeads.Add(1)
		}
		if req.Method == http.MethodGet && strings.Contains(req.URL.Path, "/blobs/sha256:") {
			if f := Fault(r.fault.Load()); f != NoFault {
				rec := httptest.NewRecorder()
				inner.ServeHTTP(rec, req)
				r.serveFaulty(w, req, rec, f)
				return
			}
		}
		inner.ServeHTTP(w, req)
	}))
	r.Host = r.srv.Listener.Addr().String()
	t.Cleanup(r.Close)
	return r
}

// serveFaulty writes the recorded answer rec to a blob request as fault f has it.
func (r *Registry) serveFaulty(w http.ResponseWriter, req *http.Request, rec *httptest.ResponseRecorder, f Fault) {
	body := rec.Body.Bytes()
	if rec.Code != http.StatusOK || len(body) < 1024 { // the config blob stays whole: faults hit layers
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		_, _ = w.Write(body)
		return
	}
	for k, v := range rec.Header() {
		w.Header()[k] = v
	}
	switch f {
	case CorruptBlobs:
		bad := append([]byte(nil), body...)
		bad[len(bad)/2] ^= 0xff
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(bad)
	case StallBlobs:
		w.WriteHeader(http.StatusOK)
		if fl, ok := w.(http.Flusher); ok {
			fl.Flush()
		}
		select {
		case <-req.Context().Done():
		case <-r.closed:
		}
	case CutBlobs:
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(body[:len(body)/2])
		if fl, ok := w.(http.Flusher); ok {
			fl.Flush()
		}
		if hj, ok := w.(http.Hijacker); ok {
			if conn, _, err := hj.Hijack(); err == nil {
				conn.Close()
			}
		}
	}
}

// SetFault makes the registry misbehave as f says from now on (NoFault restores it).
func (r *Registry) SetFault(f Fault) { r.fault.Store(int32(f)) }

// Close stops the registry: from then on its address refuses connections, as a registry that is down
// does. Close is idempotent.
func (r *Registry) Close() {
	r.closeOnce.Do(func() {
		close(r.closed)
		r.srv.CloseClientConnections()
		r.srv.Close()
	})
}

// DownAddress returns a loopback host:port where nothing listens: a registry that is down.
func DownAddress(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}
