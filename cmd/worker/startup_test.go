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

// TestStartupRefusesBadInput starts the real worker binary with one bad input at a time and checks that it
// exits at once (within testproc.RefusalWithin), before it starts containerd or looks for NATS, with one line that
// names the input and the setting to change.
func TestStartupRefusesBadInput(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the worker binary")
	}
	bin := filepath.Join(testproc.Binaries(t, testproc.Stack...), "worker")
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	taken := testproc.HoldPort(t)
	notSocket := write("not-a-socket", "")
	cases := []struct {
		name string
		args []string
		want []string // substrings of the one line
	}{
		{"listen taken", []string{"--listen", taken}, []string{"is in use", "change --listen (listen)"}},
		{"runtime binary missing", []string{"--runtime-binary", "no-such-runc"}, []string{`runtime_binary "no-such-runc"`, "--runtime-binary (runtime_binary)"}},
		{"runtime binary path missing", []string{"--runtime-binary", filepath.Join(dir, "crun")}, []string{"runtime_binary", "no such file", "--runtime-binary (runtime_binary)"}},
		{"runsc missing", []string{"--config", write("runsc.yaml", "gvisor: {runsc: "+filepath.Join(dir, "runsc")+"}\n")}, []string{"gvisor.runsc", "no such file"}},
		{"gvisor platform", []string{"--config", write("platform.yaml", "gvisor: {runsc: /bin/true, platform: vmx}\n")}, []string{"sandbox settings", `platform "vmx"`}},
		{"gvisor not offered", []string{"--runtime", "gvisor", "--config", write("nogvisor.yaml", "gvisor: {disabled: true}\n")}, []string{"sandbox settings", "default runtime is gvisor"}},
		{"containerd address missing", []string{"--containerd-address", filepath.Join(dir, "containerd.sock")}, []string{"containerd_address", "no such file", "--containerd-address (containerd_address)"}},
		{"containerd address not a socket", []string{"--containerd-address", "unix://" + notSocket}, []string{"containerd_address", "not a socket"}},
		{"config value", []string{"--slots", "0"}, []string{"slots 0 is outside 1..1024", "--slots"}},
		{"config key", []string{"--config", write("key.yaml", "slot: 4\n")}, []string{"read config", "field slot not found", "correct or remove"}},
		{"config missing", []string{"--config", filepath.Join(dir, "absent.yaml")}, []string{"open config", "absent.yaml"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			args := append([]string{"--listen", "127.0.0.1:0", "--data-dir", t.TempDir(), "--nats-url", "nats://127.0.0.1:1"}, c.args...)
			testproc.RunToExit(t, bin, nil, 10*time.Second, args...).CheckRefused(t, testproc.RefusalWithin, c.want...)
		})
	}
}
