package policy

import (
	"context"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzDecoders checks the escape decoders: no panic, a string without backslashes decodes to itself,
// and $'...' never yields a NUL (bash's value is a C string).
func FuzzDecoders(f *testing.F) {
	for _, s := range []string{`\x73udo`, `\163`, `\u0073`, `\U0001F600`, `\c[`, `\0`, `a\`, `%b%s%%`, `\e[1m`, `%d`, `\x`, "plain"} {
		f.Add(s, "arg")
	}
	f.Fuzz(func(t *testing.T, s, arg string) {
		d := decodeANSIC(s)
		if strings.IndexByte(d, 0) >= 0 {
			t.Fatalf("decodeANSIC(%q) = %q holds a NUL", s, d)
		}
		if !strings.ContainsAny(s, "\\\x00") && d != s {
			t.Fatalf("decodeANSIC(%q) = %q, want it unchanged", s, d)
		}
		if e, _ := decodeEcho(s); !strings.Contains(s, `\`) && e != s {
			t.Fatalf("decodeEcho(%q) = %q, want it unchanged", s, e)
		}
		if out, ok := printfOutput([]string{s, arg, arg}); ok && len(out) > 64*(len(s)+2*len(arg))+64 {
			t.Fatalf("printfOutput(%q) is %d bytes", s, len(out))
		}
		_ = posixDollarQuotes(s)
	})
}

// FuzzShellFacts checks judging a line with an env argument and a cwd: no panic, a complete decision,
// sorted findings of what was seen, and the same decision for the same request.
func FuzzShellFacts(f *testing.F) {
	f.Add("cat config.json", ".docker", "GIT_DIR", "x")
	f.Add("cd src && cat ../.env", "", "PATH", "/tmp")
	f.Add("echo a # c \\\nsudo reboot", "src", "FOO", "bar")
	f.Add(`$'\x73udo' x`, "a/b", "", "")
	p := Default()
	f.Fuzz(func(t *testing.T, cmd, cwd, name, value string) {
		if len(cmd) > 4096 || !utf8.ValidString(name) {
			return
		}
		r := Request{Tool: "run_shell", Facts: Facts{Command: cmd, Cwd: cwd, Env: map[string]string{name: value}}}
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
