package incontainer

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"

	"github.com/toolpool/toolpool/internal/call"
)

const (
	readFileDefaultLimit = 2000
	readFileMaxLimit     = 10000
	// readFileMaxLine is how much of one line read_file shows.
	readFileMaxLine = 2000
	// ReadFileOutputBytes caps read_file's output; it stops at a line boundary and says where to go on.
	ReadFileOutputBytes = 256 << 10
	// readFileCountLimit: files up to this size have their lines counted for the continuation hint.
	readFileCountLimit = 32 << 20
)

type readFileArgs struct {
	Path   string `json:"path"`
	Offset IntArg `json:"offset"`
	Limit  IntArg `json:"limit"`
}

func runReadFile(e *runEnv, raw json.RawMessage) (RunnerResult, error) {
	var a readFileArgs
	if err := decodeArgs(raw, &a); err != nil {
		return RunnerResult{}, err
	}
	rel, err := e.resolve("path", a.Path)
	if err != nil {
		return RunnerResult{}, err
	}
	offset, limit := int64(a.Offset), int64(a.Limit)
	if offset < 1 {
		offset = 1
	}
	explicitLimit := limit > 0
	if limit < 1 {
		limit = readFileDefaultLimit
	}
	limit = min(limit, readFileMaxLimit)

	info, err := e.root.Stat(rel)
	if err != nil {
		return RunnerResult{}, pathErr(err, "read", rel)
	}
	if info.IsDir() {
		return RunnerResult{}, toolErr(call.ErrInvalidParams, "read %s: it is a directory, not a file: use list_files to see what it holds", showPath(rel))
	}
	if !info.Mode().IsRegular() {
		return RunnerResult{}, toolErr(call.ErrInvalidParams, "read %s: it is not a regular file (%s)", showPath(rel), info.Mode().Type())
	}
	f, err := e.root.Open(rel)
	if err != nil {
		return RunnerResult{}, pathErr(err, "read", rel)
	}
	defer f.Close()
	if err := e.guard(f, "read", rel); err != nil {
		return RunnerResult{}, err
	}

	br := bufio.NewReaderSize(f, 64<<10)
	sample, err := br.Peek(binarySniffBytes)
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, bufio.ErrBufferFull) {
		return RunnerResult{}, pathErr(err, "read", rel)
	}
	if len(sample) == 0 {
		return RunnerResult{Output: fmt.Sprintf("[%s is empty: 0 bytes]", showPath(rel))}, nil
	}
	if looksBinary(sample) {
		return RunnerResult{}, toolErr(call.ErrInvalidParams,
			"read %s: it looks like a binary file (%d bytes; NUL bytes or invalid UTF-8 in its first 8 KiB) and read_file shows only text: inspect it with run_shell (file, xxd | head, strings)",
			showPath(rel), info.Size())
	}

	var (
		out        strings.Builder
		lineNo     int64
		shownFirst int64
		shownLast  int64
		capped     bool
		buf        []byte
	)
	for {
		if lineNo%1024 == 0 && e.ctx.Err() != nil {
			return RunnerResult{}, e.ctx.Err()
		}
		if lineNo-offset+1 >= limit && lineNo >= offset {
			break // limit reached
		}
		line, total, ok, err := nextLine(br, readFileMaxLine, buf)
		if err != nil {
			return RunnerResult{}, pathErr(err, "read", rel)
		}
		if !ok {
			break
		}
		buf = line
		lineNo++
		if lineNo < offset {
			continue
		}
		text, cut := lineText(line, total, readFileMaxLine)
		entry := fmt.Sprintf("%6d\t%s", lineNo, text)
		if cut > 0 {
			entry += fmt.Sprintf(" [... line cut: %d more bytes; see it with grep or run_shell]", cut)
		}
		if out.Len()+len(entry)+1 > ReadFileOutputBytes && shownLast > 0 {
			capped = true
			lineNo--
			break
		}
		out.WriteString(entry)
		out.WriteByte('\n')
		if shownFirst == 0 {
			shownFirst = lineNo
		}
		shownLast = lineNo
	}
	if shownLast == 0 {
		return RunnerResult{}, toolErr(call.ErrInvalidParams, "read %s: offset %d is past the end of the file: it has %d lines", showPath(rel), offset, lineNo)
	}
	more := capped
	if !more {
		_, err := br.Peek(1)
		more = err == nil
	}
	res := RunnerResult{OutputBytes: int64(out.Len())}
	if more {
		total := "more"
		if info.Size() <= readFileCountLimit {
			n, err := countLines(br)
			if err != nil {
				return RunnerResult{}, pathErr(err, "read", rel)
			}
			if capped {
				n++ // the line that did not fit was consumed
			}
			total = fmt.Sprint(shownLast + n)
		}
		why := ""
		if capped {
			why = fmt.Sprintf("output capped at %d KiB; ", ReadFileOutputBytes>>10)
		}
		fmt.Fprintf(&out, "\n[%sshowing lines %d-%d of %s (file is %d bytes); to read on, call read_file with offset=%d]",
			why, shownFirst, shownLast, total, info.Size(), shownLast+1)
		res.Truncated = capped || !explicitLimit
		res.OutputBytes = info.Size()
	}
	res.Output = out.String()
	return res, nil
}

// nextLine reads one line from br, line ending included, keeping at most keep bytes of it (in buf's space);
// total is the line's full length. ok is false at the end of input.
func nextLine(br *bufio.Reader, keep int, buf []byte) (line []byte, total int, ok bool, err error) {
	line = buf[:0]
	for {
		chunk, err := br.ReadSlice('\n')
		total += len(chunk)
		if room := keep + 2 - len(line); room > 0 {
			line = append(line, chunk[:min(room, len(chunk))]...)
		}
		switch {
		case err == nil:
			return line, total, true, nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF):
			return line, total, total > 0, nil
		default:
			return nil, 0, false, err
		}
	}
}

// lineText returns the line as text without its line ending, at most max bytes cut on a rune boundary, and
// how many bytes were cut.
func lineText(line []byte, total, max int) (string, int) {
	full := total == len(line)
	if full {
		line = bytes.TrimSuffix(line, []byte("\n"))
		line = bytes.TrimSuffix(line, []byte("\r"))
		total = len(line)
	}
	if len(line) <= max {
		return string(line), 0
	}
	n := max
	for n > max-utf8.UTFMax && n > 0 && !utf8.RuneStart(line[n]) {
		n--
	}
	cut := total - n
	if !full {
		cut-- // the line ending, roughly: a cut line is reported approximately
	}
	return string(line[:n]), cut
}

// countLines counts the lines left in br (a last line without a newline counts).
func countLines(br *bufio.Reader) (int64, error) {
	var n int64
	var last byte = '\n'
	buf := make([]byte, 64<<10)
	for {
		k, err := br.Read(buf)
		if k > 0 {
			n += int64(bytes.Count(buf[:k], []byte("\n")))
			last = buf[k-1]
		}
		if errors.Is(err, io.EOF) {
			if last != '\n' {
				n++
			}
			return n, nil
		}
		if err != nil {
			return 0, err
		}
	}
}
