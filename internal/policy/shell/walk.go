package shell

import (
	"fmt"
	"strings"

	"mvdan.cc/sh/v3/syntax"
)

// Walking the syntax tree: every node of a parsed program is visited and judged where it sits, then the
// checks that need the whole tree (pipelines, here-documents, code words) run.

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
	if v, known := j.assignedValue(a); a.Name != nil && injectionSetting(a.Name.Value, v, known) {
		j.opaque(Ask, RuleInjectionEnv, fmt.Sprintf("setting %s can make programs load or run other code; leave it unset", a.Name.Value))
	}
	if a.Name != nil && a.Value != nil {
		for _, w := range j.resolveWord(a.Value) {
			if w.known && !w.glob {
				j.checkEnvValue(a.Name.Value, w.text)
			}
		}
	}
	if a.Index != nil {
		j.arith(a.Index)
	}
}

// assignedValue returns an assignment's value and whether it is known before the line runs.
func (j *judge) assignedValue(a *syntax.Assign) (string, bool) {
	if a.Value == nil {
		return "", a.Array == nil && !a.Append
	}
	ws := j.resolveWord(a.Value)
	if len(ws) != 1 || !ws[0].known || ws[0].glob || a.Append || a.Array != nil {
		return "", false
	}
	return ws[0].text, true
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
			name, value, hasValue := strings.Cut(t, "=")
			if !isIdentifier(name) {
				j.opaque(Ask, RuleUnresolved, fmt.Sprintf("%s %q is not a plain variable name; a subscript there is evaluated as code", d.Variant.Value, t))
			} else if injectionSetting(name, value, hasValue) {
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
