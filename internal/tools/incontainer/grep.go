package incontainer

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"regexp"
	"strings"

	"github.com/toolpool/toolpool/internal/call"
)

const (
	grepDefaultLimit = 200
	grepMaxLimit     = 2000
	grepMaxContext   = 20
	// grepMaxLine is how much of a matching or context line grep shows.
	grepMaxLine = 500
	// grepScanLine is how much of each line grep searches.
	grepScanLine = 1 << 20
	// GrepOutputBytes caps grep's output.
	GrepOutputBytes = 192 << 10
)

type grepArgs struct {
	Pattern    string `json:"pattern"`
	Path       string `json:"path"`
	Glob       string `json:"glob"`
	IgnoreCase bool   `json:"ignore_case"`
	Context    IntArg `json:"context"`
	Limit      IntArg `json:"limit"`
}

// grepSearch is one grep call's state.
type grepSearch struct {
	e       *runEnv
	re      *regexp.Regexp
	context int
	limit   int
	out     strings.Builder
	matches int
	full    bool // limit or output cap reached
	capped  bool // output cap reached
	hidden  int  // files and directories skipped because policy denies them
}

func runGrep(e *runEnv, raw json.RawMessage) (RunnerResult, error) {
	var a grepArgs
	if err := decodeArgs(raw, &a); err != nil {
		return RunnerResult{}, err
	}
	base, err := e.resolve("path", a.Path)
	if err != nil {
		return RunnerResult{}, err
	}
	expr := a.Pattern
	if a.IgnoreCase {
		expr = "(?i)" + expr
	}
	re, err := regexp.Compile(expr)
	if err != nil {
		return RunnerResult{}, toolErr(call.ErrInvalidParams, "invalid regular expression %q: %v (Go RE2 syntax: escape literal characters such as ( [ . * + ? { | with \\, and note that lookaround and backreferences are not supported)", a.Pattern, err)
	}
	var filter *glob
	if a.Glob != "" {
		if filter, err = compileGlob(a.Glob); err != nil {
			return RunnerResult{}, toolErr(call.ErrInvalidParams, "%v", err)
		}
	}
	s := &grepSearch{e: e, re: re, context: min(max(int(a.Context), 0), grepMaxContext), limit: int(a.Limit)}
	if s.limit < 1 {
		s.limit = grepDefaultLimit
	}
	s.limit = min(s.limit, grepMaxLimit)

	info, err := e.root.Stat(base)
	if err != nil {
		return RunnerResult{}, pathErr(err, "search", base)
	}
	visited := 0
	stopped := false
	if !info.IsDir() {
		if err := s.file(base, true); err != nil {
			return RunnerResult{}, err
		}
	} else {
		if pattern, ok := e.deniedRel(base); ok {
			return RunnerResult{}, toolErr(call.ErrPolicyDenied, "search %s: it matches the denied pattern %q (secrets and keys stay out of reach); search elsewhere", showPath(base), pattern)
		}
		err = fs.WalkDir(e.root.FS(), base, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				if p == base {
					return pathErr(err, "search", base)
				}
				return nil
			}
			if visited++; visited > walkMaxEntries {
				stopped = true
				return fs.SkipAll
			}
			if p == base {
				return nil
			}
			if _, denied := e.deniedRel(p); denied {
				s.hidden++
				if d.IsDir() {
					return fs.SkipDir
				}
				return nil
			}
			if d.IsDir() {
				if ignoredDirs[d.Name()] && (filter == nil || !filter.names(d.Name())) {
					return fs.SkipDir
				}
				return nil
			}
			if !d.Type().IsRegular() {
				return nil
			}
			if filter != nil {
				rel := relTo(base, p)
				segs := strings.Split(rel, "/")
				if !strings.Contains(a.Glob, "/") {
					segs = []string{path.Base(rel)}
				}
				if !filter.match(segs) {
					return nil
				}
			}
			if err := s.file(p, false); err != nil {
				return err
			}
			if s.full {
				return fs.SkipAll
			}
			return nil
		})
		if err != nil {
			return RunnerResult{}, err
		}
	}
	hiddenNote := ""
	if s.hidden > 0 {
		hiddenNote = fmt.Sprintf("[%d files or directories were not searched: policy denies them (secrets and keys)]", s.hidden)
	}
	if s.matches == 0 {
		msg := fmt.Sprintf("No matches for %q in %s", a.Pattern, showPath(base))
		if a.Glob != "" {
			msg += fmt.Sprintf(" (files matching %q)", a.Glob)
		}
		msg += "."
		if stopped {
			msg += fmt.Sprintf(" The search stopped after %d entries: give a narrower path.", walkMaxEntries)
		}
		if hiddenNote != "" {
			msg += " " + hiddenNote
		}
		return RunnerResult{Output: msg}, nil
	}
	res := RunnerResult{}
	if hiddenNote != "" {
		s.out.WriteString(hiddenNote + "\n")
	}
	switch {
	case s.capped:
		fmt.Fprintf(&s.out, "[output capped at %d KiB after %d matching lines: narrow the pattern, path or glob, or use less context]\n", GrepOutputBytes>>10, s.matches)
		res.Truncated = true
	case s.full:
		fmt.Fprintf(&s.out, "[stopped after %d matching lines: narrow the pattern, path or glob, or raise limit (at most %d)]\n", s.matches, grepMaxLimit)
		res.Truncated = true
	}
	if stopped {
		fmt.Fprintf(&s.out, "[the search stopped after visiting %d entries: there may be more matches; give a narrower path]\n", walkMaxEntries)
		res.Truncated = true
	}
	res.Output = strings.TrimSuffix(s.out.String(), "\n")
	return res, nil
}

// file searches one file, skipping it when it looks binary.
func (s *grepSearch) file(p string, single bool) error {
	if err := s.e.ctx.Err(); err != nil {
		return err
	}
	f, err := s.e.root.Open(p)
	if err != nil {
		if single {
			return pathErr(err, "search", p)
		}
		return nil // in a walk, unreadable files and symlinks leading out of the workspace are skipped
	}
	defer f.Close()
	if err := s.e.guard(f, "search", p); err != nil {
		if single {
			return err
		}
		s.hidden++
		return nil // a link to a denied file is skipped like the file
	}
	br := bufio.NewReaderSize(f, 64<<10)
	sample, err := br.Peek(binarySniffBytes)
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, bufio.ErrBufferFull) {
		return nil
	}
	if looksBinary(sample) {
		return nil
	}
	var (
		before  []string // the last s.context lines, as rendered text
		after   int      // context lines still to print after a match
		lastOut int      // the last line number of this file printed, 0 for none
		lineNo  int
		buf     []byte
	)
	for {
		line, total, ok, err := nextLine(br, grepScanLine, buf)
		if err != nil || !ok {
			return nil
		}
		buf = line
		lineNo++
		if lineNo%4096 == 0 {
			if err := s.e.ctx.Err(); err != nil {
				return err
			}
		}
		text, _ := lineText(line, total, grepScanLine)
		if s.re.MatchString(text) {
			if s.matches >= s.limit {
				s.full = true
				return nil
			}
			if start := lineNo - len(before); s.context > 0 && s.out.Len() > 0 && (lastOut == 0 || start > lastOut+1) {
				s.write("--\n")
			}
			for i, b := range before {
				s.write(fmt.Sprintf("%s-%d-%s\n", p, lineNo-len(before)+i, b))
			}
			before = before[:0]
			s.write(fmt.Sprintf("%s:%d:%s\n", p, lineNo, shortLine(text)))
			s.matches++
			lastOut = lineNo
			after = s.context
			if s.capped {
				s.full = true
				return nil
			}
			continue
		}
		if after > 0 {
			s.write(fmt.Sprintf("%s-%d-%s\n", p, lineNo, shortLine(text)))
			after--
			lastOut = lineNo
			continue
		}
		if s.context > 0 {
			before = append(before, shortLine(text))
			if len(before) > s.context {
				before = before[1:]
			}
		}
	}
}

// write appends to the output unless the output cap is reached.
func (s *grepSearch) write(text string) {
	if s.out.Len()+len(text) > GrepOutputBytes {
		s.capped = true
		return
	}
	s.out.WriteString(text)
}

// shortLine cuts a line for display.
func shortLine(text string) string {
	if len(text) <= grepMaxLine {
		return text
	}
	n := grepMaxLine
	for n > 0 && n > grepMaxLine-4 && text[n]&0xC0 == 0x80 {
		n--
	}
	return text[:n] + fmt.Sprintf(" [... %d more bytes]", len(text)-n)
}
