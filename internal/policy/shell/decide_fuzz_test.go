package shell_test

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"mvdan.cc/sh/v3/syntax"

	"github.com/toolpool/toolpool/internal/policy"
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
	p := policy.Default()
	f.Fuzz(func(t *testing.T, a, b string) {
		for _, s := range []string{a, b} {
			checkDecision(t, s, decideShell(p, s))
		}
		pa, okA := reprint(a)
		pb, okB := reprint(b)
		if !okA || !okB {
			return
		}
		fa, errA := bashParser().Parse(strings.NewReader(pa), "")
		fb, errB := bashParser().Parse(strings.NewReader(pb), "")
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
			f, err := bashParser().Parse(strings.NewReader(compound), "")
			if err != nil || !joins(f, len(fa.Stmts), len(fb.Stmts)) {
				// Not the two parts side by side: a printed part that ends in a backslash (the printer
				// writes an escaped form feed as an escaped newline) joins the next line to its last word.
				continue
			}
			dc := decideShell(p, compound)
			checkDecision(t, compound, dc)
			if floor.StricterThan(dc.Action) {
				t.Errorf("Decide(%q) = %s by %s, more lenient than its parts: %q is %s, %q is %s",
					compound, dc.Action, dc.Rule, pa, da.Action, pb, db.Action)
			}
		}
	})
}

// bashParser returns a parser of bash, the dialect the compounds are built in.
func bashParser() *syntax.Parser {
	return syntax.NewParser(syntax.Variant(syntax.LangBash))
}

// reprint parses a shell line and prints it back; ok is false when it does not parse, or when it or its
// printing is empty: a line of only a form feed parses as a statement but prints as nothing, and an empty
// part would vanish from the compound built of it while still counting, alone, as a part to compare with.
func reprint(src string) (string, bool) {
	if len(src) > 4096 {
		return "", false
	}
	f, err := bashParser().Parse(strings.NewReader(src), "")
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

func checkDecision(t *testing.T, cmd string, d policy.Decision) {
	t.Helper()
	if !d.Action.Valid() || d.Rule == "" || d.Reason == "" {
		t.Fatalf("Decide(%q) = %+v: want a valid action, a rule and a reason", cmd, d)
	}
}

// FuzzShellFacts checks judging a line with an env argument and a cwd: no panic, a complete decision,
// sorted findings of what was seen, and the same decision for the same request.
func FuzzShellFacts(f *testing.F) {
	f.Add("cat config.json", ".docker", "GIT_DIR", "x")
	f.Add("cd src && cat ../.env", "", "PATH", "/tmp")
	f.Add("echo a # c \\\nsudo reboot", "src", "FOO", "bar")
	f.Add(`$'\x73udo' x`, "a/b", "", "")
	p := policy.Default()
	f.Fuzz(func(t *testing.T, cmd, cwd, name, value string) {
		if len(cmd) > 4096 || !utf8.ValidString(name) {
			return
		}
		r := policy.Request{Tool: "run_shell", Facts: policy.Facts{Command: cmd, Cwd: cwd, Env: map[string]string{name: value}}}
		d, s := p.Explain(context.Background(), r)
		checkDecision(t, cmd, d)
		if !slices.IsSorted(s.Programs) || !slices.IsSorted(s.Writes) {
			t.Fatalf("Explain(%q): seen lists are not sorted: %+v", cmd, s)
		}
		if again := p.Decide(context.Background(), r); again.Action != d.Action || again.Rule != d.Rule {
			t.Fatalf("Decide(%q) is not stable: %s by %s, then %s by %s", cmd, d.Action, d.Rule, again.Action, again.Rule)
		}
	})
}
