package policy

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
func (j *shellJudge) command(argv []word, depth, unwrap int, info *callInfo, runtimeArgs bool) {
	if len(argv) == 0 {
		return
	}
	j.steps++
	if j.steps > maxSteps || unwrap > maxUnwrap {
		j.blind(Ask, RuleUnresolved, "the line wraps or nests commands too deeply for policy to follow; a person must approve it")
		if argv[0].known && !argv[0].glob {
			f, _ := j.ruleFinding(ruleWords(commandBase(argv[0].text), argv))
			j.v.add(f) // still deny what a rule denies
		}
		return
	}
	first := argv[0]
	if !first.known || first.glob || first.tainted {
		j.opaque(Ask, RuleUnresolved, fmt.Sprintf("the command name %s is only known when the line runs (a variable, substitution, glob or input); write the program's name literally", shorten(first.show())))
		return
	}
	name := commandBase(first.text)
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

// ruleFinding is the layers' verdict on argv from their command rules, or from their action for the
// tool when no rule of a layer names it. listed reports whether any layer has a rule for it.
func (j *shellJudge) ruleFinding(argv []string) (f finding, listed bool) {
	v := j.env.newVerdict()
	for _, l := range j.env.layers {
		if rf, ok := l.commandOpinion(argv); ok {
			v.add(rf)
			listed = true
			continue
		}
		if a, _, why, ok := l.toolAction(j.env.tool, j.env.kind); ok {
			v.add(unlistedFinding(a, l.origin, why, argv))
		}
	}
	if !v.set {
		v.add(finding{action: Ask, rule: RuleDefault, detail: fmt.Sprintf("`%s` is on no command list and no policy sets an action for %s, so a person must approve it", showArgv(argv), j.env.tool)})
	}
	return j.env.approved(v.best, argv), listed
}

func unlistedFinding(a Action, origin, why string, argv []string) finding {
	rule := RuleToolAction
	switch {
	case strings.HasPrefix(why, "sets tools of kind"):
		rule = RuleKindAction
	case strings.HasPrefix(why, "sets its default"):
		rule = RuleDefault
	}
	var detail string
	switch a {
	case Allow:
		detail = fmt.Sprintf("`%s` is on no command list; %s %s", showArgv(argv), origin, why)
	case Ask:
		detail = fmt.Sprintf("`%s` is on no command list; %s %s, so a person must approve it (commands on an allow list need no approval)", showArgv(argv), origin, why)
	default:
		detail = fmt.Sprintf("`%s` is on no command list; %s %s, so only listed commands run", showArgv(argv), origin, why)
	}
	return finding{action: a, rule: rule, detail: detail}
}

// showArgv names a command for a message: the program and, when it looks like a subcommand, the next
// word.
func showArgv(argv []string) string {
	if len(argv) > 1 && argv[1] != "\x00" && !strings.HasPrefix(argv[1], "-") && len(argv[1]) <= 24 && !strings.ContainsAny(argv[1], "/.=") {
		return argv[0] + " " + argv[1]
	}
	return argv[0]
}

// commandOpinion is a layer's longest matching command rule (the strictest among equally long ones).
func (l *layer) commandOpinion(argv []string) (finding, bool) {
	best := -1
	var bf finding
	for _, r := range l.commands {
		for _, p := range r.prefixes {
			if !hasPrefix(argv, p) {
				continue
			}
			if len(p) > best || len(p) == best && r.action.rank() > bf.action.rank() {
				best = len(p)
				bf = finding{action: r.action, rule: r.name, detail: ruleDetail(r, p)}
			}
		}
	}
	return bf, best >= 0
}

func ruleDetail(r commandRule, prefix []string) string {
	what := "`" + strings.Join(prefix, " ") + "` "
	if r.reason != "" {
		return what + r.reason
	}
	switch r.action {
	case Allow:
		return what + "is allowed"
	case Ask:
		return what + "needs a person's approval"
	default:
		return what + "is not allowed"
	}
}

// plain judges a program that is neither a shell nor a wrapper.
func (j *shellJudge) plain(name string, argv []word, ruleArgv []string, depth, unwrap int, info *callInfo, runtimeArgs bool) {
	f, _ := j.ruleFinding(ruleArgv)
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
func (j *shellJudge) interpreter(argv []word, info *callInfo) {
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
func (j *shellJudge) insensitive(name string, argv []word) {
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
