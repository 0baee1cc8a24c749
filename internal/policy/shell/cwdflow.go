package shell

import (
	"path"
	"slices"
	"strings"

	"mvdan.cc/sh/v3/syntax"
)

// Where each part of a line runs. cd, pushd and popd move the shell; a relative path means a different
// file afterwards. cwdFlow follows the line's control flow (lists, && and ||, if, loops, case, subshells,
// substitutions) and records, for every statement and simple command, the directories it may run in: a
// cd adds its target to where the shell may be (the old directory stays possible, so judging stays
// monotone), a loop runs its body until the set stops growing, a subshell's cd stays in it. What it cannot follow (a cd in a function body, eval or source,
// a target only known at run time) makes the place unknown from there on.

// dirState is where a point of a line may run: some directories, and whether it may also be somewhere
// only known at run time.
type dirState struct {
	dirs    []string
	unknown bool
}

func (s dirState) union(o dirState) dirState {
	out := dirState{dirs: slices.Clone(s.dirs), unknown: s.unknown || o.unknown}
	for _, d := range o.dirs {
		if !slices.Contains(out.dirs, d) {
			out.dirs = append(out.dirs, d)
		}
	}
	if len(out.dirs) > maxDirs {
		out.dirs, out.unknown = out.dirs[:maxDirs], true
	}
	return out
}

func (s dirState) equal(o dirState) bool {
	if s.unknown != o.unknown || len(s.dirs) != len(o.dirs) {
		return false
	}
	for _, d := range s.dirs {
		if !slices.Contains(o.dirs, d) {
			return false
		}
	}
	return true
}

// flowOut is where the shell is after a statement succeeded and after it failed.
type flowOut struct{ ok, fail dirState }

func both(s dirState) flowOut { return flowOut{s, s} }

func (o flowOut) any() dirState { return o.ok.union(o.fail) }

type cwdFlow struct {
	j      *judge
	at     map[syntax.Node]dirState
	seen   dirState // every place the line has been: where popd and cd - may return
	funcs  []*syntax.FuncDecl
	funcCd bool // a function body moves the shell: after any call, the place is unknown
}

// flowDirs computes where every statement and simple command of f may run, starting in.
func (j *judge) flowDirs(f *syntax.File, in dirState) map[syntax.Node]dirState {
	c := &cwdFlow{j: j, at: map[syntax.Node]dirState{}, seen: in}
	c.stmts(f.Stmts, in)
	for _, fd := range c.funcs {
		// A function runs wherever it is called: judge its body wherever the line has been.
		if out := c.stmt(fd.Body, c.seen); !out.any().equal(c.seen) {
			c.funcCd = true
		}
	}
	if c.funcCd {
		for n, s := range c.at {
			s.unknown = true
			c.at[n] = s
		}
	}
	return c.at
}

func (c *cwdFlow) record(n syntax.Node, in dirState) {
	if cur, ok := c.at[n]; ok {
		c.at[n] = cur.union(in)
	} else {
		c.at[n] = in
	}
	c.seen = c.seen.union(in)
}

func (c *cwdFlow) stmts(list []*syntax.Stmt, in dirState) flowOut {
	out := both(in)
	cur := in
	for _, s := range list {
		out = c.stmt(s, cur)
		cur = out.any()
	}
	return out
}

func (c *cwdFlow) stmt(s *syntax.Stmt, in dirState) flowOut {
	if s == nil {
		return both(in)
	}
	c.record(s, in)
	for _, r := range s.Redirs {
		if r.Word != nil {
			c.substs(r.Word, in)
		}
		if r.Hdoc != nil {
			c.substs(r.Hdoc, in)
		}
	}
	if s.Background || s.Coprocess {
		c.cmd(s.Cmd, in)
		return both(in)
	}
	out := c.cmd(s.Cmd, in)
	if s.Negated {
		out.ok, out.fail = out.fail, out.ok
	}
	return out
}

func (c *cwdFlow) cmd(n syntax.Command, in dirState) flowOut {
	switch n := n.(type) {
	case nil:
		return both(in)
	case *syntax.CallExpr:
		c.record(n, in)
		c.substs(n, in)
		return c.call(n, in)
	case *syntax.Block:
		return c.stmts(n.Stmts, in)
	case *syntax.Subshell:
		c.stmts(n.Stmts, in)
		return both(in)
	case *syntax.BinaryCmd:
		switch n.Op {
		case syntax.AndStmt:
			x := c.stmt(n.X, in)
			y := c.stmt(n.Y, x.ok)
			return flowOut{y.ok, x.fail.union(y.fail)}
		case syntax.OrStmt:
			x := c.stmt(n.X, in)
			y := c.stmt(n.Y, x.fail)
			return flowOut{x.ok.union(y.ok), y.fail}
		default: // a pipeline: every stage in a subshell, the last one in the shell with lastpipe
			c.stmt(n.X, in)
			y := c.stmt(n.Y, in)
			return flowOut{in.union(y.ok), in.union(y.fail)}
		}
	case *syntax.IfClause:
		if len(n.Cond) == 0 { // else
			return c.stmts(n.Then, in)
		}
		cond := c.stmts(n.Cond, in)
		then := c.stmts(n.Then, cond.ok)
		els := both(cond.fail)
		if n.Else != nil {
			els = c.cmd(n.Else, cond.fail)
		}
		return flowOut{then.ok.union(els.ok), then.fail.union(els.fail)}
	case *syntax.WhileClause:
		return c.loop(in, func(s dirState) dirState {
			cond := c.stmts(n.Cond, s)
			enter := cond.ok
			if n.Until {
				enter = cond.fail
			}
			return cond.any().union(c.stmts(n.Do, enter).any())
		})
	case *syntax.ForClause:
		c.substs(n.Loop, in)
		return c.loop(in, func(s dirState) dirState { return c.stmts(n.Do, s).any() })
	case *syntax.CaseClause:
		c.substs(n.Word, in)
		out := in
		for _, it := range n.Items {
			for _, p := range it.Patterns {
				c.substs(p, in)
			}
			out = out.union(c.stmts(it.Stmts, in).any())
		}
		return both(out)
	case *syntax.FuncDecl:
		c.funcs = append(c.funcs, n)
		return both(in)
	case *syntax.TimeClause:
		return c.stmt(n.Stmt, in)
	case *syntax.CoprocClause:
		c.stmt(n.Stmt, in)
		return both(in)
	default: // declarations, let, (( )), [[ ]]: substitutions in them run in subshells
		c.substs(n, in)
		return both(in)
	}
}

// loop runs body from in until the set of places stops growing; a loop that keeps moving the shell
// (cd .. in a while loop) ends somewhere unknown.
func (c *cwdFlow) loop(in dirState, body func(dirState) dirState) flowOut {
	s := in
	for range 4 {
		next := s.union(body(s))
		if next.equal(s) {
			return both(s)
		}
		s = next
	}
	s.unknown = true
	body(s)
	return both(s)
}

// substs follows the command and process substitutions in n: they run in subshells, where they are.
func (c *cwdFlow) substs(n syntax.Node, in dirState) {
	syntax.Walk(n, func(m syntax.Node) bool {
		switch m := m.(type) {
		case *syntax.CmdSubst:
			c.stmts(m.Stmts, in)
			return false
		case *syntax.ProcSubst:
			c.stmts(m.Stmts, in)
			return false
		}
		return true
	})
}

// call is where a simple command leaves the shell: cd, pushd and popd move it (through builtin and
// command too), eval and source may, and a call of a function that moves it is handled by flowDirs.
func (c *cwdFlow) call(ce *syntax.CallExpr, in dirState) flowOut {
	var argv []word
	for _, a := range ce.Args {
		argv = append(argv, c.j.resolveWord(a)...)
	}
	for len(argv) > 0 && argv[0].known && (argv[0].text == "builtin" || argv[0].text == "command") {
		argv = argv[1:]
	}
	if len(argv) == 0 || !argv[0].known {
		return both(in)
	}
	switch name := argv[0].text; name {
	case "cd", "pushd", "popd":
		// Where the shell was stays possible even after a cd that succeeded: a command is then never judged
		// more leniently after a cd than alone, so "A && B" is never more lenient than B.
		return both(c.cd(name, argv[1:], in).union(in))
	case "eval", "source", ".":
		out := in
		out.unknown = out.unknown || c.mayMove(argv[1:], name != "eval")
		return both(out)
	}
	return both(in)
}

// mayMove reports whether code run in the shell itself (eval's words, a sourced file) may move it.
func (c *cwdFlow) mayMove(args []word, file bool) bool {
	if file {
		return true // a sourced file's content is unknown
	}
	for _, a := range args {
		if !a.known || strings.Contains(a.text, "cd") || strings.Contains(a.text, "pushd") || strings.Contains(a.text, "popd") {
			return true
		}
	}
	return false
}

func (c *cwdFlow) cd(name string, args []word, in dirState) dirState {
	var target *word
	for i := range args {
		w := args[i]
		if w.known && w.text == "--" {
			if i+1 < len(args) {
				target = &args[i+1]
			}
			break
		}
		if w.known && len(w.text) > 1 && strings.HasPrefix(w.text, "-") && !(name != "cd" && strings.Trim(w.text[1:], "0123456789") == "") {
			continue // options
		}
		target = &args[i]
		break
	}
	switch {
	case name == "popd" || target != nil && target.known && (target.text == "-" || name == "pushd" && len(target.text) > 1 && strings.Trim(target.text[1:], "0123456789") == "" && strings.ContainsAny(target.text[:1], "+-")):
		if c.j.stackSet {
			return dirState{unknown: true} // the line rewrote $OLDPWD or the directory stack
		}
		return c.seen.union(in) // back to somewhere the line has been
	case target == nil:
		if name == "pushd" {
			return c.seen.union(in) // swaps the top two
		}
		return dirState{dirs: slices.Clone(homeDirs)}
	case !target.known || target.glob || target.tainted:
		return dirState{unknown: true}
	}
	t := target.text
	if strings.HasPrefix(t, "/") {
		return dirState{dirs: []string{path.Clean(t)}}
	}
	if t == "~" || strings.HasPrefix(t, "~/") {
		var out dirState
		for _, h := range homeDirs {
			out.dirs = append(out.dirs, path.Clean(h+t[1:]))
		}
		return out
	}
	out := dirState{unknown: in.unknown || c.j.cdpath}
	for _, d := range in.dirs {
		out = out.union(dirState{dirs: []string{path.Join(d, t)}})
	}
	return out
}
