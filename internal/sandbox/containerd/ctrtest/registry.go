package ctrtest

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/distribution/distribution/v3/configuration"
	"github.com/distribution/distribution/v3/registry/handlers"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/inmemory" // the registry's storage
	"github.com/sirupsen/logrus"
)

// Fault is how a test Registry misbehaves when serving image content.
type Fault int32

// Faults a Registry can be switched to (Registry.SetFault).
const (
	// NoFault serves the registry as it is.
	NoFault Fault = iota
	// CutBlobs sends half of every layer blob and then drops the connection, as a registry or proxy that
	// fails midway does; a client that resumes the transfer (a range request) gets nothing of it.
	CutBlobs
	// CorruptBlobs sends every layer blob in full with one byte changed, so that its digest no longer
	// matches the manifest's.
	CorruptBlobs
	// StallBlobs sends the headers of every layer blob and then nothing until the client gives up, as a
	// registry that hangs does.
	StallBlobs
)

// Registry is an OCI distribution (API v2) registry on a loopback port, holding its content in memory,
// optionally behind HTTP basic auth. It is CNCF distribution's registry (the code of Docker Hub's and
// most private registries), from the Go module proxy, served in the test's process: its API handlers on
// the in-memory storage driver, with blobs served directly (no redirect).
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

	mu       sync.Mutex
	blobGets map[string]int // GETs of each blob answered, by digest (HoldBlobs' waiting ones too)
	held     chan struct{}  // while not nil, blob GETs wait until it is closed (HoldBlobs)
	waiting  int            // blob GETs waiting on held
}

// BlobGets returns how many GET requests for blob digest ("sha256:...") the registry has taken: a client
// that fetches a layer once asks once.
func (r *Registry) BlobGets(digest string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.blobGets[digest]
}

// HoldBlobs makes every blob GET from now on wait until the returned release is called (or the registry
// closes), so that a test can have several pulls under way at once; Waiting says how many wait.
func (r *Registry) HoldBlobs() (release func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	held := make(chan struct{})
	r.held = held
	var once sync.Once
	return func() {
		once.Do(func() {
			r.mu.Lock()
			r.held = nil
			r.mu.Unlock()
			close(held)
		})
	}
}

// Waiting returns how many blob GETs wait for HoldBlobs' release.
func (r *Registry) Waiting() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.waiting
}

// takeBlob counts a GET of blob digest and waits while blobs are held.
func (r *Registry) takeBlob(req *http.Request, digest string) {
	r.mu.Lock()
	r.blobGets[digest]++
	held := r.held
	if held != nil {
		r.waiting++
	}
	r.mu.Unlock()
	if held == nil {
		return
	}
	select {
	case <-held:
	case <-req.Context().Done():
	case <-r.closed:
	}
	r.mu.Lock()
	r.waiting--
	r.mu.Unlock()
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
	r := &Registry{Username: user, Password: password, closed: make(chan struct{}), blobGets: map[string]int{}}
	inner := newDistribution(t)
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
			r.takeBlob(req, req.URL.Path[strings.LastIndex(req.URL.Path, "/")+1:])
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

// newDistribution returns CNCF distribution's registry API on in-memory storage, quiet but for errors.
func newDistribution(t testing.TB) http.Handler {
	logrus.SetLevel(logrus.ErrorLevel) // distribution logs every request through logrus
	cfg := &configuration.Configuration{Storage: configuration.Storage{
		"inmemory":    configuration.Parameters{},
		"redirect":    configuration.Parameters{"disable": true},
		"delete":      configuration.Parameters{"enabled": true},
		"maintenance": configuration.Parameters{"uploadpurging": map[any]any{"enabled": false}},
	}}
	cfg.Log.AccessLog.Disabled = true
	cfg.HTTP.Secret = "toolpool-test-registry"
	app := handlers.NewApp(context.Background(), cfg)
	t.Cleanup(func() { _ = app.Shutdown() })
	return app
}

// serveFaulty writes the recorded answer rec to a blob request as fault f has it.
func (r *Registry) serveFaulty(w http.ResponseWriter, req *http.Request, rec *httptest.ResponseRecorder, f Fault) {
	body := rec.Body.Bytes()
	// The config blob stays whole: faults hit layers. A range of a blob (206: a client resuming a cut
	// transfer, which distribution serves) is hit whatever its size, so that a faulty registry stays
	// faulty.
	if !(rec.Code == http.StatusOK && len(body) >= 1024 || rec.Code == http.StatusPartialContent && len(body) >= 2) {
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
		// Half a blob, or nothing of a range of one (a client resuming the cut transfer makes no
		// progress), then the connection drops.
		cut := len(body) / 2
		if rec.Code == http.StatusPartialContent {
			cut = 0
		}
		w.WriteHeader(rec.Code)
		_, _ = w.Write(body[:cut])
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
