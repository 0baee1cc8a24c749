package containerd_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/policy/deniedpath"
	"github.com/toolpool/toolpool/internal/sandbox"
	"github.com/toolpool/toolpool/internal/sandbox/containerd"
	"github.com/toolpool/toolpool/internal/sandbox/containerd/ctrtest"
)

// writeAttempts tries every way a shell has to change a workspace: create, append, truncate, remove,
// rename, mkdir, chmod, link, touch, in the root and in a subdirectory. It prints each one that worked.
const writeAttempts = `cd /workspace
echo new > created && echo "wrote created"
echo more >> keep && echo "appended keep"
: > keep && echo "truncated keep"
rm -f sub/inner && [ ! -e sub/inner ] && echo "removed sub/inner"
mv keep moved 2>/dev/null && echo "renamed keep"
mkdir dir && echo "made dir"
chmod 600 sub 2>/dev/null && echo "chmod sub"
ln -s x link 2>/dev/null && echo "made link"
touch -d 2001-01-01 sub 2>/dev/null && echo "touched sub"
exit 0`

// TestReadOnlyWorkspace: a Spec with WorkspaceReadOnly runs with its workspace read-only, warm, cold and
// under gVisor:
// nothing the process does changes a file on the host. Without it the same lines change the workspace
// (the control that shows the attempts work).
func TestReadOnlyWorkspace(t *testing.T) {
	rt, d, probe := newPooledRuntime(t, containerd.Config{})
	cold := ctrtest.NewRuntimeOn(t, containerd.Config{Address: d.Address(), GVisor: gvisorIfInstalled(t)})
	for _, where := range []string{"warm", "cold", "gvisor"} {
		warm := where == "warm"
		for _, ro := range []bool{true, false} {
			name := where + map[bool]string{true: " read-only", false: " writable"}[ro]
			t.Run(name, func(t *testing.T) {
				ws := workspace(t)
				if err := os.MkdirAll(filepath.Join(ws, "sub"), 0o755); err != nil {
					t.Fatal(err)
				}
				for _, f := range []string{"keep", "sub/inner"} {
					if err := os.WriteFile(filepath.Join(ws, f), []byte("original\n"), 0o644); err != nil {
						t.Fatal(err)
					}
				}
				before := treeOf(t, ws)
				spec := warmSpec(probe, ws, writeAttempts)
				spec.WorkspaceReadOnly = ro
				if where == "gvisor" {
					ctrtest.RequireGVisor(t)
					spec.Runtime = containerd.GVisorRuntime
				}
				var out sandbox.Outcome
				if warm {
					out = runWarm(t, rt, spec)
				} else {
					var err error
					if out, err = cold.Run(context.Background(), spec); err != nil {
						t.Fatal(err)
					}
				}
				after := treeOf(t, ws)
				switch {
				case ro && (out.Stdout.String() != "" || after != before):
					t.Errorf("a read-only workspace changed: the call printed %q; before:\n%s\nafter:\n%s", out.Stdout.String(), before, after)
				case ro && !strings.Contains(out.Stderr.String(), "Read-only file system"):
					t.Errorf("the writes did not fail for a read-only file system: %q", out.Stderr.String())
				case !ro && (!strings.Contains(out.Stdout.String(), "wrote created") || after == before):
					t.Errorf("a writable workspace did not change (the attempts are broken): %q %q", out.Stdout.String(), out.Stderr.String())
				}
			})
		}
	}
}

// treeOf describes the files under dir: each path, mode, modification time and content.
func treeOf(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		b.WriteString(rel + " " + fi.Mode().String() + " " + fi.ModTime().String())
		if fi.Mode().IsRegular() {
			c, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			b.WriteString(" " + strings.TrimSpace(string(c)))
		}
		b.WriteString("\n")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// secretFiles are files under the shipped policy's denied globs, each holding a marker, and an ordinary
// file that must stay readable.
var secretFiles = map[string]string{
	".env": "SECRET-dotenv", "app/config/.env.production": "SECRET-nested", ".ssh/id_ed25519": "SECRET-ssh",
	"lib/.ssh/config": "SECRET-nested-ssh", ".aws/credentials": "SECRET-aws", "certs/server.pem": "SECRET-pem",
	".git/config": "SECRET-gitconfig", ".git/hooks/pre-commit": "SECRET-hook", "vendor/m/.git/config": "SECRET-vendored-git",
	".netrc": "SECRET-netrc", ".docker/config.json": "SECRET-docker", "README.md": "readable",
	"app/.ENV": "SECRET-case-variant", "keys/ID_RSA": "SECRET-case-key",
}

// readAttempts are ways a shell reads a tree without naming the denied files, and ways it writes to them.
const readAttempts = `cd /workspace
cat .env app/config/.env.production .ssh/id_ed25519 .aws/credentials certs/server.pem .git/config .netrc
grep -r '' . ; grep -r --include=.env '' .
tar cf - . | strings
cp -r . /tmp/copy && cat /tmp/copy/.env /tmp/copy/.aws/credentials
find . -type f -exec cat {} +
ln .env /tmp/hard 2>&1; cat /tmp/hard
bash -O cdable_vars -c 'x=/workspace/.aws; cd x; cat credentials'
python3 -c 'import os
for d, _, fs in os.walk("."):
    for f in fs:
        try: print(open(os.path.join(d, f)).read())
        except Exception as e: print(e)' 2>&1
echo overwritten > .env; rm -rf .ssh .aws certs/server.pem; mv .env moved
mv .git g; mv .docker d; mv app/config app/c; mv app a2; mv vendor/m vendor/n
ls -la .ssh .aws
exit 0`

// TestHiddenPaths: the paths a Spec hides (found by the shipped denied globs) are empty and read-only to
// everything a container runs, warm and cold, read-only workspace or not, and the workspace keeps them
// unchanged; the ordinary file stays readable. Without Hidden the same lines read every secret (the
// control that shows the attempts work).
func TestHiddenPaths(t *testing.T) {
	rt, d, probe := newPooledRuntime(t, containerd.Config{})
	cold := ctrtest.NewRuntimeOn(t, containerd.Config{Address: d.Address(), GVisor: gvisorIfInstalled(t)})
	set, err := deniedpath.Compile(defaultDeniedGlobs)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name               string
		warm, hide, rdonly bool
	}{{"warm", true, true, false}, {"cold", false, true, false}, {"warm read-only", true, true, true},
		{"cold read-only", false, true, true}, {"gvisor", false, true, false}, {"control", false, false, false}} {
		t.Run(tc.name, func(t *testing.T) {
			ws := workspace(t)
			for f, c := range secretFiles {
				p := filepath.Join(ws, f)
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, []byte(c+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			// A second name of a denied file, made before the call (on the host, or before the workspace
			// reached toolpool): the attempts' recursive readers reach it unless it is hidden too.
			if err := os.Link(filepath.Join(ws, ".env"), filepath.Join(ws, "env-link.txt")); err != nil {
				t.Fatal(err)
			}
			spec := warmSpec(probe, ws, readAttempts)
			spec.WorkspaceReadOnly = tc.rdonly
			if tc.name == "gvisor" {
				ctrtest.RequireGVisor(t)
				spec.Runtime = containerd.GVisorRuntime
			}
			if tc.hide {
				if spec.Hidden, err = set.Find(ws, 0); err != nil {
					t.Fatal(err)
				}
			}
			var out sandbox.Outcome
			if tc.warm {
				out = runWarm(t, rt, spec)
			} else if out, err = cold.Run(context.Background(), spec); err != nil {
				t.Fatal(err)
			}
			printed := out.Stdout.String() + out.Stderr.String()
			if os.Getenv("ENF_DEBUG") != "" {
				t.Logf("%s", printed)
			}
			if !strings.Contains(printed, "readable") {
				t.Errorf("the ordinary file was not read: %q", printed)
			}
			if !tc.hide {
				if !strings.Contains(printed, "SECRET-aws") || !strings.Contains(printed, "SECRET-vendored-git") ||
					!strings.Contains(printed, "SECRET-dotenv") || !strings.Contains(printed, "SECRET-case-variant") {
					t.Errorf("without Hidden the attempts read no secret (they are broken): %q", printed)
				}
				return
			}
			if strings.Contains(printed, "SECRET") {
				t.Errorf("a hidden file was read: %q", printed)
			}
			for f, c := range secretFiles {
				if b, err := os.ReadFile(filepath.Join(ws, f)); err != nil || string(b) != c+"\n" {
					t.Errorf("%s on the host: %q (%v), want it unchanged", f, b, err)
				}
			}
			for _, moved := range []string{"moved", "g", "d", "app/c", "a2", "vendor/n"} {
				if _, err := os.Lstat(filepath.Join(ws, moved)); err == nil {
					t.Errorf("the call renamed a hidden file or a directory above one to %s", moved)
				}
			}
		})
	}
}

// defaultDeniedGlobs are the shipped policy's denied globs (internal/policy/default.yaml).
var defaultDeniedGlobs = []string{"**/.env", "**/.env.*", "**/*.pem", "**/*.key", "**/*.p12", "**/*.pfx",
	"**/*.keystore", "**/*.jks", "**/id_rsa", "**/id_dsa", "**/id_ecdsa", "**/id_ed25519", "~/.ssh/**", "**/.ssh/**",
	"~/.aws/**", "~/.gnupg/**", "~/.docker/config.json", "~/.kube/config", "**/.netrc", "**/.git-credentials",
	"**/.pgpass", "**/.npmrc", "**/.pypirc", "**/.git/config", "**/.git/hooks/**"}

// BenchmarkHiddenWarm measures what hiding denied paths adds to a warm call on a 10k-file workspace
// (100 directories of 100 files, with a .env, a .git with config and hooks, a .ssh and two keys among
// them): calls of `true` alternate without and with Hidden, the latter finding the paths with the shipped
// globs (a deniedpath.Finder, as the executor does) before Run. It reports the p50 and p95 of each, the
// p50 difference, and the p50 of the walk and of the masks' mounts (the "hide" step).
func BenchmarkHiddenWarm(b *testing.B) {
	probe := buildProbe(b)
	rt, _ := ctrtest.NewRuntime(b, containerd.Config{Pool: containerd.PoolConfig{MaxSize: 4, InitBinary: probe, InitPath: probePath}})
	ws := workspace(b)
	for i := range 100 {
		for j := range 100 {
			p := filepath.Join(ws, fmt.Sprintf("pkg%d/sub/f%d.go", i, j))
			if i%10 == 0 {
				p = filepath.Join(ws, fmt.Sprintf(".hidden%d/f%d.go", i, j))
			}
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				b.Fatal(err)
			}
			if err := os.WriteFile(p, nil, 0o644); err != nil {
				b.Fatal(err)
			}
		}
	}
	for _, f := range []string{".env", ".git/config", ".git/hooks/pre-commit", ".ssh/id_rsa", "pkg3/sub/k.pem", "pkg7/sub/.env"} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(ws, f)), 0o755); err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(ws, f), []byte("SECRET"), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	set, err := deniedpath.Compile(defaultDeniedGlobs)
	if err != nil {
		b.Fatal(err)
	}
	var finder deniedpath.Finder
	var plain, hidden, walk, hide []float64
	one := func(withHidden bool) {
		spec := warmSpec(probe, ws, "true")
		spec.Argv = []string{"/bin/true"}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := rt.WaitWarm(ctx, spec); err != nil {
			b.Fatal(err)
		}
		began := time.Now()
		if withHidden {
			if spec.Hidden, err = finder.Find(set, ws, 0); err != nil {
				b.Fatal(err)
			}
			walk = append(walk, ms(time.Since(began)))
		}
		out, err := rt.Run(ctx, spec)
		took := ms(time.Since(began))
		if err != nil || out.ExitCode != 0 || !out.Warm {
			b.Fatalf("Run: %v, exit %d, warm %v", err, out.ExitCode, out.Warm)
		}
		if withHidden {
			hidden = append(hidden, took)
			for _, s := range out.Steps {
				if s.Name == "hide" {
					hide = append(hide, ms(s.Took))
				}
			}
		} else {
			plain = append(plain, took)
		}
	}
	one(false)
	one(true)
	plain, hidden, walk, hide = nil, nil, nil, nil
	b.ResetTimer()
	for i := range b.N {
		one(i%2 == 0)
		one(i%2 != 0)
	}
	b.StopTimer()
	b.ReportMetric(percentile(plain, 50), "plain-p50-ms")
	b.ReportMetric(percentile(plain, 95), "plain-p95-ms")
	b.ReportMetric(percentile(hidden, 50), "hidden-p50-ms")
	b.ReportMetric(percentile(hidden, 95), "hidden-p95-ms")
	b.ReportMetric(percentile(hidden, 50)-percentile(plain, 50), "added-p50-ms")
	b.ReportMetric(percentile(walk, 50), "walk-p50-ms")
	b.ReportMetric(percentile(hide, 50), "mounts-p50-ms")
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// gvisorIfInstalled offers gVisor when runsc is installed.
func gvisorIfInstalled(t *testing.T) *containerd.GVisorConfig {
	if _, err := exec.LookPath("runsc"); err != nil {
		t.Log("runsc is not installed: no gVisor case")
		return nil
	}
	return &containerd.GVisorConfig{}
}

// gitAttempts are ways a call could plant code for a later git command: hooks, core.fsmonitor and
// core.hooksPath in the config, a gitfile pointing elsewhere, a submodule's config and hooks, and moving
// .git away to rebuild it writable. The first line is the control: git's ordinary writes still work.
const gitAttempts = `cd /workspace
export HOME=/tmp GIT_CONFIG_NOSYSTEM=1
git add README.md && git -c user.name=a -c user.email=a@b commit -qm second && echo "committed"
echo 'echo pwned' > .git/hooks/post-checkout && echo "wrote a hook"
mkdir -p .git/hooks/x 2>/dev/null && echo "made a hooks dir"
git config core.fsmonitor 'touch /tmp/pwned' && echo "set fsmonitor"
printf '[core]\n\thooksPath = /workspace/h\n' >> .git/config && echo "appended config"
cp /workspace/evil.config .git/config 2>/dev/null && echo "copied config"
echo 'gitdir: /tmp/evil' > sub/.git && echo "rewrote the gitfile"
echo x >> .git/modules/sub/config && echo "wrote a submodule config"
touch .git/modules/sub/hooks/pre-commit && echo "wrote a submodule hook"
[ "$(cd "$(git rev-parse --git-common-dir)" && pwd -P)" = /workspace/.git ] || echo "git's common directory is elsewhere"
printf '/tmp/elsewhere\n' > .git/commondir 2>/dev/null && echo "wrote commondir"
rm -f .git/commondir 2>/dev/null; [ -e .git/commondir ] || echo "removed commondir"
mv .git g 2>/dev/null && echo "moved .git"
rm -rf .git/hooks 2>/dev/null; [ -d .git/hooks ] || echo "removed hooks"
exit 0`

// TestGitControlReadOnly: with git's control files in ReadOnlyPaths, nothing a call does changes them or
// moves them away, warm, cold and under gVisor; git's ordinary writes (index, objects, refs) still work. Without them
// the same attempts succeed (the control).
func TestGitControlReadOnly(t *testing.T) {
	ctrtest.RequirePrograms(t, "git")
	rt, d, probe := newPooledRuntime(t, containerd.Config{})
	cold := ctrtest.NewRuntimeOn(t, containerd.Config{Address: d.Address(), GVisor: gvisorIfInstalled(t)})
	for _, tc := range []struct {
		name          string
		warm, protect bool
	}{{"warm", true, true}, {"cold", false, true}, {"gvisor", false, true}, {"control", false, false}} {
		t.Run(tc.name, func(t *testing.T) {
			ws := workspace(t)
			gitRepo(t, ws)
			before := treeOf(t, filepath.Join(ws, ".git", "hooks")) + treeOf(t, filepath.Join(ws, ".git", "modules"))
			config, _ := os.ReadFile(filepath.Join(ws, ".git", "config"))
			spec := warmSpec(probe, ws, gitAttempts)
			if tc.name == "gvisor" {
				ctrtest.RequireGVisor(t)
				spec.Runtime = containerd.GVisorRuntime
			}
			if tc.protect {
				spec.ReadOnlyPaths = []string{".git/config", ".git/hooks", "sub/.git", ".git/modules/sub/config", ".git/modules/sub/hooks",
					".git/commondir"}
			}
			var out sandbox.Outcome
			var err error
			if tc.warm {
				out = runWarm(t, rt, spec)
			} else if out, err = cold.Run(context.Background(), spec); err != nil {
				t.Fatal(err)
			}
			printed := out.Stdout.String()
			if !strings.Contains(printed, "committed") {
				t.Errorf("git could not commit: %q %q", printed, out.Stderr.String())
			}
			if !tc.protect {
				if !strings.Contains(printed, "wrote a hook") || !strings.Contains(printed, "set fsmonitor") ||
					!strings.Contains(printed, "wrote commondir") {
					t.Errorf("the attempts changed nothing without protection (they are broken): %q %q", printed, out.Stderr.String())
				}
				return
			}
			if strings.TrimSpace(strings.ReplaceAll(printed, "committed", "")) != "" {
				t.Errorf("git's control files changed: %q (stderr %q)", printed, out.Stderr.String())
			}
			after := treeOf(t, filepath.Join(ws, ".git", "hooks")) + treeOf(t, filepath.Join(ws, ".git", "modules"))
			if now, _ := os.ReadFile(filepath.Join(ws, ".git", "config")); string(now) != string(config) || after != before {
				t.Errorf("on the host, the config or the hooks changed")
			}
			if b, _ := os.ReadFile(filepath.Join(ws, "sub", ".git")); string(b) != "gitdir: ../.git/modules/sub\n" {
				t.Errorf("the gitfile is now %q", b)
			}
			if b, _ := os.ReadFile(filepath.Join(ws, ".git", "commondir")); string(b) != ".\n" {
				t.Errorf("the commondir is now %q", b)
			}
		})
	}
}

// gitRepo makes ws a git repository with one commit, a hooks directory, a submodule-like gitfile whose
// git directory is under .git/modules, and a file to copy over the config.
func gitRepo(t *testing.T, ws string) {
	t.Helper()
	git := func(dir string, args ...string) {
		cmd := exec.Command("git", append([]string{"-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main", "-c", "safe.directory=*"}, args...)...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v: %s", args, err, out)
		}
	}
	git(ws, "init", "-q")
	mkfile := func(p, c string) {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(ws, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(ws, p), []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	mkfile("README.md", "one\n")
	mkfile("evil.config", "[core]\n\tfsmonitor = touch /tmp/pwned\n")
	git(ws, "add", "README.md")
	git(ws, "commit", "-qm", "first")
	mkfile("README.md", "two\n")
	mkfile(".git/modules/sub/config", "[core]\n\tbare = false\n")
	mkfile(".git/modules/sub/hooks/.keep", "")
	mkfile("sub/.git", "gitdir: ../.git/modules/sub\n")
	mkfile(".git/hooks/.keep", "")
	// What the executor puts where a main repository has no commondir (git looks in .git itself either way),
	// so that a call cannot create one pointing elsewhere.
	mkfile(".git/commondir", ".\n")
	ctrtest.ChownToSandbox(t, ws)
}
