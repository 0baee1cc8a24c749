package incontainer

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/toolpool/toolpool/internal/testproc"
	"github.com/toolpool/toolpool/internal/tools/egress"
)

// ForwardMain reaps every child of its process, so each case runs it in a process of its own: this test
// binary, re-executed with forwardMainEnv set.
const forwardMainEnv = "TOOLPOOL_TEST_FORWARD_MAIN"

func TestMain(m *testing.M) {
	if spec := os.Getenv(forwardMainEnv); spec != "" {
		addr, socket, _ := strings.Cut(spec, " ")
		os.Exit(ForwardMain(context.Background(), os.Args[1:], addr, socket, os.Stderr))
	}
	if spec := os.Getenv(runnerMainEnv); spec != "" {
		tool, ws, _ := strings.Cut(spec, " ")
		os.Exit(RunnerMain(context.Background(), tool, ws, os.Stdin, os.Stdout))
	}
	os.Exit(m.Run())
}

// runForwardMain runs ForwardMain with args in a child process, listening on addr, forwarding to socket.
func runForwardMain(t *testing.T, addr, socket string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), forwardMainEnv+"="+addr+" "+socket, "HTTP_PROXY=http://"+addr, "http_proxy=http://"+addr)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode(), out.String(), errb.String()
	} else if err != nil {
		t.Fatal(err)
	}
	return 0, out.String(), errb.String()
}

func TestForwardMain(t *testing.T) {
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "via the forwarder") }))
	defer origin.Close()
	originAP := netip.MustParseAddrPort(origin.Listener.Addr().String())
	socket := serveEgress(t, egress.Rules{}, origin)
	tests := []struct {
		name       string
		args       []string
		wantCode   int
		wantStdout string
		wantStderr string
	}{
		{"exit status", []string{"--", "/bin/sh", "-c", "exit 7"}, 7, "", ""},
		{"killed by a signal", []string{"--", "/bin/sh", "-c", "kill -TERM $$"}, 128 + 15, "", ""},
		{"stdout and environment pass through", []string{"--", "/bin/sh", "-c", `echo "proxy=$HTTP_PROXY"`}, 0, "proxy=http://", ""},
		{"the command reaches the proxy through the forwarder", []string{"--", "curl", "-sS", fmt.Sprintf("http://site.test:%d/", originAP.Port())}, 0, "via the forwarder", ""},
		{"a missing program", []string{"--", "no-such-program-tp"}, 127, "", "toolpool: run no-such-program-tp"},
		{"no command", []string{"--"}, 2, "", "usage:"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, stdout, stderr := runForwardMain(t, testproc.FreeAddr(t), socket, tt.args...)
			if code != tt.wantCode || !strings.Contains(stdout, tt.wantStdout) || !strings.Contains(stderr, tt.wantStderr) {
				t.Fatalf("exit %d stdout %q stderr %q; want %d, %q, %q", code, stdout, stderr, tt.wantCode, tt.wantStdout, tt.wantStderr)
			}
		})
	}
	t.Run("the listening address is taken", func(t *testing.T) {
		taken, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer taken.Close()
		code, _, stderr := runForwardMain(t, taken.Addr().String(), socket, "--", "/bin/true")
		if code != 126 || !strings.Contains(stderr, "start the egress forwarder") {
			t.Fatalf("exit %d stderr %q", code, stderr)
		}
	})
}
