// Package testbin builds toolpool's binaries, and nats-server from the module's dependency, once per test
// process, for the tests that run them as a user would (test/e2e, test/cluster).
package testbin

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

var (
	once sync.Once
	dir  string
	err  error
)

// Dir builds dispatcher, worker, toolpool and nats-server (statically) on first use and returns the
// directory that holds them. Call Cleanup from TestMain to remove it.
func Dir(t testing.TB) string {
	t.Helper()
	once.Do(func() {
		if dir, err = os.MkdirTemp("", "tpbin"); err != nil {
			return
		}
		cmd := exec.Command("go", "build", "-trimpath", "-o", dir+"/", "github.com/toolpool/toolpool/cmd/dispatcher",
			"github.com/toolpool/toolpool/cmd/worker", "github.com/toolpool/toolpool/cmd/toolpool", "github.com/nats-io/nats-server/v2")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, berr := cmd.CombinedOutput(); berr != nil {
			err = fmt.Errorf("go build: %v\n%s", berr, out)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// Cleanup removes the binaries, if they were built.
func Cleanup() {
	if dir != "" {
		os.RemoveAll(dir)
	}
}

// ProcessesWith lists the pids of the processes whose command line contains s.
func ProcessesWith(s string) []string {
	var pids []string
	paths, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err == nil && strings.Contains(strings.ReplaceAll(string(b), "\x00", " "), s) {
			pids = append(pids, filepath.Base(filepath.Dir(p)))
		}
	}
	return pids
}
