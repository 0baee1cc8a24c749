package tools

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/tools/incontainer"
)

// Run is what the sandbox reports about a finished process, as plain values.
type Run struct {
	// Stdout and Stderr are what the sandbox kept of the process's output: the whole stream, or when it
	// cut the stream, its head, with its tail in StdoutTail and StderrTail.
	Stdout, Stderr         []byte
	StdoutTail, StderrTail []byte
	// StdoutBytes and StderrBytes are how much the process wrote in all; larger than what was kept when
	// the sandbox cut the stream. Zero means "what was kept".
	StdoutBytes, StderrBytes int64
	ExitCode                 int
	// OutputBytes caps the model-facing output (the call's limit, as policy allowed it); zero means the
	// tool's DefaultOutputBytes. Runner tools also keep to their own caps, whatever this says.
	OutputBytes int64
	// CallID, StdoutKept and StderrKept say where the full streams can be read by range: the first
	// StdoutKept bytes of stdout of call CallID, and so on. With none kept, a cut stream's note suggests a
	// narrower command instead of read_output.
	CallID                 string
	StdoutKept, StderrKept int64
}

// Outcome is the model-facing part of a finished call: the result fields the tool decides. Timeouts,
// out-of-memory kills and cancellation are the worker's to report; it overrides Outcome for them.
type Outcome struct {
	Output string
	// Stdout and Stderr are set for run_shell and custom tools only.
	Stdout, Stderr string
	// ExitCode is set for run_shell and custom tools only.
	ExitCode    *int
	Error       *call.ErrorInfo
	Truncated   bool
	OutputBytes int64
}

// Apply copies o into r and sets r.Status to ok, or error when o has an error.
func (o Outcome) Apply(r *call.Result) {
	r.Output, r.Stdout, r.Stderr = o.Output, o.Stdout, o.Stderr
	r.ExitCode, r.Truncated, r.OutputBytes = o.ExitCode, o.Truncated, o.OutputBytes
	r.Error = o.Error
	r.Status = call.StatusOK
	if o.Error != nil {
		r.Status = call.StatusError
	}
}

// Finish turns a finished process of this tool into its Outcome; it is a pure function of run. For runner
// tools it decodes the incontainer.RunnerResult on stdout (a missing or broken one is an internal error
// quoting stderr); for run_shell and custom tools it composes Output from stdout, then "[stderr]" and
// stderr, then "[exit code N]" when N is not 0, keeping the head and tail of each stream within the cap.
func (t *Tool) Finish(run Run) Outcome {
	limit := run.OutputBytes
	if limit <= 0 {
		limit = t.DefaultOutputBytes
	}
	if t.shell {
		return finishShell(run, int(limit))
	}
	run.Stdout = append(run.Stdout[:len(run.Stdout):len(run.Stdout)], run.StdoutTail...)
	run.Stderr = append(run.Stderr[:len(run.Stderr):len(run.Stderr)], run.StderrTail...)
	return finishRunner(t.Name, run, int(limit))
}

func finishRunner(tool string, run Run, limit int) Outcome {
	var res incontainer.RunnerResult
	dec := json.NewDecoder(bytes.NewReader(run.Stdout))
	if err := dec.Decode(&res); err != nil {
		msg := fmt.Sprintf("run %s: the tool runner exited with code %d without a result (%v)", tool, run.ExitCode, err)
		if s := strings.TrimSpace(string(run.Stderr)); s != "" {
			msg += ": " + cutMiddle(s, 2000, "stderr", "")
		}
		return Outcome{Output: msg, Error: &call.ErrorInfo{Type: call.ErrInternal, Message: msg}}
	}
	o := Outcome{Output: res.Output, Error: res.Error, Truncated: res.Truncated, OutputBytes: res.OutputBytes}
	if o.OutputBytes == 0 {
		o.OutputBytes = int64(len(o.Output))
	}
	if len(o.Output) > limit {
		o.Output = cutMiddle(o.Output, limit, "output", "ask for less: a smaller limit, an offset, or a narrower path or pattern")
		o.Truncated = true
	}
	return o
}

func finishShell(run Run, limit int) Outcome {
	code := run.ExitCode
	o := Outcome{ExitCode: &code}
	out := stream{name: "stdout", head: run.Stdout, tail: run.StdoutTail, total: run.StdoutBytes, kept: run.StdoutKept}
	errs := stream{name: "stderr", head: run.Stderr, tail: run.StderrTail, total: run.StderrBytes, kept: run.StderrKept}
	out.total = max(out.total, int64(len(out.head)+len(out.tail)))
	errs.total = max(errs.total, int64(len(errs.head)+len(errs.tail)))
	o.OutputBytes = out.total + errs.total

	// Share the cap, less room for the labels ("[stderr]", "[exit code N]"): stderr gets up to a quarter,
	// or more when stdout needs less.
	limit = max(limit-labelRoom, 0)
	errBudget := int(min(errs.need(), int64(limit/4)))
	outBudget := limit - errBudget
	if out.need() < int64(outBudget) {
		errBudget = int(min(errs.need(), int64(limit)-out.need()))
		outBudget = int(out.need())
	}
	stdout, cutOut := out.clip(run.CallID, outBudget, limit)
	stderr, cutErr := errs.clip(run.CallID, errBudget, limit)
	o.Truncated = cutOut || cutErr
	o.Stdout, o.Stderr = strings.ToValidUTF8(stdout, "\uFFFD"), strings.ToValidUTF8(stderr, "\uFFFD")
	var b strings.Builder
	b.WriteString(stdout)
	if errs.total > 0 {
		if b.Len() > 0 && !strings.HasSuffix(b.String(), "\n") {
			b.WriteByte('\n')
		}
		b.WriteString("[stderr]\n")
		b.WriteString(stderr)
	}
	if code != 0 {
		if b.Len() > 0 && !strings.HasSuffix(b.String(), "\n") {
			b.WriteByte('\n')
		}
		fmt.Fprintf(&b, "[exit code %d]", code)
		o.Error = &call.ErrorInfo{Type: call.ErrExitCode, Message: fmt.Sprintf("the command exited with code %d", code)}
	}
	if b.Len() == 0 {
		b.WriteString("[no output]")
	}
	o.Output = strings.ToValidUTF8(b.String(), "\uFFFD")
	return o
}

// labelRoom is what the labels between and after the streams take at most.
const labelRoom = len("\n[stderr]\n") + len("\n[exit code -2147483648]")

// stream is one output stream of a command as the sandbox kept it: its first bytes (head), its last
// (tail; empty when head is the whole stream), how much was printed, and how much of it, from its first
// byte, can be read by range.
type stream struct {
	name       string
	head, tail []byte
	total      int64
	kept       int64
}

// need is how many bytes the stream takes in the output uncut: all of it, or when the sandbox cut it,
// what was kept and room for the note.
func (st stream) need() int64 {
	if kept := int64(len(st.head) + len(st.tail)); kept < st.total {
		return kept + 512
	}
	return st.total
}

// noCutHint is what a cut note suggests when the stream cannot be read by range.
const noCutHint = "rerun with less output: pipe through head, tail or grep, or redirect to a file and read it with read_file (offset/limit)"

// clip fits the stream into budget bytes, keeping about two thirds from its head and a third from its
// tail, on line boundaries near the cut points when there are any and never inside a UTF-8 sequence.
// In place of what it cuts it puts a note saying how many bytes were cut and exactly how to read them
// (read_output or the range endpoint, in pages of at most page bytes). It reports whether it cut.
func (st stream) clip(callID string, budget, page int) (string, bool) {
	if int64(len(st.head)+len(st.tail)) == st.total && len(st.head)+len(st.tail) <= budget {
		return string(st.head) + string(st.tail), false
	}
	note := func(off, n int64) string {
		s := fmt.Sprintf("\n[... %d bytes of %s cut here (%d bytes in all)", n, st.name, st.total)
		switch {
		case callID != "" && st.kept > off:
			s += "; read them with " + ReadHint(callID, st.name, off, min(n, st.kept-off, int64(max(page, 1))))
			if st.kept < st.total {
				s += fmt.Sprintf(" (only the first %d bytes of %s were kept)", st.kept, st.name)
			}
		default:
			s += "; to see them: " + noCutHint
		}
		return s + " ...]\n"
	}
	// Bytes that are not UTF-8 grow into U+FFFD: shrink until the text as shown fits.
	for b := max(budget-len(note(st.total, st.total)), 0); ; {
		head, tail := st.cut(b)
		off := int64(len(head))
		text := strings.ToValidUTF8(string(head), "\uFFFD") + note(off, st.total-int64(len(tail))-off) + strings.ToValidUTF8(string(tail), "\uFFFD")
		if over := len(text) - budget; over > 0 && b > 0 {
			b = max(b-over, 0)
			continue
		}
		return text, true
	}
}

// cut returns about two thirds of b bytes from the stream's head and the rest from its tail.
func (st stream) cut(b int) (head, tail []byte) {
	hN := min(b*2/3, len(st.head))
	end := st.tail
	if len(end) == 0 {
		end = st.head[hN:]
	}
	tN := min(b-hN, len(end))
	head = st.head[:hN]
	if i := bytes.LastIndexByte(head, '\n'); i >= hN/2 {
		head = head[:i+1]
	}
	for i := 0; i < utf8.UTFMax && len(head) > 0; i++ {
		if r, size := utf8.DecodeLastRune(head); r != utf8.RuneError || size != 1 {
			break
		}
		head = head[:len(head)-1]
	}
	tail = end[len(end)-tN:]
	if i := bytes.IndexByte(tail, '\n'); i >= 0 && i <= tN/2 {
		tail = tail[i+1:]
	}
	for i := 0; i < utf8.UTFMax && len(tail) > 0 && !utf8.RuneStart(tail[0]); i++ {
		tail = tail[1:]
	}
	return head, tail
}

// cutMiddle fits s into max bytes by keeping its head and tail and putting in their place a note of what
// was cut (what names the stream, hint says how to see the rest). Cuts fall on line boundaries near the
// cut points when there are any, and never inside a UTF-8 sequence.
func cutMiddle(s string, max int, what, hint string) string {
	if len(s) <= max {
		return s
	}
	note := func(cut int) string {
		n := fmt.Sprintf("\n[... %d bytes of %s cut here (%d bytes in all) ...", cut, what, len(s))
		if hint != "" {
			n += " to see them: " + hint
		}
		return n + "]\n"
	}
	budget := max - len(note(len(s)))
	if budget < 0 {
		budget = 0
	}
	head, tail := stream{head: []byte(s), total: int64(len(s))}.cut(budget)
	return string(head) + note(len(s)-len(head)-len(tail)) + string(tail)
}
