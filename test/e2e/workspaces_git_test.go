package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/toolpool/toolpool/internal/call"
)

// TestWorkspaceGit seeds workspaces from the test's git server (TestEgress's origin) through the egress
// path: a branch, the default branch, a commit and a host whose credential the proxy adds are cloned in a
// container whose proxy reaches the git host only; a missing ref, a host policy does not allow and a
// tenant without network leave no workspace; bad sources are refused before anything is queued.
func TestWorkspaceGit(t *testing.T) {
	s := startEgressStack(t)
	repoURL := func(host string) string { return fmt.Sprintf("https://%s:%d/repo.git", host, s.port) }
	clone := func(t *testing.T, tenant, name, url, ref string) response {
		t.Helper()
		r, _ := s.send(t, http.MethodPut, "/v1/workspaces/"+name, tenant+"-token", map[string]any{"git": map[string]string{"url": url, "ref": ref}},
			map[string]string{"Content-Type": "application/json"})
		return r
	}
	wsDir := func(tenant, name string) string { return filepath.Join(s.dataDir, "w", "workspaces", tenant, name) }
	// absent checks that a refused clone left nothing: no workspace, no lock, no staging directory.
	absent := func(t *testing.T, tenant, name string) {
		t.Helper()
		if r := s.do(t, http.MethodGet, "/v1/workspaces/"+name, tenant+"-token", nil); r.code != http.StatusNotFound {
			t.Errorf("workspace %s after a refused clone: HTTP %d %s", name, r.code, r.body)
		}
		for _, p := range []string{wsDir(tenant, name), filepath.Join(s.dataDir, "w", "workspaces", tenant, ".ws", name+".lock")} {
			if _, err := os.Lstat(p); !os.IsNotExist(err) {
				t.Errorf("%s is left behind (%v)", p, err)
			}
		}
		if ents, _ := os.ReadDir(filepath.Join(s.dataDir, "w", "workspaces", tenant, ".trash")); len(ents) != 0 {
			t.Errorf("the trash holds %d staging entries", len(ents))
		}
	}
	callOf := func(t *testing.T, r response) *call.Result {
		t.Helper()
		var v struct {
			CallID string `json:"call_id"`
		}
		json.Unmarshal(r.body, &v)
		return s.do(t, http.MethodGet, "/v1/calls/"+v.CallID, "dev-token", nil).result(t)
	}

	t.Run("a branch, through the egress path, owned by the sandbox user", func(t *testing.T) {
		r := clone(t, "dev", "git-main", repoURL("git.test"), "main")
		if r.code != http.StatusCreated {
			t.Fatalf("clone: HTTP %d %s", r.code, r.body)
		}
		if inf := wsInfo(t, r); inf.Files < 3 {
			t.Fatalf("want README and .git: %+v", inf)
		}
		res := callOf(t, r)
		if res.Tool != "workspace_clone" || egressEntry(res, "git.test", call.EgressAllowed) == nil || len(res.Egress) != 1 {
			t.Fatalf("want the clone's call with one allowed egress entry, for git.test: %+v", res.Egress)
		}
		if f := s.do(t, http.MethodGet, "/v1/workspaces/git-main/files/README", "dev-token", nil); string(f.body) != gitFile {
			t.Fatalf("README: HTTP %d %q", f.code, f.body)
		}
		sh := s.shell(t, "dev-token", "git-main", `stat -c %u README .git/HEAD; id -u; git log --oneline | wc -l; git rm -q README; git status --short`, nil).result(t)
		lines := strings.Split(sh.Stdout, "\n")
		if sh.Status != call.StatusOK || len(lines) < 5 || lines[0] != lines[2] || lines[1] != lines[2] || lines[3] != "1" || lines[4] != "D  README" {
			t.Fatalf("want a one-commit checkout the sandbox user owns and can change: %s %s %s", sh.Status, sh.Stdout, sh.Stderr)
		}
		if r := clone(t, "dev", "git-main", repoURL("git.test"), "main"); r.code != http.StatusConflict {
			t.Fatalf("clone into a taken name: HTTP %d %s", r.code, r.body)
		}
	})

	t.Run("the default branch, and a commit", func(t *testing.T) {
		if r := clone(t, "dev", "git-default", repoURL("git.test"), ""); r.code != http.StatusCreated {
			t.Fatalf("clone: HTTP %d %s", r.code, r.body)
		}
		commit, err := exec.Command("git", "-C", filepath.Join(s.origin.gitDir, "repo.git"), "rev-parse", "main").Output()
		if err != nil {
			t.Fatal(err)
		}
		sha := strings.TrimSpace(string(commit))
		if r := clone(t, "dev", "git-commit", repoURL("git.test"), sha); r.code != http.StatusCreated {
			t.Fatalf("clone of commit %s: HTTP %d %s", sha, r.code, r.body)
		}
		head := s.shell(t, "dev-token", "git-commit", "git rev-parse HEAD && cat README", nil).result(t)
		if !strings.HasPrefix(head.Stdout, sha+"\n") || !strings.Contains(head.Stdout, gitFile) {
			t.Fatalf("want HEAD at %s: %s %s", sha, head.Stdout, head.Stderr)
		}
	})

	t.Run("a private host: the proxy adds its credential, the sandbox never sees it", func(t *testing.T) {
		r := clone(t, "dev", "git-corp", repoURL("git.corp.test"), "main")
		if r.code != http.StatusCreated {
			t.Fatalf("clone: HTTP %d %s", r.code, r.body)
		}
		if !slices.Contains(s.origin.seen("git.corp.test"), s.headers["git.corp.test"]) {
			t.Fatal("the git server did not get the credential")
		}
		if e := egressEntry(callOf(t, r), "git.corp.test", call.EgressAllowed); e == nil || e.Credential != "corp-git" {
			t.Fatalf("want the egress entry to name the credential: %+v", e)
		}
		grep := s.shell(t, "dev-token", "git-corp", "grep -rc tpsecret . | grep -v ':0$'; cat .git/config", nil).result(t)
		if strings.Contains(grep.Stdout, "tpsecret") || strings.Contains(grep.Stdout, s.secrets["git.corp.test"]) {
			t.Fatalf("the credential is in the workspace: %s", grep.Stdout)
		}
	})

	t.Run("refused: a missing ref, a host policy does not allow, a tenant without network", func(t *testing.T) {
		r := clone(t, "dev", "git-noref", repoURL("git.test"), "no-such-branch")
		if r.code != http.StatusUnprocessableEntity || !strings.Contains(string(r.body), `has no branch or tag \"no-such-branch\"`) {
			t.Fatalf("missing ref: HTTP %d %s", r.code, r.body)
		}
		absent(t, "dev", "git-noref")

		before := s.origin.requests("files.test")
		r = clone(t, "dev", "git-files", repoURL("files.test"), "main") // run_shell may reach it; a clone may not
		if res := r.result(t); r.code != http.StatusForbidden || res.Decision.Rule != "domain-not-allowed" {
			t.Fatalf("host not allowed: HTTP %d %s", r.code, r.body)
		}
		if n := s.origin.requests("files.test"); n != before {
			t.Fatalf("files.test got %d requests from a denied clone", n-before)
		}
		absent(t, "dev", "git-files")

		r = clone(t, "beta", "git-beta", repoURL("git.test"), "main")
		if res := r.result(t); r.code != http.StatusForbidden || res.Decision.Rule != "no-network" || !strings.Contains(res.Error.Message, "tools.workspace_clone.network") {
			t.Fatalf("tenant without network: HTTP %d %s", r.code, r.body)
		}
		absent(t, "beta", "git-beta")
	})

	t.Run("bad sources are refused before anything is queued", func(t *testing.T) {
		for _, tc := range []struct{ url, ref, msg string }{
			{"https://git:" + s.secrets["git.corp.test"] + "@git.corp.test/repo.git", "", "carries credentials"},
			{"git@git.test:repo.git", "", "ssh address"},
			{"http://git.test/repo.git", "", "plain http"},
			{repoURL("git.test"), "--upload-pack=touch /tmp/pwned", "read as an option"},
		} {
			r := clone(t, "dev", "git-bad", tc.url, tc.ref)
			if r.code != http.StatusBadRequest || !strings.Contains(string(r.body), tc.msg) || strings.Contains(string(r.body), "call_id") {
				t.Errorf("%s %s: HTTP %d %s; want 400 saying %q", tc.url, tc.ref, r.code, r.body, tc.msg)
			}
		}
		absent(t, "dev", "git-bad")
	})

	t.Run("the CLI", func(t *testing.T) {
		cli := func(args ...string) (string, error) {
			cmd := exec.Command(filepath.Join(binaries(t), "toolpool"), args...)
			cmd.Env = append(os.Environ(), "TOOLPOOL_URL="+s.url, "TOOLPOOL_TOKEN=dev-token")
			out, err := cmd.CombinedOutput()
			t.Logf("$ toolpool %s\n%s", strings.Join(args, " "), out)
			return string(out), err
		}
		if out, err := cli("ws", "create", "git-cli", "--git", repoURL("git.test"), "--ref", "main"); err != nil || !strings.Contains(out, `"name": "git-cli"`) {
			t.Fatalf("ws create --git: %v", err)
		}
		if out, err := cli("ws", "create", "git-cli2", "--git", repoURL("files.test")); err == nil || !strings.Contains(out, "workspace_clone was denied") {
			t.Fatalf("ws create --git of a host policy does not allow: %v, want exit 1 saying it was denied", err)
		}
		if out, err := cli("ws", "create", "git-cli3", "--git", "https://tok@git.test/repo.git"); err == nil || !strings.Contains(out, "carries credentials") {
			t.Fatalf("ws create --git with a token in the URL: %v, want a refusal", err)
		}
	})

	var audit struct {
		Events []call.AuditEvent `json:"events"`
	}
	json.Unmarshal(s.do(t, http.MethodGet, "/v1/audit?since=1h&limit=1000", "dev-token", nil).body, &audit)
	var events []string
	for _, e := range audit.Events {
		if e.Tool == "workspace_clone" {
			events = append(events, e.Event+" "+e.Action+" "+string(e.Status))
			if e.Event == "finished" && e.Status == call.StatusOK && len(e.Egress) == 0 {
				t.Errorf("a finished clone's audit event lacks its egress: %+v", e)
			}
		}
	}
	for _, want := range []string{"accepted allow ", "finished allow ok", "finished allow error", "finished deny denied"} {
		if !slices.ContainsFunc(events, func(e string) bool { return strings.HasPrefix(e, want) }) {
			t.Errorf("the audit log lacks a workspace_clone %q event: %v", want, events)
		}
	}
}
