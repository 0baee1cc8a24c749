package oracle

import (
	"bufio"
	"encoding/hex"
	"io"
	"path"
	"strconv"
	"strings"
)

// What one traced run did, read from `strace -f -qq -xx -y` output: every program a process executed
// and every file opened for writing or created, renamed, removed or linked, with the process's image at
// the time, so that each action can be laid at the door of whoever did it.

// proc is one traced process. strace prints a child's first calls before its parent's fork returns
// at times, so images are kept with the sequence number of the line that set them, and who called what
// is worked out when the whole trace is read.
type proc struct {
	parent   int
	forkSeq  int      // when the parent's fork returned
	images   []seqImg // the programs the process ran, from its successful execves
	cwd      string   // its working directory, for calls that name a relative path without a descriptor
	hasCwd   bool
	execSeen bool
}

type seqImg struct {
	seq   int
	image string
}

type execEvent struct {
	pid    int
	seq    int
	path   string
	caller []string // images from the calling process up to the root, before the execve
	first  bool     // the root's own execve of the shell
}

type fileEvent struct {
	pid     int
	seq     int
	path    string // as the call named it, joined to its directory descriptor's path
	real    string // as the kernel resolved it (the returned descriptor's path), when known
	write   bool
	dir     bool     // opened as a directory (O_DIRECTORY): listed, not read
	caller  []string // images from the process up to the root
	syscall string
}

type trace struct {
	execs []execEvent
	files []fileEvent
	procs map[int]*proc
}

var writeSyscalls = map[string]bool{
	"creat": true, "rename": true, "renameat": true, "renameat2": true, "unlink": true, "unlinkat": true,
	"mkdir": true, "mkdirat": true, "rmdir": true, "symlink": true, "symlinkat": true, "link": true,
	"linkat": true, "truncate": true,
}

// parseTrace reads strace output.
func parseTrace(r io.Reader, cwd string) trace {
	t := trace{procs: map[int]*proc{}}
	pending := map[int]string{}
	root := 0
	seq := 0
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Text()
		pidText, rest, ok := strings.Cut(strings.TrimLeft(line, " "), " ")
		pid, err := strconv.Atoi(pidText)
		if !ok || err != nil {
			continue
		}
		rest = strings.TrimLeft(rest, " ")
		seq++
		if root == 0 {
			root = pid
			t.procs[pid] = &proc{cwd: cwd, hasCwd: true}
		}
		if strings.HasSuffix(rest, "<unfinished ...>") {
			pending[pid] = strings.TrimSuffix(rest, "<unfinished ...>")
			continue
		}
		if strings.HasPrefix(rest, "<... ") {
			_, after, ok := strings.Cut(rest, " resumed>")
			if !ok {
				continue
			}
			rest = pending[pid] + after
			delete(pending, pid)
		}
		name, args, ret, ok := splitCall(rest)
		if !ok {
			continue
		}
		p := t.procs[pid]
		if p == nil {
			p = &proc{}
			t.procs[pid] = p
		}
		switch name {
		case "clone", "clone3", "fork", "vfork":
			if child, err := strconv.Atoi(retValue(ret)); err == nil && child > 0 {
				c := t.procs[child]
				if c == nil {
					c = &proc{}
					t.procs[child] = c
				}
				c.parent, c.forkSeq = pid, seq
				if !c.hasCwd {
					c.cwd, c.hasCwd = p.cwd, true
				}
			}
		case "chdir", "fchdir":
			if retValue(ret) != "0" {
				continue
			}
			if name == "chdir" {
				p.cwd = absolute(p.cwd, decodeString(at(args, 0)))
			} else if _, dir, ok := strings.Cut(at(args, 0), "<"); ok {
				p.cwd = decodeString(`"` + strings.TrimSuffix(dir, ">") + `"`)
			}
		case "execve", "execveat":
			if retValue(ret) != "0" || len(args) == 0 {
				continue
			}
			file := args[0]
			if name == "execveat" && len(args) > 1 {
				file = joinDir(args[0], args[1])
			}
			ev := execEvent{pid: pid, seq: seq, path: decodeString(file), first: pid == root && !p.execSeen}
			t.execs = append(t.execs, ev)
			p.images = append(p.images, seqImg{seq, path.Base(ev.path)})
			p.execSeen = true
		case "open", "openat", "openat2", "creat":
			if strings.HasPrefix(retValue(ret), "-") {
				continue
			}
			var file, flags string
			switch name {
			case "open":
				file, flags = at(args, 0), at(args, 1)
			case "creat":
				file, flags = at(args, 0), "O_CREAT|O_WRONLY|O_TRUNC"
			default:
				file, flags = joinDir(at(args, 0), at(args, 1)), at(args, 2)
			}
			write := strings.Contains(flags, "O_WRONLY") || strings.Contains(flags, "O_RDWR") ||
				strings.Contains(flags, "O_CREAT") || strings.Contains(flags, "O_TRUNC") || strings.Contains(flags, "O_APPEND")
			t.files = append(t.files, fileEvent{pid: pid, seq: seq, path: absolute(p.cwd, decodeString(file)), real: descriptorPath(ret), write: write,
				dir: strings.Contains(flags, "O_DIRECTORY"), syscall: name})
		default:
			if !writeSyscalls[name] || strings.HasPrefix(retValue(ret), "-") {
				continue
			}
			for _, f := range writtenPaths(name, args) {
				t.files = append(t.files, fileEvent{pid: pid, seq: seq, path: absolute(p.cwd, f), write: true, syscall: name})
			}
		}
	}
	for i := range t.execs {
		e := &t.execs[i]
		e.caller = t.chain(e.pid, e.seq-1) // the images before this execve
	}
	for i := range t.files {
		f := &t.files[i]
		f.caller = t.chain(f.pid, f.seq)
	}
	return t
}

func absolute(cwd, p string) string {
	if strings.HasPrefix(p, "/") || cwd == "" {
		return path.Clean(p)
	}
	return path.Join(cwd, p)
}

// chain lists the images of pid and its ancestors as they were at line seq.
func (t trace) chain(pid, seq int) []string {
	var out []string
	for seen := 0; pid != 0 && seen < 64; seen++ {
		out = append(out, t.imageAt(pid, seq))
		p := t.procs[pid]
		if p == nil {
			break
		}
		if p.parent != 0 && p.forkSeq < seq {
			seq = p.forkSeq // the parent as it was when it forked
		}
		pid = p.parent
	}
	return out
}

// imageAt is the program pid ran at line seq: its last execve before then, or else what its parent ran
// when it forked.
func (t trace) imageAt(pid, seq int) string {
	for seen := 0; pid != 0 && seen < 64; seen++ {
		p := t.procs[pid]
		if p == nil {
			return ""
		}
		img, ok := "", false
		for _, si := range p.images {
			if si.seq <= seq {
				img, ok = si.image, true
			}
		}
		if ok {
			return img
		}
		if p.parent == 0 {
			return ""
		}
		seq = min(seq, p.forkSeq)
		pid = p.parent
	}
	return ""
}

// writtenPaths are the paths a write-like call changes.
func writtenPaths(name string, args []string) []string {
	d := func(s string) string { return decodeString(s) }
	switch name {
	case "rename", "link", "symlink":
		if name == "symlink" {
			return []string{d(at(args, 1))}
		}
		return []string{d(at(args, 0)), d(at(args, 1))}
	case "renameat", "renameat2", "linkat":
		if name == "linkat" {
			return []string{d(joinDir(at(args, 2), at(args, 3)))}
		}
		return []string{d(joinDir(at(args, 0), at(args, 1))), d(joinDir(at(args, 2), at(args, 3)))}
	case "symlinkat":
		return []string{d(joinDir(at(args, 1), at(args, 2)))}
	case "unlinkat", "mkdirat":
		return []string{d(joinDir(at(args, 0), at(args, 1)))}
	default: // unlink, mkdir, rmdir, truncate, creat
		return []string{d(at(args, 0))}
	}
}

func at(args []string, i int) string {
	if i < len(args) {
		return args[i]
	}
	return ""
}

// joinDir joins a path argument to its directory descriptor, shown by -y as AT_FDCWD<path> or 3<path>.
// The result is in strace's quoted form.
func joinDir(dirfd, file string) string {
	f := decodeString(file)
	if strings.HasPrefix(f, "/") {
		return file
	}
	_, dir, ok := strings.Cut(dirfd, "<")
	if !ok {
		return file
	}
	return `"` + escapeHex(path.Join(decodeString(`"`+strings.TrimSuffix(dir, ">")+`"`), f)) + `"`
}

func descriptorPath(ret string) string {
	_, p, ok := strings.Cut(ret, "<")
	if !ok {
		return ""
	}
	return decodeString(`"` + strings.TrimSuffix(strings.TrimSpace(p), ">") + `"`)
}

func retValue(ret string) string {
	v, _, _ := strings.Cut(strings.TrimSpace(ret), "<")
	f := strings.Fields(v)
	if len(f) == 0 {
		return ""
	}
	return f[0]
}

// splitCall splits `name(a, b, c) = ret` into its parts, arguments split at top-level commas.
func splitCall(s string) (name string, args []string, ret string, ok bool) {
	open := strings.IndexByte(s, '(')
	if open <= 0 {
		return "", nil, "", false
	}
	name = s[:open]
	depth, inStr := 0, false
	start := open + 1
	for i := open + 1; i < len(s); i++ {
		c := s[i]
		switch {
		case inStr:
			if c == '\\' {
				i++
			} else if c == '"' {
				inStr = false
			}
		case c == '"':
			inStr = true
		case c == '(' || c == '[' || c == '{' || c == '<':
			depth++
		case c == ']' || c == '}' || c == '>':
			depth--
		case c == ')':
			if depth == 0 {
				if a := strings.TrimSpace(s[start:i]); a != "" {
					args = append(args, a)
				}
				_, ret, _ = strings.Cut(s[i+1:], "=")
				return name, args, strings.TrimSpace(ret), true
			}
			depth--
		case c == ',' && depth == 0:
			args = append(args, strings.TrimSpace(s[start:i]))
			start = i + 1
		}
	}
	return "", nil, "", false
}

// decodeString decodes a quoted strace string printed with -xx ("\x2f\x74...").
func decodeString(s string) string {
	s = strings.TrimSuffix(s, "...")
	if len(s) < 2 || s[0] != '"' {
		return s
	}
	s = s[1 : len(s)-1]
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) && s[i+1] == 'x' {
			if v, err := hex.DecodeString(s[i+2 : i+4]); err == nil {
				b.WriteByte(v[0])
				i += 3
				continue
			}
		}
		if s[i] == '\\' && i+1 < len(s) {
			i++
			switch s[i] {
			case 'n':
				b.WriteByte('\n')
			case 't':
				b.WriteByte('\t')
			default:
				b.WriteByte(s[i])
			}
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func escapeHex(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		b.WriteString(`\x`)
		b.WriteString(hex.EncodeToString([]byte{s[i]}))
	}
	return b.String()
}

// runShells are the shells the driver's wrapper runs each line under, by the name splitRuns gives
// their runs.
var runShells = map[string]string{"/bin/sh": "sh", "/bin/bash": "bash"}

// splitRuns splits the trace of the driver's wrapper shell (the root) into the runs of the shells it
// started, by shell name ("sh", "bash"). A run starts at the first execve of a shell by a process that
// descends from no run yet (the wrapper's timeout is in between); each later event goes to the run whose
// shell the process descends from, and the wrapper's own work (resetting the workspace between the
// runs) to none. In each run, the shell's execve is its first, and a caller chain ends at its shell.
func splitRuns(t trace) map[string]trace {
	root := 0
	for _, e := range t.execs {
		if e.first {
			root = e.pid
			break
		}
	}
	type run struct {
		name  string
		seq   int // of the shell's execve
		depth int // how many processes above the run's shell, up to the root
	}
	runs := map[int]run{}
	top := func(pid int) (int, bool) {
		for seen := 0; pid != 0 && pid != root && seen < 64; seen++ {
			if _, ok := runs[pid]; ok {
				return pid, true
			}
			p := t.procs[pid]
			if p == nil {
				break
			}
			pid = p.parent
		}
		return 0, false
	}
	for _, e := range t.execs {
		name, shell := runShells[e.path]
		if !shell || e.pid == root {
			continue
		}
		if _, inRun := top(e.pid); !inRun {
			depth := 0
			for p := t.procs[e.pid]; p != nil && p.parent != 0 && depth < 64; p = t.procs[p.parent] {
				depth++
			}
			runs[e.pid] = run{name: name, seq: e.seq, depth: depth}
		}
	}
	trim := func(c []string, r run) []string {
		return c[:max(len(c)-r.depth, 0)]
	}
	out := map[string]trace{}
	into := func(pid int, add func(tr *trace, r run, shell int)) {
		if shell, ok := top(pid); ok {
			r := runs[shell]
			tr := out[r.name]
			add(&tr, r, shell)
			out[r.name] = tr
		}
	}
	for _, e := range t.execs {
		into(e.pid, func(tr *trace, r run, shell int) {
			e.first = e.pid == shell && e.seq == r.seq
			e.caller = trim(e.caller, r)
			tr.execs = append(tr.execs, e)
		})
	}
	for _, f := range t.files {
		into(f.pid, func(tr *trace, r run, _ int) {
			f.caller = trim(f.caller, r)
			tr.files = append(tr.files, f)
		})
	}
	for name, tr := range out {
		tr.procs = t.procs
		out[name] = tr
	}
	return out
}
