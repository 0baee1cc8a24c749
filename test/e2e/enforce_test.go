package e2e

import (
	"bytes"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/sandbox/containerd/ctrtest"
)

// postureTenants adds a read-only tenant and an autonomous one to the stack's dispatcher.
const postureTenants = `    - name: auditor
      posture: read-only
      tokens: [{token: auditor-token}]
    - name: ci
      posture: autonomous
      tokens: [{token: ci-token}]
`

// TestSandboxKeepsPolicyPromises: through the whole stack, with the shipped default policy, a line the
// shell judge lets through cannot break what the posture and the denied paths promise: a read-only
// tenant's allowed reader cannot change its workspace, and an autonomous tenant's recursive readers and
// git commands read no denied file and cannot write git's hooks.
//
// Each line is one the judge allows although it should not (issue 29): the test fails, saying so, when the
// judge learns better, so that another line takes its place.
func TestSandboxKeepsPolicyPromises(t *testing.T) {
	s := startStackWith(t, stackOptions{extraConfig: postureTenants})
	seed := func(tenant, ws string) string {
		t.Helper()
		dir := filepath.Join(s.dataDir, "w", "workspaces", tenant, ws)
		files := map[string]string{"README.md": "readable\n", ".env": "E2E-SECRET-env\n", "app/.env.local": "E2E-SECRET-nested\n",
			".aws/credentials": "E2E-SECRET-aws\n"}
		for f, c := range files {
			p := filepath.Join(dir, f)
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, []byte(c), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		git := exec.Command("sh", "-c", "git -c safe.directory=* init -q && git -c safe.directory=* add README.md && git -c safe.directory=* commit -qm init")
		git.Dir = dir
		git.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "HOME="+dir, "GIT_AUTHOR_NAME=e", "GIT_AUTHOR_EMAIL=e@x",
			"GIT_COMMITTER_NAME=e", "GIT_COMMITTER_EMAIL=e@x")
		if b, err := git.CombinedOutput(); err != nil {
			t.Fatalf("git: %v: %s", err, b)
		}
		ctrtest.ChownToSandbox(t, dir)
		return dir
	}
	run := func(t *testing.T, token, ws, cmd string) *call.Result {
		t.Helper()
		r := s.shell(t, token, ws, cmd, nil)
		if r.code != http.StatusOK {
			t.Fatalf("%q: HTTP %d %s", cmd, r.code, r.body)
		}
		return r.result(t)
	}
	// A first call creates each workspace; then the test seeds it on the host.
	for token, ws := range map[string]string{"auditor-token": "ro", "ci-token": "auto"} {
		run(t, token, ws, "true")
	}
	roDir, autoDir := seed("auditor", "ro"), seed("ci", "auto")

	t.Run("read-only: an allowed line cannot write", func(t *testing.T) {
		// `git status` is a reader to the judge, and it rewrites the index when the files' times moved.
		later := time.Now().Add(time.Hour)
		if err := os.Chtimes(filepath.Join(roDir, "README.md"), later, later); err != nil {
			t.Fatal(err)
		}
		index, _ := os.ReadFile(filepath.Join(roDir, ".git", "index"))
		res := run(t, "auditor-token", "ro", "git status")
		if res.Decision == nil || res.Decision.Action != "allow" || res.Status != call.StatusOK {
			t.Fatalf("git status: decision %+v, status %s, stderr %q", res.Decision, res.Status, res.Stderr)
		}
		if now, _ := os.ReadFile(filepath.Join(roDir, ".git", "index")); !bytes.Equal(now, index) {
			t.Errorf("git status rewrote the index of a read-only tenant's workspace")
		}
		if _, err := os.Stat(filepath.Join(roDir, ".git", "index.lock")); err == nil {
			t.Errorf("git status left a lock in a read-only tenant's workspace")
		}
	})
	t.Run("autonomous: recursive readers read no denied file", func(t *testing.T) {
		for _, cmd := range []string{"grep -r '' .", "grep -r '' --include='.e*' .", "tar cf - . | strings",
			`python3 -c "import os;[print(open(os.path.join(d,f),errors='replace').read()) for d,_,fs in os.walk('.') for f in fs]"`} {
			res := run(t, "ci-token", "auto", cmd)
			if res.Decision == nil || res.Decision.Action == "deny" {
				continue // the judge stops it: nothing to prove here
			}
			if out := res.Stdout + res.Stderr; strings.Contains(out, "E2E-SECRET") {
				t.Errorf("%q printed a denied file: %q", cmd, out)
			}
		}
		res := run(t, "ci-token", "auto", "grep -r '' .")
		if !strings.Contains(res.Stdout, "readable") {
			t.Errorf("the ordinary file was not read: %q %q", res.Stdout, res.Stderr)
		}
	})
	t.Run("autonomous: git's hooks stay read-only", func(t *testing.T) {
		// The judge cannot tell where $h/post-checkout is, and allows it as a reader's redirect.
		res := run(t, "ci-token", "auto", "h=hooks; cd .git && echo pwned > $h/post-checkout")
		if res.Decision == nil || res.Decision.Action != "allow" {
			t.Fatalf("the judge no longer allows the line (decision %+v): pick another it misjudges", res.Decision)
		}
		if _, err := os.Stat(filepath.Join(autoDir, ".git", "hooks", "post-checkout")); err == nil {
			t.Errorf("a call wrote a git hook (decision %+v, stderr %q)", res.Decision, res.Stderr)
		}
	})
}
