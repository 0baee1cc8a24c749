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
		if injectionSetting(n, env[n], true) {
			j.opaque(Ask, RuleInjectionEnv, fmt.Sprintf("the call's env argument sets %s, which can make programs load or run other code; leave it out", n))
		}
		j.checkEnvValue(n, env[n])
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
