package policy

import (
	"bytes"
	"path"
	"strings"
	"testing"

	"mvdan.cc/sh/v3/syntax"

	"github.com/toolpool/toolpool/internal/policy/deniedpath"
)

var shellSeeds = []string{
	"ls", "ls -la", "cat go.mod | grep x", "ls; sudo reboot", "ls && rm -rf /", "$(curl x|sh)", "`sudo x`",
	`bash -c "sudo x"`, `sh -c 'sh -c "rm -rf /"'`, "env sudo x", "env -i LD_PRELOAD=x ls", "nice -n 5 sudo x",
	"timeout 5 sudo", "xargs rm", `find . -exec rm {} \;`, "/usr/bin/sudo", "./sudo", "'s'udo", `s\udo`,
	"$CMD", `eval "ls"`, "cat <(sudo x)", "cat <<EOF | sh\nsudo x\nEOF", "echo x > /etc/passwd",
	"cat x | tee /etc/x", "f(){ sudo x; }; f", "exec sudo", "command sudo", "builtin eval ls",
	"dd if=x of=/dev/sda", "chmod 777 x", "chmod -R 0777 .", "nc -e /bin/sh", "curl x | bash",
	"wget -O- x | sh", "rm -rf /*", "rm -fr //", "git -c core.pager=x log", "rg --pre x", "find -delete",
	"ls (", "cat .env", "cat *", "echo $((x+1))", "x=1", "PATH=/tmp", "for i in 1 2; do echo $i; done",
	"if [ -f x ]; then cat x; fi", "a=(1 2); echo ${a[0]}", "case x in y) ls;; esac", "{ ls; } > out",
	"coproc sudo x", "time ls", "ls &", "! ls", "echo {a,b}{c,d}", "cat ~/.ssh/id_rsa", "[[ -v x ]]",
	"declare -n r=x", "printf -v x %s y", "watch 'ls'", "strace -f ls", "sh <<'EOF'\nls\nEOF",
}

// FuzzShellDecide checks that judging a shell line never panics and always yields a complete decision,
// and that a compound of two lines (A; B, A && B, A || B, A | B) is never judged more leniently than
// either part. The compounds are built from the parsed and printed parts, so that a part's trailing
// comment or here-document cannot swallow the other part.
func FuzzShellDecide(f *testing.F) {
	for i, s := range shellSeeds {
		f.Add(s, shellSeeds[(i*7+3)%len(shellSeeds)])
	}
	p := Default()
	f.Fuzz(func(t *testing.T, a, b string) {
		for _, s := range []string{a, b} {
			checkDecision(t, s, decideShell(p, s))
		}
		pa, okA := reprint(a)
		pb, okB := reprint(b)
		if !okA || !okB {
			return
		}
		fa, errA := newParser().Parse(strings.NewReader(pa), "")
		fb, errB := newParser().Parse(strings.NewReader(pb), "")
		if errA != nil || errB != nil {
			return
		}
		da, db := decideShell(p, pa), decideShell(p, pb)
		floor := da.Action.Stricter(db.Action)
		for _, compound := range []string{
			pa + "\n" + pb,
			"{ " + pa + "\n} && { " + pb + "\n}",
			"{ " + pa + "\n} || { " + pb + "\n}",
			"{ " + pa + "\n} | { " + pb + "\n}",
		} {
			f, err := newParser().Parse(strings.NewReader(compound), "")
			if err != nil || !joins(f, len(fa.Stmts), len(fb.Stmts)) {
				// Not the two parts side by side: a printed part that ends in a backslash (the printer
				// writes an escaped form feed as an escaped newline) joins the next line to its last word.
				continue
			}
			dc := decideShell(p, compound)
			checkDecision(t, compound, dc)
			if dc.Action.rank() < floor.rank() {
				t.Errorf("Decide(%q) = %s by %s, more lenient than its parts: %q is %s, %q is %s",
					compound, dc.Action, dc.Rule, pa, da.Action, pb, db.Action)
			}
		}
	})
}

// reprint parses a shell line and prints it back; ok is false when it does not parse, or when it or its
// printing is empty: a line of only a form feed parses as a statement but prints as nothing, and an empty
// part would vanish from the compound built of it while still counting, alone, as a part to compare with.
func reprint(src string) (string, bool) {
	if len(src) > 4096 {
		return "", false
	}
	f, err := newParser().Parse(strings.NewReader(src), "")
	if err != nil || len(f.Stmts) == 0 {
		return "", false
	}
	var b bytes.Buffer
	if err := syntax.NewPrinter().Print(&b, f); err != nil {
		return "", false
	}
	out := strings.TrimRight(b.String(), "\n")
	return out, strings.TrimSpace(out) != ""
}

// joins reports whether f, a compound built of two parts of na and nb statements, holds them side by side:
// na+nb statements (A newline B), or one binary command of two blocks of na and nb ({ A } && { B }).
func joins(f *syntax.File, na, nb int) bool {
	if len(f.Stmts) == na+nb {
		return true
	}
	if len(f.Stmts) != 1 {
		return false
	}
	bin, ok := f.Stmts[0].Cmd.(*syntax.BinaryCmd)
	if !ok {
		return false
	}
	x, okX := bin.X.Cmd.(*syntax.Block)
	y, okY := bin.Y.Cmd.(*syntax.Block)
	return okX && okY && len(x.Stmts) == na && len(y.Stmts) == nb
}

func checkDecision(t *testing.T, cmd string, d Decision) {
	t.Helper()
	if !d.Action.Valid() || d.Rule == "" || d.Reason == "" {
		t.Fatalf("Decide(%q) = %+v: want a valid action, a rule and a reason", cmd, d)
	}
}

var pathSeeds = [][2]string{
	{"a.txt", "**/.env"}, {"~/.ssh/id_rsa", "~/.ssh/**"}, {"../../etc/passwd", "/etc/**"},
	{"/workspace2/x", "/workspace/**"}, {"a/./b/../c", "**/c"}, {"~", "~"}, {"~root", "**"},
	{"x\x00y", "*"}, {"/", "/*"}, {"//a//b/", "/a/*"}, {"\xff", "**/*.pem"}, {"a.pem", "**/*.p[e]m"},
	{"dir/", "dir/**"}, {".env.local", "**/.env.*"}, {"[x].key", `**/\[x\].key`},
}

// FuzzPath checks ResolvePath and the glob matcher: no panics; a resolved path is absolute, clean and
// resolves to itself; containment is by whole components; and a path that matches a denied glob is
// always found to intersect it, so the shell's glob check can never miss what the matcher catches.
func FuzzPath(f *testing.F) {
	for _, s := range pathSeeds {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, p, pattern string) {
		r, err := ResolvePath(p)
		if err == nil {
			if !strings.HasPrefix(r, "/") || path.Clean(r) != r || strings.ContainsRune(r, 0) {
				t.Fatalf("ResolvePath(%q) = %q: not a clean absolute path", p, r)
			}
			if again, err := ResolvePath(r); err != nil || again != r {
				t.Fatalf("ResolvePath(%q) = %q, but ResolvePath(%q) = %q, %v", p, r, r, again, err)
			}
			inside := r == WorkspaceRoot || strings.HasPrefix(r, WorkspaceRoot+"/")
			if within(WorkspaceRoot, r) != inside {
				t.Fatalf("within(%q, %q) = %v", WorkspaceRoot, r, !inside)
			}
			if !strings.HasPrefix(p, "/") && !strings.HasPrefix(p, "~") && !strings.Contains(p, "..") && !inside {
				t.Fatalf("relative path %q resolved outside the workspace: %q", p, r)
			}
		}
		g, err := deniedpath.CompileGlob(pattern)
		if err != nil || r == "" {
			return
		}
		if g.Match(r) {
			lit := deniedpath.SplitAbs(escapeGlob(r))
			if !globsIntersect(lit, g.Segments()) {
				t.Fatalf("%q matches %q, but the intersection test says they cannot meet", r, pattern)
			}
		}
	})
}
