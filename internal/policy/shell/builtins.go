package shell

import (
	"fmt"
	"slices"
	"strings"
)

// Shell builtins that evaluate strings or subscripts as code, change what later command names run,
// write files, or move the working directory.

// bashOnly are names that bash runs as builtins or keywords and dash runs as programs that do not exist:
// in the POSIX reading of a line they run nothing.
var bashOnly = map[string]bool{
	"[[": true, "]]": true, "declare": true, "typeset": true, "let": true, "source": true, "shopt": true,
	"function": true, "select": true, "coproc": true, "mapfile": true, "readarray": true, "disown": true,
	"enable": true, "caller": true, "compgen": true, "complete": true, "compopt": true, "bind": true,
	"dirs": true, "pushd": true, "popd": true, "suspend": true, "help": true, "history": true, "logout": true,
	"builtin": true, "fc": true,
}

// safeShopts are shopt options that change nothing policy relies on: globs are judged as if dotglob,
// nocaseglob and globstar were on, and echo's escapes both ways.
var safeShopts = map[string]bool{
	"nullglob": true, "failglob": true, "globstar": true, "dotglob": true, "nocaseglob": true,
	"nocasematch": true, "extglob": true, "lastpipe": true, "inherit_errexit": true, "globasciiranges": true,
	"checkwinsize": true, "xpg_echo": true, "pipefail": true, "errexit": true, "nounset": true, "xtrace": true,
	"noglob": true, "noclobber": true, "errtrace": true, "functrace": true, "verbose": true, "allexport": true,
}

// searchPathVars are the variables whose removal changes which program a later command name runs.
var searchPathVars = map[string]bool{"PATH": true}

// builtin judges the builtins that need more than their argument paths checked. It reports whether it
// judged the command completely.
func (j *judge) builtin(name string, argv []word, depth int, info *callInfo) bool {
	args := argv[1:]
	switch name {
	case "set":
		j.set(args)
		return true
	case "shopt":
		j.shopt(args)
		return true
	case "trap":
		j.trap(args, depth, info)
		return true
	case "alias":
		j.alias(args, depth, info)
		return true
	case "hash":
		for i := 0; i < len(args); i++ {
			if args[i].known && args[i].text == "-p" && i+1 < len(args) {
				j.opaque(Ask, RuleUnresolved, fmt.Sprintf("`hash -p %s` makes a later command name run that program; call it by its name", args[i+1].show()))
				j.command(args[i+1:i+2], depth, 1, info, false)
				i++
			}
		}
		return true
	case "enable":
		for _, a := range args {
			if !a.known || !slices.Contains([]string{"-a", "-p", "-s"}, a.text) {
				j.opaque(Ask, RuleUnresolved, "`enable` turns builtins on or off or loads them from a file, which changes what later command names run; leave it out")
				break
			}
		}
		return true
	case "compgen", "complete", "compopt":
		for i := 0; i < len(args); i++ {
			if args[i].known && (args[i].text == "-C" || args[i].text == "-F") && i+1 < len(args) {
				if args[i].text == "-C" {
					j.shellString(args[i+1], name+" -C", depth, info, dialectBash)
				}
				j.opaque(Ask, RuleUnresolved, fmt.Sprintf("`%s %s` runs a command or function to complete words; a person must approve it", name, args[i].text))
				i++
			}
		}
		return true
	case "history":
		for _, a := range args {
			if a.known && strings.HasPrefix(a.text, "-") && strings.ContainsAny(a.text, "awrn") {
				j.add(Ask, RuleDangerousFlags, fmt.Sprintf("`history %s` reads or writes the history file; a person must approve it", a.text))
				if slices.ContainsFunc(args, func(w word) bool { return !strings.HasPrefix(w.text, "-") }) {
					for _, w := range args {
						if !strings.HasPrefix(w.text, "-") {
							j.checkPathWord(w, true)
						}
					}
				} else {
					j.checkPathText("~/.bash_history", true)
				}
				break
			}
		}
		return true
	case "fc", "bind":
		j.opaque(Ask, RuleUnresolved, fmt.Sprintf("`%s` runs commands from the history or an editor, or binds keys to commands; a person must approve it", name))
		return true
	case "unset":
		funcs := false
		for _, a := range args {
			switch {
			case a.known && (a.text == "-f"):
				funcs = true
			case a.known && strings.HasPrefix(a.text, "-"):
			case funcs:
			case a.known && searchPathVars[a.text]:
				j.opaque(Ask, RuleUnresolved, fmt.Sprintf("`unset %s` changes where the shell looks for later commands (without PATH, in the working directory: a workspace's own `ls` would run); leave it set", a.text))
			default:
				j.varRef("unset", a)
			}
		}
		return true
	case "read":
		j.readVars(args)
		return true
	case "mapfile", "readarray":
		j.mapfile(name, args, depth, info)
		return true
	case "getopts":
		if len(args) > 1 {
			j.varRef("getopts", args[1])
		}
		return true
	case "wait":
		for i := 0; i < len(args); i++ {
			if t := args[i].text; args[i].known && strings.HasPrefix(t, "-") && strings.Contains(t, "p") {
				if rest := t[strings.IndexByte(t, 'p')+1:]; rest != "" {
					j.varRef("wait -p", literalWord(rest))
				} else if i+1 < len(args) {
					i++
					j.varRef("wait -p", args[i])
				}
			}
		}
		return true
	case "cd", "pushd", "popd":
		j.cd(name, args)
		return true
	}
	return false
}

// varRef asks unless w names a variable without evaluating code (a name, or a name with a subscript of
// digits).
func (j *judge) varRef(who string, w word) {
	if w.known && !w.tainted && isVarRef(w.text) {
		return
	}
	j.opaque(Ask, RuleUnresolved, fmt.Sprintf("`%s %s` evaluates a subscript (or a name only known at run time) as code; use a plain variable name", who, shorten(w.show())))
}

func (j *judge) set(args []word) {
	for i, w := range args {
		t := w.text
		if !w.known || t == "--" || t == "-" {
			if t == "--" || t == "-" {
				return // positional parameters follow
			}
			continue
		}
		if len(t) > 1 && (t[0] == '-' || t[0] == '+') {
			if t == "-o" || t == "+o" {
				if i+1 < len(args) {
					switch args[i+1].text {
					case "keyword":
						j.opaque(Ask, RuleDangerousFlags, "`set -k` turns arguments that look like assignments into environment variables, which policy cannot follow; leave it out")
					case "history", "histexpand":
						j.opaque(Ask, RuleDangerousFlags, "history expansion rewrites later lines from the history, which policy cannot follow; leave it out")
					}
				}
				continue
			}
			if strings.ContainsRune(t[1:], 'k') {
				j.opaque(Ask, RuleDangerousFlags, "`set -k` turns arguments that look like assignments into environment variables, which policy cannot follow; leave it out")
			}
			if strings.ContainsRune(t[1:], 'H') && t[0] == '-' {
				j.opaque(Ask, RuleDangerousFlags, "`set -H` turns on history expansion, which rewrites later lines from the history; leave it out")
			}
			continue
		}
		return // positional parameters
	}
}

func (j *judge) shopt(args []word) {
	for _, w := range args {
		if !w.known {
			j.opaque(Ask, RuleUnresolved, "shopt sets an option only known when the line runs")
			return
		}
		if strings.HasPrefix(w.text, "-") || safeShopts[w.text] {
			continue
		}
		j.opaque(Ask, RuleUnresolved, fmt.Sprintf("`shopt %s` changes how bash reads and runs later lines (aliases, debugging traps, echo), which policy cannot follow; leave it out", w.text))
		return
	}
}

// trap judges trap's command string: trap [-lp] [--] [ARG SIGNAL...].
func (j *judge) trap(args []word, depth int, info *callInfo) {
	for len(args) > 0 && args[0].known && (args[0].text == "-l" || args[0].text == "-p") {
		return // lists, sets nothing
	}
	if len(args) > 0 && args[0].known && args[0].text == "--" {
		args = args[1:]
	}
	if len(args) < 2 {
		return // a lone operand is a signal to reset
	}
	if args[0].known && (args[0].text == "-" || args[0].text == "") {
		return
	}
	j.shellString(args[0], "trap", depth, info, j.dialect)
}

// alias judges the value of each alias definition as the code it becomes wherever its name is used
// later (dash expands aliases in every shell, bash with expand_aliases).
func (j *judge) alias(args []word, depth int, info *callInfo) {
	for _, a := range args {
		if a.known && strings.HasPrefix(a.text, "-") {
			continue
		}
		_, value, def := strings.Cut(a.text, "=")
		if a.known && !def {
			continue // prints an alias
		}
		j.opaque(Ask, RuleUnresolved, fmt.Sprintf("`alias %s` changes what a later command name runs; call the commands directly", shorten(a.show())))
		if !a.known || a.tainted {
			continue
		}
		j.shellString(literalWord(value), "alias", depth, info, j.dialect)
	}
}

// optionValues walks a builtin's arguments: for each short option among valued it calls onValue with
// the option and its value (attached or the next word), and it calls onOperand for every operand (and
// for everything after "--").
func optionValues(args []word, valued string, onValue func(opt byte, v word), onOperand func(w word)) {
	for i := 0; i < len(args); i++ {
		w := args[i]
		if w.known && w.text == "--" {
			for _, o := range args[i+1:] {
				onOperand(o)
			}
			return
		}
		if !w.known || !strings.HasPrefix(w.text, "-") || len(w.text) < 2 {
			onOperand(w)
			continue
		}
		t := w.text
		for k := 1; k < len(t); k++ {
			if strings.IndexByte(valued, t[k]) < 0 {
				continue
			}
			v := word{}
			if k+1 < len(t) {
				v = literalWord(t[k+1:])
			} else if i+1 < len(args) {
				i++
				v = args[i]
			}
			onValue(t[k], v)
			break
		}
	}
}

// readVars checks the variables read assigns: read [-ers] [-a ARRAY] [-d D] [-i T] [-n N] [-N N] [-p P]
// [-t T] [-u FD] [NAME...].
func (j *judge) readVars(args []word) {
	optionValues(args, "adinNptu", func(opt byte, v word) {
		if opt == 'a' {
			j.varRef("read -a", v)
		}
	}, func(w word) { j.varRef("read", w) })
}

// mapfile checks mapfile's array name and judges its callback: mapfile [-d D] [-n N] [-O ORIGIN] [-s N]
// [-t] [-u FD] [-C CALLBACK] [-c N] [ARRAY].
func (j *judge) mapfile(name string, args []word, depth int, info *callInfo) {
	optionValues(args, "dnOsuCc", func(opt byte, v word) {
		if opt == 'C' {
			j.opaque(Ask, RuleUnresolved, fmt.Sprintf("`%s -C` runs a callback as code for every chunk of lines; a person must approve it", name))
			j.shellString(v, name+" -C", depth, info, dialectBash)
		}
	}, func(w word) { j.varRef(name, w) })
}

// cd judges the target of cd and pushd as a directory read; where the shell goes is cwdFlow's.
func (j *judge) cd(name string, args []word) {
	for i, w := range args {
		switch {
		case w.known && w.text == "--":
			if i+1 < len(args) {
				j.checkPathWord(args[i+1], false)
			}
			return
		case w.known && (len(w.text) > 1 && (strings.HasPrefix(w.text, "-") || strings.HasPrefix(w.text, "+")) || w.text == "-"):
			continue
		case name != "popd":
			j.checkPathWord(w, false)
			return
		}
	}
}

// addDir widens the directories of the command being judged by one it moves into for itself (env -C,
// git -C, go -C, make -C, tar -C).
func (j *judge) addDir(w word) {
	if !w.known || w.glob || w.tainted {
		j.dirUnknown = true
		return
	}
	paths, unknownBase := j.resolve(w.text)
	j.dirUnknown = j.dirUnknown || unknownBase
	for _, p := range paths {
		if !slices.Contains(j.dirs, p) {
			j.dirs = append(slices.Clone(j.dirs), p)
		}
	}
}

// chdirOptions finds the directory options of make and tar (-C DIR, --directory=DIR).
func (j *judge) chdirOptions(argv []word) {
	for i := 1; i < len(argv); i++ {
		w := argv[i]
		if !w.known {
			continue
		}
		t := w.text
		var dir word
		switch {
		case t == "-C" || t == "--directory" || t == "--dir":
			if i+1 >= len(argv) {
				return
			}
			i++
			dir = argv[i]
		case strings.HasPrefix(t, "--directory="):
			dir = literalWord(strings.TrimPrefix(t, "--directory="))
		case strings.HasPrefix(t, "-C") && len(t) > 2:
			dir = literalWord(t[2:])
		default:
			continue
		}
		j.checkPathWord(dir, false)
		j.addDir(dir)
	}
}
