package policy

import (
	"bytes"
	"fmt"
	"path"
	"slices"
	"strings"

	"mvdan.cc/sh/v3/syntax"
)

// How the shell judge works. The command line is parsed with mvdan.cc/sh (bash dialect) and every node of
// the tree is visited, so every command the line could run is judged wherever it sits: in a pipeline, a
// list, the background, a subshell or block, an if/while/for/case, a function body (judged where it is
// defined), a command or process substitution, an argument, a redirection or a here-document. Command
// strings that run as code (sh -c, eval, watch, su -c, trap, a here-document or echo piped into a shell)
// are parsed and judged in turn, up to maxNesting levels. Wrappers (env, nice, timeout, xargs, find
// -exec...) are unwrapped with knowledge of their options, and the wrapped command is judged too.
//
// Each part yields findings; the strictest finding wins (deny over ask over allow). Judging a line is
// therefore monotone: "A; B", "A | B" and "A && B" are never judged more leniently than A or B alone.
// Anything whose meaning is only known at run time (a command name from a variable, eval, source, a
// non-literal argument of a program that reads files) is at least ask.

const (
	maxCommandBytes = 64 << 10 // longer lines are not parsed: a person judges them
	maxNesting      = 8        // sh -c inside sh -c inside ..., eval, here-documents fed to a shell
	maxUnwrap       = 32       // wrappers around one command (env nice timeout ...)
	maxBraceWords   = 64       // words one brace expansion may produce before it counts as unresolved
	maxSteps        = 1 << 16  // commands judged for one line, wrappers and nested strings included
	maxGenericTries = 64       // operands of a generic wrapper (strace...) judged as possible commands
)

// judgeShell decides a shell command line for e's tool.
func (e *decideEnv) judgeShell(command string) finding {
	j := &shellJudge{env: e, infos: map[*syntax.CallExpr]*callInfo{}}
	if len(command) > maxCommandBytes {
		j.add(Ask, RuleUnresolved, fmt.Sprintf("the command is %d bytes long and policy reads at most %d; a person must approve it, or put the script in a file", len(command), maxCommandBytes))
		return j.v.best
	}
	j.program(command, 0)
	if j.commands == 0 {
		if tf := e.toolFinding(); tf.action == Deny {
			j.v.add(tf)
		} else {
			j.v.add(finding{Allow, RuleNoCommand, "the line runs no command"})
		}
	}
	return j.v.best
}

type shellJudge struct {
	env      *decideEnv
	v        verdict
	commands int // simple commands seen
	steps    int // command() calls, bounded by maxSteps
	// inGeneric is set while the operands of a generic wrapper are judged as commands.
	inGeneric bool
	infos     map[*syntax.CallExpr]*callInfo
}

// callInfo is what judging one simple command learned that the pipeline and data-flow checks need.
type callInfo struct {
	names       []string       // program names after unwrapping: timeout 5 curl -> [timeout curl]
	stdinScript bool           // runs a script it reads from standard input (sh, bash -s, python -)
	posixShell  bool           // ...and that script is shell code policy can judge
	codeWords   []*syntax.Word // words whose value runs as code: sh -c STR, eval ARGS, source FILE
}

func (j *shellJudge) add(a Action, rule, detail string) {
	j.v.add(finding{a, rule, detail})
}

func newParser() *syntax.Parser {
	return syntax.NewParser(syntax.Variant(syntax.LangBash))
}

// program parses and judges src, a shell program nested depth levels deep.
func (j *shellJudge) program(src string, depth int) {
	if depth > maxNesting {
		j.add(Ask, RuleUnresolved, fmt.Sprintf("the line nests shells, eval or here-documents more than %d levels deep; a person must approve it", maxNesting))
		return
	}
	outerGeneric := j.inGeneric
	j.inGeneric = false // a nested program's generic wrappers try their own operands
	defer func() { j.inGeneric = outerGeneric }()
	f, err := newParser().Parse(strings.NewReader(src), "")
	if err != nil {
		j.add(Ask, RuleUnparseable, fmt.Sprintf("the shell parser cannot read %s (%v); fix the syntax", shorten(src), err))
		j.salvage(src, depth)
		return
	}
	j.file(f, depth)
}

// salvage judges what it can of a line that does not parse. Bash runs the lines before a syntax error,
// so each line that parses on its own is judged, then each piece between list, pipe and grouping
// characters, and any word that a deny rule names denies the line. Misreading a piece can only make the
// decision stricter, and the line is ask already.
func (j *shellJudge) salvage(src string, depth int) {
	for _, line := range strings.Split(src, "\n") {
		if f, err := newParser().Parse(strings.NewReader(line), ""); err == nil {
			j.file(f, depth)
		}
	}
	pieces := strings.FieldsFunc(src, func(r rune) bool { return strings.ContainsRune("\n;&|()`{}", r) })
	if len(pieces) <= 64 {
		for _, piece := range pieces {
			if f, err := newParser().Parse(strings.NewReader(piece), ""); err == nil {
				j.file(f, depth)
			}
		}
	}
	tokens := strings.FieldsFunc(src, func(r rune) bool {
		return strings.ContainsRune(" \t\n;&|()<>`$\"'{}!=\\", r)
	})
	for _, t := range tokens {
		name := commandBase(t)
		for _, l := range j.env.layers {
			if f, ok := l.commandOpinion([]string{name}); ok && f.action == Deny {
				j.v.add(f)
			}
		}
	}
}

// file judges every node of a parsed program, then the checks that need the whole tree.
func (j *shellJudge) file(f *syntax.File, depth int) {
	var pipes []*syntax.BinaryCmd
	var fed []*syntax.Stmt
	var calls []*syntax.CallExpr
	syntax.Walk(f, func(n syntax.Node) bool {
		switch n := n.(type) {
		case *syntax.Stmt:
			j.redirects(n)
			if hasHereInput(n) {
				fed = append(fed, n)
			}
		case *syntax.CallExpr:
			calls = append(calls, n)
			j.callExpr(n, depth)
		case *syntax.BinaryCmd:
			if n.Op == syntax.Pipe || n.Op == syntax.PipeAll {
				pipes = append(pipes, n)
			}
		case *syntax.Assign:
			j.assign(n)
		case *syntax.DeclClause:
			j.declClause(n)
		case *syntax.WordIter:
			if injectionVar(n.Name.Value) {
				j.add(Ask, RuleInjectionEnv, fmt.Sprintf("the loop sets %s, which can make programs load or run other code; use another variable name", n.Name.Value))
			}
		case *syntax.ParamExp:
			if !plainParam(n) {
				j.add(Ask, RuleUnresolved, fmt.Sprintf("the expansion %s is computed when the line runs and can hide code; use a plain $name or literal values", shorten(printNode(n))))
			}
		case *syntax.ArithmExp:
			j.arith(n.X)
		case *syntax.ArithmCmd:
			j.arith(n.X)
		case *syntax.LetClause:
			for _, x := range n.Exprs {
				j.arith(x)
			}
		case *syntax.CStyleLoop:
			for _, x := range []syntax.ArithmExpr{n.Init, n.Cond, n.Post} {
				if x != nil {
					j.arith(x)
				}
			}
		case *syntax.BinaryTest:
			j.binaryTest(n)
		case *syntax.UnaryTest:
			if n.Op == syntax.TsVarSet || n.Op == syntax.TsRefVar {
				if w, ok := n.X.(*syntax.Word); !ok || strings.Contains(w.Lit(), "[") || w.Lit() == "" {
					j.add(Ask, RuleUnresolved, "[[ -v name[...] ]] evaluates the subscript as code; test a plain variable name")
				}
			}
		}
		return true
	})
	for _, p := range pipes {
		j.pipeline(p, depth)
	}
	for _, s := range fed {
		j.hereInput(s, depth)
	}
	for _, c := range calls {
		for _, w := range j.infos[c].codeWords {
			if w != nil && j.containsDownload(w) {
				j.add(Deny, RuleDownloadToShell, fmt.Sprintf("%s runs code downloaded from the network as it arrives; download the file, read it, and run only what you have checked", shorten(printNode(w))))
			}
		}
	}
}

func (j *shellJudge) callExpr(ce *syntax.CallExpr, depth int) {
	info := &callInfo{}
	j.infos[ce] = info
	if len(ce.Args) == 0 {
		return // assignments only: judged by assign
	}
	j.commands++
	var argv []word
	for _, a := range ce.Args {
		argv = append(argv, resolveWord(a)...)
	}
	j.command(argv, depth, 0, info, false)
}

// assign judges a variable assignment: a prefix (X=1 cmd), a plain one (X=1) or a declare argument.
func (j *shellJudge) assign(a *syntax.Assign) {
	if a.Name != nil && injectionVar(a.Name.Value) {
		j.add(Ask, RuleInjectionEnv, fmt.Sprintf("setting %s can make programs load or run other code; leave it unset", a.Name.Value))
	}
	if a.Index != nil {
		j.arith(a.Index)
	}
}

func (j *shellJudge) declClause(d *syntax.DeclClause) {
	if d.Variant.Value == "nameref" {
		j.add(Ask, RuleUnresolved, "nameref makes one variable stand for another, which policy cannot follow; use plain variables")
	}
	for _, a := range d.Args {
		if !a.Naked || a.Name != nil || a.Value == nil {
			continue
		}
		ws := resolveWord(a.Value)
		if len(ws) != 1 || !ws[0].known {
			j.add(Ask, RuleUnresolved, fmt.Sprintf("%s %s names a variable only known when the line runs", d.Variant.Value, shorten(printNode(a.Value))))
			continue
		}
		t := ws[0].text
		switch {
		case strings.HasPrefix(t, "-") || strings.HasPrefix(t, "+"):
			if strings.ContainsAny(t[1:], "ni") {
				j.add(Ask, RuleUnresolved, fmt.Sprintf("%s %s makes later assignments evaluate as code or alias other variables; use plain variables", d.Variant.Value, t))
			}
		case !isIdentifier(t):
			j.add(Ask, RuleUnresolved, fmt.Sprintf("%s %q is not a plain variable name; a subscript there is evaluated as code", d.Variant.Value, t))
		}
	}
}

// arith asks for arithmetic that reads variables: bash evaluates a variable's value as an arithmetic
// expression, and an array subscript inside that value runs command substitutions.
func (j *shellJudge) arith(x syntax.ArithmExpr) {
	if arithHasVar(x) {
		j.add(Ask, RuleUnresolved, fmt.Sprintf("the arithmetic %s evaluates variables, whose values can hide code; use literal numbers", shorten(printNode(x))))
	}
}

func arithHasVar(x syntax.ArithmExpr) bool {
	found := false
	syntax.Walk(x, func(n syntax.Node) bool {
		if w, ok := n.(*syntax.Word); ok {
			lit := w.Lit()
			if lit == "" || lit[0] < '0' || lit[0] > '9' {
				found = true
			}
			return false
		}
		return !found
	})
	return found
}

func (j *shellJudge) binaryTest(b *syntax.BinaryTest) {
	switch b.Op {
	case syntax.TsEql, syntax.TsNeq, syntax.TsLeq, syntax.TsGeq, syntax.TsLss, syntax.TsGtr:
	default:
		return
	}
	for _, x := range []syntax.TestExpr{b.X, b.Y} {
		if w, ok := x.(*syntax.Word); ok {
			if lit := w.Lit(); lit != "" && strings.Trim(lit, "0123456789-+") == "" {
				continue
			}
		}
		j.add(Ask, RuleUnresolved, "an arithmetic comparison in [[ ]] evaluates variables, whose values can hide code; compare with [ ] or literal numbers")
		return
	}
}

// redirects judges a statement's redirections: files written, files read, and network devices.
func (j *shellJudge) redirects(s *syntax.Stmt) {
	for _, r := range s.Redirs {
		switch r.Op {
		case syntax.RdrOut, syntax.AppOut, syntax.RdrClob, syntax.AppClob, syntax.RdrAll, syntax.AppAll,
			syntax.RdrAllClob, syntax.AppAllClob, syntax.RdrInOut:
			j.redirectTarget(r, true)
		case syntax.DplOut, syntax.DplIn:
			if lit := r.Word.Lit(); lit == "-" || isFDMove(lit) {
				continue // >&2, <&0, >&-, 3>&1-: descriptors, not files
			}
			j.redirectTarget(r, r.Op == syntax.DplOut)
		case syntax.RdrIn:
			j.redirectTarget(r, false)
		}
	}
}

func isFDMove(lit string) bool {
	d := strings.TrimSuffix(lit, "-")
	return d != "" && strings.Trim(d, "0123456789") == ""
}

func (j *shellJudge) redirectTarget(r *syntax.Redirect, write bool) {
	if len(r.Word.Parts) == 1 {
		if _, ok := r.Word.Parts[0].(*syntax.ProcSubst); ok {
			return // > >(cmd): a pipe to a command, which the walk judges
		}
	}
	op := r.Op.String()
	ws := resolveWord(r.Word)
	if len(ws) != 1 || !ws[0].known {
		j.add(Ask, RuleUnresolved, fmt.Sprintf("the redirection %s %s goes to a file only known when the line runs; name the file literally", op, shorten(printNode(r.Word))))
		return
	}
	w := ws[0]
	if !w.glob {
		if p, err := ResolvePath(w.text); err == nil {
			if strings.HasPrefix(p, "/dev/tcp/") || strings.HasPrefix(p, "/dev/udp/") {
				j.add(Deny, RuleReverseShell, fmt.Sprintf("%s %s opens a network connection from the shell; this is how reverse shells work and is never allowed", op, w.text))
				return
			}
			if isHarmlessDevice(p) {
				return
			}
		}
	}
	j.checkPathWord(w, write)
	if write {
		j.add(Ask, RuleRedirectWrite, fmt.Sprintf("%s %s writes a file; a person must approve it (leave out the redirection to just see the output)", op, w.text))
	}
}

func hasHereInput(s *syntax.Stmt) bool {
	for _, r := range s.Redirs {
		if r.Op == syntax.Hdoc || r.Op == syntax.DashHdoc || r.Op == syntax.WordHdoc {
			return true
		}
	}
	return false
}

// hereInput judges a here-document or here-string fed to a shell as the script it is.
func (j *shellJudge) hereInput(s *syntax.Stmt, depth int) {
	if _, posix := j.runsStdinScript(s); !posix {
		return
	}
	if content, ok := hereContent(s); ok {
		j.program(content, depth+1)
	}
}

// runsStdinScript reports whether a command in the statement runs a script from the statement's
// standard input (sh, bash -s, python -), and whether one of those is a shell whose script policy can
// judge.
func (j *shellJudge) runsStdinScript(s *syntax.Stmt) (any, posix bool) {
	syntax.Walk(s, func(n syntax.Node) bool {
		switch n := n.(type) {
		case *syntax.CmdSubst, *syntax.ProcSubst:
			return false
		case *syntax.CallExpr:
			if info := j.infos[n]; info != nil && info.stdinScript {
				any = true
				posix = posix || info.posixShell
			}
		}
		return true
	})
	return any, posix
}

// hereContent returns the text a statement's here-document or here-string feeds to standard input, when
// it is static.
func hereContent(s *syntax.Stmt) (string, bool) {
	for _, r := range s.Redirs {
		switch r.Op {
		case syntax.Hdoc, syntax.DashHdoc:
			if r.Hdoc == nil {
				return "", true
			}
			quoted := false
			for _, p := range r.Word.Parts {
				switch p := p.(type) {
				case *syntax.SglQuoted, *syntax.DblQuoted:
					quoted = true
				case *syntax.Lit:
					quoted = quoted || strings.Contains(p.Value, `\`)
				}
			}
			var b strings.Builder
			for _, p := range r.Hdoc.Parts {
				lit, ok := p.(*syntax.Lit)
				if !ok {
					return "", false
				}
				if quoted {
					b.WriteString(lit.Value)
				} else {
					b.WriteString(unescapeHeredoc(lit.Value))
				}
			}
			return b.String(), true
		case syntax.WordHdoc:
			ws := resolveWord(r.Word)
			if len(ws) != 1 || !ws[0].known {
				return "", false
			}
			return ws[0].text + "\n", true
		}
	}
	return "", false
}

// pipeline checks what flows into a stage that runs a script from its standard input: code downloaded
// by an earlier stage is denied, and static text (echo "..." | sh) is judged as the script it is.
func (j *shellJudge) pipeline(b *syntax.BinaryCmd, depth int) {
	stages := flattenPipeline(b)
	for k, st := range stages {
		any, posix := j.runsStdinScript(st)
		if !any {
			continue
		}
		for _, prev := range stages[:k] {
			if j.containsDownload(prev) {
				j.add(Deny, RuleDownloadToShell, "piping a download into an interpreter (curl ... | sh) runs code from the network unseen; download the file, read it, and run only what you have checked")
				break
			}
		}
		if k > 0 && posix {
			if content, ok := j.staticOutput(stages[k-1]); ok {
				j.program(content, depth+1)
			}
		}
	}
}

func flattenPipeline(b *syntax.BinaryCmd) []*syntax.Stmt {
	var out []*syntax.Stmt
	var add func(s *syntax.Stmt)
	add = func(s *syntax.Stmt) {
		if bc, ok := s.Cmd.(*syntax.BinaryCmd); ok && (bc.Op == syntax.Pipe || bc.Op == syntax.PipeAll) && len(s.Redirs) == 0 {
			add(bc.X)
			add(bc.Y)
			return
		}
		out = append(out, s)
	}
	add(b.X)
	add(b.Y)
	return out
}

// staticOutput returns what a pipeline stage writes when policy can know it: echo or printf of literal
// words, or cat of a here-document.
func (j *shellJudge) staticOutput(s *syntax.Stmt) (string, bool) {
	ce, ok := s.Cmd.(*syntax.CallExpr)
	if !ok || len(ce.Args) == 0 {
		return "", false
	}
	var argv []string
	for _, a := range ce.Args {
		ws := resolveWord(a)
		for _, w := range ws {
			if !w.known || w.glob {
				return "", false
			}
			argv = append(argv, w.text)
		}
	}
	switch commandBase(argv[0]) {
	case "echo":
		args := argv[1:]
		for len(args) > 0 && (args[0] == "-n" || args[0] == "-e" || args[0] == "-E") {
			args = args[1:]
		}
		return strings.Join(args, " ") + "\n", true
	case "printf":
		if len(argv) == 2 && !strings.ContainsAny(argv[1], `%\`) {
			return argv[1], true
		}
	case "cat":
		if len(argv) == 1 {
			return hereContent(s)
		}
	}
	return "", false
}

// downloaders fetch data from the network.
var downloaders = map[string]bool{
	"curl": true, "wget": true, "fetch": true, "aria2c": true, "http": true, "https": true, "xh": true,
	"lwp-download": true, "lwp-request": true, "GET": true, "nc": true, "ncat": true, "netcat": true,
	"socat": true, "ftp": true, "tftp": true, "openssl": true,
}

// containsDownload reports whether a command under n downloads.
func (j *shellJudge) containsDownload(n syntax.Node) bool {
	found := false
	syntax.Walk(n, func(n syntax.Node) bool {
		if ce, ok := n.(*syntax.CallExpr); ok {
			if info := j.infos[ce]; info != nil {
				for _, name := range info.names {
					found = found || downloaders[name]
				}
			}
		}
		return !found
	})
	return found
}

// word is one argument after the expansions policy can do statically: quote removal, backslash escapes,
// "~" and brace expansion. Parameter expansion, command substitution and the like make it unknown.
type word struct {
	text    string       // the value; for a glob, the pattern as the shell sees it; /dev/fd/63 for <(cmd)
	pattern string       // text as a glob pattern, quoted metacharacters escaped with '\'
	glob    bool         // has unquoted glob metacharacters: the shell expands it into file names
	known   bool         // false when the value is only known when the line runs
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

// resolveWord expands w statically. It returns one word, or several for a brace expansion, or a single
// unknown word when the value is only known at run time.
func resolveWord(w *syntax.Word) []word {
	if len(w.Parts) == 1 {
		if _, ok := w.Parts[0].(*syntax.ProcSubst); ok {
			// <(cmd) is a pipe the shell names /dev/fd/N; the walk judges cmd itself.
			return []word{{text: "/dev/fd/63", pattern: "/dev/fd/63", known: true, src: w}}
		}
	}
	parts := w.Parts
	cp := &syntax.Word{Parts: slices.Clone(w.Parts)}
	if syntax.SplitBraces(cp) {
		parts = cp.Parts
	}
	alts, ok := expandParts(parts, true)
	if !ok {
		return []word{{src: w}}
	}
	out := make([]word, len(alts))
	for i, a := range alts {
		out[i] = word{text: a.text, pattern: a.pat, glob: a.glob, known: true, src: w}
	}
	return out
}

func expandParts(parts []syntax.WordPart, atStart bool) ([]partial, bool) {
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
			text, pat, glob, ok := unquoteLit(p.Value, atStart && i == 0, i == len(parts)-1)
			if !ok {
				return nil, false
			}
			appendAll(text, pat, glob)
		case *syntax.SglQuoted:
			if p.Dollar && strings.Contains(p.Value, `\`) {
				return nil, false // $'\x73udo': ANSI-C escapes are not decoded, so the value is unknown
			}
			appendAll(p.Value, escapeGlob(p.Value), false)
		case *syntax.DblQuoted:
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
				sub, ok := expandParts(el.Parts, atStart && i == 0)
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

// unquoteLit removes backslash escapes from an unquoted literal and finds glob metacharacters. At the
// start of a word, "~" and "~/" become the workspace root; other tilde forms are unknown.
func unquoteLit(v string, atStart, last bool) (text, pat string, glob, ok bool) {
	var t, p strings.Builder
	if atStart && strings.HasPrefix(v, "~") {
		prefix, _, slash := strings.Cut(v, "/")
		if prefix != "~" || (!slash && !last) {
			return "", "", false, false
		}
		t.WriteString(WorkspaceRoot)
		p.WriteString(WorkspaceRoot)
		v = v[1:]
	}
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
	return t.String(), p.String(), glob, true
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

// injectionVar reports whether setting the variable can make a program load or run other code, or
// change how the shell finds and expands commands.
func injectionVar(name string) bool {
	for _, p := range []string{"LD_", "DYLD_", "GIT_", "BASH_FUNC_", "NPM_CONFIG_", "npm_config_"} {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return injectionVars[name]
}

var injectionVars = map[string]bool{
	"BASH_ENV": true, "ENV": true, "PROMPT_COMMAND": true, "PS0": true, "PS1": true, "PS2": true, "PS3": true,
	"PS4": true, "SHELLOPTS": true, "BASHOPTS": true, "IFS": true, "PATH": true, "CDPATH": true,
	"GLOBIGNORE": true, "HOME": true, "XDG_CONFIG_HOME": true, "ZDOTDIR": true, "PAGER": true,
	"MANPAGER": true, "EDITOR": true, "VISUAL": true, "BROWSER": true, "LESSOPEN": true, "LESSCLOSE": true,
	"PYTHONPATH": true, "PYTHONSTARTUP": true, "PYTHONHOME": true, "PERL5OPT": true, "PERL5LIB": true,
	"PERLLIB": true, "RUBYOPT": true, "RUBYLIB": true, "NODE_OPTIONS": true, "NODE_PATH": true,
	"JAVA_TOOL_OPTIONS": true, "_JAVA_OPTIONS": true, "BASH_LOADABLES_PATH": true, "SSH_ASKPASS": true,
	"SUDO_ASKPASS": true, "GCONV_PATH": true, "NLSPATH": true, "RIPGREP_CONFIG_PATH": true,
	"GREP_OPTIONS": true, "TAR_OPTIONS": true, "INPUTRC": true, "FCEDIT": true, "TERMINFO": true,
}

// commandBase names a program the way rules do: /usr/bin/rm and ./rm are rm.
func commandBase(name string) string {
	if !strings.Contains(name, "/") {
		return name
	}
	b := path.Base(name)
	if b == "/" || b == "." {
		return ""
	}
	return b
}

var systemBinDirs = map[string]bool{
	"/bin": true, "/usr/bin": true, "/usr/local/bin": true, "/sbin": true, "/usr/sbin": true, "/usr/local/sbin": true,
}

func printNode(n syntax.Node) string {
	var b bytes.Buffer
	if err := syntax.NewPrinter().Print(&b, n); err != nil {
		return "(unprintable)"
	}
	return b.String()
}

// shorten quotes s for a message, cut to a readable length.
func shorten(s string) string {
	s = strings.TrimSpace(s)
	if len(s) > 80 {
		s = s[:77] + "..."
	}
	return "`" + strings.ReplaceAll(s, "`", "'") + "`"
}
