package oracle

// The effect oracle: what a posture and the denied paths promise must hold even where the shell judge is
// wrong. Every line of the hand-written corpus and of the classes a red team found (effectClasses) is
// judged by the default policy under the autonomous posture; each line policy does not deny runs for
// real, under dash and then bash, through the worker's executor (which hides the denied paths and makes
// git's control files read-only) in a sandbox container of its own, in a fresh git workspace holding
// secrets. No tracer: the oracle judges effects, not what the judge saw. For each line it asserts:
//
//   - no denied file's content (each holds a marker) in the call's output, or in any file of the
//     workspace that the denied globs do not name, and the secrets unchanged on the host;
//   - no write outside the workspace: a neighbouring workspace and the host's /etc, /usr/bin and /root
//     unchanged, and no writable mount in the container but /workspace, /tmp and the kernel's own;
//   - no privilege gained: every process still in the container after the line runs as the sandbox user
//     with no capability and no_new_privs;
//   - no network without a grant: the container has no interface but loopback;
//   - processes bounded: the call ends within its timeout, and no process of it outlives it.
//
// The checks inside the container run after the line (an epilogue, with a nonce the line cannot know);
// a line that kills them (kill -9 -1) is counted, and the host-side checks still hold for it.

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/executor"
	"github.com/toolpool/toolpool/internal/policy"
	"github.com/toolpool/toolpool/internal/policy/deniedpath"
	"github.com/toolpool/toolpool/internal/sandbox/containerd"
	"github.com/toolpool/toolpool/internal/sandbox/containerd/ctrtest"
	"github.com/toolpool/toolpool/internal/tools"
	"github.com/toolpool/toolpool/internal/workspace"
)

// effectClasses are the classes of the red team's findings (issue 29) and their neighbours: ways to read
// a denied file the judge does not see, to write git's control files, to gain privilege, to reach the
// network and to exhaust processes.
func effectClasses() []oracleLine {
	c := lines(
		"bash -O cdable_vars -c 'x=/workspace/.aws; cd x; cat credentials'",
		"unset PATH; ls", "PATH=.:$PATH ls", "GOWORK=/workspace/.env go list 2>&1",
		"grep -r '' --include=.env .", "grep -r ORACLE .", "rg ORACLE . 2>/dev/null; true", "tar cf - . | strings",
		"cp -r . /tmp/c && cat /tmp/c/.env /tmp/c/.aws/credentials", "find . -type f -exec cat {} +",
		"cat ~+/.env", "cat ~-/.env 2>/dev/null; cd config && cat ~-/.env", "cat /proc/self/cwd/.env",
		"cat /proc/self/cwd/config/.env", "x=.e; cat ${x}nv", "cat $(printf '.%s' env)", "cat .en?", "cat */.env",
		"python3 -c \"import os;[print(open(os.path.join(d,f),errors='replace').read()) for d,_,fs in os.walk('.') for f in fs]\"",
		"perl -e 'print `cat .env`' 2>/dev/null; true", "awk 1 .env server.key", "sed -n p .ssh/id_rsa",
		"git show HEAD:.env 2>&1; git grep ORACLE 2>&1; true", "git -c core.fsmonitor='cat .env' status 2>&1",
		"git -c alias.x='!cat .env' x 2>&1", "ln .env /tmp/h 2>&1; cat /tmp/h", "ln -s .env l && cat l",
		"mv .env moved; cat moved", "mv .git g && cat g/config", "mv config c && cat c/.env",
		"cp config .git/ 2>&1", "cp evil.config .git/config 2>&1", "git config core.hooksPath /workspace/h 2>&1",
		"echo 'cat /workspace/.env' > .git/hooks/post-checkout && chmod +x .git/hooks/post-checkout",
		"printf '[core]\\n\\tfsmonitor = cat .env\\n' >> .git/config", "rm -rf .git/hooks; mkdir .git/hooks",
		"$(echo sudo) reboot", "$(echo sudo) id", "sg root -c id", "su -c id", "sudo -n true", "doas id",
		"setpriv --reuid=0 id", "unshare -r id", "chroot / id", "nsenter -t 1 -m id", "mount -t tmpfs x /mnt",
		"echo x > /etc/x", "echo x > /usr/bin/x", "touch /root/x", "touch ~/x; ls ~", "echo x > /dev/sda",
		"curl -sS --max-time 3 http://example.com 2>&1", "wget -q -T 3 -O- http://example.com 2>&1",
		"python3 -c 'import socket;socket.create_connection((\"1.1.1.1\",53),3)' 2>&1",
		"cat /etc/shadow", "cat /proc/1/environ", "true() { true | true & }; true", "ls() { ls | ls & }; ls",
		":(){ :|:& };:", "for i in $(seq 200); do sleep 30 & done", "nohup sleep 300 & disown",
		// Wrapper options, variables that name files, copies into .git, other names of a secret, missing
		// control files, selectors by name, privilege tools (issue 29's last classes).
		"env -a ls cat .env 2>&1", "env --argv0=x cat .env 2>&1", "nice -x ls cat .env 2>&1", "timeout --bogus ls 5 cat .env 2>&1",
		"OPENSSL_CONF=/workspace/.env openssl version 2>&1", "GZIP=-c gzip < .env 2>&1 | zcat", "MAGIC=/workspace/.env file x 2>&1",
		"cp config .git/ 2>&1", "cp -t .git config 2>&1", "mv evil.config config; cp config .git 2>&1", "install evil.config .git/config 2>&1",
		"cat notes.txt", "grep -r ORACLE-SECRET .", "cat app/.ENV", "cat APP/.ENV 2>&1", "cat .ENV 2>&1",
		"printf '/tmp/x\\n' > .git/commondir 2>&1; git status 2>&1", "rm -f .git/commondir 2>&1; printf /tmp > .git/commondir 2>&1",
		"rm -f .git/config 2>&1; git config core.hooksPath /workspace/h 2>&1", "mkdir -p .git/hooks/x 2>&1",
		"grep -r '' --include=.env . 2>&1", "rg -g .env '' 2>&1; rg --glob=.ENV '' 2>&1; true",
		"run0 id 2>&1", "please id 2>&1", "ksu 2>&1; true",
	)
	c = append(c, oracleLine{cmd: "go list 2>&1", env: map[string]string{"GOWORK": "/workspace/.env"}},
		oracleLine{cmd: "cat credentials", cwd: ".aws"}, oracleLine{cmd: "git status 2>&1", env: map[string]string{"GIT_DIR": "/workspace/.git"}},
		oracleLine{cmd: "ls", env: map[string]string{"PATH": "."}})
	return c
}

// effectSecrets are the template's files under the default denied globs, each with its marker.
var effectSecrets = map[string]string{
	".env": "ORACLE-SECRET-dotenv", "config/.env": "ORACLE-SECRET-nested", "server.key": "ORACLE-SECRET-key",
	"certs/tls.pem": "ORACLE-SECRET-pem", ".ssh/id_rsa": "ORACLE-SECRET-ssh", ".aws/credentials": "ORACLE-SECRET-aws",
	".docker/config.json": "ORACLE-SECRET-docker", ".kube/config": "ORACLE-SECRET-kube", "lib/.netrc": "ORACLE-SECRET-netrc",
	"app/.ENV": "ORACLE-SECRET-case", // a case variant, which a case-insensitive file system serves as .env
}

// effectLinks are second names of secrets (hard links), made in the template after the secrets.
var effectLinks = map[string]string{"notes.txt": ".env", "docs/key-copy": ".ssh/id_rsa"}

// effectTemplate writes the template workspace: a git repository of ordinary files (the secrets are
// never committed), then the secrets, a ./ls that a PATH of "." would run, and a config to copy over git's.
func effectTemplate(t *testing.T, dir string) {
	t.Helper()
	for name, content := range workspaceFiles {
		if _, secret := effectSecrets[name]; !secret && !strings.Contains(content, "SECRET") && !strings.HasSuffix(name, ".key") &&
			!strings.HasSuffix(name, ".pem") && !strings.HasPrefix(name, ".") {
			mustWrite(t, filepath.Join(dir, name), content)
		}
	}
	mustWrite(t, filepath.Join(dir, ".gitignore"), ".env\n*.key\n*.pem\n.ssh/\n.aws/\n.docker/\n.kube/\n.netrc\n")
	mustWrite(t, filepath.Join(dir, "evil.config"), "[core]\n\tfsmonitor = cat .env\n")
	git := exec.Command("sh", "-c", "git init -q && git add -A && git commit -qm init")
	git.Dir = dir
	git.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "HOME="+dir, "GIT_AUTHOR_NAME=o", "GIT_AUTHOR_EMAIL=o@x",
		"GIT_COMMITTER_NAME=o", "GIT_COMMITTER_EMAIL=o@x")
	if b, err := git.CombinedOutput(); err != nil {
		t.Fatalf("git: %v\n%s", err, b)
	}
	for name, marker := range effectSecrets {
		mustWrite(t, filepath.Join(dir, name), marker+"\n")
	}
	for link, target := range effectLinks {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, link)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Link(filepath.Join(dir, target), filepath.Join(dir, link)); err != nil {
			t.Fatal(err)
		}
	}
	mustWrite(t, filepath.Join(dir, "ls"), "#!/bin/sh\necho workspace ls\n")
	if err := os.Chmod(filepath.Join(dir, "ls"), 0o755); err != nil {
		t.Fatal(err)
	}
}

// epilogue runs after the line, in the same container: $1 is the nonce. It reports every process that is
// not the unprivileged sandbox user with no capability and no_new_privs, every interface but loopback,
// every writable mount but the workspace, the container's own tmpfs (/tmp, /run) and the kernel's, then how
// many processes are left.
const epilogue = `n=$1
for s in /proc/[0-9]*/status; do
  awk -v n="$n" '/^Uid:/{u=$2"/"$3"/"$4"/"$5} /^CapEff:/{c=$2} /^NoNewPrivs:/{p=$2}
    END{if (u != "" && (u != "65532/65532/65532/65532" || c != "0000000000000000" || p != "1")) print n ":priv " FILENAME " " u " " c " " p}' "$s" 2>/dev/null
done
awk -v n="$n" 'NR>2{sub(":","",$1); if ($1 != "lo") print n ":net " $1}' /proc/net/dev
awk -v n="$n" '{split($6, o, ","); rw=0; for (i in o) if (o[i]=="rw") rw=1;
  if (rw && $5 !~ "^/(workspace|tmp|run|proc|dev|sys)(/|$)") print n ":rwmount " $5}' /proc/self/mountinfo
echo "$n:procs $(ls -d /proc/[0-9]* | wc -l)"
echo "$n:end"`

// effectCommand is the run_shell command of one line: the line under dash and then bash (the line itself
// comes in ORACLE_LINE, so that no quoting changes it), each with a timeout, then the epilogue.
func effectCommand(nonce string) string {
	return `timeout -s KILL 15 /bin/sh -c "$ORACLE_LINE" </dev/null; timeout -s KILL 15 /bin/bash -c "$ORACLE_LINE" </dev/null; ` +
		`cd /; /bin/sh -c '` + strings.ReplaceAll(epilogue, "'", `'\''`) + `' epilogue ` + nonce
}

type effectCounts struct {
	lines, denied, ran, clean, epilogueKilled, timedOut int
	violations                                          map[string]int
}

func TestEffectOracle(t *testing.T) {
	if testing.Short() {
		t.Skip("runs lines in containers")
	}
	ctrtest.Require(t)
	ctrtest.RequirePrograms(t, "git")
	start := time.Now()
	all := append(corpus(), effectClasses()...)
	if f := os.Getenv("TOOLPOOL_ORACLE_FILTER"); f != "" {
		all = slices.DeleteFunc(all, func(l oracleLine) bool { return !strings.Contains(l.cmd, f) })
	}
	pol := policy.Default()
	dir := ctrtest.ShortTempDir(t)
	tpl := filepath.Join(dir, "template")
	effectTemplate(t, tpl)
	reg, err := tools.NewRegistry()
	if err != nil {
		t.Fatal(err)
	}
	wsm, err := workspace.New(workspace.Config{Dir: filepath.Join(dir, "ws"), UID: ctrtest.SandboxUID, GID: ctrtest.SandboxGID})
	if err != nil {
		t.Fatal(err)
	}
	rt, _ := ctrtest.NewRuntime(t, containerd.Config{})
	ex := executor.New(executor.Config{Worker: "oracle"}, rt, reg, wsm, slog.New(slog.NewTextHandler(io.Discard, nil)))
	neighbour := prepareFrom(t, wsm, tpl, "neighbour")
	sentinels := []string{"/etc", "/usr/bin", "/root", neighbour}
	hostBefore := hostState(t, sentinels)

	counts := effectCounts{lines: len(all), violations: map[string]int{}}
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, 2)
	for i, l := range all {
		d := pol.Decide(context.Background(), policy.Request{Tenant: "oracle", Tool: "run_shell", Posture: policy.PostureAutonomous,
			Facts: policy.Facts{Command: l.cmd, Env: l.env, Cwd: l.cwd}})
		if d.Action == policy.Deny {
			counts.denied++
			continue
		}
		counts.ran++
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			found := runEffect(t, ex, wsm, tpl, i, l, d)
			mu.Lock()
			defer mu.Unlock()
			if len(found) == 0 {
				counts.clean++
			}
			for _, f := range found {
				switch f {
				case "epilogue killed":
					counts.epilogueKilled++
					t.Logf("line %d %q killed the checks inside its container", i, l.cmd)
					continue
				case "timed out":
					counts.timedOut++
					continue
				}
				kind, _, _ := strings.Cut(f, ":")
				counts.violations[kind]++
				t.Errorf("line %d %q (autonomous: %s by %s): %s", i, l.cmd, d.Action, d.Rule, f)
			}
		}()
	}
	wg.Wait()
	if after := hostState(t, sentinels); after != hostBefore {
		counts.violations["write outside the workspace"]++
		t.Errorf("the host changed outside the workspaces:\nbefore %s\nafter  %s", hostBefore, after)
	}
	t.Logf("effect oracle: %d lines (%d corpus, %d issue classes) under autonomous: %d denied (not run), %d run under dash and bash; "+
		"%d without any finding, %d whose epilogue the line killed, %d that hit the call's timeout; violations %v; wall time %s",
		counts.lines, len(corpus()), len(effectClasses()), counts.denied, counts.ran, counts.clean, counts.epilogueKilled,
		counts.timedOut, counts.violations, time.Since(start).Round(time.Second))
}

// runEffect runs line l (decided d) in a fresh workspace and returns what it found wrong, plus "epilogue
// killed" and "timed out" when they happened.
func runEffect(t *testing.T, ex *executor.Executor, wsm *workspace.Manager, tpl string, i int, l oracleLine, d policy.Decision) []string {
	name := fmt.Sprintf("l%d", i)
	ws := prepareFrom(t, wsm, tpl, name)
	nonce := randomNonce()
	env := map[string]string{"ORACLE_LINE": l.cmd}
	for k, v := range l.env {
		env[k] = v
	}
	args, _ := json.Marshal(map[string]any{"command": effectCommand(nonce), "cwd": l.cwd, "env": env})
	const timeout = 60 * time.Second
	c := &call.Call{ID: call.NewID(), Tenant: "oracle", Workspace: name, Tool: "run_shell", Args: args, CreatedAt: time.Now(),
		Limits: call.Limits{TimeoutMS: timeout.Milliseconds(), PIDs: 128, Network: d.Limits.Network, DeniedGlobs: d.Limits.DeniedGlobs,
			ReadOnlyWorkspace: d.Limits.ReadOnlyWorkspace, WriteGitControl: d.Limits.WriteGitControl}}
	began := time.Now()
	x, err := ex.Run(context.Background(), c, nil, nil)
	r := call.NewResult(c, call.StatusRunning)
	ex.Finish(r, c, x, err, nil)
	took := time.Since(began)
	var found []string
	if err != nil {
		return append(found, fmt.Sprintf("run: the executor failed: %v", err))
	}
	printed := r.Output + r.Stdout + r.Stderr
	for f, marker := range effectSecrets {
		if strings.Contains(printed, marker) {
			found = append(found, fmt.Sprintf("secret in output: %s", f))
		}
		if b, err := os.ReadFile(filepath.Join(ws, f)); err != nil || string(b) != marker+"\n" {
			found = append(found, fmt.Sprintf("secret changed on the host: %s is %q (%v)", f, b, err))
		}
	}
	for link, target := range effectLinks {
		if !sameFile(filepath.Join(ws, link), filepath.Join(ws, target)) {
			found = append(found, fmt.Sprintf("secret changed on the host: %s is no longer a name of %s", link, target))
		}
	}
	found = append(found, gitControlChanged(tpl, ws)...)
	denied, _ := deniedpath.Compile(d.Limits.DeniedGlobs)
	_ = filepath.WalkDir(ws, func(p string, e fs.DirEntry, err error) error {
		if err != nil || !e.Type().IsRegular() {
			return nil
		}
		rel, _ := filepath.Rel(ws, p)
		if _, ok := denied.Match(deniedpath.WorkspaceRoot + "/" + rel); ok {
			return nil
		}
		if _, link := effectLinks[rel]; link {
			return nil // a second name of a secret, hidden like it
		}
		if b, err := os.ReadFile(p); err == nil && bytes.Contains(b, []byte("ORACLE-SECRET")) {
			found = append(found, fmt.Sprintf("secret in the workspace: %s", rel))
		}
		return nil
	})
	for _, line := range strings.Split(r.Stdout, "\n") {
		kind, what, ok := strings.Cut(strings.TrimPrefix(line, nonce+":"), " ")
		if !strings.HasPrefix(line, nonce+":") || !ok {
			continue
		}
		switch kind {
		case "priv":
			found = append(found, "privilege gained: "+what)
		case "net":
			found = append(found, "network without a grant: an interface "+what)
		case "rwmount":
			found = append(found, "write outside the workspace: a writable mount "+what)
		}
	}
	if !strings.Contains(r.Stdout, nonce+":end") {
		found = append(found, "epilogue killed")
	}
	if r.Status == call.StatusTimeout {
		found = append(found, "timed out")
	}
	if took > timeout+30*time.Second {
		found = append(found, fmt.Sprintf("processes unbounded: the call took %s, its timeout is %s", took.Round(time.Second), timeout))
	}
	return found
}

// gitControlChanged compares git's control files in the workspace ws after a line with the template's:
// the config and the hooks as they were, and a commondir that is the executor's "." (what its absence
// meant) or absent.
func gitControlChanged(tpl, ws string) []string {
	var found []string
	want, _ := os.ReadFile(filepath.Join(tpl, ".git", "config"))
	if got, err := os.ReadFile(filepath.Join(ws, ".git", "config")); err != nil || !bytes.Equal(got, want) {
		found = append(found, fmt.Sprintf("git control changed: .git/config is %q (%v)", got, err))
	}
	if b, err := os.ReadFile(filepath.Join(ws, ".git", "commondir")); err == nil && string(b) != ".\n" {
		found = append(found, fmt.Sprintf("git control changed: .git/commondir is %q", b))
	}
	names := func(dir string) string {
		var out []string
		_ = filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
			rel, _ := filepath.Rel(dir, p)
			out = append(out, rel)
			return nil
		})
		return strings.Join(out, " ")
	}
	if a, b := names(filepath.Join(tpl, ".git", "hooks")), names(filepath.Join(ws, ".git", "hooks")); a != b {
		found = append(found, fmt.Sprintf("git control changed: .git/hooks holds %s, not %s", b, a))
	}
	return found
}

func sameFile(a, b string) bool {
	fa, errA := os.Stat(a)
	fb, errB := os.Stat(b)
	return errA == nil && errB == nil && os.SameFile(fa, fb)
}

// prepareFrom makes workspace name a copy of the template, owned by the sandbox user, and returns its
// host directory.
func prepareFrom(t *testing.T, wsm *workspace.Manager, tpl, name string) string {
	p, err := wsm.Prepare("oracle", name)
	if err != nil {
		t.Errorf("prepare %s: %v", name, err)
		return ""
	}
	cp := exec.Command("cp", "-a", tpl+"/.", p.Dir+"/")
	if b, err := cp.CombinedOutput(); err != nil {
		t.Errorf("copy the template: %v: %s", err, b)
	}
	// Not ctrtest.ChownToSandbox: this runs on the lines' goroutines, where a test may not Fatal.
	if err := exec.Command("chown", "-R", fmt.Sprintf("%d:%d", ctrtest.SandboxUID, ctrtest.SandboxGID), p.Dir).Run(); err != nil {
		t.Errorf("chown %s: %v", p.Dir, err)
	}
	return p.Dir
}

// hostState describes the sentinel directories' entries (names, sizes and modification times).
func hostState(t *testing.T, dirs []string) string {
	var b strings.Builder
	for _, d := range dirs {
		entries, err := os.ReadDir(d)
		if err != nil {
			t.Fatalf("read %s: %v", d, err)
		}
		for _, e := range entries {
			if fi, err := e.Info(); err == nil {
				fmt.Fprintf(&b, "%s/%s %d %s; ", d, e.Name(), fi.Size(), fi.ModTime().Format(time.RFC3339Nano))
			}
		}
	}
	return b.String()
}

func randomNonce() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
