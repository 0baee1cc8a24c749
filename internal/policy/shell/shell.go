// Package shell is policy's shell analyser: it judges a shell command line (run_shell's command, with the
// environment and working directory the call gives it) against the command rules and path rules of one
// request, and reports what it looked at. The policy engine (package policy) owns the rules, the posture
// and the decision, and reaches the analyser through Judge alone; this package never imports it, and
// reaches the engine's rules through the Rules it is given.
//
// How the analyser works. The command line is parsed with mvdan.cc/sh and every node of the tree is
// visited, so every command the line could run is judged wherever it sits: in a pipeline, a list, the
// background, a subshell or block, an if/while/for/case, a function body (judged where it is defined), a
// command or process substitution, an argument, a redirection or a here-document. Command strings that
// run as code (sh -c, eval, watch, su -c, trap, alias, a here-document or echo piped into a shell) are
// parsed and judged in turn, up to maxNesting levels. Wrappers (env, nice, timeout, xargs, find -exec...)
// are unwrapped with knowledge of their options, and the wrapped command is judged too.
//
// What runs is what the shell reads, not what a parser prints. So, before anything is parsed:
//   - a line with a control character (a carriage return, a vertical tab, an escape, DEL, C1 codes), a
//     bidirectional override, a Unicode line separator or invalid UTF-8 is refused: shells, parsers and
//     people reading an approval read those differently;
//   - the line is judged in every dialect of the shell that may run it: run_shell's /bin/sh is dash on
//     Debian and bash elsewhere, so a top-level line is judged as POSIX sh (dash: no $'...', no brace
//     expansion, (( is two subshells) and as bash, and the strictest verdict wins; bash -c strings are
//     judged as bash only, dash -c strings as POSIX only;
//   - comments end at the newline whatever they hold (the parser would continue one at a trailing
//     backslash; bash does not);
//   - $'...' is decoded as bash decodes it ($'\x73udo' is sudo), and $"..." is translated at run time
//     through a message catalogue, so its value is unknown.
//
// Relative paths are resolved from every directory the line may run in: run_shell's cwd, and every
// directory a cd, pushd, env -C, git -C, go -C, make -C or tar -C in the line names (judging repeats until
// that set stops growing); a directory only known at run time makes a relative path that may name a
// denied file ask. "~" is both the workspace (policy's meaning) and the sandbox's HOME (/tmp).
//
// Each part yields findings; the strictest finding wins (deny over ask over allow). Judging a line is
// therefore monotone: "A; B", "A | B" and "A && B" are never judged more leniently than A or B alone.
// Anything whose meaning is only known at run time (a command name from a variable, eval, source, a
// non-literal argument of a program that reads files) is at least ask.
package shell

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	"mvdan.cc/sh/v3/syntax"
)

const (
	maxCommandBytes = 64 << 10 // longer lines are not parsed: a person judges them
	maxNesting      = 8        // sh -c inside sh -c inside ..., eval, here-documents fed to a shell
	maxUnwrap       = 32       // wrappers around one command (env nice timeout ...)
	maxBraceWords   = 64       // words one brace expansion may produce before it counts as unresolved
	maxSteps        = 1 << 16  // commands judged for one line, wrappers and nested strings included
	maxGenericTries = 64       // operands of a generic wrapper (strace...) judged as possible commands
	maxDirs         = 16       // working directories a line may move through before they count as unknown
	maxDirRounds    = 4        // judging rounds that may discover more working directories
)

// homeDirs are what "~" may stand for: the workspace (policy's own meaning, as for file tools) and the
// sandbox's HOME.
var homeDirs = []string{WorkspaceRoot, "/tmp"}

// Seen is what judging a shell command looked at: the programs it judged, the files it judged as
// written, and why parts of the line run code it cannot read. It is for tests (the differential oracle
// compares it with what a traced shell did) and for explaining a decision; a decision does not need it.
type Seen struct {
	// Programs are the base names of every program judged, wrappers and nested commands included.
	Programs []string
	// Writes are the files judged as written: clean absolute paths, or absolute glob patterns for words
	// the shell expands (each segment in path.Match syntax).
	Writes []string
	// Opaque says why the line may run code or write files that policy cannot see (eval of a variable, a
	// script file, input piped into a shell...); empty when policy saw everything the line runs.
	Opaque []string
}

// Rules is what the analyser judges a line against: the policy engine's command rules for one request's
// tenant and tool, and how the engine shapes a finding (its posture and built-in ask settings). Judge
// calls it from its own goroutine only and does not keep it.
type Rules interface {
	// Command is the verdict on one command, given as the words command rules match: the program's base
	// name, then its literal words ("\x00" for a word only known at run time). listed reports whether a
	// command rule of some layer names it. The finding is final: Judge does not shape it.
	Command(argv []string) (f Finding, listed bool)
	// Forbidden returns the findings of the command rules that deny argv, final as Command's: what a line
	// that does not parse is still refused for by the words in it.
	Forbidden(argv []string) []Finding
	// Shape applies the posture and the built-in ask settings to one of the analyser's own findings.
	Shape(f Finding) Finding
}

// Input is one shell command to judge.
type Input struct {
	Command string            // the command line
	Env     map[string]string // the environment the call adds, judged as assignments in the line
	Cwd     string            // the directory the command starts in, as the model gave it; "" is WorkspaceRoot
}

// Result is what judging one line found.
type Result struct {
	// Finding is the strictest finding, shaped; Found is false when there is none.
	Finding Finding
	Found   bool
	// NoCommand reports a line that runs no command (only assignments or comments) or yields no finding:
	// the engine judges it by the tool's own action.
	NoCommand bool
	Seen      Seen
}

// Judge judges a shell command with its environment and working directory against rules and paths, and
// reports what it saw. It never blocks on I/O; calls with different Rules may run concurrently.
func Judge(rules Rules, paths Paths, in Input) Result {
	base := WorkspaceRoot
	if in.Cwd != "" {
		if p, err := ResolvePath(in.Cwd); err == nil {
			base = p // a bad cwd is denied by the engine as a path of the call
		}
	}
	j := &judge{rules: rules, paths: paths, infos: map[*syntax.CallExpr]*callInfo{}, dirs: []string{base},
		dialect: dialectBash, seen: newSeenSet()}
	if in.Cwd != "" {
		j.checkPathText(base, false) // the command reads its working directory
	}
	j.judgeEnv(in.Env)
	noCommand := j.line(in.Command)
	return Result{Finding: j.v.best, Found: j.v.set, NoCommand: noCommand, Seen: j.seen.result()}
}

// line judges a whole command line and reports whether it runs no command.
func (j *judge) line(command string) (noCommand bool) {
	if len(command) > maxCommandBytes {
		j.blind(Ask, RuleUnresolved, fmt.Sprintf("the command is %d bytes long and policy reads at most %d; a person must approve it, or put the script in a file", len(command), maxCommandBytes))
		return false
	}
	j.program(command, 0, dialectsSh)
	return j.commands == 0 || !j.v.set
}

// judgeEnv judges the environment a call adds (run_shell's env argument) like assignments in the line.
func (j *judge) judgeEnv(env map[string]string) {
	names := make([]string, 0, len(env))
	for n := range env {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		if n == "CDPATH" {
			j.cdpath = true
		}
		if n == "OLDPWD" || n == "DIRSTACK" {
			j.stackSet = true
		}
		if injectionVar(n) {
			j.opaque(Ask, RuleInjectionEnv, fmt.Sprintf("the call's env argument sets %s, which can make programs load or run other code; leave it out", n))
		}
	}
}

// judge is the state of judging one line.
type judge struct {
	rules    Rules
	paths    Paths
	v        verdict
	commands int // simple commands seen
	steps    int // command() calls, bounded by maxSteps
	// inGeneric is set while the operands of a generic wrapper are judged as commands.
	inGeneric bool
	infos     map[*syntax.CallExpr]*callInfo
	dialect   dialect // of the program being walked
	// dirs are the directories the command being judged may run in (see cwdFlow); dirUnknown adds
	// "somewhere only known at run time".
	dirs       []string
	dirUnknown bool
	cdpath     bool // CDPATH is set: a relative cd may go anywhere
	stackSet   bool // OLDPWD or DIRSTACK is set: cd -, popd and pushd +N may go anywhere
	wideGlobs  bool // the line may turn on dotglob or nocaseglob: globs are judged as if it did
	seen       seenSet
}

// callInfo is what judging one simple command learned that the pipeline and data-flow checks need.
type callInfo struct {
	names        []string       // program names after unwrapping: timeout 5 curl -> [timeout curl]
	stdinScript  bool           // runs a script it reads from standard input (sh, bash -s, python -)
	stdinDialect dialect        // ...and the shell dialects of that script when policy can judge it
	codeWords    []*syntax.Word // words whose value runs as code: sh -c STR, eval ARGS, source FILE
}

// add adds one of the analyser's own findings, shaped by the rules.
func (j *judge) add(a Action, rule, detail string) {
	j.v.add(j.rules.Shape(Finding{Action: a, Rule: rule, Detail: detail}))
}

// opaque adds a finding about code or writes policy cannot see, and records it in what was seen.
func (j *judge) opaque(a Action, rule, detail string) {
	j.add(a, rule, detail)
	j.seen.opaque = append(j.seen.opaque, detail)
}

// blind adds a finding about a line or part policy could not read at all. The autonomous posture refuses
// it rather than run it unread.
func (j *judge) blind(a Action, rule, detail string) {
	j.v.add(j.rules.Shape(Finding{Action: a, Rule: rule, Detail: detail, Blind: true}))
	j.seen.opaque = append(j.seen.opaque, detail)
}

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

// newParser returns a bash parser; parse picks the dialect.
func newParser() *syntax.Parser {
	return syntax.NewParser(syntax.Variant(syntax.LangBash))
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

// file judges every node of a parsed program, then the checks that need the whole tree. Each statement
// and command is judged in the directories it may run in (flowDirs).
func (j *judge) file(f *syntax.File, depth int) {
	var pipes []*syntax.BinaryCmd
	var fed []*syntax.Stmt
	var calls []*syntax.CallExpr
	entry := dirState{dirs: j.dirs, unknown: j.dirUnknown}
	j.prescan(f)
	at := j.flowDirs(f, entry)
	place := func(n syntax.Node) {
		s, ok := at[n]
		if !ok {
			s = entry
		}
		j.dirs, j.dirUnknown = s.dirs, s.unknown
	}
	syntax.Walk(f, func(n syntax.Node) bool {
		switch n := n.(type) {
		case *syntax.Stmt:
			place(n)
			j.redirects(n)
			if hasHereInput(n) {
				fed = append(fed, n)
			}
		case *syntax.CallExpr:
			calls = append(calls, n)
			place(n)
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
				j.opaque(Ask, RuleInjectionEnv, fmt.Sprintf("the loop sets %s, which can make programs load or run other code; use another variable name", n.Name.Value))
			}
		case *syntax.ParamExp:
			if !plainParam(n) {
				j.opaque(Ask, RuleUnresolved, fmt.Sprintf("the expansion %s is computed when the line runs and can hide code; use a plain $name or literal values", shorten(printNode(n))))
			}
		case *syntax.DblQuoted:
			if n.Dollar && j.dialect == dialectBash {
				j.opaque(Ask, RuleUnresolved, fmt.Sprintf("%s is translated through a message catalogue when the line runs (TEXTDOMAIN, TEXTDOMAINDIR), so its text is unknown and its expansions can run code; use \"...\"", shorten(printNode(n))))
			}
		case *syntax.ArrayElem:
			if n.Index != nil {
				j.arith(n.Index) // a=([i]=1): an indexed array's subscript is arithmetic
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
					j.opaque(Ask, RuleUnresolved, "[[ -v name[...] ]] evaluates the subscript as code; test a plain variable name")
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

// prescan finds what changes how the whole line must be read, wherever it stands: CDPATH set, and
// dotglob, nocaseglob or GLOBIGNORE turned on.
func (j *judge) prescan(f *syntax.File) {
	syntax.Walk(f, func(n syntax.Node) bool {
		switch n := n.(type) {
		case *syntax.Assign:
			if n.Name != nil && n.Name.Value == "CDPATH" {
				j.cdpath = true
			}
			if n.Name != nil && n.Name.Value == "GLOBIGNORE" {
				j.wideGlobs = true
			}
			if n.Name != nil && (n.Name.Value == "OLDPWD" || n.Name.Value == "DIRSTACK") {
				j.stackSet = true
			}
		case *syntax.CallExpr:
			shopt := false
			for i, a := range n.Args {
				for _, w := range j.resolveWord(a) {
					if i == 0 && w.known && (w.text == "shopt" || w.text == "set") {
						shopt = true
					}
					if w.known && (strings.Contains(w.text, "dotglob") || strings.Contains(w.text, "nocaseglob")) || !w.known && shopt {
						j.wideGlobs = true
					}
				}
			}
		}
		return true
	})
}

func (j *judge) callExpr(ce *syntax.CallExpr, depth int) {
	info := &callInfo{}
	j.infos[ce] = info
	if len(ce.Args) == 0 {
		return // assignments only: judged by assign
	}
	j.commands++
	var argv []word
	for _, a := range ce.Args {
		argv = append(argv, j.resolveWord(a)...)
	}
	j.command(argv, depth, 0, info, false)
}

// assign judges a variable assignment: a prefix (X=1 cmd), a plain one (X=1) or a declare argument.
func (j *judge) assign(a *syntax.Assign) {
	if a.Name != nil && injectionVar(a.Name.Value) {
		j.opaque(Ask, RuleInjectionEnv, fmt.Sprintf("setting %s can make programs load or run other code; leave it unset", a.Name.Value))
	}
	if a.Index != nil {
		j.arith(a.Index)
	}
}

func (j *judge) declClause(d *syntax.DeclClause) {
	if d.Variant.Value == "nameref" {
		j.opaque(Ask, RuleUnresolved, "nameref makes one variable stand for another, which policy cannot follow; use plain variables")
	}
	for _, a := range d.Args {
		if !a.Naked || a.Name != nil || a.Value == nil {
			continue
		}
		ws := j.resolveWord(a.Value)
		if len(ws) != 1 || !ws[0].known {
			j.opaque(Ask, RuleUnresolved, fmt.Sprintf("%s %s names a variable only known when the line runs", d.Variant.Value, shorten(printNode(a.Value))))
			continue
		}
		t := ws[0].text
		switch {
		case strings.HasPrefix(t, "-") || strings.HasPrefix(t, "+"):
			if strings.ContainsAny(t[1:], "ni") {
				j.opaque(Ask, RuleUnresolved, fmt.Sprintf("%s %s makes later assignments evaluate as code or alias other variables; use plain variables", d.Variant.Value, t))
			}
		default:
			name, _, _ := strings.Cut(t, "=")
			if !isIdentifier(name) {
				j.opaque(Ask, RuleUnresolved, fmt.Sprintf("%s %q is not a plain variable name; a subscript there is evaluated as code", d.Variant.Value, t))
			} else if injectionVar(name) {
				j.opaque(Ask, RuleInjectionEnv, fmt.Sprintf("setting %s can make programs load or run other code; leave it unset", name))
			}
		}
	}
}

// arith asks for arithmetic that reads variables: bash evaluates a variable's value as an arithmetic
// expression, and an array subscript inside that value runs command substitutions.
func (j *judge) arith(x syntax.ArithmExpr) {
	if arithHasVar(x) {
		j.opaque(Ask, RuleUnresolved, fmt.Sprintf("the arithmetic %s evaluates variables, whose values can hide code; use literal numbers", shorten(printNode(x))))
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

func (j *judge) binaryTest(b *syntax.BinaryTest) {
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
		j.opaque(Ask, RuleUnresolved, "an arithmetic comparison in [[ ]] evaluates variables, whose values can hide code; compare with [ ] or literal numbers")
		return
	}
}

// redirects judges a statement's redirections: files written, files read, and network devices.
func (j *judge) redirects(s *syntax.Stmt) {
	for _, r := range s.Redirs {
		if r.N != nil && strings.HasPrefix(r.N.Value, "{") && !isIdentifier(strings.Trim(r.N.Value, "{}")) {
			j.opaque(Ask, RuleUnresolved, fmt.Sprintf("the descriptor name %s is evaluated as code; use a plain {name}", r.N.Value))
		}
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

func (j *judge) redirectTarget(r *syntax.Redirect, write bool) {
	if len(r.Word.Parts) == 1 {
		if _, ok := r.Word.Parts[0].(*syntax.ProcSubst); ok {
			return // > >(cmd): a pipe to a command, which the walk judges
		}
	}
	op := r.Op.String()
	ws := j.resolveWord(r.Word)
	if len(ws) == 0 || !ws[0].known {
		detail := fmt.Sprintf("the redirection %s %s goes to a file only known when the line runs; name the file literally", op, shorten(printNode(r.Word)))
		if write {
			j.opaque(Ask, RuleUnresolved, detail)
		} else {
			j.add(Ask, RuleUnresolved, detail)
		}
		return
	}
	// A word with several values (a brace or tilde expansion) is an "ambiguous redirect" in bash and a
	// literal file name in dash: judge every value.
	for _, w := range ws {
		if !w.glob {
			if p, err := ResolvePath(w.text); err == nil {
				if strings.HasPrefix(p, "/dev/tcp/") || strings.HasPrefix(p, "/dev/udp/") {
					j.add(Deny, RuleReverseShell, fmt.Sprintf("%s %s opens a network connection from the shell; this is how reverse shells work and is never allowed", op, w.text))
					return
				}
				if isHarmlessDevice(p) {
					continue
				}
			}
		}
		j.checkPathWord(w, write)
		if write {
			j.add(Ask, RuleRedirectWrite, fmt.Sprintf("%s %s writes a file; a person must approve it (leave out the redirection to just see the output)", op, w.text))
		}
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
func (j *judge) hereInput(s *syntax.Stmt, depth int) {
	_, dl := j.runsStdinScript(s)
	if dl == 0 {
		return
	}
	if content, ok := j.hereContent(s); ok {
		j.program(content, depth+1, dl)
	}
}

// runsStdinScript reports whether a command in the statement runs a script from the statement's
// standard input (sh, bash -s, python -), and the dialects of the shells among them whose script policy
// can judge.
func (j *judge) runsStdinScript(s *syntax.Stmt) (any bool, dl dialect) {
	syntax.Walk(s, func(n syntax.Node) bool {
		switch n := n.(type) {
		case *syntax.CmdSubst, *syntax.ProcSubst:
			return false
		case *syntax.CallExpr:
			if info := j.infos[n]; info != nil && info.stdinScript {
				any = true
				dl |= info.stdinDialect
			}
		}
		return true
	})
	return any, dl
}

// hereContent returns the text a statement's here-document or here-string feeds to standard input, when
// it is static.
func (j *judge) hereContent(s *syntax.Stmt) (string, bool) {
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
			ws := j.resolveWord(r.Word)
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
func (j *judge) pipeline(b *syntax.BinaryCmd, depth int) {
	stages := flattenPipeline(b)
	for k, st := range stages {
		any, dl := j.runsStdinScript(st)
		if !any {
			continue
		}
		for _, prev := range stages[:k] {
			if j.containsDownload(prev) {
				j.add(Deny, RuleDownloadToShell, "piping a download into an interpreter (curl ... | sh) runs code from the network unseen; download the file, read it, and run only what you have checked")
				break
			}
		}
		if k > 0 && dl != 0 {
			for _, content := range j.staticOutput(stages[k-1]) {
				j.program(content, depth+1, dl)
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

// staticOutput returns what a pipeline stage may write when policy can know it: echo or printf of literal
// words, or cat of a here-document. echo is read both as bash's (escapes kept) and as dash's or echo -e
// (escapes decoded).
func (j *judge) staticOutput(s *syntax.Stmt) []string {
	ce, ok := s.Cmd.(*syntax.CallExpr)
	if !ok || len(ce.Args) == 0 {
		return nil
	}
	var argv []string
	for _, a := range ce.Args {
		for _, w := range j.resolveWord(a) {
			if !w.known || w.glob {
				return nil
			}
			argv = append(argv, w.text)
		}
	}
	switch CommandBase(argv[0]) {
	case "echo":
		args := argv[1:]
		for len(args) > 0 && (args[0] == "-n" || args[0] == "-e" || args[0] == "-E") {
			args = args[1:]
		}
		raw := strings.Join(args, " ") + "\n"
		out := []string{raw}
		if decoded, _ := decodeEcho(raw); decoded != raw {
			out = append(out, decoded)
		}
		return out
	case "printf":
		if out, ok := printfOutput(argv[1:]); ok {
			return []string{out}
		}
	case "cat":
		if len(argv) == 1 {
			if c, ok := j.hereContent(s); ok {
				return []string{c}
			}
		}
	}
	return nil
}

// downloaders fetch data from the network (and so do netcats).
var downloaders = map[string]bool{
	"curl": true, "wget": true, "fetch": true, "aria2c": true, "http": true, "https": true, "xh": true,
	"lwp-download": true, "lwp-request": true, "GET": true, "socat": true, "ftp": true, "tftp": true,
	"openssl": true,
}

// containsDownload reports whether a command under n downloads.
func (j *judge) containsDownload(n syntax.Node) bool {
	found := false
	syntax.Walk(n, func(n syntax.Node) bool {
		if ce, ok := n.(*syntax.CallExpr); ok {
			if info := j.infos[ce]; info != nil {
				for _, name := range info.names {
					found = found || downloaders[name] || netcats[name]
				}
			}
		}
		return !found
	})
	return found
}

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

// seenSet accumulates what a judge looked at.
type seenSet struct {
	programs map[string]bool
	writes   map[string]bool
	opaque   []string
}

func newSeenSet() seenSet {
	return seenSet{programs: map[string]bool{}, writes: map[string]bool{}}
}

func (s seenSet) result() Seen {
	out := Seen{Opaque: slices.Clone(s.opaque)}
	for p := range s.programs {
		out.Programs = append(out.Programs, p)
	}
	for w := range s.writes {
		out.Writes = append(out.Writes, w)
	}
	slices.Sort(out.Programs)
	slices.Sort(out.Writes)
	return out
}
