package shell

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"mvdan.cc/sh/v3/syntax"
)

// Reading the input: a line is checked for characters that shells, parsers and people read differently,
// then parsed in every dialect of the shell that may run it, as that shell reads it (see the package doc).

// dialect is a shell language a line may be read in.
type dialect uint8

const (
	dialectPOSIX dialect = 1 << iota // dash, busybox ash, posh: /bin/sh on Debian
	dialectBash                      // bash, and the approximation for ksh and zsh

	dialectsSh = dialectPOSIX | dialectBash // /bin/sh: either
)

func (d dialect) String() string {
	if d == dialectPOSIX {
		return "POSIX sh"
	}
	return "bash"
}

// parse parses src as dialect d reads it. For POSIX sh, "$'" is first made "\$'": dash has no $'...'
// quoting and reads a dollar sign, then a single-quoted string. Comments are blanked to the end of their
// line and the source parsed again, because the parser continues a comment at a trailing backslash and
// shells do not.
func parse(src string, d dialect) (*syntax.File, error) {
	lang := syntax.LangBash
	if d == dialectPOSIX {
		lang = syntax.LangPOSIX
		src = posixDollarQuotes(src)
	}
	p := syntax.NewParser(syntax.Variant(lang), syntax.KeepComments(true))
	f, err := p.Parse(strings.NewReader(src), "")
	if err != nil {
		return nil, err
	}
	for range 3 {
		blanked, changed := blankComments(src, f)
		if !changed {
			return f, nil
		}
		src = blanked
		if f, err = p.Parse(strings.NewReader(src), ""); err != nil {
			return nil, err
		}
	}
	return f, nil
}

// posixDollarQuotes escapes the dollar sign of every "$'" that is not already escaped, so that a POSIX
// parser reads it as dash does: a literal "$" and then a single-quoted string.
func posixDollarQuotes(src string) string {
	if !strings.Contains(src, "$'") {
		return src
	}
	var b strings.Builder
	for i := 0; i < len(src); i++ {
		if src[i] == '$' && i+1 < len(src) && src[i+1] == '\'' {
			backslashes := 0
			for k := i - 1; k >= 0 && src[k] == '\\'; k-- {
				backslashes++
			}
			if backslashes%2 == 0 {
				b.WriteByte('\\')
			}
		}
		b.WriteByte(src[i])
	}
	return b.String()
}

// blankComments replaces the text of every comment, from after its "#" to the end of its physical
// line, with spaces. It reports whether anything changed.
func blankComments(src string, f *syntax.File) (string, bool) {
	var spans [][2]int
	syntax.Walk(f, func(n syntax.Node) bool {
		if c, ok := n.(*syntax.Comment); ok {
			start := int(c.Hash.Offset()) + 1
			if start > len(src) {
				return true
			}
			end := strings.IndexByte(src[start:], '\n')
			if end < 0 {
				end = len(src) - start
			}
			if strings.TrimLeft(src[start:start+end], " ") != "" {
				spans = append(spans, [2]int{start, start + end})
			}
		}
		return true
	})
	if len(spans) == 0 {
		return src, false
	}
	b := []byte(src)
	for _, s := range spans {
		for k := s[0]; k < s[1]; k++ {
			b[k] = ' '
		}
	}
	return string(b), true
}

// badCharacter returns what is wrong with the first character of s that shells, parsers and people may
// read differently, or "" when there is none.
func badCharacter(s string) string {
	for i, r := range s {
		switch {
		case r == utf8.RuneError:
			if _, size := utf8.DecodeRuneInString(s[i:]); size == 1 {
				return fmt.Sprintf("byte %d is not valid UTF-8", i)
			}
		case r == '\t' || r == '\n':
		case r < 0x20 || r == 0x7f || r >= 0x80 && r <= 0x9f:
			return fmt.Sprintf("byte %d is the control character %U", i, r)
		case r >= 0x202a && r <= 0x202e || r >= 0x2066 && r <= 0x2069 || r == 0x200e || r == 0x200f || r == 0x061c:
			return fmt.Sprintf("byte %d is the bidirectional control %U, which makes the line read differently from how it runs", i, r)
		case r == 0x2028 || r == 0x2029:
			return fmt.Sprintf("byte %d is the line separator %U", i, r)
		}
	}
	return ""
}

// program parses and judges src, a shell program nested depth levels deep, in every dialect of dl.
func (j *judge) program(src string, depth int, dl dialect) {
	if depth > maxNesting {
		j.blind(Ask, RuleUnresolved, fmt.Sprintf("the line nests shells, eval or here-documents more than %d levels deep; a person must approve it", maxNesting))
		return
	}
	if bad := badCharacter(src); bad != "" {
		j.add(Deny, RuleControlCharacter, fmt.Sprintf("the command cannot be read reliably: %s; write control characters with printf escapes such as '\\r' and use LF line endings", bad))
		return
	}
	outerGeneric, outerDialect, outerDirs, outerUnknown := j.inGeneric, j.dialect, j.dirs, j.dirUnknown
	j.inGeneric = false // a nested program's generic wrappers try their own operands
	defer func() {
		j.inGeneric, j.dialect, j.dirs, j.dirUnknown = outerGeneric, outerDialect, outerDirs, outerUnknown
	}()
	var failed []dialect
	var firstErr error
	parsed := false
	for _, d := range []dialect{dialectBash, dialectPOSIX} {
		if dl&d == 0 {
			continue
		}
		f, err := parse(src, d)
		if err != nil {
			failed = append(failed, d)
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		parsed = true
		j.dialect = d
		j.dirs, j.dirUnknown = outerDirs, outerUnknown
		j.file(f, depth)
	}
	if len(failed) == 0 {
		return
	}
	if !parsed {
		j.blind(Ask, RuleUnparseable, fmt.Sprintf("the shell parser cannot read %s (%v); fix the syntax", shorten(src), firstErr))
	}
	for _, d := range failed {
		// A shell runs the complete commands before a syntax error: judge what it can of them.
		j.dialect = d
		j.dirs, j.dirUnknown = outerDirs, outerUnknown
		j.salvage(src, depth)
	}
}

// salvage judges what it can of a line that does not parse. Shells run the lines before a syntax error,
// so each line that parses on its own is judged, then each piece between list, pipe and grouping
// characters, and any word that a deny rule names denies the line. Misreading a piece can only make the
// decision stricter.
func (j *judge) salvage(src string, depth int) {
	for _, line := range strings.Split(src, "\n") {
		if f, err := parse(line, j.dialect); err == nil {
			j.file(f, depth)
		}
	}
	pieces := strings.FieldsFunc(src, func(r rune) bool { return strings.ContainsRune("\n;&|()`{}", r) })
	if len(pieces) <= 64 {
		for _, piece := range pieces {
			if f, err := parse(piece, j.dialect); err == nil {
				j.file(f, depth)
			}
		}
	}
	tokens := strings.FieldsFunc(src, func(r rune) bool {
		return strings.ContainsRune(" \t\n;&|()<>`$\"'{}!=\\", r)
	})
	for _, t := range tokens {
		name := CommandBase(t)
		for _, f := range j.rules.Forbidden([]string{name}) {
			j.v.add(f)
		}
	}
}
