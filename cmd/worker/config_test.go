package main

import (
	"flag"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/sandbox/containerd"
)

// TestLoadConfigPool checks the warm pool's and the OCI runtime's settings: defaults, file, flags, and a
// clear error for each bad value.
func TestLoadConfigPool(t *testing.T) {
	for _, tc := range []struct {
		name    string
		yaml    string
		flags   []string
		want    poolConfig
		binary  string
		wantErr string
	}{
		{name: "defaults", want: poolConfig{MaxSize: 8, MemoryBytes: 256 << 20, MaxAge: 10 * time.Minute}, binary: "auto"},
		{name: "file", yaml: "runtime_binary: crun\npool: {max_size: 3, memory_bytes: 1048576, max_age: 30s}\n",
			want: poolConfig{MaxSize: 3, MemoryBytes: 1 << 20, MaxAge: 30 * time.Second}, binary: "crun"},
		{name: "flags over the file", yaml: "runtime_binary: crun\npool: {max_size: 3}\n", flags: []string{"-pool-size", "0", "-runtime-binary", "runc"},
			want: poolConfig{MaxSize: 0, MemoryBytes: 256 << 20, MaxAge: 10 * time.Minute}, binary: "runc"},
		{name: "negative size", flags: []string{"-pool-size", "-1"}, wantErr: "pool.max_size -1 is outside 0..1024"},
		{name: "negative budget", yaml: "pool: {memory_bytes: -5}\n", wantErr: "pool.memory_bytes -5 is negative"},
		{name: "negative age", yaml: "pool: {max_age: -1s}\n", wantErr: "pool.max_age -1s is negative"},
		{name: "unknown key", yaml: "pool: {size: 3}\n", wantErr: "field size not found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, ok := loadTestConfig(t, tc.yaml, tc.flags, tc.wantErr)
			if !ok {
				return
			}
			if cfg.Pool != tc.want || cfg.RuntimeBinary != tc.binary {
				t.Errorf("pool %+v binary %q, want %+v %q", cfg.Pool, cfg.RuntimeBinary, tc.want, tc.binary)
			}
		})
	}
}

// TestSandboxBinaries checks where the worker finds toolpool-runner and toolpool-init: as configured,
// else beside its executable, and an error that says how to fix it when one is missing.
func TestSandboxBinaries(t *testing.T) {
	dir := t.TempDir()
	runner, initBin := filepath.Join(dir, "r"), filepath.Join(dir, "i")
	for _, p := range []string{runner, initBin} {
		if err := os.WriteFile(p, nil, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cfg := config{RunnerBinary: runner, InitBinary: initBin}
	if r, i, err := cfg.sandboxBinaries(); err != nil || r != runner || i != initBin {
		t.Fatalf("configured: %q %q %v", r, i, err)
	}
	cfg = config{InitBinary: initBin} // the test binary has no toolpool-runner beside it
	_, _, err := cfg.sandboxBinaries()
	if err == nil || !strings.Contains(err.Error(), "find toolpool-runner") || !strings.Contains(err.Error(), "runner_binary") {
		t.Fatalf("missing runner: %v", err)
	}
	cfg = config{RunnerBinary: runner, InitBinary: dir}
	if _, _, err = cfg.sandboxBinaries(); err == nil || !strings.Contains(err.Error(), "toolpool-init") || !strings.Contains(err.Error(), "not a regular file") {
		t.Fatalf("init a directory: %v", err)
	}
}

// TestLoadConfigImages checks the image settings: defaults, the file's registries reaching the sandbox's
// pull configuration, the default image by its full name, and a clear error for each bad value.
func TestLoadConfigImages(t *testing.T) {
	for _, tc := range []struct {
		name, yaml, wantErr string
		check               func(t *testing.T, cfg config)
	}{
		{name: "defaults", check: func(t *testing.T, cfg config) {
			pull := cfg.sandboxConfig("/run/c.sock", "/r", "/i").Pull
			if cfg.Image != "" || pull.MaxBytes != containerd.DefaultPullMaxBytes || pull.Timeout != containerd.DefaultPullTimeout || pull.Registries != nil {
				t.Errorf("image %q pull %+v", cfg.Image, pull)
			}
		}},
		{name: "file", yaml: "image: python:3.12\nimages:\n  max_bytes: 1000\n  pull_timeout: 30s\n  cache_bytes: 5000\n  pinned: [python:3.12]\n  registries:\n  - {host: reg.example:5000, username: u, password: p, plain_http: true, tenants: [acme]}\n",
			check: func(t *testing.T, cfg config) {
				pull := cfg.sandboxConfig("/run/c.sock", "/r", "/i").Pull
				want := containerd.RegistryConfig{Host: "reg.example:5000", Username: "u", Password: "p", PlainHTTP: true, Tenants: []string{"acme"}}
				if cfg.Image != "docker.io/library/python:3.12" || pull.MaxBytes != 1000 || pull.Timeout != 30*time.Second || len(pull.Registries) != 1 || !reflect.DeepEqual(pull.Registries[0], want) ||
					pull.CacheBytes != 5000 || len(pull.Pinned) != 1 || pull.Pinned[0] != "python:3.12" {
					t.Errorf("image %q pull %+v", cfg.Image, pull)
				}
			}},
		{name: "bad image", yaml: "image: Not/A::ref\n", wantErr: "image (--image): image reference"},
		{name: "half the credentials", yaml: "images: {registries: [{host: r.example, username: u}]}\n", wantErr: "set both username and password"},
		{name: "two passwords", yaml: "images: {registries: [{host: r.example, username: u, password: p, password_file: /run/p}]}\n", wantErr: "password or password_file, not both"},
		{name: "a scheme in the host", yaml: "images: {registries: [{host: 'https://r.example'}]}\n", wantErr: "without a scheme or path"},
		{name: "zero size", yaml: "images: {max_bytes: 0}\n", wantErr: "images.max_bytes 0 must be positive"},
		{name: "a bad pinned image", yaml: "images: {pinned: ['Bad::Ref']}\n", wantErr: "images.pinned[0]: image reference"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if cfg, ok := loadTestConfig(t, tc.yaml, nil, tc.wantErr); ok {
				tc.check(t, cfg)
			}
		})
	}
}

// loadTestConfig loads the worker's configuration from yaml (no file when empty) and flags, with a fresh
// data directory. With wantErr empty it fails the test on any error and returns the configuration and
// true; otherwise it fails the test unless loading fails saying wantErr, and returns false.
func loadTestConfig(t *testing.T, yaml string, flags []string, wantErr string) (config, bool) {
	t.Helper()
	args := append([]string{"-data-dir", t.TempDir()}, flags...)
	if yaml != "" {
		p := filepath.Join(t.TempDir(), "worker.yaml")
		if err := os.WriteFile(p, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		args = append(args, "-config", p)
	}
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	cfg, err := loadConfig(fs, args)
	if wantErr != "" {
		if err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Fatalf("err %v, want one saying %q", err, wantErr)
		}
		return config{}, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return cfg, true
}

// TestLoadConfigCheckpoints: checkpoints are off by default; the S3 keys come from the environment unless
// the file sets them; the flag picks the store over the file; every bad value is refused with what to fix.
func TestLoadConfigCheckpoints(t *testing.T) {
	t.Setenv("AWS_ACCESS_KEY_ID", "env-key")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "env-secret")
	t.Setenv("AWS_REGION", "")
	cfg, err := load(t, "-data-dir", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if c := cfg.Checkpoints; c.Store != "none" || c.ChunkBytes != 4<<20 || c.Parallel != 16 || c.S3.AccessKeyID != "env-key" || c.GCEvery != time.Hour || c.GCGrace != time.Hour ||
		c.PackFilesUnder != 256<<10 || c.packFilesUnder() != 256<<10 {
		t.Fatalf("defaults: %+v", c)
	}
	cfg, err = load(t, "-data-dir", t.TempDir(), "-config", writeConfig(t,
		"checkpoints:\n  store: jetstream\n  chunk_bytes: 1048576\n  pack_files_under: 0\n  max_workspace_bytes: 1073741824\n  max_tenant_bytes: 10737418240\n  gc_every: 10m\n  gc_grace: 2h\n  s3: {endpoint: 'http://127.0.0.1:9000', bucket: ckpt, secret_access_key: file-secret}\n"),
		"-checkpoints", "s3")
	if err != nil {
		t.Fatal(err)
	}
	s3 := cfg.Checkpoints.s3()
	if cfg.Checkpoints.Store != "s3" || cfg.Checkpoints.ChunkBytes != 1<<20 || cfg.Checkpoints.MaxWorkspaceBytes != 1<<30 || cfg.Checkpoints.MaxTenantBytes != 10<<30 || cfg.Checkpoints.GCEvery != 10*time.Minute || cfg.Checkpoints.GCGrace != 2*time.Hour || s3.AccessKeyID != "env-key" || s3.SecretAccessKey != "file-secret" || s3.Bucket != "ckpt" ||
		cfg.Checkpoints.PackFilesUnder != 0 || cfg.Checkpoints.packFilesUnder() >= 0 {
		t.Fatalf("file and flag: %+v", cfg.Checkpoints)
	}
	_, err = load(t, "-data-dir", t.TempDir(), "-config", writeConfig(t, "checkpoints: {store: nfs, chunk_bytes: 1000, pack_files_under: 5000000, parallel: 0, max_workspace_bytes: -1, max_tenant_bytes: -2, gc_every: 10s, gc_grace: 5m}\n"))
	for _, want := range []string{`checkpoints.store "nfs" is none of none, jetstream or s3`, "checkpoints.chunk_bytes 1000 is outside 65536..67108864",
		"checkpoints.pack_files_under 5000000 is outside 0..4194304",
		"checkpoints.parallel 0 is outside 1..256", "checkpoints.max_workspace_bytes -1 is negative", "checkpoints.max_tenant_bytes -2 is negative",
		"checkpoints.gc_every 10s must be at least 1m", "checkpoints.gc_grace 5m0s is under 30m0s"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not say %q", err, want)
		}
	}
	t.Setenv("AWS_SECRET_ACCESS_KEY", "")
	_, err = load(t, "-data-dir", t.TempDir(), "-checkpoints", "s3")
	if err == nil || !strings.Contains(err.Error(), "checkpoints.s3: s3 endpoint is empty") {
		t.Errorf("s3 without an endpoint: %v", err)
	}
}
