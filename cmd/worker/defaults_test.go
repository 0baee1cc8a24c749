package main

import (
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/sandbox/containerd"
	"github.com/toolpool/toolpool/internal/worker"
)

func writeConfig(t *testing.T, yaml string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "worker.yaml")
	if err := os.WriteFile(p, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func load(t *testing.T, args ...string) (config, error) {
	t.Helper()
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return loadConfig(fs, args)
}

type fakeQueue struct{}

func (fakeQueue) AckWait() time.Duration { return 30 * time.Second }
func (fakeQueue) MaxDeliver() int        { return 10 }
func (fakeQueue) Now() time.Time         { return time.Time{} }

// TestConfigDefaults pins the worker's defaults and where each comes from: the lease is three heartbeats
// and at least 1s whether the command (loadConfig) or the library (worker.DefaultLease, which worker.New
// fills in) is asked; the heartbeat and the warm pool are the libraries' defaults.
func TestConfigDefaults(t *testing.T) {
	cfg, err := load(t, "-data-dir", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	pool := containerd.DefaultPoolConfig()
	switch {
	case cfg.Heartbeat != worker.DefaultHeartbeat || worker.DefaultHeartbeat != 5*time.Second:
		t.Errorf("heartbeat %s, want 5s (worker.DefaultHeartbeat)", cfg.Heartbeat)
	case cfg.Lease != 15*time.Second || cfg.Lease != worker.DefaultLease(cfg.Heartbeat):
		t.Errorf("lease %s, want 15s (worker.DefaultLease)", cfg.Lease)
	case cfg.Pool != poolConfig{MaxSize: 8, MemoryBytes: 256 << 20, MaxAge: 10 * time.Minute} ||
		cfg.Pool != poolConfig{MaxSize: pool.MaxSize, MemoryBytes: pool.MemoryBytes, MaxAge: pool.MaxAge}:
		t.Errorf("pool %+v, want containerd.DefaultPoolConfig's %+v", cfg.Pool, pool)
	case cfg.Namespace != "toolpool" || cfg.Runtime != containerd.RuncRuntime || cfg.RuntimeBinary != containerd.RuntimeBinaryAuto:
		t.Errorf("namespace %q runtime %q binary %q", cfg.Namespace, cfg.Runtime, cfg.RuntimeBinary)
	case cfg.Slots != 4 || cfg.DrainTimeout != 30*time.Second || cfg.WorkspaceQuota != 1<<30 || cfg.FullOutputBytes != worker.DefaultFullOutputBytes:
		t.Errorf("slots %d drain %s quota %d full output %d", cfg.Slots, cfg.DrainTimeout, cfg.WorkspaceQuota, cfg.FullOutputBytes)
	case cfg.WorkspacesDir != filepath.Join(cfg.DataDir, "workspaces"):
		t.Errorf("workspaces dir %q is not under the data dir %q", cfg.WorkspacesDir, cfg.DataDir)
	}
	if got := cfg.workerConfig(fakeQueue{}, "/bin/runner", nil).Lease; got != cfg.Lease {
		t.Errorf("the worker is given lease %s, the command says %s", got, cfg.Lease)
	}

	// A short heartbeat: three of them are below the NATS server's 1s, so the lease is 1s, in the command
	// as in the library.
	cfg, err = load(t, "-data-dir", t.TempDir(), "-config", writeConfig(t, "heartbeat: 100ms\n"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Lease != time.Second || worker.DefaultLease(100*time.Millisecond) != time.Second {
		t.Errorf("heartbeat 100ms: lease %s (library %s), want 1s", cfg.Lease, worker.DefaultLease(100*time.Millisecond))
	}
	// An idle TTL without a sweep interval sweeps every tenth of it, at most every minute.
	cfg, err = load(t, "-data-dir", t.TempDir(), "-config", writeConfig(t, "workspaces: {idle_ttl: 1h}\n"))
	if err != nil || cfg.Workspaces.SweepEvery != time.Minute {
		t.Errorf("idle_ttl 1h: sweep every %s, %v; want 1m", cfg.Workspaces.SweepEvery, err)
	}
}

// TestConfigPrecedence shows the one path: a flag wins over the file, the file over the defaults, and
// the values derived from others (the lease, the workspaces dir) follow what won.
func TestConfigPrecedence(t *testing.T) {
	fileDir, flagDir := t.TempDir(), t.TempDir()
	path := writeConfig(t, "data_dir: "+fileDir+"\nslots: 3\nlisten: 127.0.0.1:7000\nheartbeat: 2s\nlog_level: debug\nworkspace_quota: -1\n")
	cfg, err := load(t, "-config", path, "-slots", "5", "-data-dir", flagDir)
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case cfg.Slots != 5 || cfg.DataDir != flagDir:
		t.Errorf("slots %d data dir %q: the flags (5, %q) must win over the file", cfg.Slots, cfg.DataDir, flagDir)
	case cfg.Listen != "127.0.0.1:7000" || cfg.LogLevel != "debug" || cfg.Heartbeat != 2*time.Second:
		t.Errorf("listen %q log level %q heartbeat %s: the file must win over the defaults", cfg.Listen, cfg.LogLevel, cfg.Heartbeat)
	case cfg.Lease != 6*time.Second:
		t.Errorf("lease %s, want three of the file's heartbeats (6s)", cfg.Lease)
	case cfg.WorkspacesDir != filepath.Join(flagDir, "workspaces"):
		t.Errorf("workspaces dir %q, want under the flag's data dir", cfg.WorkspacesDir)
	case cfg.WorkspaceQuota != 0:
		t.Errorf("workspace_quota -1 became %d, want 0 (no quota)", cfg.WorkspaceQuota)
	}
	// A lease the file sets is kept.
	cfg, err = load(t, "-data-dir", t.TempDir(), "-config", writeConfig(t, "heartbeat: 2s\nlease: 20s\n"))
	if err != nil || cfg.Lease != 20*time.Second {
		t.Errorf("lease %s, %v; want the file's 20s", cfg.Lease, err)
	}
}

// TestConfigValidate checks that each bad value is refused with what to change, all of them at once.
func TestConfigValidate(t *testing.T) {
	_, err := load(t, "-data-dir", t.TempDir(), "-slots", "0", "-log-level", "loud",
		"-config", writeConfig(t, "heartbeat: 0s\nlease: 500ms\nuid: 0\nruntimes: {\"a b\": x}\n"))
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{"slots 0 is outside 1..1024", "heartbeat 0s must be positive", "lease 500ms is below 1s", "raise lease",
		"uid and gid must not be 0", `log level "loud"`, "runtime"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}
