package jetstream

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// DefaultListen is where a dispatcher's embedded NATS server listens unless configured, and DefaultURL
// where a worker looks for it: NATS's standard client port on loopback.
const (
	DefaultListen = "127.0.0.1:4222"
	DefaultURL    = "nats://" + DefaultListen
)

// EmbeddedConfig configures the NATS server a dispatcher embeds when no external one is given.
type EmbeddedConfig struct {
	// Listen is host:port for NATS clients (workers); port 0 or -1 picks a free port.
	Listen string
	// StoreDir holds JetStream's files.
	StoreDir string
	// SyncAlways makes JetStream fsync every write before acknowledging it; without it a host crash can lose
	// the writes of the last sync interval (2 minutes by default), though a process crash loses nothing.
	SyncAlways bool
	// MaxStoreBytes caps JetStream's disk use; 0 means the server's default (most of the free space).
	MaxStoreBytes int64
}

// Embedded is an in-process NATS server with JetStream on disk.
type Embedded struct {
	srv  *server.Server
	once sync.Once
}

// StartEmbedded starts a NATS server with JetStream and waits until it accepts connections. The caller
// must Shutdown it.
func StartEmbedded(cfg EmbeddedConfig) (*Embedded, error) {
	host, portStr, err := net.SplitHostPort(cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("parse nats listen address %q: %w", cfg.Listen, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return nil, fmt.Errorf("parse nats listen port %q: %w", portStr, err)
	}
	if port == 0 {
		port = server.RANDOM_PORT
	}
	if cfg.StoreDir == "" {
		return nil, errors.New("start nats: store dir is empty")
	}
	opts := &server.Options{
		ServerName:        "toolpool-embedded",
		Host:              host,
		Port:              port,
		JetStream:         true,
		StoreDir:          cfg.StoreDir,
		JetStreamMaxStore: cfg.MaxStoreBytes,
		SyncAlways:        cfg.SyncAlways,
		NoSigs:            true,
		NoLog:             true,
		// MaxPayload stays at the stock 1 MiB: no call message and no record is larger, and an external
		// server with stock settings takes what the embedded one takes.
		DisableShortFirstPing: true,
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("create nats server: %w", err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(30 * time.Second) {
		srv.Shutdown()
		return nil, fmt.Errorf("start nats on %s: not ready after 30s", cfg.Listen)
	}
	return &Embedded{srv: srv}, nil
}

// URL is the nats:// address clients connect to.
func (e *Embedded) URL() string { return e.srv.ClientURL() }

// Shutdown stops the server and waits for it. It is idempotent.
func (e *Embedded) Shutdown() {
	e.once.Do(func() {
		e.srv.Shutdown()
		e.srv.WaitForShutdown()
	})
}
