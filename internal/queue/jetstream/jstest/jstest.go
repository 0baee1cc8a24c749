// Package jstest starts real, in-process NATS JetStream for tests: an embedded server on a free loopback
// port with its store in a test's temporary directory, and connections to it. It is imported by tests only.
package jstest

import (
	"context"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/queue/jetstream"
)

// Server starts an embedded NATS server with JetStream storing under storeDir (a fresh temporary directory
// of t when empty) on a free loopback port, and shuts it down when t ends. Starting another server on the
// same storeDir after Shutdown is a restart: the streams and buckets are as the first one left them.
func Server(t testing.TB, storeDir string) *jetstream.Embedded {
	t.Helper()
	if storeDir == "" {
		storeDir = t.TempDir()
	}
	srv, err := jetstream.StartEmbedded(jetstream.EmbeddedConfig{Listen: "127.0.0.1:-1", StoreDir: storeDir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	return srv
}

// Connect connects to the server at url as name with jetstream.DefaultConfig, edited by edit if given,
// and closes the connection when t ends. A dispatcher's connection (provision) creates the stream and
// buckets; a worker's binds to them.
func Connect(t testing.TB, url, name string, provision bool, edit ...func(*jetstream.Config)) *jetstream.Conn {
	t.Helper()
	return connect(t, url, name, provision, func(cfg *jetstream.Config) {
		for _, e := range edit {
			e(cfg)
		}
	})
}

// Provisioned starts a server (Server) and returns a provisioning connection to it with the default
// Config changed by edit (may be nil) and the connection options opts, and the server's URL.
func Provisioned(t testing.TB, edit func(*jetstream.Config), opts ...jetstream.Option) (*jetstream.Conn, string) {
	t.Helper()
	url := Server(t, "").URL()
	return connect(t, url, "dispatcher", true, edit, opts...), url
}

func connect(t testing.TB, url, name string, provision bool, edit func(*jetstream.Config), opts ...jetstream.Option) *jetstream.Conn {
	t.Helper()
	cfg := jetstream.DefaultConfig()
	cfg.URL, cfg.Name, cfg.Provision = url, name, provision
	if edit != nil {
		edit(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := jetstream.Connect(ctx, cfg, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	return conn
}
