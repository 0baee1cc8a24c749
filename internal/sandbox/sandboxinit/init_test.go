package sandboxinit_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/toolpool/toolpool/internal/sandbox/sandboxinit"
)

// modeEnv makes the test binary the init (Main) or the program the init executes ("fds": it prints each
// descriptor it holds that refers to one of the files hostEnv names by device and inode; the Go runtime
// opens descriptors of its own, such as the cgroup's CPU quota, so openness alone says nothing).
const (
	modeEnv = "SANDBOXINIT_TEST_MODE"
	hostEnv = "SANDBOXINIT_TEST_HOST_FILES"
)

func TestMain(m *testing.M) {
	switch os.Getenv(modeEnv) {
	case "init":
		os.Exit(sandboxinit.Main(os.Stderr))
	case "fds":
		host := strings.Fields(os.Getenv(hostEnv))
		for fd := 3; fd < 256; fd++ {
			var st unix.Stat_t
			if unix.Fstat(fd, &st) == nil && slices.Contains(host, fmt.Sprintf("%d:%d", st.Dev, st.Ino)) {
				fmt.Printf("host descriptor %d\n", fd)
			}
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestHostDescriptors runs Main with descriptors of the host beyond the standard three (what runc leaked
// in CVE-2024-21626): a directory at 3, a file at 4. None may reach the program, and the directory may
// not serve as a way out for the working directory (/proc/self/fd/3) either.
func TestHostDescriptors(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name     string
		cwd      string
		wantCode int
		wantOut  string
	}{
		{name: "no descriptor reaches the program", cwd: "/", wantCode: 0, wantOut: ""},
		{name: "working directory through a host directory descriptor", cwd: "/proc/self/fd/3", wantCode: sandboxinit.ExitCwd},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir, err := os.Open(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			defer dir.Close()
			file, err := os.Open(self)
			if err != nil {
				t.Fatal(err)
			}
			defer file.Close()
			var ids []string
			for _, f := range []*os.File{dir, file} {
				var st unix.Stat_t
				if err := unix.Fstat(int(f.Fd()), &st); err != nil {
					t.Fatal(err)
				}
				ids = append(ids, fmt.Sprintf("%d:%d", st.Dev, st.Ino))
			}
			req, err := sandboxinit.Encode(sandboxinit.Request{Argv: []string{self},
				Env: []string{modeEnv + "=fds", hostEnv + "=" + strings.Join(ids, " ")}, Cwd: c.cwd, Nonce: "n"})
			if err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(self)
			cmd.Env = []string{modeEnv + "=init"}
			cmd.Stdin = bytes.NewReader(req)
			cmd.ExtraFiles = []*os.File{dir, file}
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err = cmd.Run()
			code := 0
			if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if code != c.wantCode || strings.TrimSpace(stdout.String()) != c.wantOut {
				t.Errorf("exit %d (want %d), stdout %q (want %q), stderr %q", code, c.wantCode, stdout.String(), c.wantOut, stderr.String())
			}
			if !strings.HasPrefix(stderr.String(), sandboxinit.Ack("n")) || strings.Count(stderr.String(), sandboxinit.Ack("n")) != 1 {
				t.Errorf("stderr %q does not begin with the init's acknowledgement, once", stderr.String())
			}
		})
	}
}

// TestNoAckWithoutRequest: an init that could not read a request writes no acknowledgement, so the
// runtime knows the call never reached it.
func TestNoAckWithoutRequest(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self)
	cmd.Env = []string{modeEnv + "=init"}
	cmd.Stdin = strings.NewReader("not a request at all")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err == nil {
		t.Fatal("the init ran a garbled request")
	}
	if strings.Contains(stderr.String(), "request taken") || !strings.Contains(stderr.String(), "not a toolpool init request") {
		t.Fatalf("stderr %q", stderr.String())
	}
}
