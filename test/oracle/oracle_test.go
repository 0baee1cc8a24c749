// Package oracle holds the differential oracle of the shell policy: every line of a corpus (written by
// hand, and generated from a fixed seed) is judged by the default policy and then run, in a real sandbox
// container, under dash and under bash, traced by strace. The test fails when a shell executed a
// program, or opened a file for writing, that policy did not see and judge.
//
// What it checks, for each line policy does not deny (a denied line never runs):
//
//   - unseen program: a program executed by the shell itself (or by a wrapper policy unwraps: env,
//     timeout, xargs, find -exec...) is among the programs policy judged, unless policy said it could not
//     see everything (Seen.Opaque: eval of a variable, a script file, input into a shell...);
//   - unseen write: a file the shell itself (a redirection) or such a wrapper wrote, created, renamed or
//     removed is among the writes policy judged, unless policy said it could not see everything;
//   - allowed but acted: a line policy allows executed nothing it did not judge (whoever ran it, with a
//     short list of helpers: go runs its compiler, git its own commands) and wrote nothing.
//
// What strace cannot see, and this oracle therefore cannot check: what builtins do inside the shell
// (assignments, cd, read, printf -v, unset: only their side effects in the kernel are visible), writes
// through descriptors opened before the trace, memory-mapped writes, what a program does without a
// system call of the traced kinds (network connections are not traced), and anything a shell other than
// dash and bash would do with the same bytes.
package oracle

import (
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/policy"
	"github.com/toolpool/toolpool/internal/policy/deniedpath"
	"github.com/toolpool/toolpool/internal/policy/shell"
	"github.com/toolpool/toolpool/internal/sandbox"
	"github.com/toolpool/toolpool/internal/sandbox/containerd"
	"github.com/toolpool/toolpool/internal/sandbox/containerd/ctrtest"
)

const (
	fuzzSeed  = 13
	fuzzLines = 200
	batches   = 2 // containers at once
)

// traced are the system calls the oracle reads.
const traced = "execve,execveat,fork,vfork,clone,clone3,open,openat,openat2,creat,rename,renameat,renameat2," +
	"unlink,unlinkat,mkdir,mkdirat,rmdir,symlink,symlinkat,link,linkat,truncate,chdir,fchdir"

// driver runs the lines of one batch, each in a fresh copy of the template workspace and a clean /tmp,
// under each shell.
//
// Both shells run a line in one traced session, which halves what tracing costs: a wrapper shell runs
// dash on the line, puts the workspace and /tmp back as they were, then runs bash on it; each shell has a
// timeout of its own, so a slow first run never costs the second its trace. The trace is split by which
// of the two shells a process descends from (splitRuns).
const driver = `in=/.toolpool/oracle
out=/.toolpool/out
for n in $(cat "$in/$1"); do
  (
    cwd= git=
    . "$in/lines/$n.sh"
    tpl="$in/plain"
    if [ -n "$git" ]; then tpl="$in/template"; fi
    . "$in/reset.sh"
    cd "/workspace/$cwd" || exit 0
    exec timeout -s KILL 60 strace -f --seccomp-bpf -qq -xx -y -s 4096 -e signal=none -e trace=` + traced + ` \
      -o "$out/$n" /bin/sh -c '
        timeout -s KILL 20 /bin/sh -c "$1"
        tpl=$2; . /.toolpool/oracle/reset.sh; cd "$3" || exit 0
        timeout -s KILL 20 /bin/bash -c "$1"
        :' oracle "$cmd" "$tpl" "/workspace/$cwd" </dev/null >/dev/null 2>&1
  )
done
echo done
`

// reset puts the workspace (from the template directory $tpl) and /tmp back as they were before a run.
const reset = `rm -rf /workspace/* /workspace/.[!.]* /workspace/..?* /tmp/* /tmp/.[!.]* /tmp/..?* 2>/dev/null
cp -a "$tpl/." /workspace/
`

// workspaceFiles is the template workspace every line starts from: ordinary files, and secrets that
// the default policy's denied globs name.
var workspaceFiles = map[string]string{
	"README.md": "# demo\nTODO: more\n", "names.txt": "bob\nalice\nbob\n", "go.mod": "module demo\n\ngo 1.22\n",
	"main.go": "package main\n\nfunc main() {}\n", "src/main.go": "package main\n\nfunc main() {}\n",
	"src/a.go": "package main\n\n// TODO\n", "run.sh": "echo ran\n", "Makefile": "all:\n\techo made\n",
	".env": "SECRET=1\n", "config/.env": "SECRET=2\n", "server.key": "KEY\n", "certs/tls.pem": "PEM\n",
	".ssh/id_rsa": "RSA\n", ".docker/config.json": "{}\n", ".kube/config": "kube\n", ".gitignore": "out.txt\n",
}

type judged struct {
	line     oracleLine
	decision policy.Decision
	seen     shell.Seen
}

type mismatch struct {
	id, shell, kind, what string
}

func TestOracle(t *testing.T) {
	if testing.Short() {
		t.Skip("runs lines in containers")
	}
	ctrtest.RequirePrograms(t, "strace")
	start := time.Now()
	all := append(corpus(), generate(fuzzSeed, fuzzLines)...)
	if f := os.Getenv("TOOLPOOL_ORACLE_FILTER"); f != "" {
		// For a narrower run while changing policy: only the lines that contain f.
		all = slices.DeleteFunc(all, func(l oracleLine) bool { return !strings.Contains(l.cmd, f) })
	}
	pol := policy.Default()
	denied, err := deniedpath.Compile(mustDecision(pol, "ls").Limits.DeniedGlobs)
	if err != nil {
		t.Fatal(err)
	}

	dir := ctrtest.ShortTempDir(t)
	in, out := filepath.Join(dir, "in"), filepath.Join(dir, "out")
	writeTemplate(t, filepath.Join(in, "template"), true)
	writeTemplate(t, filepath.Join(in, "plain"), false)
	mustWrite(t, filepath.Join(in, "driver.sh"), driver)
	mustWrite(t, filepath.Join(in, "reset.sh"), reset)
	var run []int
	judgedLines := make([]judged, len(all))
	counts := map[policy.Action]int{}
	for i, l := range all {
		d, s := pol.Explain(context.Background(), policy.Request{Tenant: "oracle", Tool: "run_shell",
			Facts: policy.Facts{Command: l.cmd, Env: l.env, Cwd: l.cwd}})
		judgedLines[i] = judged{line: l, decision: d, seen: s}
		counts[d.Action]++
		if d.Action == policy.Deny {
			continue // a denied line never runs
		}
		run = append(run, i)
		// Each line is a script the driver sources, so that running it costs no extra process.
		var b strings.Builder
		fmt.Fprintf(&b, "cmd=%s\ncwd=%s\n", shQuote(l.cmd), shQuote(l.cwd))
		if strings.Contains(l.cmd, "git") {
			b.WriteString("git=1\n")
		}
		for _, k := range slices.Sorted(maps.Keys(l.env)) {
			fmt.Fprintf(&b, "export %s=%s\n", k, shQuote(l.env[k]))
		}
		mustWrite(t, filepath.Join(in, "lines", strconv.Itoa(i)+".sh"), b.String())
	}
	for b := 0; b < batches; b++ {
		var ids []string
		for k := b; k < len(run); k += batches {
			ids = append(ids, strconv.Itoa(run[k]))
		}
		mustWrite(t, filepath.Join(in, fmt.Sprintf("batch%d", b)), strings.Join(ids, "\n")+"\n")
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(out, ctrtest.SandboxUID, ctrtest.SandboxGID); err != nil {
		t.Fatal(err)
	}
	chmodTree(t, in)

	rt, _ := ctrtest.NewRuntime(t, containerd.Config{})
	for _, mp := range []string{"/.toolpool/oracle", "/.toolpool/out"} {
		if err := rt.EnsureMountPoint(mp, true); err != nil {
			t.Fatal(err)
		}
	}
	if why := probeTracer(t, rt, dir, in, out); why != "" {
		// A host where a call cannot trace its own processes (ptrace refused by the kernel's Yama
		// policy or by another runtime's seccomp filter) cannot run the oracle; policy's own tests still
		// run, but nothing here compares policy with what the shells do.
		msg := fmt.Sprintf("strace cannot trace inside this host's sandbox (%s): the oracle compared no line with what dash and bash do", why)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	var wg sync.WaitGroup
	errs := make([]error, batches)
	for b := 0; b < batches; b++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := runSandbox(rt, dir, in, out, fmt.Sprintf("batch%d", b), driver, fmt.Sprintf("batch%d", b))
			switch {
			case err != nil:
				errs[b] = err
			case res.ExitCode != 0 || !strings.Contains(res.Stdout.String(), "done"):
				errs[b] = fmt.Errorf("batch %d: exit %d, stdout %q, stderr %q", b, res.ExitCode, res.Stdout.String(), res.Stderr.String())
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatalf("run the corpus: %v", err)
		}
	}

	var mismatches []mismatch
	stats := struct{ runs, missing, opaque, secretReads int }{}
	secretReads := map[string]map[string]bool{} // by line: the denied files it read
	for _, i := range run {
		j := judgedLines[i]
		if len(j.seen.Opaque) > 0 {
			stats.opaque++
		}
		f, err := os.Open(filepath.Join(out, strconv.Itoa(i)))
		if err != nil {
			stats.missing += 2
			continue
		}
		runs := splitRuns(parseTrace(f, path.Join("/workspace", j.line.cwd)))
		f.Close()
		for _, sh := range []string{"sh", "bash"} {
			tr, ok := runs[sh]
			if !ok {
				stats.missing++
				t.Logf("line %d left no trace under %s: %q", i, sh, j.line.cmd)
				continue
			}
			stats.runs++
			for _, m := range check(j, tr) {
				m.id, m.shell = strconv.Itoa(i), sh
				mismatches = append(mismatches, m)
			}
			if j.decision.Action == policy.Allow {
				for _, fe := range tr.files {
					if _, ok := denied.Match(fe.path); ok && !fe.write && !fe.dir {
						stats.secretReads++
						if secretReads[j.line.cmd] == nil {
							secretReads[j.line.cmd] = map[string]bool{}
						}
						secretReads[j.line.cmd][fe.path] = true
					}
				}
			}
		}
	}
	t.Logf("oracle: %d lines (%d written, %d generated from seed %d): %d allowed, %d ask, %d denied (not run); "+
		"%d traced runs under dash and bash, %d missing traces; %d lines policy declared partly opaque; "+
		"%d mismatches; %d reads of denied files by allowed lines (these containers do not hide denied paths, the worker's do: TestEffectOracle); wall time %s",
		len(all), len(corpus()), fuzzLines, fuzzSeed, counts[policy.Allow], counts[policy.Ask], counts[policy.Deny],
		stats.runs, stats.missing, stats.opaque, len(mismatches), stats.secretReads, time.Since(start).Round(time.Second))
	for _, cmd := range slices.Sorted(maps.Keys(secretReads)) {
		t.Logf("read where the worker would hide it: %q read %s", cmd, strings.Join(slices.Sorted(maps.Keys(secretReads[cmd])), " "))
	}
	sort.Slice(mismatches, func(a, b int) bool { return mismatches[a].id < mismatches[b].id })
	for _, m := range mismatches {
		k, _ := strconv.Atoi(m.id)
		j := judgedLines[k]
		t.Errorf("line %s under %s: %s: %s\n  line: %q\n  policy: %s by %s; saw programs %v, writes %v, opaque %v",
			m.id, m.shell, m.kind, m.what, j.line.cmd, j.decision.Action, j.decision.Rule, j.seen.Programs, j.seen.Writes, j.seen.Opaque)
	}
	if stats.missing > 0 {
		t.Errorf("%d runs left no trace", stats.missing)
	}
}

// transparent are the images through which policy follows what runs: shells, and the wrappers it
// unwraps. What they execute or write, policy must have seen.
var transparent = map[string]bool{
	"": true, "sh": true, "dash": true, "bash": true, "env": true, "nice": true, "timeout": true, "nohup": true,
	"setsid": true, "stdbuf": true, "xargs": true, "find": true, "flock": true, "time": true, "ionice": true,
	"taskset": true, "watch": true, "script": true, "strace": true, "chroot": true, "su": true, "sg": true,
	"runuser": true, "unbuffer": true,
}

// helpers are what an allowed program may run on its own: the go command its toolchain, git itself.
var helpers = map[string][]string{
	"go":  {"go", "vet", "compile", "asm", "link", "cgo", "gcc", "cc1", "as", "ld", "collect2", "git"},
	"git": {"git"},
}

// owner is the first image in a caller chain that policy does not see through.
func owner(caller []string) string {
	for _, img := range caller {
		if !transparent[img] {
			return img
		}
	}
	return ""
}

func check(j judged, tr trace) []mismatch {
	var out []mismatch
	opaque := len(j.seen.Opaque) > 0
	allowed := j.decision.Action == policy.Allow
	seenProg := func(p string) bool { return slices.Contains(j.seen.Programs, p) }
	for _, e := range tr.execs {
		if e.first {
			continue
		}
		prog := path.Base(e.path)
		own := owner(e.caller)
		switch {
		case own == "" && !seenProg(prog) && !opaque:
			out = append(out, mismatch{kind: "unseen program", what: fmt.Sprintf("the shell executed %s", e.path)})
		case allowed && !seenProg(prog) && !slices.Contains(helpers[own], prog) && !(own == "git" && strings.HasPrefix(prog, "git-")):
			out = append(out, mismatch{kind: "allowed but acted", what: fmt.Sprintf("%s executed %s", ownerName(own), e.path)})
		}
	}
	for _, f := range tr.files {
		if !f.write || harmless(f.path) || harmless(f.real) {
			continue
		}
		own := owner(f.caller)
		switch {
		case own == "" && !opaque && !judgedWrite(j.seen.Writes, f.path) && !judgedWrite(j.seen.Writes, f.real):
			out = append(out, mismatch{kind: "unseen write", what: fmt.Sprintf("%s (%s) %s", ownerName(f.caller[0]), f.syscall, f.path)})
		case allowed && !benignWrite(own, f.path):
			out = append(out, mismatch{kind: "allowed but acted", what: fmt.Sprintf("%s (%s) wrote %s", ownerName(own), f.syscall, f.path)})
		}
	}
	return out
}

func ownerName(img string) string {
	if img == "" {
		return "the shell"
	}
	return img
}

// harmless are the files any command may write: devices that discard or print, pipes, the shells'
// here-document buffers.
func harmless(p string) bool {
	switch {
	case p == "" || p == "/dev/null" || p == "/dev/tty" || p == "/dev/stdout" || p == "/dev/stderr":
		return true
	case strings.HasPrefix(p, "/dev/fd/") || strings.HasPrefix(p, "/proc/self/fd/") || strings.HasPrefix(p, "/dev/pts/"):
		return true
	case strings.HasPrefix(p, "pipe:") || strings.HasPrefix(p, "/tmp/sh-thd"):
		return true
	}
	return false
}

// benignWrite are writes an allowed program makes on its own: git refreshing its index, go its cache.
func benignWrite(owner, p string) bool {
	switch owner {
	case "git":
		return strings.HasPrefix(p, "/workspace/.git/index")
	case "go", "vet", "compile", "link", "asm":
		return strings.HasPrefix(p, "/tmp/")
	}
	return false
}

// judgedWrite reports whether policy judged a write of p: the path itself, or a glob that matches it.
func judgedWrite(writes []string, p string) bool {
	if p == "" {
		return false
	}
	for _, w := range writes {
		if w == p {
			return true
		}
		ws, ps := strings.Split(w, "/"), strings.Split(p, "/")
		if len(ws) != len(ps) {
			continue
		}
		ok := true
		for k := range ws {
			if m, _ := path.Match(ws[k], ps[k]); !m {
				ok = false
				break
			}
		}
		if ok {
			return true
		}
	}
	return false
}

func mustDecision(p *policy.Policy, cmd string) policy.Decision {
	d, _ := p.Explain(context.Background(), policy.Request{Tool: "run_shell", Facts: policy.Facts{Command: cmd}})
	return d
}

// writeTemplate writes the template workspace, as a git repository when repo is set (the lines that
// mention git get that one; copying a repository for every line would double the oracle's time).
func writeTemplate(t *testing.T, dir string, repo bool) {
	for name, content := range workspaceFiles {
		mustWrite(t, filepath.Join(dir, name), content)
	}
	if !repo {
		return
	}
	git := func(args ...string) {
		cmd := exec.Command("git", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "HOME="+dir, "GIT_AUTHOR_NAME=o", "GIT_AUTHOR_EMAIL=o@x",
			"GIT_COMMITTER_NAME=o", "GIT_COMMITTER_EMAIL=o@x")
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, b)
		}
	}
	git("init", "-q")
	git("add", "-A", "-f")
	git("commit", "-qm", "init")
}

func mustWrite(t *testing.T, name, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(name, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// chmodTree makes the input readable by the sandbox user.
func chmodTree(t *testing.T, root string) {
	err := filepath.Walk(root, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if info.IsDir() {
			return os.Chmod(p, 0o755)
		}
		return os.Chmod(p, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// runSandbox runs script with args in a container of rt, in a workspace of its own named name, with the
// oracle's input mounted read-only and its output directory writable.
func runSandbox(rt *containerd.Runtime, dir, in, out, name, script string, args ...string) (sandbox.Outcome, error) {
	ws := filepath.Join(dir, "ws-"+name)
	if err := os.Mkdir(ws, 0o755); err != nil {
		return sandbox.Outcome{}, err
	}
	if err := os.Chown(ws, ctrtest.SandboxUID, ctrtest.SandboxGID); err != nil {
		return sandbox.Outcome{}, err
	}
	return rt.Run(context.Background(), sandbox.Spec{
		ID: fmt.Sprintf("oracle-%d-%s", os.Getpid(), name), Argv: append([]string{"/bin/sh", "-c", script, "driver"}, args...),
		WorkspaceDir: ws,
		Mounts: []sandbox.Mount{{Source: in, Destination: "/.toolpool/oracle"},
			{Source: out, Destination: "/.toolpool/out", Writable: true}},
		Limits: sandbox.Limits{Timeout: 25 * time.Minute, CPUMillis: 2000}, // 6 to 12 minutes at a load average of 25 to 55
	})
}

// probeTracer traces one shell in a container as the driver will, and says why that failed, or "".
func probeTracer(t *testing.T, rt *containerd.Runtime, dir, in, out string) string {
	t.Helper()
	res, err := runSandbox(rt, dir, in, out, "probe", `strace -f --seccomp-bpf -qq -e trace=execve -o /.toolpool/out/probe /bin/sh -c '/bin/true; :' 2>&1`)
	if err != nil {
		t.Fatalf("run the tracer's probe: %v", err)
	}
	b, err := os.ReadFile(filepath.Join(out, "probe"))
	if err != nil || !strings.Contains(string(b), `execve("/bin/true"`) {
		return fmt.Sprintf("exit %d: %s", res.ExitCode, strings.TrimSpace(res.Stdout.String()+res.Stderr.String()))
	}
	return ""
}
