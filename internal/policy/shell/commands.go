package shell

import (
	"fmt"
	"path"
	"strings"
)

// This file and programs.go and wrappers.go are policy's knowledge of programs: which ones wrap other
// commands and how their options read, which ones run code from strings, which of their flags write
// files or run programs, and which of their arguments are paths. This file judges one simple command.

// command judges one simple command after static expansion; argv[0] names the program. unwrap counts
// the wrappers around it, runtimeArgs says a wrapper (xargs, find -exec) adds arguments at run time.
func (j *judge) command(argv []word, depth, unwrap int, info *callInfo, runtimeArgs bool) {
	if len(argv) == 0 {
		return
	}
	j.steps++
	if j.steps > maxSteps || unwrap > maxUnwrap {
		j.blind(Ask, RuleUnresolved, "the line wraps or nests commands too deeply for policy to follow; a person must approve it")
		if argv[0].known && !argv[0].glob {
			f, _ := j.rules.Command(ruleWords(CommandBase(argv[0].text), argv))
			j.v.add(f) // still deny what a rule denies
		}
		return
	}
	first := argv[0]
	if !first.known || first.glob || first.tainted {
		j.opaque(Ask, RuleUnresolved, fmt.Sprintf("the command name %s is only known when the line runs (a variable, substitution, glob or input); write the program's name literally", shorten(first.show())))
		return
	}
	name := CommandBase(first.text)
	if name == "" {
		j.add(Ask, RuleUnresolved, fmt.Sprintf("%s is not a program name", shorten(first.text)))
		return
	}
	info.names = append(info.names, name)
	j.seen.programs[name] = true
	if j.dialect == dialectPOSIX && bashOnly[name] && !strings.Contains(first.text, "/") {
		return // dash has no such builtin and no program has the name: "not found", nothing runs
	}
	if strings.Contains(first.text, "/") && !systemBinDirs[path.Dir(path.Clean(first.text))] {
		j.opaque(Ask, RuleUnresolved, fmt.Sprintf("%s runs a program from %s, not the system's %s; a person must approve it", first.text, path.Dir(first.text), name))
	}
	ruleArgv := ruleWords(name, argv)
	switch {
	case shells[name]:
		j.shell(name, argv, ruleArgv, depth, info)
	case wrappers[name] != nil:
		j.wrapper(name, argv, ruleArgv, depth, unwrap, info, runtimeArgs)
	case genericWrappers[name]:
		j.genericWrapper(name, argv, ruleArgv, depth, unwrap, info)
	case name == "eval":
		j.eval(argv, ruleArgv, depth, info)
	case name == "source" || name == ".":
		j.source(name, argv, ruleArgv, info)
	default:
		j.plain(name, argv, ruleArgv, depth, unwrap, info, runtimeArgs)
	}
}

// ruleWords is the argv that command rules match: the program's base name, then the literal words (a word
// only known at run time matches nothing). For git, the global options before the subcommand are left
// out, so "git diff" matches `git --no-pager diff`; the dangerous ones are judged separately.
func ruleWords(name string, argv []word) []string {
	start := 1
	if name == "git" {
		start = gitSubcommand(argv)
	}
	out := []string{name}
	for _, w := range argv[start:] {
		if w.known {
			out = append(out, w.text)
		} else {
			out = append(out, "\x00")
		}
	}
	return out
}

// plain judges a program that is neither a shell nor a wrapper.
func (j *judge) plain(name string, argv []word, ruleArgv []string, depth, unwrap int, info *callInfo, runtimeArgs bool) {
	f, _ := j.rules.Command(ruleArgv)
	j.v.add(f)
	if isInterpreter(name) {
		j.interpreter(argv, info)
	}
	if j.builtin(name, argv, depth, info) {
		return
	}
	spec := argSpecs[name]
	if spec.insensitive {
		j.insensitive(name, argv)
		return
	}
	for _, w := range argv[1:] {
		if !w.known || w.tainted {
			j.add(Ask, RuleUnresolved, fmt.Sprintf("the argument %s of %s is only known when the line runs, so policy cannot check what it reads or writes; write it literally", shorten(w.show()), name))
			break
		}
	}
	if runtimeArgs {
		j.add(Ask, RuleUnresolved, fmt.Sprintf("%s gets arguments only known when the line runs (from xargs or find -exec), so policy cannot check which files it touches", name))
	}
	switch name {
	case "find":
		j.find(argv, depth, unwrap, info)
		return
	case "git":
		j.git(argv)
		return
	case "go":
		j.goCommand(argv, depth, unwrap, info)
		return
	case "dd":
		j.dd(argv)
		return
	case "rm":
		j.rm(argv)
	case "chmod":
		for _, w := range argv[1:] {
			if w.known && worldWritableMode(w.text) {
				j.add(Deny, RuleWorldWritable, fmt.Sprintf("`chmod %s` makes files writable by every user; use a mode such as 755, 644 or u+w", w.text))
			}
		}
	case "socat":
		for _, w := range argv[1:] {
			if l := strings.ToLower(w.text); w.known && (strings.Contains(l, "exec:") || strings.Contains(l, "system:")) {
				j.add(Deny, RuleReverseShell, fmt.Sprintf("`socat %s` connects a program to the network; this is how reverse shells work and is never allowed", w.text))
			}
		}
	case "make", "gmake", "tar":
		j.chdirOptions(argv)
	}
	if netcats[name] {
		j.netcat(name, argv)
	}
	positionals := j.argPaths(argv, spec)
	if name == "uniq" && len(positionals) > 1 {
		j.add(Ask, RuleDangerousFlags, fmt.Sprintf("`uniq %s %s` writes its output to %s; a person must approve it", positionals[0].show(), positionals[1].show(), positionals[1].show()))
	}
}

// interpreter notes code that an interpreter (python, perl, node...) takes from a string or from its
// standard input, for the download checks.
func (j *judge) interpreter(argv []word, info *callInfo) {
	positional := false
	for i := 1; i < len(argv); i++ {
		t := argv[i].text
		switch {
		case !argv[i].known:
			positional = true
		case t == "-":
			info.stdinScript = true
			return
		case t == "-c" || t == "-e" || t == "-E" || t == "-r" || t == "--eval" || t == "-p" || t == "--print":
			if i+1 < len(argv) && argv[i+1].src != nil {
				info.codeWords = append(info.codeWords, argv[i+1].src)
			}
			return
		case t == "-m":
			return
		case !strings.HasPrefix(t, "-"):
			positional = true
		}
		if positional {
			if argv[i].src != nil {
				info.codeWords = append(info.codeWords, argv[i].src)
			}
			return
		}
	}
	info.stdinScript = true
}

func isInterpreter(name string) bool {
	for _, p := range []string{"python", "perl", "ruby", "php", "lua"} {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	switch name {
	case "node", "nodejs", "deno", "bun", "tclsh", "pwsh", "Rscript", "irb", "jshell", "osascript", "guile", "racket":
		return true
	}
	return false
}

// insensitive checks the few dangerous uses of programs whose arguments are otherwise just strings.
func (j *judge) insensitive(name string, argv []word) {
	switch name {
	case "printf":
		// Only the first argument can be -v NAME (or -vNAME).
		if len(argv) < 2 || !argv[1].known || !strings.HasPrefix(argv[1].text, "-v") {
			return
		}
		target, known := strings.TrimPrefix(argv[1].text, "-v"), true
		if target == "" && len(argv) > 2 {
			target, known = argv[2].text, argv[2].known
		}
		if !known || !isIdentifier(target) || injectionVar(target) {
			j.opaque(Ask, RuleUnresolved, fmt.Sprintf("printf -v %s assigns to a name that can run code (a subscript) or change how programs run; assign to a plain variable", shorten(target)))
		}
	case "test", "[":
		for i := 1; i+1 < len(argv); i++ {
			if argv[i].known && argv[i].text == "-v" && (!argv[i+1].known || strings.Contains(argv[i+1].text, "[")) {
				j.opaque(Ask, RuleUnresolved, "test -v name[...] evaluates the subscript as code; test a plain variable name")
			}
		}
	}
}

// CommandBase names a program the way rules do: /usr/bin/rm and ./rm are rm.
func CommandBase(name string) string {
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
