package shell

import (
	"fmt"
	"slices"
	"strings"

	"mvdan.cc/sh/v3/syntax"
)

// Programs that run other programs or code: shells, eval and source, and wrappers such as env, nice,
// timeout and xargs.

// shells run shell code: from -c, from a script file, or from standard input.
var shells = map[string]bool{
	"sh": true, "bash": true, "dash": true, "zsh": true, "ksh": true, "mksh": true, "ash": true, "yash": true,
	"posh": true, "rbash": true, "lksh": true, "oksh": true, "pdksh": true, "ksh93": true, "fish": true,
	"csh": true, "tcsh": true,
}

// shellDialects are the dialects a shell program reads; shells not listed read roughly bash (ksh, zsh) or
// are judged as both.
var shellDialects = map[string]dialect{
	"sh": dialectsSh, "dash": dialectPOSIX, "ash": dialectPOSIX, "posh": dialectPOSIX, "bash": dialectBash,
	"rbash": dialectBash,
}

func dialectOf(shell string) dialect {
	if d, ok := shellDialects[shell]; ok {
		return d
	}
	return dialectsSh
}

func (j *judge) shell(name string, argv []word, ruleArgv []string, depth int, info *callInfo) {
	if f, listed := j.rules.Command(ruleArgv); listed {
		j.v.add(f)
	}
	if name == "zsh" {
		j.add(Ask, RuleDangerousFlags, "zsh always runs the startup file ~/.zshenv from the workspace; use sh -c or bash -c")
	}
	hasC, stdin := false, false
	i := 1
loop:
	for ; i < len(argv); i++ {
		a := argv[i]
		if !a.known {
			if hasC {
				break loop // the command string
			}
			if a.src != nil {
				info.codeWords = append(info.codeWords, a.src)
			}
			j.opaque(Ask, RuleUnresolved, fmt.Sprintf("the argument %s of %s is only known when the line runs", shorten(a.show()), name))
			return
		}
		t := a.text
		switch {
		case t == "--" || t == "-":
			i++
			break loop
		case strings.HasPrefix(t, "--"):
			switch t {
			case "--rcfile", "--init-file":
				j.opaque(Ask, RuleDangerousFlags, fmt.Sprintf("`%s %s` runs a startup file; leave it out", name, t))
				i++
			case "--login", "--debugger":
				j.opaque(Ask, RuleDangerousFlags, fmt.Sprintf("`%s %s` runs startup files; leave it out", name, t))
			case "--dump-strings", "--dump-po-strings":
				j.add(Ask, RuleDangerousFlags, fmt.Sprintf("`%s %s` lists translatable strings instead of running the script", name, t))
			}
		case len(t) > 1 && (t[0] == '-' || t[0] == '+'):
			for k := 1; k < len(t); k++ {
				switch t[k] {
				case 'c':
					hasC = true
				case 's':
					stdin = true
				case 'i', 'l':
					j.opaque(Ask, RuleDangerousFlags, fmt.Sprintf("`%s %s` runs the startup files in the workspace; leave out -i and -l", name, t))
				case 'o', 'O':
					// An option policy does not judge for (cdable_vars makes `cd x` a cd to $x, and so on)
					// changes what the command string does.
					i++
					if i < len(argv) && (!argv[i].known || !safeShopts[argv[i].text]) {
						j.opaque(Ask, RuleUnresolved, fmt.Sprintf("`%s %c%c %s` changes how the shell runs the command string in ways policy does not judge; leave the option out", name, t[0], t[k], argv[i].show()))
					}
				case 'k':
					j.opaque(Ask, RuleUnresolved, fmt.Sprintf("`%s %s` makes every NAME=value word of a command an environment variable, where policy reads an argument; leave -k out", name, t))
				}
			}
		default:
			break loop
		}
	}
	var rest []word
	if i < len(argv) {
		rest = argv[i:]
	}
	switch {
	case hasC:
		if len(rest) == 0 {
			j.opaque(Ask, RuleUnresolved, fmt.Sprintf("`%s -c` has no command string here; its arguments come at run time", name))
			return
		}
		j.shellString(rest[0], name+" -c", depth, info, dialectOf(name))
	case len(rest) > 0 && !stdin && !isStdinPath(rest[0]):
		if rest[0].src != nil {
			info.codeWords = append(info.codeWords, rest[0].src)
		}
		j.opaque(Ask, RuleUnresolved, fmt.Sprintf("`%s %s` runs a script file whose content policy cannot see; a person must approve it, or run its commands directly", name, rest[0].show()))
		j.checkPathWord(rest[0], false)
	default:
		info.stdinScript = true
		if name != "fish" && name != "csh" && name != "tcsh" {
			info.stdinDialect = dialectOf(name)
		}
		j.opaque(Ask, RuleUnresolved, fmt.Sprintf("`%s` reads its commands from standard input, which policy cannot fully see; pass them with %s -c instead", name, name))
	}
}

func isStdinPath(w word) bool {
	return w.known && (w.text == "/dev/stdin" || w.text == "/dev/fd/0" || w.text == "/proc/self/fd/0")
}

// shellString judges a string that who runs as shell code in the dialects dl. A string into which a
// program splices its input at run time (xargs -I) is judged as written, and asks for what is spliced.
func (j *judge) shellString(w word, who string, depth int, info *callInfo, dl dialect) {
	if w.src != nil {
		info.codeWords = append(info.codeWords, w.src)
	}
	if !w.known || w.glob {
		j.opaque(Ask, RuleUnresolved, fmt.Sprintf("`%s` runs the command string %s, which is only known when the line runs; write it literally", who, shorten(w.show())))
		return
	}
	if w.tainted {
		j.opaque(Ask, RuleUnresolved, fmt.Sprintf("`%s` runs the command string %s with its input spliced in at run time, so the input runs as code; pass input as arguments (sh -c '...' sh {}) instead", who, shorten(w.show())))
	}
	j.program(w.text, depth+1, dl)
}

func (j *judge) eval(argv []word, ruleArgv []string, depth int, info *callInfo) {
	if f, listed := j.rules.Command(ruleArgv); listed {
		j.v.add(f)
	}
	j.opaque(Ask, RuleUnresolved, "eval runs a string as code, so a person must approve it; run the commands directly")
	args := argv[1:]
	if len(args) > 0 && args[0].known && args[0].text == "--" {
		args = args[1:]
	}
	texts := make([]string, 0, len(args))
	known := true
	for _, a := range args {
		if a.src != nil {
			info.codeWords = append(info.codeWords, a.src)
		}
		known = known && a.known && !a.glob
		texts = append(texts, a.text)
	}
	if known && len(texts) > 0 {
		j.program(strings.Join(texts, " "), depth+1, j.dialect)
	}
}

func (j *judge) source(name string, argv []word, ruleArgv []string, info *callInfo) {
	if f, listed := j.rules.Command(ruleArgv); listed {
		j.v.add(f)
	}
	if len(argv) < 2 {
		j.add(Ask, RuleUnresolved, fmt.Sprintf("`%s` without a file name reads nothing useful", name))
		return
	}
	file := argv[1]
	if file.src != nil {
		info.codeWords = append(info.codeWords, file.src)
	}
	if isStdinPath(file) {
		info.stdinScript, info.stdinDialect = true, j.dialect
	}
	j.opaque(Ask, RuleUnresolved, fmt.Sprintf("`%s %s` runs the commands in a file policy cannot see; a person must approve it, or run the commands directly", name, file.show()))
	j.checkPathWord(file, false)
}

// wrapParse is what a wrapper's options say about the command it runs.
type wrapParse struct {
	inner       []word // the wrapped command; empty when the wrapper runs none
	shellCode   *word  // a string the wrapper runs as shell code with /bin/sh (watch, su -c, flock -c)
	runtimeArgs bool   // the wrapper adds arguments at run time (xargs)
	stdinShell  bool   // the wrapper starts a shell that reads standard input (script without -c)
	bad         string // why the options could not be followed; empty when they could
}

type wrapperFunc func(j *judge, argv []word) wrapParse

// wrappers run another command, with options policy knows. Each table lists every option of the
// wrapper, so that an option it does not list (a newer version's, such as env -a NAME from coreutils 9.5,
// whose value would otherwise be read as the command) asks instead of being guessed.
var wrappers = map[string]wrapperFunc{
	"env":  parseEnv,
	"nice": optsThen(optSpec{shortValue: "n", longValue: []string{"--adjustment"}, numeric: true}, 0, nil),
	"timeout": optsThen(optSpec{flags: "fpv", shortValue: "ks", longFlags: []string{"--foreground", "--preserve-status", "--verbose"},
		longValue: []string{"--kill-after", "--signal"}}, 1, nil),
	"nohup":    optsThen(optSpec{}, 0, nil),
	"setsid":   optsThen(optSpec{flags: "cfwhV", longFlags: []string{"--ctty", "--fork", "--wait"}}, 0, nil),
	"unbuffer": optsThen(optSpec{flags: "p"}, 0, nil),
	"stdbuf":   optsThen(optSpec{shortValue: "ioe", longValue: []string{"--input", "--output", "--error"}}, 0, nil),
	"exec":     optsThen(optSpec{flags: "cl", shortValue: "a"}, 0, nil),
	"builtin":  func(j *judge, argv []word) wrapParse { return wrapParse{inner: argv[1:]} },
	"command":  optsThen(optSpec{flags: "pvV"}, 0, func(o opt) bool { return o.name == "-v" || o.name == "-V" }),
	"ionice": optsThen(optSpec{flags: "thV", shortValue: "cnpPu", longFlags: []string{"--ignore"},
		longValue: []string{"--class", "--classdata", "--pid", "--pgid", "--uid"}}, 0,
		func(o opt) bool {
			return o.name == "-p" || o.name == "-P" || o.name == "-u" || strings.HasPrefix(o.name, "--p") || o.name == "--uid"
		}),
	"taskset": optsThen(optSpec{flags: "apchV", longFlags: []string{"--all-tasks", "--pid", "--cpu-list"}}, 1,
		func(o opt) bool { return o.name == "-p" || o.name == "--pid" }),
	"time":  parseTime,
	"xargs": parseXargs,
	"sudo": optsThen(optSpec{flags: "AbBEeHhiKklNnPSsVv", shortValue: "aCcDgpRrTtUu",
		longFlags: []string{"--askpass", "--bell", "--background", "--preserve-env", "--edit", "--set-home", "--host",
			"--login", "--remove-timestamp", "--reset-timestamp", "--list", "--non-interactive", "--preserve-groups",
			"--stdin", "--shell", "--validate"},
		longValue: []string{"--auth-type", "--chdir", "--close-from", "--login-class", "--group", "--prompt", "--chroot",
			"--role", "--type", "--command-timeout", "--other-user", "--user"}}, 0, nil),
	"doas":    optsThen(optSpec{flags: "Lns", shortValue: "aCu"}, 0, nil),
	"pkexec":  optsThen(optSpec{longFlags: []string{"--disable-internal-agent", "--keep-cwd"}, longValue: []string{"--user"}}, 0, nil),
	"su":      parseSu,
	"runuser": parseSu,
	"chroot":  parseChroot,
	"flock":   parseFlock,
	"watch":   parseWatch,
	"script":  parseScript,
	"busybox": parseBusybox,
	"sg":      parseSg,
}

// genericWrappers run another command with options policy does not model: they are always at least ask,
// and every operand is also judged as a possible command.
var genericWrappers = map[string]bool{
	"strace": true, "ltrace": true, "valgrind": true, "catchsegv": true, "fakeroot": true, "fakechroot": true,
	"eatmydata": true, "torsocks": true, "proxychains": true, "proxychains4": true, "tsocks": true,
	"firejail": true, "bwrap": true, "proot": true, "systemd-run": true, "chrt": true, "numactl": true,
	"nsenter": true, "unshare": true, "faketime": true, "prlimit": true, "cgexec": true, "setpriv": true,
	"capsh": true, "gdb": true, "perf": true, "nocache": true, "trickle": true, "rlwrap": true,
	"parallel": true, "sem": true, "xvfb-run": true, "dbus-run-session": true, "entr": true, "watchexec": true,
	"expect": true, "cpulimit": true, "daemonize": true, "start-stop-daemon": true, "chpst": true, "softlimit": true,
	"setlock": true, "envdir": true, "tini": true, "dumb-init": true, "chronic": true, "setarch": true,
	"linux32": true, "linux64": true, "schedtool": true, "run-one": true, "retry": true, "lckdo": true,
	"timelimit": true, "minijail0": true, "runcon": true, "nsjail": true, "gosu": true, "su-exec": true,
	"setuidgid": true, "run0": true, "please": true, "ksu": true, "calife": true, "machinectl": true,
}

func (j *judge) wrapper(name string, argv []word, ruleArgv []string, depth, unwrap int, info *callInfo, runtimeArgs bool) {
	f, listed := j.rules.Command(ruleArgv)
	if listed {
		j.v.add(f)
	}
	wp := wrappers[name](j, argv)
	if !listed && wp.bad == "" && len(wp.inner) == 0 && wp.shellCode == nil && !wp.stdinShell {
		j.v.add(f) // it runs no other command: judge it as itself (env alone prints the environment)
	}
	if wp.bad != "" {
		j.opaque(Ask, RuleUnresolved, fmt.Sprintf("policy cannot tell which command `%s` runs here (%s); write it more plainly", name, wp.bad))
		return
	}
	if wp.shellCode != nil {
		j.seen.programs["sh"] = true // the wrapper runs the string with /bin/sh -c
		j.shellString(*wp.shellCode, name, depth, info, dialectsSh)
	}
	if wp.stdinShell {
		info.stdinScript, info.stdinDialect = true, dialectsSh
		j.opaque(Ask, RuleUnresolved, fmt.Sprintf("`%s` starts a shell that reads commands from standard input, which policy cannot fully see", name))
	}
	j.command(wp.inner, depth, unwrap+1, info, runtimeArgs || wp.runtimeArgs)
}

func (j *judge) genericWrapper(name string, argv []word, ruleArgv []string, depth, unwrap int, info *callInfo) {
	if f, listed := j.rules.Command(ruleArgv); listed {
		j.v.add(f)
	}
	j.opaque(Ask, RuleUnresolved, fmt.Sprintf("`%s` runs another command in a way policy cannot follow exactly; a person must approve it", name))
	if j.inGeneric {
		return // an outer generic wrapper already tries every operand of this argv
	}
	j.inGeneric = true
	defer func() { j.inGeneric = false }()
	tried := 0
	for i := 1; i < len(argv) && tried < maxGenericTries; i++ {
		if w := argv[i]; w.known && !w.glob && !strings.HasPrefix(w.text, "-") {
			tried++
			j.command(argv[i:], depth, unwrap+1, info, false)
		}
	}
}

// optSpec is a wrapper's whole option table: an option it does not list makes the wrapper's command
// unknown. --help and --version are known to every wrapper.
type optSpec struct {
	flags      string   // short options without a value
	shortValue string   // short options that take a value
	longFlags  []string // long options without a value, or with an optional one that must be attached (--preserve-env=X)
	longValue  []string // long options whose value may be the next word
	numeric    bool     // -N is an option too (nice's obsolete -5, --5, -+5)
}

type opt struct {
	name  string // "-u", "--unset"
	value word
}

// parseOpts reads a wrapper's options from argv[1:] up to the first operand, the way getopt does with a
// leading "+" (which these wrappers use): it returns the options and the index of the first operand. An
// option the spec does not list is bad: its value, if it takes one, could be the word policy would
// otherwise judge as the command.
func parseOpts(argv []word, spec optSpec) (opts []opt, rest int, bad string) {
	i := 1
	for i < len(argv) {
		a := argv[i]
		if !a.known {
			return opts, i, ""
		}
		t := a.text
		if t == "--" {
			return opts, i + 1, ""
		}
		if t == "-" || !strings.HasPrefix(t, "-") {
			return opts, i, ""
		}
		if spec.numeric && isNumericOpt(t) {
			opts = append(opts, opt{name: t})
			i++
			continue
		}
		if strings.HasPrefix(t, "--") {
			n, v, hasV := strings.Cut(t, "=")
			o := opt{name: n}
			// getopt accepts any unambiguous prefix: --adj 5 is --adjustment 5.
			isPrefix := func(full string) bool { return isLongOptPrefix(n, full) }
			takesValue := slices.ContainsFunc(spec.longValue, isPrefix)
			isFlag := slices.ContainsFunc(spec.longFlags, isPrefix) || isPrefix("--help") || isPrefix("--version")
			switch {
			case !takesValue && !isFlag:
				return opts, i, fmt.Sprintf("%s is not an option policy knows for it", n)
			case hasV:
				o.value = literalWord(v)
			case takesValue:
				if i+1 >= len(argv) {
					return opts, i, n + " has no value"
				}
				i++
				o.value = argv[i]
			}
			opts = append(opts, o)
			i++
			continue
		}
		for k := 1; k < len(t); k++ {
			o := opt{name: "-" + t[k:k+1]}
			if strings.IndexByte(spec.shortValue, t[k]) >= 0 {
				if k+1 < len(t) {
					o.value = literalWord(t[k+1:])
				} else {
					if i+1 >= len(argv) {
						return opts, i, o.name + " has no value"
					}
					i++
					o.value = argv[i]
				}
				opts = append(opts, o)
				break
			}
			if strings.IndexByte(spec.flags, t[k]) < 0 {
				return opts, i, fmt.Sprintf("%s is not an option policy knows for it", o.name)
			}
			opts = append(opts, o)
		}
		i++
	}
	return opts, i, ""
}

// isNumericOpt reports whether t is nice's obsolete adjustment: -N, --N or -+N.
func isNumericOpt(t string) bool {
	n := strings.TrimPrefix(t, "-")
	n = strings.TrimLeft(n, "+-")
	if n == "" || len(t)-len(n) > 2 {
		return false
	}
	return strings.Trim(n, "0123456789") == ""
}

// optsThen builds a wrapper parser: options, then skip operands (timeout's duration), then the command.
// noCommand reports options after which the wrapper runs no command (command -v, ionice -p).
func optsThen(spec optSpec, skip int, noCommand func(opt) bool) wrapperFunc {
	return func(j *judge, argv []word) wrapParse {
		opts, i, bad := parseOpts(argv, spec)
		if bad != "" {
			return wrapParse{bad: bad}
		}
		for _, o := range opts {
			if noCommand != nil && noCommand(o) {
				return wrapParse{}
			}
		}
		i += skip
		if i >= len(argv) {
			return wrapParse{}
		}
		return wrapParse{inner: argv[i:]}
	}
}

func parseEnv(j *judge, argv []word) wrapParse {
	opts, i, bad := parseOpts(argv, optSpec{flags: "i0v", shortValue: "aCSu",
		longFlags: []string{"--ignore-environment", "--null", "--debug", "--list-signal-handling", "--block-signal",
			"--default-signal", "--ignore-signal"},
		longValue: []string{"--argv0", "--unset", "--chdir", "--split-string"}})
	if bad != "" {
		return wrapParse{bad: bad}
	}
	var split *word
	for _, o := range opts {
		switch {
		case o.name == "-C" || isLongOptPrefix(o.name, "--chdir"):
			j.checkPathWord(o.value, false)
			j.addDir(o.value)
		case o.name == "-S" || isLongOptPrefix(o.name, "--split-string"):
			v := o.value
			split = &v
		}
	}
	for ; i < len(argv); i++ {
		a := argv[i]
		if !a.known {
			break
		}
		if a.text == "-" {
			continue
		}
		name, value, isAssign := strings.Cut(a.text, "=")
		if !isAssign {
			break
		}
		if name == "CDPATH" {
			j.cdpath = true
		}
		if injectionSetting(name, value, true) {
			j.opaque(Ask, RuleInjectionEnv, fmt.Sprintf("`env %s=...` sets a variable that can make programs load or run other code; leave it unset", name))
		}
		if a.known {
			j.checkEnvValue(name, strings.SplitN(a.text, "=", 2)[1])
		}
	}
	inner := argv[i:]
	if split != nil {
		words, ok := j.splitWords(*split)
		if !ok {
			return wrapParse{bad: "the env -S string is not plain words"}
		}
		// env -S splits its string into arguments in place: judge env again with them.
		again := append([]word{literalWord("env")}, words...)
		return wrapParse{inner: append(again, inner...)}
	}
	return wrapParse{inner: inner}
}

// splitWords splits a string into words the way a shell would, when they are all literal.
func (j *judge) splitWords(w word) ([]word, bool) {
	if !w.known {
		return nil, false
	}
	f, err := parse(w.text, j.dialect)
	if err != nil || len(f.Stmts) != 1 || len(f.Stmts[0].Redirs) > 0 {
		return nil, false
	}
	ce, ok := f.Stmts[0].Cmd.(*syntax.CallExpr)
	if !ok || len(ce.Assigns) > 0 {
		return nil, false
	}
	var out []word
	for _, a := range ce.Args {
		for _, r := range j.resolveWord(a) {
			if !r.known {
				return nil, false
			}
			out = append(out, r)
		}
	}
	return out, true
}

func parseTime(j *judge, argv []word) wrapParse {
	opts, i, bad := parseOpts(argv, optSpec{flags: "apqvV", shortValue: "fo", longFlags: []string{"--append", "--portability", "--quiet", "--verbose"},
		longValue: []string{"--format", "--output"}})
	if bad != "" {
		return wrapParse{bad: bad}
	}
	for _, o := range opts {
		if o.name == "-o" || isLongOptPrefix(o.name, "--output") {
			j.checkPathWord(o.value, true)
			j.add(Ask, RuleDangerousFlags, "`time -o` writes a file; a person must approve it")
		}
	}
	return wrapParse{inner: argv[i:]}
}

// xargsLongFlags are xargs's long options without a value, or with an optional one that must be attached.
var xargsLongFlags = []string{"--null", "--eof", "--max-lines", "--open-tty", "--interactive", "--no-run-if-empty",
	"--verbose", "--show-limits", "--exit", "--help", "--version"}

// parseXargs reads xargs's options. xargs adds arguments at run time; with -I, -i or --replace it splices
// its input into every word holding the replace string, so those words are tainted.
func parseXargs(j *judge, argv []word) wrapParse {
	replace := ""
	i := 1
	for ; i < len(argv); i++ {
		a := argv[i]
		if !a.known {
			return wrapParse{bad: "an option is only known when the line runs"}
		}
		t := a.text
		if t == "--" {
			i++
			break
		}
		if t == "-" || !strings.HasPrefix(t, "-") {
			break
		}
		if strings.HasPrefix(t, "--") {
			n, v, hasV := strings.Cut(t, "=")
			switch {
			case isLongOptPrefix(n, "--replace"):
				replace = "{}"
				if hasV {
					replace = v
				}
			case isLongOptPrefix(n, "--arg-file"), isLongOptPrefix(n, "--delimiter"), isLongOptPrefix(n, "--max-args"),
				isLongOptPrefix(n, "--max-procs"), isLongOptPrefix(n, "--max-chars"),
				isLongOptPrefix(n, "--process-slot-var"):
				if !hasV {
					if i+1 >= len(argv) {
						return wrapParse{bad: n + " has no value"}
					}
					i++
					v = argv[i].text
				}
				if isLongOptPrefix(n, "--arg-file") {
					j.checkPathText(v, false)
				}
				if isLongOptPrefix(n, "--process-slot-var") && injectionVar(v) {
					j.opaque(Ask, RuleInjectionEnv, fmt.Sprintf("`xargs --process-slot-var=%s` sets a variable that can make programs load or run other code; use another name", v))
				}
			case !slices.ContainsFunc(xargsLongFlags, func(full string) bool { return isLongOptPrefix(n, full) }):
				return wrapParse{bad: n + " is not an option policy knows for it"}
			}
			continue
		}
		for k := 1; k < len(t); k++ {
			c := t[k]
			switch c {
			case 'a', 'd', 'E', 'I', 'L', 'n', 'P', 's':
				v := t[k+1:]
				if v == "" {
					if i+1 >= len(argv) {
						return wrapParse{bad: "-" + string(c) + " has no value"}
					}
					i++
					v = argv[i].text
				}
				switch c {
				case 'a':
					j.checkPathText(v, false)
				case 'I':
					replace = v
				}
				k = len(t)
			case 'i':
				replace = "{}"
				if rest := t[k+1:]; rest != "" {
					replace = rest
				}
				k = len(t)
			case 'e', 'l':
				k = len(t) // an optional value, attached
			default:
				if strings.IndexByte("0oprtx", c) < 0 {
					return wrapParse{bad: "-" + string(c) + " is not an option policy knows for it"}
				}
			}
		}
	}
	inner := slices.Clone(argv[i:])
	if len(inner) == 0 {
		inner = []word{literalWord("echo")}
	}
	if replace != "" {
		for k := range inner {
			if strings.Contains(inner[k].text, replace) {
				inner[k].tainted = true
			}
		}
	}
	return wrapParse{inner: inner, runtimeArgs: true}
}

func parseSu(j *judge, argv []word) wrapParse {
	opts, i, bad := parseOpts(argv, optSpec{flags: "flmpPhV", shortValue: "cgGsuw", longFlags: []string{"--fast", "--login", "--preserve-environment", "--pty"},
		longValue: []string{"--command", "--session-command",
			"--group", "--supp-group", "--shell", "--user", "--whitelist-environment"}})
	if bad != "" {
		return wrapParse{bad: bad}
	}
	for _, o := range opts {
		if o.name == "-c" || isLongOptPrefix(o.name, "--command") || isLongOptPrefix(o.name, "--session-command") {
			v := o.value
			return wrapParse{shellCode: &v}
		}
		if (o.name == "-u" || isLongOptPrefix(o.name, "--user")) && i < len(argv) {
			return wrapParse{inner: argv[i:]} // runuser -u USER COMMAND...
		}
	}
	return wrapParse{stdinShell: true}
}

func parseChroot(j *judge, argv []word) wrapParse {
	_, i, bad := parseOpts(argv, optSpec{longFlags: []string{"--skip-chdir"}, longValue: []string{"--userspec", "--groups"}})
	if bad != "" {
		return wrapParse{bad: bad}
	}
	if i >= len(argv) {
		return wrapParse{bad: "no new root"}
	}
	j.checkPathWord(argv[i], false)
	if i+1 >= len(argv) {
		return wrapParse{stdinShell: true}
	}
	return wrapParse{inner: argv[i+1:]}
}

func parseFlock(j *judge, argv []word) wrapParse {
	opts, i, bad := parseOpts(argv, optSpec{flags: "sxeunoFhV", shortValue: "Ewc", longFlags: []string{"--shared", "--exclusive", "--unlock",
		"--nonblock", "--close", "--no-fork", "--verbose"}, longValue: []string{"--conflict-exit-code", "--timeout", "--command"}})
	if bad != "" {
		return wrapParse{bad: bad}
	}
	for _, o := range opts {
		if o.name == "-c" || isLongOptPrefix(o.name, "--command") {
			v := o.value
			return wrapParse{shellCode: &v}
		}
	}
	if i >= len(argv) {
		return wrapParse{}
	}
	if f := argv[i]; !f.known || strings.Trim(f.text, "0123456789") != "" {
		j.checkPathWord(f, true)
		j.add(Ask, RuleDangerousFlags, fmt.Sprintf("`flock %s` creates the lock file when it does not exist; a person must approve it, or lock a descriptor", f.show()))
	}
	rest := argv[i+1:]
	if len(rest) > 1 && rest[0].known && (rest[0].text == "-c" || rest[0].text == "--command") {
		v := rest[1]
		return wrapParse{shellCode: &v}
	}
	return wrapParse{inner: rest}
}

func parseWatch(j *judge, argv []word) wrapParse {
	opts, i, bad := parseOpts(argv, optSpec{flags: "bcCdegprtwxhv", shortValue: "nq", longFlags: []string{"--beep", "--color", "--no-color",
		"--differences", "--errexit", "--chgexit", "--precise", "--no-rerun", "--no-title", "--no-wrap", "--exec"},
		longValue: []string{"--interval", "--equexit"}})
	if bad != "" {
		return wrapParse{bad: bad}
	}
	for _, o := range opts {
		if o.name == "-x" || isLongOptPrefix(o.name, "--exec") {
			return wrapParse{inner: argv[i:]}
		}
	}
	if i >= len(argv) {
		return wrapParse{}
	}
	// watch joins its operands with spaces and runs them with sh -c.
	joined := word{known: true}
	var texts []string
	for _, w := range argv[i:] {
		if !w.known || w.glob {
			joined.known = false
			joined.src = w.src
		}
		texts = append(texts, w.text)
	}
	joined.text = strings.Join(texts, " ")
	return wrapParse{shellCode: &joined}
}

// parseScript reads script's options. script writes a typescript of the session: to its operand, to
// ./typescript without one, and to the files of --log-out, --log-in, --log-io and --log-timing.
func parseScript(j *judge, argv []word) wrapParse {
	opts, i, bad := parseOpts(argv, optSpec{flags: "aefqthV", shortValue: "cEIOBTmo", longFlags: []string{"--append", "--return", "--flush",
		"--force", "--quiet", "--timing"}, longValue: []string{"--command", "--echo", "--log-in", "--log-out", "--log-io",
		"--log-timing", "--logging-format", "--output-limit"}})
	if bad != "" {
		return wrapParse{bad: bad}
	}
	var writes []word
	if i < len(argv) {
		writes = append(writes, argv[i])
	} else {
		writes = append(writes, literalWord("typescript"))
	}
	var code *word
	for _, o := range opts {
		switch {
		case o.name == "-c" || isLongOptPrefix(o.name, "--command"):
			v := o.value
			code = &v
		case o.name == "-I" || o.name == "-O" || o.name == "-B" || o.name == "-T" ||
			isLongOptPrefix(o.name, "--log-in") || isLongOptPrefix(o.name, "--log-out") ||
			isLongOptPrefix(o.name, "--log-io") || isLongOptPrefix(o.name, "--log-timing"):
			writes = append(writes, o.value)
		}
	}
	for _, w := range writes {
		if p, err := ResolvePath(w.text); w.known && err == nil && isHarmlessDevice(p) {
			continue
		}
		j.checkPathWord(w, true)
		j.add(Ask, RuleDangerousFlags, fmt.Sprintf("`script` writes a typescript of the session to %s; a person must approve it (script -qc CMD /dev/null writes nothing)", w.show()))
	}
	if code != nil {
		return wrapParse{shellCode: code}
	}
	return wrapParse{stdinShell: true}
}

func parseBusybox(j *judge, argv []word) wrapParse {
	if len(argv) < 2 || argv[1].known && strings.HasPrefix(argv[1].text, "-") {
		return wrapParse{}
	}
	return wrapParse{inner: argv[1:]}
}

// parseSg reads sg GROUP [-c] COMMAND, where COMMAND is a string run by /bin/sh.
func parseSg(j *judge, argv []word) wrapParse {
	i := 2
	if i < len(argv) && argv[i].known && argv[i].text == "-c" {
		i++
	}
	if i >= len(argv) {
		return wrapParse{stdinShell: true}
	}
	v := argv[i]
	return wrapParse{shellCode: &v}
}
