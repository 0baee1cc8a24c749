package shell

import (
	"slices"
	"strings"

	"mvdan.cc/sh/v3/syntax"
)

// Expanding words: what policy can know statically of an argument (quote removal, escapes, $'...', "~"
// and brace expansion), and what it cannot.

// word is one argument after the expansions policy can do statically: quote removal, backslash escapes,
// $'...' decoding, "~" and brace expansion. Parameter expansion, command substitution and the like make
// it unknown.
type word struct {
	text    string       // the value; for a glob, the pattern as the shell sees it; /dev/fd/63 for <(cmd)
	pattern string       // text as a glob pattern, quoted metacharacters escaped with '\'
	glob    bool         // has unquoted glob metacharacters: the shell expands it into file names
	known   bool         // false when the value is only known when the line runs
	tainted bool         // known text into which a program splices run-time input (xargs -I, find -exec {})
	src     *syntax.Word // the parsed word; nil for words policy made up
}

func (w word) show() string {
	if w.known && (w.src == nil || !strings.HasPrefix(w.text, "/dev/fd/")) {
		return w.text
	}
	if w.src != nil {
		return printNode(w.src)
	}
	if w.text != "" {
		return w.text
	}
	return "(runtime value)"
}

func literalWord(s string) word {
	return word{text: s, pattern: escapeGlob(s), known: true}
}

func runtimeWord(s string) word {
	return word{text: s}
}

type partial struct {
	text, pat string
	glob      bool
}

// resolveWord expands w statically in the judge's dialect. It returns one word, or several for a brace
// or tilde expansion, or a single unknown word when the value is only known at run time.
func (j *judge) resolveWord(w *syntax.Word) []word {
	if len(w.Parts) == 1 {
		if _, ok := w.Parts[0].(*syntax.ProcSubst); ok {
			// <(cmd) is a pipe the shell names /dev/fd/N; the walk judges cmd itself.
			return []word{{text: "/dev/fd/63", pattern: "/dev/fd/63", known: true, src: w}}
		}
	}
	parts := w.Parts
	if j.dialect == dialectBash {
		cp := &syntax.Word{Parts: slices.Clone(w.Parts)}
		if syntax.SplitBraces(cp) {
			parts = cp.Parts
		}
	}
	alts, ok := j.expandParts(parts, true)
	if !ok {
		return []word{{src: w}}
	}
	out := make([]word, len(alts))
	for i, a := range alts {
		out[i] = word{text: a.text, pattern: a.pat, glob: a.glob, known: true, src: w}
	}
	return out
}

func (j *judge) expandParts(parts []syntax.WordPart, atStart bool) ([]partial, bool) {
	alts := []partial{{}}
	appendAll := func(text, pat string, glob bool) {
		for k := range alts {
			alts[k].text += text
			alts[k].pat += pat
			alts[k].glob = alts[k].glob || glob
		}
	}
	for i, p := range parts {
		switch p := p.(type) {
		case *syntax.Lit:
			v := p.Value
			if atStart && i == 0 && strings.HasPrefix(v, "~") {
				prefix, _, slash := strings.Cut(v, "/")
				if prefix != "~" || (!slash && i != len(parts)-1) {
					return nil, false // ~user, ~+, ~-: another directory
				}
				var next []partial
				for _, a := range alts {
					for _, h := range homeDirs {
						next = append(next, partial{a.text + h, a.pat + escapeGlob(h), a.glob})
					}
				}
				alts = next
				v = v[1:]
			}
			text, pat, glob := unquoteLit(v)
			appendAll(text, pat, glob)
		case *syntax.SglQuoted:
			v := p.Value
			if p.Dollar {
				v = decodeANSIC(v)
			}
			appendAll(v, escapeGlob(v), false)
		case *syntax.DblQuoted:
			if p.Dollar {
				if j.dialect == dialectBash {
					return nil, false // $"...": translated at run time
				}
				appendAll("$", "$", false)
			}
			for _, q := range p.Parts {
				lit, ok := q.(*syntax.Lit)
				if !ok {
					return nil, false
				}
				v := unescapeDouble(lit.Value)
				appendAll(v, escapeGlob(v), false)
			}
		case *syntax.BraceExp:
			if p.Sequence {
				return nil, false
			}
			var next []partial
			for _, el := range p.Elems {
				sub, ok := j.expandParts(el.Parts, atStart && i == 0)
				if !ok {
					return nil, false
				}
				for _, a := range alts {
					for _, s := range sub {
						next = append(next, partial{a.text + s.text, a.pat + s.pat, a.glob || s.glob})
					}
				}
				if len(next) > maxBraceWords {
					return nil, false
				}
			}
			alts = next
		default:
			return nil, false
		}
	}
	return alts, true
}

// unquoteLit removes backslash escapes from an unquoted literal and finds glob metacharacters.
func unquoteLit(v string) (text, pat string, glob bool) {
	var t, p strings.Builder
	for i := 0; i < len(v); i++ {
		c := v[i]
		switch c {
		case '\\':
			if i+1 >= len(v) {
				t.WriteByte('\\')
				p.WriteString(`\\`)
				continue
			}
			i++
			if v[i] == '\n' {
				continue
			}
			t.WriteByte(v[i])
			p.WriteString(escapeGlob(v[i : i+1]))
		case '*', '?':
			glob = true
			t.WriteByte(c)
			p.WriteByte(c)
		case '[':
			if strings.IndexByte(v[i+1:], ']') >= 0 {
				glob = true
				t.WriteByte(c)
				p.WriteByte(c)
			} else {
				t.WriteByte(c)
				p.WriteString(`\[`)
			}
		default:
			t.WriteByte(c)
			p.WriteByte(c)
		}
	}
	return t.String(), p.String(), glob
}

// unescapeDouble removes the backslash escapes that work inside double quotes: \$ \` \" \\ and
// backslash-newline. Other backslashes stay.
func unescapeDouble(v string) string { return unescape(v, "$`\"\\") }

// unescape removes a backslash before any byte of escapable, and backslash-newline pairs; other
// backslashes stay.
func unescape(v, escapable string) string {
	if !strings.Contains(v, `\`) {
		return v
	}
	var b strings.Builder
	for i := 0; i < len(v); i++ {
		if v[i] == '\\' && i+1 < len(v) {
			if v[i+1] == '\n' {
				i++
				continue
			}
			if strings.IndexByte(escapable, v[i+1]) >= 0 {
				b.WriteByte(v[i+1])
				i++
				continue
			}
		}
		b.WriteByte(v[i])
	}
	return b.String()
}

// unescapeHeredoc removes the escapes that work in a here-document with an unquoted delimiter: as in
// double quotes, except that \" stays as it is.
func unescapeHeredoc(v string) string { return unescape(v, "$`\\") }

func escapeGlob(s string) string {
	if !strings.ContainsAny(s, `*?[\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if strings.IndexByte(`*?[\`, s[i]) >= 0 {
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func plainParam(p *syntax.ParamExp) bool {
	return !p.Excl && !p.Length && !p.Width && !p.IsSet && p.Flags == nil && p.NestedParam == nil &&
		p.Index == nil && p.Slice == nil && p.Repl == nil && p.Names == 0 && p.Exp == nil && len(p.Modifiers) == 0
}

func isIdentifier(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || i > 0 && c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// isVarRef reports whether s names a variable without evaluating code: a plain name, or a name with a
// subscript of digits only. Bash evaluates any other subscript as arithmetic, and command substitutions
// in it run.
func isVarRef(s string) bool {
	name, sub, ok := strings.Cut(s, "[")
	if !ok {
		return isIdentifier(s)
	}
	digits, ok := strings.CutSuffix(sub, "]")
	return ok && isIdentifier(name) && digits != "" && strings.Trim(digits, "0123456789") == ""
}
