package shell

import (
	"fmt"
	"strings"
)

// The go command: its flags that run programs (-toolexec, -vettool, -exec), read files (-overlay,
// -modfile, -pgo) or write them (-o, profiles, -mod=mod), the directory of -C, and go env -w.

// goValueFlags are go's build and test flags that take a value; the others are booleans.
var goValueFlags = map[string]bool{
	"C": true, "o": true, "p": true, "toolexec": true, "vettool": true, "exec": true, "overlay": true,
	"modfile": true, "pgo": true, "pkgdir": true, "tags": true, "ldflags": true, "gcflags": true,
	"asmflags": true, "gccgoflags": true, "installsuffix": true, "mod": true, "buildmode": true,
	"compiler": true, "covermode": true, "coverpkg": true, "coverprofile": true, "cpuprofile": true,
	"memprofile": true, "memprofilerate": true, "blockprofile": true, "blockprofilerate": true,
	"mutexprofile": true, "mutexprofilefraction": true, "trace": true, "outputdir": true, "run": true,
	"bench": true, "benchtime": true, "count": true, "cpu": true, "fuzz": true, "fuzztime": true,
	"fuzzminimizetime": true, "parallel": true, "timeout": true, "shuffle": true, "skip": true, "list": true,
	"f": true, "reuse": true, "debug-actiongraph": true, "debug-runtime-trace": true, "debug-trace": true,
	"fuzzcache": true, "covermeta": true,
}

var (
	goRunFlags   = map[string]bool{"toolexec": true, "vettool": true, "exec": true}
	goReadFlags  = map[string]bool{"overlay": true, "modfile": true, "pgo": true, "reuse": true}
	goWriteFlags = map[string]bool{"o": true, "coverprofile": true, "cpuprofile": true, "memprofile": true,
		"blockprofile": true, "mutexprofile": true, "trace": true, "outputdir": true, "pkgdir": true,
		"debug-actiongraph": true, "debug-runtime-trace": true, "debug-trace": true, "fuzzcache": true}
	goToolFlags = map[string]bool{"ldflags": true, "gcflags": true, "asmflags": true, "gccgoflags": true}
)

// goCommand judges go's global -C, its subcommand's flags, and go env -w.
func (j *judge) goCommand(argv []word, depth, unwrap int, info *callInfo) {
	i := 1
	sub := ""
	for ; i < len(argv); i++ {
		w := argv[i]
		if !w.known {
			return // the unknown-argument rule has asked already
		}
		name, value, hasV := goFlag(w.text)
		if name == "" {
			sub = w.text
			i++
			break
		}
		if name == "C" {
			if !hasV && i+1 < len(argv) {
				i++
				value = argv[i].text
			}
			j.checkPathText(value, false)
			j.addDir(literalWord(value))
		}
	}
	for ; i < len(argv); i++ {
		w := argv[i]
		if !w.known {
			continue
		}
		if w.text == "-args" || w.text == "--args" {
			return // the rest goes to the test binary
		}
		name, value, hasV := goFlag(w.text)
		if name == "" {
			if sub == "env" || sub == "doc" {
				continue // variable names, symbols
			}
			j.checkPathWord(w, false)
			continue
		}
		if sub == "env" && (name == "w" || name == "u") {
			j.opaque(Ask, RuleDangerousFlags, fmt.Sprintf("`go env -%s` writes go's configuration file, which sets flags (such as -toolexec) for every later go command; pass flags on the command line instead", name))
			continue
		}
		if !hasV && goValueFlags[name] {
			if i+1 >= len(argv) {
				return
			}
			i++
			if !argv[i].known {
				continue
			}
			value = argv[i].text
		}
		switch {
		case goRunFlags[name]:
			j.opaque(Ask, RuleDangerousFlags, fmt.Sprintf("`go %s -%s` runs %s for the go command; a person must approve it", sub, name, shorten(value)))
			j.commandString(value, "go -"+name, depth, unwrap, info)
		case goReadFlags[name]:
			j.checkPathText(value, false)
		case goWriteFlags[name]:
			j.checkPathText(value, true)
			j.add(Ask, RuleDangerousFlags, fmt.Sprintf("`go %s -%s %s` writes a file; a person must approve it", sub, name, value))
		case goToolFlags[name] && (strings.Contains(value, "extld") || strings.Contains(value, "extar") || strings.Contains(value, "toolexec")):
			j.opaque(Ask, RuleDangerousFlags, fmt.Sprintf("`go %s -%s=%s` makes the toolchain run another program; a person must approve it", sub, name, value))
		case name == "mod" && value == "mod":
			j.add(Ask, RuleDangerousFlags, fmt.Sprintf("`go %s -mod=mod` may rewrite go.mod and go.sum; a person must approve it", sub))
		case name == "compiler" && value != "gc":
			j.opaque(Ask, RuleDangerousFlags, fmt.Sprintf("`go %s -compiler=%s` runs another compiler; a person must approve it", sub, value))
		}
	}
}

// goFlag splits a go flag, written with one or two dashes and an optional =value; name is "" for an
// operand.
func goFlag(t string) (name, value string, hasValue bool) {
	if len(t) < 2 || t[0] != '-' || t == "--" {
		return "", "", false
	}
	t = strings.TrimPrefix(t[1:], "-")
	name, value, hasValue = strings.Cut(t, "=")
	return name, value, hasValue
}

// commandString judges a string that a program splits into a command and runs (go -toolexec, rg --pre),
// adding arguments of its own at run time.
func (j *judge) commandString(s, who string, depth, unwrap int, info *callInfo) {
	words, ok := j.splitWords(literalWord(s))
	if !ok || len(words) == 0 {
		j.opaque(Ask, RuleUnresolved, fmt.Sprintf("`%s` runs %s, which policy cannot split into a command; write it plainly", who, shorten(s)))
		return
	}
	j.command(words, depth, unwrap+1, info, true)
}
