package main

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/console"
	"github.com/toolpool/toolpool/internal/dispatcher"
	"github.com/toolpool/toolpool/internal/mcp"
	"github.com/toolpool/toolpool/internal/queue/jetstream"
)

func writeConfig(t *testing.T, yaml string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "dispatcher.yaml")
	if err := os.WriteFile(p, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestConfigDefaults pins the dispatcher's defaults: its own, the libraries' (api, mcp, queue,
// reconciler) as their DefaultConfig states them, and the values derived from others.
func TestConfigDefaults(t *testing.T) {
	t.Setenv("TOOLPOOL_TOKEN", "")
	cfg, err := loadConfig([]string{"-dev-tenant", "-data-dir", t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Listen != "127.0.0.1:8080" || cfg.NATSListen != "127.0.0.1:4222" || cfg.NATSURL != "" || cfg.NATSSync != "always" || cfg.LogLevel != "info" {
		t.Errorf("listen %q nats listen %q url %q sync %q log level %q", cfg.Listen, cfg.NATSListen, cfg.NATSURL, cfg.NATSSync, cfg.LogLevel)
	}
	if len(cfg.API.Tenants) != 1 || cfg.API.Tenants[0].Tokens[0].Token != "dev" {
		t.Errorf("-dev-tenant: tenants %+v, want dev with token dev", cfg.API.Tenants)
	}
	api := cfg.API
	api.Tenants = nil
	if !reflect.DeepEqual(api, dispatcher.DefaultConfig()) {
		t.Errorf("api %+v, want dispatcher.DefaultConfig()", api)
	}
	if !reflect.DeepEqual(cfg.Queue, jetstream.DefaultConfig()) {
		t.Errorf("queue %+v, want jetstream.DefaultConfig()", cfg.Queue)
	}
	// The /mcp endpoint takes the API's body limit (960 KiB), never mcp's own default.
	wantMCP := mcp.DefaultConfig()
	wantMCP.MaxBodyBytes = 960 << 10
	if !reflect.DeepEqual(cfg.MCP, wantMCP) || cfg.MCP.MaxBodyBytes != cfg.API.MaxBodyBytes {
		t.Errorf("mcp %+v, want %+v", cfg.MCP, wantMCP)
	}
	// The reconciler looks at a delivered call after two ack waits, at a waiting one after the queue timeout.
	want := dispatcher.DefaultReconcilerConfig()
	want.InFlightAge, want.WaitingAge = 60*time.Second, 10*time.Minute
	if cfg.Reconciler != want {
		t.Errorf("reconciler %+v, want %+v", cfg.Reconciler, want)
	}
	if !reflect.DeepEqual(cfg.Console, console.DefaultConfig()) {
		t.Errorf("console %+v, want console.DefaultConfig()", cfg.Console)
	}
}

// TestConfigPrecedence shows the one path: a flag wins over the file, the file over the defaults, and
// the values derived from others follow what won.
func TestConfigPrecedence(t *testing.T) {
	fileDir, flagDir := t.TempDir(), t.TempDir()
	path := writeConfig(t, `listen: 127.0.0.1:7000
data_dir: `+fileDir+`
log_level: debug
api:
  tenants: [{name: acme, tokens: [{token: acme-token}]}]
  max_body_bytes: 65536
  queue_timeout: 5m
queue: {ack_wait: 10s}
`)
	cfg, err := loadConfig([]string{"-config", path, "-listen", "127.0.0.1:7001", "-data-dir", flagDir})
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case cfg.Listen != "127.0.0.1:7001" || cfg.DataDir != flagDir:
		t.Errorf("listen %q data dir %q: the flags must win over the file", cfg.Listen, cfg.DataDir)
	case cfg.LogLevel != "debug" || cfg.API.QueueTimeout != 5*time.Minute || cfg.Queue.AckWait != 10*time.Second:
		t.Errorf("log level %q queue timeout %s ack wait %s: the file must win over the defaults", cfg.LogLevel, cfg.API.QueueTimeout, cfg.Queue.AckWait)
	case cfg.API.MaxTimeout != dispatcher.DefaultConfig().MaxTimeout:
		t.Errorf("api max_timeout %s: a field the file leaves out keeps its default", cfg.API.MaxTimeout)
	case cfg.MCP.MaxBodyBytes != 65536 || cfg.Reconciler.InFlightAge != 20*time.Second || cfg.Reconciler.WaitingAge != 5*time.Minute:
		t.Errorf("mcp body %d in-flight age %s waiting age %s: want them derived from the file's values", cfg.MCP.MaxBodyBytes,
			cfg.Reconciler.InFlightAge, cfg.Reconciler.WaitingAge)
	}
}

// TestConfigValidate checks that bad values are refused, all at once, each with what to change.
func TestConfigValidate(t *testing.T) {
	path := writeConfig(t, "nats_sync: sometimes\nqueue: {max_age: 1m}\nreconciler: {interval: 0s}\nconsole: {worker_metrics: [worker-1:9091]}\n")
	_, err := loadConfig([]string{"-config", path, "-listen", "nowhere", "-log-level", "loud", "-data-dir", t.TempDir()})
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{`listen "nowhere"`, `nats_sync "sometimes" is not always or interval`, `log level "loud"`,
		"no tenants: add one", "raise queue.max_age", "reconciler interval and grace must be positive",
		`console.worker_metrics[0] "worker-1:9091" is not an http(s) URL`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if _, err := loadConfig([]string{"-print-default-policy"}); !errors.Is(err, errPrintPolicy) {
		t.Errorf("-print-default-policy: %v", err)
	}
}
