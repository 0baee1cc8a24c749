package incontainer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/call"
)

// The tests in this file kill the mutants `make mutants` found surviving in the file tools (the baseline,
// scripts/mutants-baseline.txt, names each), and the classes behind them: an empty file filled by an edit,
// an edit's diff trimmed to the lines that changed and the count of the lines it cut, walks past
// directories the runner cannot read, the order of matches modified at the same time, escapes inside
// glob braces, the counts in the notes, and lines cut inside a multi-byte character.

// runnerMainEnv, set in a child process of this test binary to "TOOL WORKSPACE", makes TestMain run
// RunnerMain for TOOL in WORKSPACE on the child's stdin and stdout (see runUnprivileged).
const runnerMainEnv = "TOOLPOOL_TEST_RUNNER_MAIN"

// nobody is the user runUnprivileged runs the runner as when the tests run as root.
const nobody = 65534

// runUnprivileged runs tool as run does, but without root's power to read every directory: in the
// sandbox the runner is a non-root user, to whom a directory of mode 0 is unreadable. Run as root, it runs
// RunnerMain in a child process, this test binary re-executed as the user nobody; otherwise in this
// process. ws must be readable by nobody (unprivilegedWorkspace makes one).
func runUnprivileged(t *testing.T, ws, tool string, args any) RunnerResult {
	t.Helper()
	if os.Geteuid() != 0 {
		return run(t, ws, tool, args)
	}
	in, err := json.Marshal(args)
	if err != nil {
		t.Fatal(err)
	}
	// The test binary sits in a directory only root may enter: nobody runs a copy.
	dir, err := os.MkdirTemp("", "incontainer-bin-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "incontainer.test")
	src, err := os.Open(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := os.OpenFile(bin, os.O_CREATE|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), runnerMainEnv+"="+tool+" "+ws)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	cmd.Stdin = bytes.NewReader(in)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("run %s as uid %d: %v; stdout %s; stderr %s", tool, nobody, err, out.String(), errb.String())
	}
	var res RunnerResult
	dec := json.NewDecoder(&out)
	if err := dec.Decode(&res); err != nil {
		t.Fatalf("decode RunnerResult: %v (stdout %q, stderr %q)", err, out.String(), errb.String())
	}
	if dec.More() {
		t.Fatalf("RunnerMain wrote more than one JSON value")
	}
	return res
}

// unprivilegedWorkspace creates a workspace that every user may read, holding the given files, with the
// directories locked (created if missing) made unreadable: mode 0.
func unprivilegedWorkspace(t *testing.T, fs map[string]string, locked ...string) string {
	t.Helper()
	ws, err := os.MkdirTemp("", "incontainer-ws-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, d := range locked {
			os.Chmod(filepath.Join(ws, d), 0o755)
		}
		os.RemoveAll(ws)
	})
	if err := os.Chmod(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFiles(t, ws, fs)
	// Deepest first, so that a locked directory inside another is locked while its parent can be entered.
	for i := len(locked) - 1; i >= 0; i-- {
		p := filepath.Join(ws, locked[i])
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, 0); err != nil {
			t.Fatal(err)
		}
	}
	return ws
}

// TestWalksSkipUnreadableDirectories: grep, glob and list_files skip a directory below their base that
// the runner cannot read (list_files counts them), and answer permission_denied when the base itself is
// unreadable.
func TestWalksSkipUnreadableDirectories(t *testing.T) {
	ws := unprivilegedWorkspace(t, map[string]string{
		"a.txt":        "needle\n",
		"sub/b.txt":    "needle\n",
		"locked/c.txt": "needle\n",
	}, "locked", "sub/locked")
	if _, err := os.ReadDir(filepath.Join(ws, "locked")); err == nil && os.Geteuid() != 0 {
		t.Fatal("a directory of mode 0 is readable: the test cannot lock one")
	}
	tests := []struct {
		name     string
		tool     string
		args     map[string]any
		wantType string
		want     string
	}{
		{"grep skips", "grep", map[string]any{"pattern": "needle"}, "", "a.txt:1:needle\nsub/b.txt:1:needle"},
		{"glob skips", "glob", map[string]any{"pattern": "**/*.txt"}, "", ""},
		{"list_files counts", "list_files", map[string]any{"depth": 3}, "", "" +
			"file     a.txt (7 bytes)\n" +
			"dir      locked/\n" +
			"dir      sub/\n" +
			"file     sub/b.txt (7 bytes)\n" +
			"dir      sub/locked/\n" +
			"[2 directories could not be read]"},
		{"grep of an unreadable base", "grep", map[string]any{"pattern": "needle", "path": "locked"}, call.ErrPermissionDenied,
			"search locked: permission denied"},
		{"glob of an unreadable base", "glob", map[string]any{"pattern": "*", "path": "sub/locked"}, call.ErrPermissionDenied,
			"search sub/locked: permission denied"},
		{"list_files of an unreadable base", "list_files", map[string]any{"path": "locked"}, call.ErrPermissionDenied,
			"list locked: permission denied"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := runUnprivileged(t, ws, tt.tool, tt.args)
			want := tt.want
			if tt.tool == "glob" && tt.wantType == "" {
				// Both files carry one modification time or another: glob orders by it, so either order.
				if r.Output != "a.txt\nsub/b.txt" && r.Output != "sub/b.txt\na.txt" {
					t.Errorf("got (%q)\n%s\nwant a.txt and sub/b.txt", errType(r), r.Output)
				}
				return
			}
			if errType(r) != tt.wantType || r.Output != want {
				t.Errorf("got (%q)\n%s\nwant (%q)\n%s", errType(r), r.Output, tt.wantType, want)
			}
		})
	}
}

// TestEditFillsAnEmptyFile: an empty old_string creates a missing file or fills an empty one, and either
// way answers with what it wrote.
func TestEditFillsAnEmptyFile(t *testing.T) {
	ws := files(t, map[string]string{"empty.txt": ""})
	for _, tt := range []struct{ path, verb string }{
		{"empty.txt", "Wrote empty.txt (4 bytes; it was empty)."},
		{"new.txt", "Created new.txt (4 bytes)."},
	} {
		r := run(t, ws, "edit_file", map[string]any{"path": tt.path, "old_string": "", "new_string": "a\nb\n"})
		want := tt.verb + "\n\n--- a/" + tt.path + "\n+++ b/" + tt.path + "\n@@ -0,0 +1,2 @@\n+a\n+b"
		if errType(r) != "" || r.Output != want {
			t.Errorf("edit %s: got (%q)\n%s\nwant\n%s", tt.path, errType(r), r.Output, want)
		}
		if b, err := os.ReadFile(filepath.Join(ws, tt.path)); err != nil || string(b) != "a\nb\n" {
			t.Errorf("%s = %q, %v; want %q", tt.path, b, err, "a\nb\n")
		}
	}
}

// TestEditDiffShowsOnlyChangedLines: the lines that old_string and new_string share at their start or
// their end are context in the diff, not a removal and an addition.
func TestEditDiffShowsOnlyChangedLines(t *testing.T) {
	const before = "a\nb\nc\nd\ne\nf\ng\n"
	tests := []struct {
		name, old, new, want string
	}{
		{"same last lines", "b\nc\nd\n", "B\nc\nd\n", "@@ -1,5 +1,5 @@\n a\n-b\n+B\n c\n d\n e"},
		{"same first lines", "b\nc\nd\n", "b\nc\nD\n", "@@ -1,7 +1,7 @@\n a\n b\n c\n-d\n+D\n e\n f\n g"},
		{"same first and last lines", "b\nc\nd\ne\n", "b\nC\nX\ne\n", "@@ -1,7 +1,7 @@\n a\n b\n-c\n-d\n+C\n+X\n e\n f\n g"},
		{"a line dropped before the same last lines", "b\nc\nd\n", "c\nd\n", "@@ -1,5 +1,4 @@\n a\n-b\n c\n d\n e"},
		{"a line added before the same last lines", "c\nd\n", "x\nc\nd\n", "@@ -1,5 +1,6 @@\n a\n b\n+x\n c\n d\n e"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			i := strings.Index(before, tt.old)
			after := before[:i] + tt.new + before[i+len(tt.old):]
			got := unifiedDiff("f", before, after, []span{{old: i, oldLen: len(tt.old), newLen: len(tt.new)}})
			got = strings.TrimPrefix(got, "--- a/f\n+++ b/f\n")
			if got != tt.want {
				t.Errorf("diff =\n%s\nwant\n%s", got, tt.want)
			}
			if applied := applyDiff(t, before, "--- a/f\n+++ b/f\n"+got); applied != after {
				t.Errorf("the diff applied gives %q, want %q", applied, after)
			}
		})
	}
}

// TestEditDiffCutCount: a diff longer than diffMaxLines shows that many lines and says exactly how many
// more it left out.
func TestEditDiffCutCount(t *testing.T) {
	for _, n := range []int{diffMaxLines / 2, diffMaxLines/2 + 1, diffMaxLines} {
		t.Run(fmt.Sprint(n, " lines changed"), func(t *testing.T) {
			ws := files(t, map[string]string{"f.txt": strings.Repeat("x\n", n)})
			r := run(t, ws, "edit_file", map[string]any{"path": "f.txt", "old_string": "x", "new_string": "y", "replace_all": true})
			if errType(r) != "" {
				t.Fatalf("edit: %s", r.Output)
			}
			shown := strings.Count(r.Output, "\n-x") + strings.Count(r.Output, "\n+y")
			if shown != min(2*n, diffMaxLines) {
				t.Errorf("the diff shows %d changed lines, want %d", shown, min(2*n, diffMaxLines))
			}
			cut := "[... diff cut: "
			if more := 2*n - diffMaxLines; more > 0 {
				want := fmt.Sprintf("[... diff cut: %d more lines; read the file to see the rest]", more)
				if !strings.HasSuffix(r.Output, "\n"+want) {
					t.Errorf("output ends with %q, want %q", r.Output[strings.LastIndex(r.Output, "\n")+1:], want)
				}
			} else if strings.Contains(r.Output, cut) {
				t.Errorf("a diff of %d lines says it was cut", 2*n)
			}
		})
	}
}

// TestGlobOrdersTiesByPath: glob lists the most recently modified first, and matches modified at the same
// time in path order.
func TestGlobOrdersTiesByPath(t *testing.T) {
	names := []string{"m.go", "b.go", "z/a.go", "a.go", "k/k.go", "c.go", "y.go", "d/e.go", "f.go", "h.go", "g.go", "j.go", "i.go", "x.go"}
	fs := map[string]string{"newest.go": ""}
	for _, n := range names {
		fs[n] = ""
	}
	ws := files(t, fs)
	then := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, n := range names {
		if err := os.Chtimes(filepath.Join(ws, n), then, then); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chtimes(filepath.Join(ws, "newest.go"), then.Add(time.Hour), then.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	r := run(t, ws, "glob", map[string]any{"pattern": "**/*.go"})
	want := "newest.go\na.go\nb.go\nc.go\nd/e.go\nf.go\ng.go\nh.go\ni.go\nj.go\nk/k.go\nm.go\nx.go\ny.go\nz/a.go"
	if errType(r) != "" || r.Output != want {
		t.Errorf("got (%q)\n%s\nwant\n%s", errType(r), r.Output, want)
	}
}

// TestGrepCountsEveryDeniedFile: grep's note counts every file it did not search because policy denies
// it, whether the walk's path names it or a link leads to it.
func TestGrepCountsEveryDeniedFile(t *testing.T) {
	ws := files(t, map[string]string{
		"a.txt":           "nothing here\n",
		".env":            "SECRET=1\n",
		".ssh/id_rsa":     "SECRET rsa\n",
		".ssh/config":     "SECRET config\n",
		".ssh/known_host": "SECRET host\n",
	})
	if err := os.Symlink(".ssh", filepath.Join(ws, "keys")); err != nil {
		t.Fatal(err)
	}
	globs := defaultDenied(t)
	tests := []struct {
		name, path, want string
	}{
		// keys/id_rsa is denied by its name; keys/config and keys/known_host by where the link leads.
		{"through a directory link", "keys", `No matches for "SECRET" in keys. [3 files or directories were not searched: policy denies them (secrets and keys)]`},
		// .env and the directory .ssh by their names; the walk does not follow the link keys.
		{"the whole workspace", "", `No matches for "SECRET" in /workspace. [2 files or directories were not searched: policy denies them (secrets and keys)]`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := run(t, ws, "grep", withPolicy(t, map[string]any{"pattern": "SECRET", "path": tt.path}, globs))
			if errType(r) != "" || r.Output != tt.want {
				t.Errorf("got (%q)\n%s\nwant\n%s", errType(r), r.Output, tt.want)
			}
		})
	}
}

// TestLinesCutInsideACharacter: a line longer than what grep or read_file shows is cut before a
// character the limit falls inside, never in its middle or after it, and the count of bytes cut says so.
func TestLinesCutInsideACharacter(t *testing.T) {
	for _, r := range []string{"é", "€", "𝄞"} {
		for inside := 0; inside < len(r); inside++ {
			// inside is how many of r's bytes fit under the limit: 0 when r starts at the limit.
			for _, tool := range []struct {
				name, prefix string
				limit        int
				args         map[string]any
				shown        func(text string, more int) string
			}{
				{"grep", "f.txt:1:", grepMaxLine, map[string]any{"pattern": "^a", "path": "f.txt"},
					func(text string, more int) string { return fmt.Sprintf("f.txt:1:%s [... %d more bytes]", text, more) }},
				{"read_file", "", readFileMaxLine, map[string]any{"path": "f.txt"},
					func(text string, more int) string {
						return fmt.Sprintf("     1\t%s [... line cut: %d more bytes; see it with grep or run_shell]\n", text, more)
					}},
			} {
				t.Run(fmt.Sprintf("%s %d of %d bytes of %s", tool.name, inside, len(r), r), func(t *testing.T) {
					k := tool.limit - inside // r starts at byte k
					line := strings.Repeat("a", k) + r + strings.Repeat("z", 10)
					ws := files(t, map[string]string{"f.txt": line + "\n"})
					res := run(t, ws, tool.name, tool.args)
					text := line[:k]
					if inside == 0 {
						text = line[:tool.limit]
					}
					want := tool.shown(text, len(line)-len(text))
					if errType(res) != "" || res.Output != want {
						t.Errorf("got (%q)\n%q\nwant\n%q", errType(res), res.Output, want)
					}
				})
			}
		}
	}
}

// TestReadFileCappedCountsEveryLine: when read_file's output cap stops it, its hint still counts every
// line of the file, the one that did not fit included.
func TestReadFileCappedCountsEveryLine(t *testing.T) {
	const lines = 600
	line := strings.Repeat("w", 1000)
	for _, tt := range []struct {
		name, tail string
		total      int
	}{
		{"every line ends", "", lines},
		{"a last line without a newline", "last", lines + 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ws := files(t, map[string]string{"f.txt": strings.Repeat(line+"\n", lines) + tt.tail})
			r := run(t, ws, "read_file", map[string]any{"path": "f.txt"})
			// Each line shows as 7 bytes of number and tab, the line, and a newline.
			shown := ReadFileOutputBytes / (7 + len(line) + 1)
			want := fmt.Sprintf("[output capped at %d KiB; showing lines 1-%d of %d (file is %d bytes); to read on, call read_file with offset=%d]",
				ReadFileOutputBytes>>10, shown, tt.total, lines*(len(line)+1)+len(tt.tail), shown+1)
			if errType(r) != "" || !strings.HasSuffix(r.Output, "\n"+want) {
				t.Errorf("output ends with %q, want %q", r.Output[strings.LastIndex(r.Output, "\n")+1:], want)
			}
		})
	}
}
