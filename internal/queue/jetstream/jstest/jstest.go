// Package jstest gives tests a real JetStream: an in-process server on a free port with its store in a
// temporary directory, and a provisioned connection to it, both gone when the test ends.
package jstest

import (
	"context"
	"testing"

	"github.com/toolpool/toolpool/internal/queue/jetstream"
)

// Connect starts a server and returns a provisioning connection to it with the default Config changed by
// edit (may be nil), and the server's URL.
func Connect(t testing.TB, edit func(*jetstream.Config), opts ...jetstream.Option) (*jetstream.Conn, string) {
	t.Helper()
	srv, err := jetstream.StartEmbedded(jetstream.EmbeddedConfig{Listen: "127.0.0.1:-1", StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	cfg := jetstream.DefaultConfig()
	cfg.URL, cfg.Provision = srv.URL(), true
	if edit != nil {
		edit(&cfg)
	}
	c, err := jetstream.Connect(context.Background(), cfg, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c, srv.URL()
}
