package shell

import (
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/toolpool/toolpool/internal/policy/deniedpath"
)

// Knowledge of single programs: their dangerous arguments, and which arguments are paths.

func (j *judge) rm(argv []word) {
	for _, w := range argv[1:] {
		if !w.known {
			continue
		}
		if w.text == "--no-preserve-root" {
			j.add(Deny, RuleDestructive, "`rm --no-preserve-root` exists to delete the whole file system and is never allowed")
			continue
		}
		root := false
		if w.glob {
			root = globAtRoot(w.pattern)
		} else if p, err := ResolvePath(w.text); err == nil && p == "/" {
			root = true
		}
		if root {
			j.add(Deny, RuleDestructive, fmt.Sprintf("`%s` would delete the whole file system; delete specific paths inside %s instead", showWords(argv), WorkspaceRoot))
		}
	}
}

// globAtRoot reports whether an absolute glob pattern expands at the top of the file system, like /* or
// //.*.
func globAtRoot(pattern string) bool {
	if !strings.HasPrefix(pattern, "/") {
		return false
	}
	for _, s := range strings.Split(pattern, "/") {
		if s == "" || s == "." {
			continue
		}
		return hasGlobMeta(s)
	}
	return false
}

// worldWritableMode reports whether a chmod mode gives others write permission: an octal mode with the
// 0002 bit (777, 0666, 1777) or a symbolic one like o+w, a+rwx, ugo=rwx.
func worldWritableMode(s string) bool {
	if s == "" {
		return false
	}
	if strings.Trim(s, "01234567") == "" {
		if len(s) > 5 {
			return false
		}
		v, err := strconv.ParseUint(s, 8, 32)
		return err == nil && v&0o002 != 0
	}
	for _, clause := range strings.Split(s, ",") {
		k := 0
		for k < len(clause) && strings.IndexByte("ugoa", clause[k]) >= 0 {
			k++
		}
		who, rest := clause[:k], clause[k:]
		if rest == "" || strings.IndexByte("+-=", rest[0]) < 0 {
			return false
		}
		for rest != "" {
			op := rest[0]
			rest = rest[1:]
			end := strings.IndexAny(rest, "+-=")
			if end < 0 {
				end = len(rest)
			}
			perms := rest[:end]
			rest = rest[end:]
			if (op == '+' || op == '=') && strings.ContainsAny(who, "oa") && strings.ContainsAny(perms, "wug") {
				return true
			}
		}
	}
	return false
}

// netcats are the names netcat goes by: each is judged by netcat and counts as a downloader.
var netcats = map[string]bool{"nc": true, "ncat": true, "netcat": true, "nc.openbsd": true, "nc.traditional": true}

func (j *judge) netcat(name string, argv []word) {
	for _, w := range argv[1:] {
		t := w.text
		if !w.known || len(t) < 2 || t[0] != '-' {
			continue
		}
		if strings.HasPrefix(t, "--") {
			n, _, _ := strings.Cut(t, "=")
			for _, d := range []string{"--exec", "--sh-exec", "--lua-exec"} {
				if isLongOptPrefix(n, d) {
					j.add(Deny, RuleReverseShell, fmt.Sprintf("`%s %s` connects a program to the network; this is how reverse shells work and is never allowed", name, n))
				}
			}
			continue
		}
		if strings.ContainsAny(t[1:], "ec") {
			j.add(Deny, RuleReverseShell, fmt.Sprintf("`%s %s` runs a program connected to the network; this is how reverse shells work and is never allowed", name, t))
		}
	}
}

func (j *judge) dd(argv []word) {
	for _, w := range argv[1:] {
		if !w.known {
			continue
		}
		k, v, ok := strings.Cut(w.text, "=")
		if !ok {
			continue
		}
		if v == "~" || strings.HasPrefix(v, "~/") {
			v = WorkspaceRoot + v[1:] // bash expands ~ after = in assignment-like words
		}
		switch k {
		case "of":
			if p, err := ResolvePath(v); err == nil && strings.HasPrefix(p, "/dev/") && !isHarmlessDevice(p) {
				j.add(Deny, RuleDeviceWrite, fmt.Sprintf("`dd of=%s` writes raw data to a device and is never allowed; write to a file in the workspace", v))
				continue
			}
			j.checkPathText(v, true)
		case "if":
			j.checkPathText(v, false)
		}
	}
}

// find judges find: its starting points and file arguments are paths, -exec and friends run a command
// for each file (judged too), and -delete and -fprint write.
func (j *judge) find(argv []word, depth, unwrap int, info *callInfo) {
	i := 1
	for i < len(argv) && argv[i].known {
		t := argv[i].text
		if t == "-H" || t == "-L" || t == "-P" || strings.HasPrefix(t, "-O") {
			i++
		} else if t == "-D" {
			i += 2
		} else {
			break
		}
	}
	for ; i < len(argv); i++ {
		t := argv[i].text
		if argv[i].known && (strings.HasPrefix(t, "-") || t == "(" || t == "!" || t == ")" || t == ",") {
			break
		}
		j.checkPathWord(argv[i], false)
	}
	for i < len(argv) {
		t := argv[i].text
		if !argv[i].known {
			i++
			continue
		}
		switch {
		case t == "-exec" || t == "-execdir" || t == "-ok" || t == "-okdir":
			k := i + 1
			for k < len(argv) && !(argv[k].known && (argv[k].text == ";" || argv[k].text == "+" && k > i+1 && argv[k-1].text == "{}")) {
				k++
			}
			var inner []word
			for _, w := range argv[i+1 : k] {
				if strings.Contains(w.text, "{}") {
					w.tainted = true // find splices each file name in at run time
				}
				inner = append(inner, w)
			}
			j.add(Ask, RuleDangerousFlags, fmt.Sprintf("`find %s` runs %s on every file it finds; a person must approve it", t, shorten(showWords(inner))))
			j.command(inner, depth, unwrap+1, info, true)
			i = k + 1
		case t == "-delete":
			j.add(Ask, RuleDangerousFlags, "`find -delete` deletes every file it finds; a person must approve it")
			i++
		case t == "-fprint" || t == "-fprint0" || t == "-fls" || t == "-fprintf":
			j.add(Ask, RuleDangerousFlags, fmt.Sprintf("`find %s` writes a file; a person must approve it", t))
			if i+1 < len(argv) {
				j.checkPathWord(argv[i+1], true)
			}
			i += 2
			if t == "-fprintf" {
				i++
			}
		case strings.HasPrefix(t, "-newer") || t == "-anewer" || t == "-cnewer" || t == "-samefile" || t == "-files0-from":
			if i+1 < len(argv) {
				j.checkPathWord(argv[i+1], false)
			}
			i += 2
		default:
			i++
		}
	}
}

func showWords(ws []word) string {
	var s []string
	for _, w := range ws {
		s = append(s, w.show())
	}
	return strings.Join(s, " ")
}

// gitSubcommand returns the index of git's subcommand, after the global options.
func gitSubcommand(argv []word) int {
	i := 1
	for i < len(argv) {
		t := argv[i].text
		if !argv[i].known {
			return i
		}
		switch {
		case t == "-C" || t == "-c" || t == "--git-dir" || t == "--work-tree" || t == "--namespace" ||
			t == "--config-env" || t == "--super-prefix" || t == "--attr-source" || t == "--list-cmds":
			i += 2
		case strings.HasPrefix(t, "-"):
			i++
		default:
			return i
		}
	}
	// An option that takes a value may end the line without one ("git --git-dir"): the subcommand's
	// index is then the end of argv, never past it.
	return min(i, len(argv))
}

// gitDangerous are subcommand options that write files or run programs.
var gitDangerous = []struct{ name, why string }{
	{"--output", "writes its output to a file"},
	{"--ext-diff", "runs an external diff program"},
	{"--textconv", "runs text conversion programs from the configuration"},
	{"--upload-pack", "runs a program"},
	{"--receive-pack", "runs a program"},
	{"--exec", "runs a program"},
	{"--open-files-in-pager", "runs a pager program"},
}

func (j *judge) git(argv []word) {
	sub := gitSubcommand(argv)
	for i := 1; i < sub; i++ {
		t := argv[i].text
		switch {
		case t == "-c" || strings.HasPrefix(t, "--config-env"):
			j.opaque(Ask, RuleDangerousFlags, fmt.Sprintf("`git %s` sets configuration such as core.pager or core.sshCommand, which run programs; leave it out", t))
			if t == "-c" || t == "--config-env" {
				i++
			}
		case strings.HasPrefix(t, "--exec-path"):
			j.opaque(Ask, RuleDangerousFlags, "`git --exec-path` changes where git finds the helper programs it runs; leave it out")
		case strings.HasPrefix(t, "--git-dir") || strings.HasPrefix(t, "--work-tree"):
			j.opaque(Ask, RuleDangerousFlags, fmt.Sprintf("`git %s` points git at another repository, whose configuration and hooks can run programs; run git inside the repository instead", t))
			if v, ok := strings.CutPrefix(t, "--git-dir="); ok {
				j.checkPathText(v, false)
			} else if v, ok := strings.CutPrefix(t, "--work-tree="); ok {
				j.checkPathText(v, false)
			} else if i+1 < len(argv) {
				i++
				j.checkPathWord(argv[i], false)
			}
		case t == "-p" || t == "--paginate":
			j.opaque(Ask, RuleDangerousFlags, "`git --paginate` runs a pager program; leave it out")
		case t == "-C":
			if i+1 < len(argv) {
				i++
				j.checkPathWord(argv[i], false)
				j.addDir(argv[i])
			}
		case t == "--namespace" || t == "--super-prefix" || t == "--attr-source" || t == "--list-cmds":
			i++
		}
	}
	if sub >= len(argv) {
		return
	}
	subName := argv[sub].text
	args := argv[sub+1:]
	endOpts := false
	for i := 0; i < len(args); i++ {
		w := args[i]
		if !w.known {
			continue
		}
		t := w.text
		if !endOpts && t == "--" {
			endOpts = true
			continue
		}
		if !endOpts && strings.HasPrefix(t, "-") && t != "-" {
			n, v, hasV := strings.Cut(t, "=")
			if strings.HasPrefix(n, "--") {
				for _, d := range gitDangerous {
					if isLongOptPrefix(n, d.name) {
						j.opaque(Ask, RuleDangerousFlags, fmt.Sprintf("`git %s %s` %s; a person must approve it", subName, n, d.why))
					}
				}
				if hasV && isLongOptPrefix(n, "--output") {
					j.checkPathText(v, true)
				}
				if hasV && !stringOption(n) {
					j.maySecret(v)
				} else if !hasV && gitFileOption(n) && i+1 < len(args) {
					i++
					j.checkPathWord(args[i], false)
				}
			} else {
				if subName == "grep" && strings.HasPrefix(t, "-O") {
					j.opaque(Ask, RuleDangerousFlags, "`git grep -O` runs a pager program; a person must approve it")
				}
				if !strings.ContainsAny(t[1:2], "mSGe") { // -m message, -S/-G strings, -e pattern
					j.maySecret(t)
				}
			}
			continue
		}
		j.checkPathWord(w, false)
		j.gitPathArg(subName, t)
	}
	if subName == "branch" {
		j.gitBranch(args)
	}
}

// gitContentReaders are the git subcommands that show the content of the files their pathspecs match.
var gitContentReaders = map[string]bool{
	"log": true, "show": true, "diff": true, "grep": true, "blame": true, "annotate": true, "archive": true,
	"format-patch": true, "whatchanged": true, "stash": true, "difftool": true, "cat-file": true,
	"diff-tree": true, "diff-index": true, "diff-files": true, "range-diff": true,
}

// gitFileOption reports whether a long git option takes a file to read as its next word.
func gitFileOption(name string) bool {
	for _, o := range []string{"--contents", "--pathspec-from-file", "--ignore-revs-file", "--exclude-from",
		"--file", "--template", "--orderfile", "--rerere-autoupdate"} {
		if isLongOptPrefix(name, o) {
			return o != "--rerere-autoupdate"
		}
	}
	return false
}

// gitPathArg judges what a git operand may name beyond itself: the path of a REV:PATH, :N:PATH or
// -L...:PATH (a blob read from the repository, relative to its top, or to the working directory after
// "./"), and a pathspec with magic (:(top), :(icase), :/) or wildcards, which git matches itself: a "*"
// there crosses directories.
func (j *judge) gitPathArg(sub, t string) {
	for k := 0; k < len(t); k++ {
		if t[k] == ':' && k+1 < len(t) && t[k+1] != '(' {
			j.gitTreePath(t[k+1:])
		}
	}
	spec, top, icase, literal, exclude := parsePathspec(t)
	if exclude || spec == "" {
		return
	}
	bases := j.dirs
	if top {
		bases = j.repoTops()
	}
	if icase {
		spec = strings.ToLower(spec)
	}
	wild := !literal && strings.ContainsAny(spec, "*?[") && gitContentReaders[sub]
	for _, b := range bases {
		full := path.Join(b, spec)
		if wild {
			segs := deniedpath.SplitAbs(path.Clean(b + "/" + spec))
			for _, g := range j.paths.Denied {
				if pathspecMayMeet(segs, g.Segments()) {
					j.add(Ask, RuleDeniedPath, fmt.Sprintf("git matches the pathspec %s itself, and it may match files denied by %q; name the files you need literally", shorten(t), g.Source()))
					return
				}
			}
			continue
		}
		for _, g := range j.paths.Denied {
			if g.Match(full) || icase && g.Match(strings.ToLower(full)) || icase && globsMayMeet(deniedpath.SplitAbs(escapeGlob(full)), g.Segments()) {
				j.add(Deny, RuleDeniedPath, DeniedDetail(full, g))
				return
			}
		}
	}
}

// gitTreePath checks the path part of REV:PATH: relative to the top of the repository (any directory
// the line runs in, or one above it), or to the working directory when it starts with ./ or ../.
func (j *judge) gitTreePath(p string) {
	if p == "" || strings.HasPrefix(p, "/") {
		return
	}
	if _, err := ResolvePath(p); err != nil {
		return
	}
	bases := j.repoTops()
	if strings.HasPrefix(p, "./") || strings.HasPrefix(p, "../") {
		bases = j.dirs
	}
	for _, b := range bases {
		full := path.Join(b, p)
		if g, ok := j.paths.DeniedBy(full); ok {
			j.add(Deny, RuleDeniedPath, DeniedDetail(full, g))
			return
		}
	}
}

// repoTops are the directories a repository's top may be: the directories the line runs in and every
// directory above them.
func (j *judge) repoTops() []string {
	var out []string
	for _, d := range j.dirs {
		for {
			if !slices.Contains(out, d) {
				out = append(out, d)
			}
			if d == "/" {
				break
			}
			d = path.Dir(d)
		}
	}
	return out
}

// parsePathspec strips a git pathspec's magic: ":(top,icase)x", ":/x", ":!x", ":^x".
func parsePathspec(t string) (spec string, top, icase, literal, exclude bool) {
	if !strings.HasPrefix(t, ":") {
		return t, false, false, false, false
	}
	rest := t[1:]
	if strings.HasPrefix(rest, "(") {
		end := strings.IndexByte(rest, ')')
		if end < 0 {
			return "", false, false, false, false
		}
		for _, m := range strings.Split(rest[1:end], ",") {
			switch {
			case m == "top":
				top = true
			case m == "icase":
				icase = true
			case m == "literal":
				literal = true
			case m == "exclude":
				exclude = true
			}
		}
		return rest[end+1:], top, icase, literal, exclude
	}
	for rest != "" && strings.IndexByte("/!^", rest[0]) >= 0 {
		switch rest[0] {
		case '/':
			top = true
		default:
			exclude = true
		}
		rest = rest[1:]
	}
	rest = strings.TrimPrefix(rest, ":")
	return rest, top, icase, literal, exclude
}

// gitBranch asks for git branch forms that change branches: options that delete, move, copy or track,
// or a name without a listing option (which creates a branch).
func (j *judge) gitBranch(args []word) {
	listing := false
	positional := 0
	for _, w := range args {
		t := w.text
		if !w.known {
			positional++
			continue
		}
		switch {
		case strings.HasPrefix(t, "--"):
			n, _, _ := strings.Cut(t, "=")
			for _, m := range []string{"--delete", "--move", "--copy", "--force", "--set-upstream-to", "--unset-upstream", "--edit-description", "--track", "--no-track", "--create-reflog"} {
				if isLongOptPrefix(n, m) {
					j.add(Ask, RuleDangerousFlags, fmt.Sprintf("`git branch %s` changes branches; a person must approve it", n))
					return
				}
			}
			for _, m := range []string{"--list", "--all", "--remotes", "--contains", "--no-contains", "--merged", "--no-merged", "--points-at", "--show-current"} {
				if isLongOptPrefix(n, m) {
					listing = true
				}
			}
		case strings.HasPrefix(t, "-") && len(t) > 1:
			if strings.ContainsAny(t[1:], "dDmMcCfut") {
				j.add(Ask, RuleDangerousFlags, fmt.Sprintf("`git branch %s` changes branches; a person must approve it", t))
				return
			}
			if strings.ContainsAny(t[1:], "alr") {
				listing = true
			}
		default:
			positional++
		}
	}
	if positional > 0 && !listing {
		j.add(Ask, RuleDangerousFlags, "`git branch NAME` creates a branch; a person must approve it (git branch alone lists branches)")
	}
}

// isLongOptPrefix reports whether a long option as typed (GNU getopt accepts any unambiguous prefix)
// may stand for full.
func isLongOptPrefix(given, full string) bool {
	return len(given) > 2 && strings.HasPrefix(given, "--") && strings.HasPrefix(full, given)
}

// argSpec says how a program's arguments read, so policy can find the paths among them.
type argSpec struct {
	insensitive  bool     // arguments are only strings (echo, printf): no paths, unknown values are fine
	noPaths      bool     // arguments are not paths (tr)
	shortValue   string   // short options that take a value (attached or the next word)
	longValue    []string // long options whose value may be the next word
	patternFirst bool     // the first operand is a pattern, script or mode, not a path...
	patternOpts  string   // ...unless one of these short options gave it (grep -e)
	pathOpts     []string // options whose value is a path the program reads
	writeOpts    []string // options whose value is a path the program writes
	writes       int      // which operands the program writes
	writesWith   []string // options that make every operand written (sed -i)
	// nameSelectors are options whose value is a file name or glob that picks which files the program reads
	// as it walks directories (grep --include, rg -g): judged against the denied globs by name.
	nameSelectors []string
	dangerous     map[string]string
}

const (
	writesNone = iota
	writesAll
	writesLast
)

var (
	grepSpec = argSpec{shortValue: "efmABCDd", patternFirst: true, patternOpts: "ef", nameSelectors: []string{"--include"},
		pathOpts: []string{"-f", "--file", "--exclude-from"},
		longValue: []string{"--regexp", "--file", "--max-count", "--context", "--after-context", "--before-context",
			"--devices", "--directories", "--include", "--exclude", "--exclude-dir", "--exclude-from", "--label",
			"--binary-files", "--group-separator"}}
	filesFrom = map[string]string{"--files0-from": "reads the names of the files to open from a file, which policy cannot check"}
	writeAll  = argSpec{writes: writesAll}
	copySpec  = argSpec{shortValue: "tS", writeOpts: []string{"-t", "--target-directory"}, longValue: []string{"--target-directory", "--suffix"}, writes: writesLast}
)

var argSpecs = map[string]argSpec{
	"echo": {insensitive: true}, "printf": {insensitive: true}, "true": {insensitive: true},
	"false": {insensitive: true}, ":": {insensitive: true}, "pwd": {insensitive: true},
	"test": {insensitive: true}, "[": {insensitive: true}, "basename": {insensitive: true},
	"dirname": {insensitive: true}, "sleep": {insensitive: true}, "type": {insensitive: true},
	"which": {insensitive: true}, "printenv": {insensitive: true}, "whoami": {insensitive: true},
	"id": {insensitive: true}, "uname": {insensitive: true}, "nproc": {insensitive: true},

	"ls": {shortValue: "ITw", longValue: []string{"--ignore", "--hide", "--format", "--sort", "--time-style",
		"--width", "--block-size", "--tabsize", "--indicator-style", "--quoting-style"}},
	"head": {shortValue: "nc", longValue: []string{"--lines", "--bytes"}},
	"tail": {shortValue: "ncs", longValue: []string{"--lines", "--bytes", "--pid", "--sleep-interval", "--max-unchanged-stats"}},
	"wc":   {dangerous: filesFrom},
	"du": {shortValue: "dBtX", pathOpts: []string{"-X", "--exclude-from"}, dangerous: filesFrom,
		longValue: []string{"--max-depth", "--block-size", "--threshold", "--exclude", "--time-style", "--exclude-from"}},
	"grep": grepSpec, "egrep": grepSpec, "fgrep": grepSpec,
	"rg": {shortValue: "efgtTmABCEjMrd", patternFirst: true, patternOpts: "ef", nameSelectors: []string{"-g", "--glob", "--iglob"},
		pathOpts: []string{"-f", "--file", "--ignore-file"},
		longValue: []string{"--regexp", "--file", "--glob", "--iglob", "--type", "--type-not", "--max-count",
			"--max-columns", "--threads", "--encoding", "--replace", "--max-depth", "--context", "--after-context",
			"--before-context", "--ignore-file", "--sort", "--sortr", "--colors", "--color", "--pre", "--pre-glob"},
		dangerous: map[string]string{"--pre": "runs a preprocessor program on every file it searches",
			"--hostname-bin": "runs a program"}},
	"sort": {shortValue: "kotST", writeOpts: []string{"-o", "--output", "-T", "--temporary-directory"},
		longValue: []string{"--key", "--output", "--field-separator", "--buffer-size", "--temporary-directory",
			"--parallel", "--batch-size", "--sort", "--random-source", "--compress-program"},
		dangerous: map[string]string{"-o": "writes its output to a file", "--output": "writes its output to a file",
			"--compress-program": "runs a compression program", "--files0-from": filesFrom["--files0-from"],
			"-T": "writes temporary files in that directory", "--temporary-directory": "writes temporary files in that directory"}},
	"uniq": {shortValue: "fsw", longValue: []string{"--skip-fields", "--skip-chars", "--check-chars"}},
	"cut":  {shortValue: "bcdf", longValue: []string{"--bytes", "--characters", "--delimiter", "--fields", "--output-delimiter"}},
	"tr":   {noPaths: true},
	"diff": {shortValue: "CUIxXSFL", pathOpts: []string{"-X", "--exclude-from"}, longValue: []string{"--label", "--exclude", "--exclude-from", "--ignore-matching-lines"}},
	"tree": {shortValue: "LPIo", writeOpts: []string{"-o"}, dangerous: map[string]string{"-o": "writes its output to a file"}},
	"stat": {shortValue: "c", longValue: []string{"--format", "--printf"}},
	"file": {shortValue: "mfFeP", pathOpts: []string{"-m", "-f", "--magic-file", "--files-from"},
		dangerous: map[string]string{"-C": "compiles magic files into .mgc files it writes", "--compile": "compiles magic files into .mgc files it writes"}},
	"sed":  {shortValue: "efl", patternFirst: true, patternOpts: "ef", pathOpts: []string{"-f", "--file"}, longValue: []string{"--expression", "--file", "--line-length"}, writesWith: []string{"-i", "--in-place"}, dangerous: map[string]string{"-i": "edits files in place", "--in-place": "edits files in place"}},
	"date": {shortValue: "dfrI", pathOpts: []string{"-f", "-r", "--file", "--reference"}, dangerous: map[string]string{"-s": "sets the system clock", "--set": "sets the system clock"}},
	"tar":  {dangerous: map[string]string{"--to-command": "runs a program for every file", "-I": "runs a compression program", "--use-compress-program": "runs a compression program", "--checkpoint-action": "can run a program", "--rsh-command": "runs a remote shell program", "--info-script": "runs a program", "--new-volume-script": "runs a program", "-F": "runs a program"}},
	"rm":   writeAll, "rmdir": writeAll, "unlink": writeAll, "tee": writeAll,
	"mkdir":    {shortValue: "m", longValue: []string{"--mode"}, writes: writesAll},
	"touch":    {shortValue: "dtr", pathOpts: []string{"-r", "--reference"}, longValue: []string{"--date", "--reference"}, writes: writesAll},
	"truncate": {shortValue: "sr", pathOpts: []string{"-r", "--reference"}, longValue: []string{"--size", "--reference"}, writes: writesAll},
	"shred":    {shortValue: "nsu", writes: writesAll},
	"mv":       {shortValue: "tS", writeOpts: []string{"-t", "--target-directory"}, longValue: []string{"--target-directory", "--suffix"}, writes: writesAll},
	"cp":       copySpec, "ln": copySpec,
	"install": {shortValue: "gmotS", writeOpts: []string{"-t", "--target-directory"}, longValue: []string{"--group", "--mode", "--owner", "--target-directory", "--suffix"}, writes: writesLast},
	"chmod":   {patternFirst: true, pathOpts: []string{"--reference"}, writes: writesAll},
	"chown":   {patternFirst: true, pathOpts: []string{"--reference"}, writes: writesAll},
	"chgrp":   {patternFirst: true, pathOpts: []string{"--reference"}, writes: writesAll},
	"dd":      {noPaths: true},
}

// argPaths checks the paths among a program's arguments and asks for its dangerous options. It returns
// the operands (arguments that are not options).
func (j *judge) argPaths(argv []word, spec argSpec) []word {
	name := argv[0].text
	var operands []word
	sawPattern := false
	writes := spec.writes
	targetDir := false
	var targets []word // the -t DIR of cp, mv, ln and install
	endOpts := false
	value := func(opt string, v word, separate bool) {
		if slices.Contains(spec.nameSelectors, opt) {
			j.nameSelector(name, opt, v)
			return
		}
		switch {
		case slices.Contains(spec.writeOpts, opt):
			j.checkPathWord(v, true)
			if opt == "-t" || opt == "--target-directory" {
				targetDir = true
				targets = append(targets, v)
			}
		case slices.Contains(spec.pathOpts, opt):
			j.checkPathWord(v, false)
		case separate && v.glob:
			j.checkGlobWord(v, false) // a glob expands into file names wherever it stands
		case v.known && !stringOption(opt) && !(len(opt) == 2 && strings.IndexByte(spec.patternOpts, opt[1]) >= 0):
			j.maySecret(v.text) // an option policy does not know may read a file: --from-file=.env
		}
	}
	dangerous := func(opt string) {
		for d, why := range spec.dangerous {
			if opt == d || strings.HasPrefix(opt, "--") && isLongOptPrefix(opt, d) {
				j.add(Ask, RuleDangerousFlags, fmt.Sprintf("`%s %s` %s; a person must approve it", CommandBase(name), opt, why))
			}
		}
		if slices.Contains(spec.writesWith, opt) {
			writes = writesAll
		}
	}
	for i := 1; i < len(argv); i++ {
		w := argv[i]
		t := w.text
		if !w.known {
			continue
		}
		if endOpts || t == "-" || !strings.HasPrefix(t, "-") {
			operands = append(operands, w)
			continue
		}
		if t == "--" {
			endOpts = true
			continue
		}
		if strings.HasPrefix(t, "--") {
			n, v, hasV := strings.Cut(t, "=")
			dangerous(n)
			switch {
			case hasV:
				value(n, literalWord(v), false)
			case slices.Contains(spec.longValue, n) && i+1 < len(argv):
				i++
				value(n, argv[i], true)
			}
			continue
		}
		if strings.Trim(t[1:], spec.shortValue+spec.patternOpts) != "" {
			j.maySecret(t) // a value attached to an option policy does not know: -f.env
		}
		for k := 1; k < len(t); k++ {
			opt := "-" + t[k:k+1]
			dangerous(opt)
			if strings.IndexByte(spec.patternOpts, t[k]) >= 0 {
				sawPattern = true
			}
			if strings.IndexByte(spec.shortValue, t[k]) >= 0 {
				if k+1 < len(t) {
					value(opt, literalWord(t[k+1:]), false)
				} else if i+1 < len(argv) {
					i++
					value(opt, argv[i], true)
				}
				break
			}
		}
	}
	if spec.noPaths {
		return operands
	}
	paths := operands
	if spec.patternFirst && !sawPattern && len(paths) > 0 {
		if paths[0].glob {
			j.checkGlobWord(paths[0], false)
		}
		paths = paths[1:]
	}
	for i, w := range paths {
		write := writes == writesAll || writes == writesLast && i == len(paths)-1 && !targetDir && len(paths) > 1
		j.checkPathWord(w, write)
		if w.known && !w.glob && strings.ContainsAny(w.text, ":=@") {
			j.maySecret(w.text) // REV:PATH, key=PATH, @PATH (curl -d @.env, gcc @.env: a file's content)
		}
	}
	if slices.Contains(spec.writeOpts, "--target-directory") {
		sources := paths
		if !targetDir && len(paths) > 1 {
			targets, sources = paths[len(paths)-1:], paths[:len(paths)-1]
		}
		j.intoDirectories(sources, targets)
	}
	return operands
}

// intoDirectories judges what cp, mv, ln and install write when their target is a directory (-t DIR, a
// last operand that is one, or may be: policy cannot see the file system): each source under its own
// name in it, so that `cp config .git/` is judged as writing .git/config. A source whose name is only
// known when the line runs, or a glob, names no file policy can judge here; the unknown-argument rule
// has asked for it already.
func (j *judge) intoDirectories(sources, targets []word) {
	for _, t := range targets {
		if !t.known || t.glob || t.tainted {
			continue
		}
		for _, s := range sources {
			if !s.known || s.glob || s.tainted {
				continue
			}
			base := path.Base(path.Clean(s.text))
			if base == "." || base == ".." || base == "/" {
				continue // cp -r x/. d copies x's entries, not x: their names are not in the line
			}
			j.checkPathText(strings.TrimSuffix(t.text, "/")+"/"+base, true)
		}
	}
}

// checkPathWord checks an argument that names a file.
func (j *judge) checkPathWord(w word, write bool) {
	if !w.known || w.tainted {
		if write {
			j.seen.opaque = append(j.seen.opaque, fmt.Sprintf("writes %s, a file only known when the line runs", w.show()))
		}
		return // the unknown-argument rule has asked already
	}
	if w.glob {
		j.checkGlobWord(w, write)
		return
	}
	j.checkPathText(w.text, write)
}

// resolve turns a path as the line gives it into the clean absolute paths it may name: an absolute path
// names itself, "~" each home, and a relative path one path per directory the line may run in.
// unknownBase reports that the line may also run in a directory only known at run time.
func (j *judge) resolve(text string) (paths []string, unknownBase bool) {
	switch {
	case strings.HasPrefix(text, "/"):
		return []string{path.Clean(text)}, false
	case text == "~" || strings.HasPrefix(text, "~/"):
		for _, h := range homeDirs {
			paths = append(paths, path.Clean(h+text[1:]))
		}
		return paths, false
	}
	for _, d := range j.dirs {
		paths = append(paths, path.Join(d, text))
	}
	return paths, j.dirUnknown
}

// checkPathText checks a literal path from a command line against the tool's path rules. Reads outside
// the roots ask; writes outside them, to system directories or to devices deny; denied globs deny.
func (j *judge) checkPathText(text string, write bool) {
	if text == "" || text == "-" {
		return
	}
	if _, err := ResolvePath(text); err != nil {
		j.add(Ask, RuleInvalidPath, fmt.Sprintf("the argument %s cannot be checked as a path (%v)", shorten(text), err))
		return
	}
	paths, unknownBase := j.resolve(text)
	for _, p := range paths {
		j.checkResolved(p, write)
	}
	if unknownBase {
		j.checkUnknownBase(text, write)
	}
}

func (j *judge) checkResolved(p string, write bool) {
	if isHarmlessDevice(p) {
		return
	}
	if write {
		j.seen.writes[p] = true
	}
	rules := j.paths
	if g, ok := rules.DeniedBy(p); ok {
		j.add(Deny, RuleDeniedPath, DeniedDetail(p, g))
	}
	switch {
	case write && strings.HasPrefix(p, "/dev/"):
		j.add(Deny, RuleDeviceWrite, fmt.Sprintf("the command writes to the device %s; write to a file in the workspace", p))
	case write && isSystemPath(p):
		j.add(Deny, RuleSystemPath, fmt.Sprintf("the command writes %s, a system path; write inside %s", p, WorkspaceRoot))
	case write && !rules.InRoots(p):
		j.add(Deny, RuleOutsideRoots, fmt.Sprintf("the command writes %s, outside the directories it may write (%s)", p, rules.RootsText()))
	case !write && !rules.InRoots(p):
		j.add(Ask, RuleOutsideRoots, fmt.Sprintf("the command reads %s, outside the workspace (%s); a person must approve it", p, rules.RootsText()))
	}
}

// checkUnknownBase checks a relative path under a directory only known at run time: it asks, and names
// the denied glob when the path, wherever it lands, may be a file it denies by name.
func (j *judge) checkUnknownBase(text string, write bool) {
	if write {
		j.seen.opaque = append(j.seen.opaque, fmt.Sprintf("writes %s in a directory only known when the line runs", text))
	}
	segs := []string{"**"}
	for _, s := range strings.Split(path.Clean(text), "/") {
		if s != ".." && s != "." {
			segs = append(segs, escapeGlob(s))
		}
	}
	for _, g := range j.paths.Denied {
		if g.Segments()[len(g.Segments())-1] != "**" && j.globsMeet(segs, g.Segments()) {
			j.add(Ask, RuleDeniedPath, fmt.Sprintf("the command runs in a directory only known when the line runs, where %s may be a file denied by %q; name the path from the workspace root", shorten(text), g.Source()))
			return
		}
	}
	j.add(Ask, RuleUnresolved, fmt.Sprintf("the command runs in a directory only known when the line runs (after a cd to a computed place), so policy cannot tell which file %s is; name the path from the workspace root", shorten(text)))
}

// globsMeet is the glob intersection test for this line: as bash matches by default, or widened when
// the line may turn on dotglob or nocaseglob.
func (j *judge) globsMeet(shellGlob, denied []string) bool {
	if j.wideGlobs {
		return globsMayMeet(shellGlob, denied)
	}
	return globsIntersect(shellGlob, denied)
}

// checkGlobWord checks an argument the shell expands into file names: its fixed directory must be
// inside the roots, and it must not be able to match a denied glob (judged as if dotglob and nocaseglob
// were on, which a line can turn on).
func (j *judge) checkGlobWord(w word, write bool) {
	var bases []string
	switch {
	case strings.HasPrefix(w.pattern, "/"):
		bases = []string{""}
	default:
		bases = j.dirs
		if j.dirUnknown {
			j.checkUnknownBase(w.pattern, write)
		}
	}
	for _, b := range bases {
		pat := w.pattern
		if b != "" {
			pat = b + "/" + pat
		}
		if j.checkGlobPattern(w, pat, write) {
			return
		}
	}
}

// checkGlobPattern checks one absolute glob pattern; it reports whether it found the pattern unusable.
func (j *judge) checkGlobPattern(w word, pat string, write bool) bool {
	var segs []string
	for _, s := range strings.Split(pat, "/") {
		switch s {
		case "", ".":
			continue
		case "..":
			j.add(Ask, RuleOutsideRoots, fmt.Sprintf("the pattern %s climbs out with \"..\", so policy cannot tell which files it names; name them literally", shorten(w.text)))
			if write {
				j.seen.opaque = append(j.seen.opaque, "writes the files a pattern with .. names")
			}
			return true
		}
		segs = append(segs, s)
	}
	if write {
		j.seen.writes["/"+strings.Join(segs, "/")] = true
	}
	dir := "/"
	for _, s := range segs {
		if hasGlobMeta(s) {
			break
		}
		dir = path.Join(dir, unescapeGlob(s))
	}
	rules := j.paths
	switch {
	case write && isSystemPath(dir):
		j.add(Deny, RuleSystemPath, fmt.Sprintf("the pattern %s writes under %s, a system path; write inside %s", shorten(w.text), dir, WorkspaceRoot))
	case write && !rules.InRoots(dir):
		j.add(Deny, RuleOutsideRoots, fmt.Sprintf("the pattern %s writes under %s, outside the directories it may write (%s)", shorten(w.text), dir, rules.RootsText()))
	case !write && !rules.InRoots(dir):
		j.add(Ask, RuleOutsideRoots, fmt.Sprintf("the pattern %s reads under %s, outside the workspace; a person must approve it", shorten(w.text), dir))
	}
	for _, g := range rules.Denied {
		if j.globsMeet(segs, g.Segments()) {
			j.add(Ask, RuleDeniedPath, fmt.Sprintf("the pattern %s may match files denied by %q; name the files you need literally", shorten(w.text), g.Source()))
			break
		}
	}
	return false
}

// nameSelector judges the value of an option that picks, by name, the files a program reads beneath the
// directories it walks (grep -r --include=.env, rg -g id_rsa): a name that is denied wherever it is
// (**/.env, **/*.pem) is a read of those files, and denied. A name denied only in some directories
// (config: .git/config) also picks ordinary files, and a pattern (--include=*.go, which may pick .env.go)
// narrows the recursive read it belongs to (grep -r x .): both are left to the sandbox, which hides every
// denied file whatever reads it. An exclusion (rg's "!x") picks nothing.
func (j *judge) nameSelector(prog, opt string, v word) {
	if !v.known || hasGlobMeta(v.text) || strings.HasPrefix(v.text, "!") || strings.Contains(v.text, "/") {
		return // unknown: the unknown-argument rule has asked already
	}
	for _, d := range j.dirs {
		for _, p := range []string{path.Join(d, v.text), path.Join(d, "x", v.text)} {
			if g, ok := j.paths.DeniedBy(p); ok {
				j.add(Deny, RuleDeniedPath, fmt.Sprintf("`%s %s %s` reads every file named %s beneath %s, which %q denies; leave them out", CommandBase(prog), opt, v.text, v.text, d, g.Source()))
				return
			}
		}
	}
}

// maySecret checks a word that may name a file although policy does not know the program's options:
// an option's value (--contents=.env, -f.env), or what follows a colon (HEAD:.env) or an equals sign.
// Only the denied globs apply: such a word is not known to be a path, so it is not held to the roots.
func (j *judge) maySecret(text string) {
	if len(text) > maxPathBytes {
		return
	}
	var cands []string
	cands = append(cands, text)
	for i := 0; i < len(text); i++ {
		if text[i] == '=' || text[i] == ':' || text[i] == '@' {
			cands = append(cands, text[i+1:]) // --file=X, REV:X, file:///X, curl -d @X
		}
	}
	if len(text) > 2 && text[0] == '-' && text[1] != '-' {
		for k := 2; k < len(text) && k < 16; k++ {
			cands = append(cands, text[k:])
		}
	}
	for _, c := range cands {
		if c == "" || c == "-" {
			continue
		}
		if _, err := ResolvePath(c); err != nil {
			continue
		}
		paths, unknownBase := j.resolve(c)
		for _, p := range paths {
			if g, ok := j.paths.DeniedBy(p); ok {
				j.add(Deny, RuleDeniedPath, DeniedDetail(p, g))
				return
			}
		}
		if unknownBase {
			j.checkUnknownBase(c, false)
		}
	}
}

// stringOption reports whether a long option's value is, by its name, a pattern or text rather than a
// file: --exclude=.env names no file to read.
func stringOption(name string) bool {
	for _, s := range []string{"exclude", "include", "ignore", "hide", "name", "glob", "pattern", "regex",
		"match", "message", "label", "title", "format", "grep", "author", "committer", "since", "until",
		"before", "after", "date", "prefix", "suffix", "separator", "delimiter", "type"} {
		if strings.Contains(name, s) {
			return true
		}
	}
	return false
}

func unescapeGlob(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+1 < len(s) {
			i++
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
