package main

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/testproc"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testproc.Cleanup()
	os.Exit(code)
}

// TestStartupRefusesBadInput starts the real dispatcher binary with one bad input at a time and checks that
// it exits at once (within testproc.RefusalWithin) with one line that names the input and the setting to change.
func TestStartupRefusesBadInput(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the dispatcher binary")
	}
	bin := filepath.Join(testproc.Binaries(t, testproc.Stack...), "dispatcher")
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	unreadable := write("unreadable.yaml", "version: 1\ndefault_action: allow\n")
	if err := os.Chmod(unreadable, 0); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		args []string
		want []string // substrings of the one line
	}{
		{"listen taken", []string{"--listen", testproc.HoldPort(t)}, []string{"is in use", "change --listen (listen)"}},
		{"nats listen taken", []string{"--nats-listen", testproc.HoldPort(t)}, []string{"embedded nats", "is in use", "change --nats-listen (nats_listen)", "--nats-url"}},
		{"listen not an address", []string{"--listen", "8080"}, []string{`listen "8080" is not host:port`}},
		{"nats listen not an address", []string{"--nats-listen", "localhost"}, []string{`nats_listen "localhost" is not host:port`, "--nats-listen"}},
		{"config value", []string{"--config", write("sync.yaml", "nats_sync: sometimes\n")}, []string{`nats_sync "sometimes"`, "set always"}},
		{"config key", []string{"--config", write("key.yaml", "nats_listn: 127.0.0.1:0\n")}, []string{"read config", "nats_listn"}},
		{"config missing", []string{"--config", filepath.Join(dir, "absent.yaml")}, []string{"open config", "absent.yaml"}},
		{"log level", []string{"--log-level", "loud"}, []string{`log level "loud"`}},
		{"policy missing", []string{"--policy", filepath.Join(dir, "absent-policy.yaml")}, []string{"load policy", "absent-policy.yaml", "--policy (policy_file)"}},
		{"policy invalid", []string{"--policy", write("bad-policy.yaml", "version: 1\ndefault_action: perhaps\n")}, []string{"load policy", "perhaps", "--policy (policy_file)"}},
	}
	if os.Geteuid() != 0 { // root reads a file whatever its mode
		cases = append(cases, struct {
			name string
			args []string
			want []string
		}{"policy unreadable", []string{"--policy", unreadable}, []string{"load policy", "permission denied", "--policy (policy_file)"}})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			args := append([]string{"--dev-tenant", "--listen", "127.0.0.1:0", "--nats-listen", "127.0.0.1:0", "--data-dir", t.TempDir()}, c.args...)
			testproc.RunToExit(t, bin, nil, 10*time.Second, args...).CheckRefused(t, testproc.RefusalWithin, c.want...)
		})
	}
}
