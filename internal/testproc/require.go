package testproc

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// Lack fails the test under CI=true, and skips it elsewhere, for want of missing (what to install, and
// how): CI must run every test, a developer's machine may lack a tool. It does nothing when missing is
// empty.
func Lack(t testing.TB, missing string) {
	t.Helper()
	if missing == "" {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("this test needs %s, and CI must not skip it", missing)
	}
	t.Skipf("this test needs %s", missing)
}

// RequireNode is Lack for Node.js of at least major and npm on PATH (make deps installs Debian's).
func RequireNode(t testing.TB, major int) {
	t.Helper()
	out, err := exec.Command("node", "--version").Output()
	got := 0
	if v, ok := strings.CutPrefix(strings.TrimSpace(string(out)), "v"); ok {
		got, _ = strconv.Atoi(strings.SplitN(v, ".", 2)[0])
	}
	_, npmErr := exec.LookPath("npm")
	if err != nil || got < major || npmErr != nil {
		Lack(t, fmt.Sprintf("Node.js %d or later and npm (make deps installs Debian's when they are missing; "+
			"Debian 12's Node.js is 18: take Node.js 20 from Debian 13 or nodejs.org): node --version: %q %v; npm: %v",
			major, out, err, npmErr))
	}
}
