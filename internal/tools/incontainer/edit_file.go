package incontainer

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"strings"

	"github.com/toolpool/toolpool/internal/call"
)

const (
	// editFileMaxBytes bounds the files edit_file loads into memory.
	editFileMaxBytes = 16 << 20
	// diffContext is how many unchanged lines surround each hunk of edit_file's diff.
	diffContext = 3
	// diffMaxLines bounds the diff edit_file returns.
	diffMaxLines = 400
)

type editFileArgs struct {
	Path       string `json:"path"`
	OldString  string `json:"old_string"`
	NewString  string `json:"new_string"`
	ReplaceAll bool   `json:"replace_all"`
}

func runEditFile(e *runEnv, raw json.RawMessage) (RunnerResult, error) {
	var a editFileArgs
	if err := decodeArgs(raw, &a); err != nil {
		return RunnerResult{}, err
	}
	rel, err := e.resolve("path", a.Path)
	if err != nil {
		return RunnerResult{}, err
	}
	shown := showPath(rel)
	if a.OldString == a.NewString {
		return RunnerResult{}, toolErr(call.ErrInvalidParams, "edit %s: old_string and new_string are the same, so there is nothing to change", shown)
	}
	info, err := e.root.Stat(rel)
	if errors.Is(err, fs.ErrNotExist) && a.OldString == "" && !isEscape(err) {
		if dir := path.Dir(rel); dir != "." {
			if err := e.root.MkdirAll(dir, 0o755); err != nil {
				return RunnerResult{}, pathErr(err, "create directory", dir)
			}
		}
		if err := e.writeAtomic(rel, []byte(a.NewString)); err != nil {
			return RunnerResult{}, err
		}
		return RunnerResult{Output: fmt.Sprintf("Created %s (%d bytes).\n\n%s", shown, len(a.NewString),
			unifiedDiff(rel, "", a.NewString, []span{{0, 0, len(a.NewString)}}))}, nil
	}
	if err != nil {
		return RunnerResult{}, pathErr(err, "edit", rel)
	}
	if info.IsDir() {
		return RunnerResult{}, toolErr(call.ErrInvalidParams, "edit %s: it is a directory, not a file", shown)
	}
	if !info.Mode().IsRegular() {
		return RunnerResult{}, toolErr(call.ErrInvalidParams, "edit %s: it is not a regular file (%s)", shown, info.Mode().Type())
	}
	if info.Size() > editFileMaxBytes {
		return RunnerResult{}, toolErr(call.ErrInvalidParams, "edit %s: the file has %d bytes, more than edit_file's limit of %d: edit it with run_shell (sed, a script)", shown, info.Size(), editFileMaxBytes)
	}
	data, err := e.readGuarded(rel, "edit")
	if err != nil {
		return RunnerResult{}, err
	}
	content := string(data)
	if looksBinary(data[:min(len(data), binarySniffBytes)]) {
		return RunnerResult{}, toolErr(call.ErrInvalidParams, "edit %s: it looks like a binary file: edit_file changes text only", shown)
	}
	if a.OldString == "" {
		if content != "" {
			return RunnerResult{}, toolErr(call.ErrInvalidParams, "edit %s: old_string is empty, which only creates a file or fills an empty one, and this file has %d bytes: give the text to replace, or use write_file to replace the whole file", shown, len(content))
		}
		if err := e.writeAtomic(rel, []byte(a.NewString)); err != nil {
			return RunnerResult{}, err
		}
		return RunnerResult{Output: fmt.Sprintf("Wrote %s (%d bytes; it was empty).\n\n%s", shown, len(a.NewString),
			unifiedDiff(rel, "", a.NewString, []span{{0, 0, len(a.NewString)}}))}, nil
	}

	oldS, newS := a.OldString, a.NewString
	n := strings.Count(content, oldS)
	if n == 0 && strings.Contains(content, "\r\n") && strings.Contains(oldS, "\n") && !strings.Contains(oldS, "\r\n") {
		// The model saw the file through read_file, which hides "\r": match it with CRLF endings.
		oldS = strings.ReplaceAll(oldS, "\n", "\r\n")
		newS = strings.ReplaceAll(strings.ReplaceAll(newS, "\r\n", "\n"), "\n", "\r\n")
		n = strings.Count(content, oldS)
	}
	switch {
	case n == 0:
		hint := "re-read the file with read_file and copy the text exactly: check whitespace, indentation (tabs or spaces) and line breaks, and leave out the line numbers"
		if strings.Contains(content, strings.TrimSpace(a.OldString)) && strings.TrimSpace(a.OldString) != "" {
			hint = "the text occurs with different leading or trailing whitespace or line breaks: " + hint
		}
		return RunnerResult{}, toolErr(call.ErrInvalidParams, "edit %s: old_string was not found in the file: %s", shown, hint)
	case n > 1 && !a.ReplaceAll:
		return RunnerResult{}, toolErr(call.ErrInvalidParams, "edit %s: old_string was found %d times, but it must occur exactly once: add surrounding lines to make it unique, or set replace_all to true to replace all %d", shown, n, n)
	}

	var (
		b     strings.Builder
		spans []span
		start int
	)
	for start <= len(content) {
		i := strings.Index(content[start:], oldS)
		if i < 0 {
			break
		}
		i += start
		b.WriteString(content[start:i])
		spans = append(spans, span{old: i, oldLen: len(oldS), newLen: len(newS)})
		b.WriteString(newS)
		start = i + len(oldS)
		if !a.ReplaceAll {
			break
		}
	}
	b.WriteString(content[start:])
	updated := b.String()
	if err := e.writeAtomic(rel, []byte(updated)); err != nil {
		return RunnerResult{}, err
	}
	what := "1 occurrence"
	if len(spans) > 1 {
		what = fmt.Sprintf("%d occurrences", len(spans))
	}
	return RunnerResult{Output: fmt.Sprintf("Edited %s: replaced %s.\n\n%s", shown, what, unifiedDiff(rel, content, updated, spans))}, nil
}

// span is one replacement: oldLen bytes at offset old of the old text became newLen bytes.
type span struct {
	old, oldLen, newLen int
}

// unifiedDiff renders the replacements spans (in order, not overlapping) that turned before into after as a
// unified diff with diffContext lines of context, hunks that touch merged, cut after diffMaxLines lines.
func unifiedDiff(name, before, after string, spans []span) string {
	oldLines, newLines := splitLines(before), splitLines(after)
	oldStarts, newStarts := lineStarts(before), lineStarts(after)

	// Each change as byte regions [s, e) that begin and end on line boundaries in both texts. A region
	// takes in every replacement that starts before its end, and grows by whole lines until its end is a
	// line boundary in the new text too.
	type region struct{ os, oe, ns, ne int }
	var regions []region
	spanEnd := func(sp span, lineStart int) int {
		if sp.oldLen == 0 && sp.old == lineStart {
			return sp.old // an insertion at a line start replaces no line
		}
		return nextBoundary(before, sp.old+max(sp.oldLen, 1)-1)
	}
	deltaBefore := 0
	for i := 0; i < len(spans); {
		r := region{os: oldStarts[lineOf(oldStarts, spans[i].old)]}
		r.ns = r.os + deltaBefore
		r.oe = spanEnd(spans[i], r.os)
		d := spans[i].newLen - spans[i].oldLen
		j := i
		for {
			for j+1 < len(spans) && spans[j+1].old < r.oe {
				j++
				d += spans[j].newLen - spans[j].oldLen
				r.oe = max(r.oe, spanEnd(spans[j], oldStarts[lineOf(oldStarts, spans[j].old)]))
			}
			r.ne = r.oe + deltaBefore + d
			if r.oe >= len(before) || r.ne == 0 || r.ne >= len(after) || after[r.ne-1] == '\n' {
				break
			}
			r.oe = nextBoundary(before, r.oe) // the new text ends mid-line: take in the rest of that line
		}
		regions = append(regions, r)
		deltaBefore += d
		i = j + 1
	}
	type change struct{ os, oe, ns, ne int }
	var changes []change
	for _, r := range regions {
		c := change{
			os: boundaryLine(oldStarts, len(oldLines), len(before), r.os),
			oe: boundaryLine(oldStarts, len(oldLines), len(before), r.oe),
			ns: boundaryLine(newStarts, len(newLines), len(after), r.ns),
			ne: boundaryLine(newStarts, len(newLines), len(after), r.ne),
		}
		// Lines of old_string that new_string repeats are context, not change.
		for c.os < c.oe && c.ns < c.ne && oldLines[c.os] == newLines[c.ns] {
			c.os, c.ns = c.os+1, c.ns+1
		}
		for c.os < c.oe && c.ns < c.ne && oldLines[c.oe-1] == newLines[c.ne-1] {
			c.oe, c.ne = c.oe-1, c.ne-1
		}
		if c.os == c.oe && c.ns == c.ne {
			continue
		}
		if n := len(changes); n > 0 && c.os == changes[n-1].oe {
			changes[n-1].oe, changes[n-1].ne = c.oe, c.ne // adjacent: one block of "-" then "+"
			continue
		}
		changes = append(changes, c)
	}

	var b strings.Builder
	fmt.Fprintf(&b, "--- a/%s\n+++ b/%s\n", name, name)
	lines := 0
	for i := 0; i < len(changes); {
		j := i
		for j+1 < len(changes) && changes[j+1].os-changes[j].oe <= 2*diffContext {
			j++
		}
		first, last := changes[i], changes[j]
		hos := max(0, first.os-diffContext)
		hns := first.ns - (first.os - hos)
		hoe := min(len(oldLines), last.oe+diffContext)
		hne := last.ne + (hoe - last.oe)
		fmt.Fprintf(&b, "@@ -%s +%s @@\n", hunkRange(hos, hoe-hos), hunkRange(hns, hne-hns))
		emit := func(prefix string, l string) {
			lines++
			if lines > diffMaxLines {
				return
			}
			b.WriteString(prefix)
			b.WriteString(strings.TrimSuffix(l, "\n"))
			b.WriteByte('\n')
			if !strings.HasSuffix(l, "\n") {
				b.WriteString("\\ No newline at end of file\n")
			}
		}
		o := hos
		for k := i; k <= j; k++ {
			c := changes[k]
			for ; o < c.os; o++ {
				emit(" ", oldLines[o])
			}
			for x := c.os; x < c.oe; x++ {
				emit("-", oldLines[x])
			}
			for x := c.ns; x < c.ne; x++ {
				emit("+", newLines[x])
			}
			o = c.oe
		}
		for ; o < hoe; o++ {
			emit(" ", oldLines[o])
		}
		i = j + 1
	}
	if lines > diffMaxLines {
		fmt.Fprintf(&b, "[... diff cut: %d more lines; read the file to see the rest]\n", lines-diffMaxLines)
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// splitLines splits s into lines, each with its "\n" (the last may lack one).
func splitLines(s string) []string {
	if s == "" {
		return nil
	}
	lines := strings.SplitAfter(s, "\n")
	if lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	return lines
}

// lineStarts returns the byte offset where each line of s starts, and len(s) when s ends with "\n" (where a
// line added at the end would start).
func lineStarts(s string) []int {
	starts := []int{0}
	for i := 0; i < len(s); i++ {
		if s[i] == '\n' {
			starts = append(starts, i+1)
		}
	}
	return starts
}

// lineOf returns the index of the line holding byte offset off.
func lineOf(starts []int, off int) int {
	lo, hi := 0, len(starts)-1
	for lo < hi {
		mid := (lo + hi + 1) / 2
		if starts[mid] <= off {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return lo
}

// nextBoundary returns the offset just after the line ending at or after byte off of s, or len(s).
func nextBoundary(s string, off int) int {
	if off >= len(s) {
		return len(s)
	}
	if i := strings.IndexByte(s[off:], '\n'); i >= 0 {
		return off + i + 1
	}
	return len(s)
}

// boundaryLine returns the index of the line starting at byte b, a line boundary of a text of size bytes and
// n lines.
func boundaryLine(starts []int, n, size, b int) int {
	if b >= size {
		return n
	}
	return lineOf(starts, b)
}

// hunkRange renders "start,count" of a unified diff header (1-based; an empty range names the line before).
func hunkRange(start, count int) string {
	if count == 0 {
		return fmt.Sprintf("%d,0", start)
	}
	if count == 1 {
		return fmt.Sprintf("%d", start+1)
	}
	return fmt.Sprintf("%d,%d", start+1, count)
}
