package tools

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/tools/incontainer"
)

func TestFinishRunner(t *testing.T) {
	reg := mustRegistry(t)
	rf, _ := reg.Lookup("read_file")
	tests := []struct {
		name string
		run  Run
		want Outcome
	}{
		{"ok", Run{Stdout: []byte(`{"output":"hi","output_bytes":2}` + "\n")}, Outcome{Output: "hi", OutputBytes: 2}},
		{"tool error", Run{Stdout: []byte(`{"output":"gone","error":{"type":"not_found","message":"gone"}}`)},
			Outcome{Output: "gone", OutputBytes: 4, Error: &call.ErrorInfo{Type: "not_found", Message: "gone"}}},
		{"truncated", Run{Stdout: []byte(`{"output":"x","truncated":true,"output_bytes":99}`)}, Outcome{Output: "x", Truncated: true, OutputBytes: 99}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := rf.Finish(tt.run)
			gj, _ := json.Marshal(got)
			wj, _ := json.Marshal(tt.want)
			if string(gj) != string(wj) {
				t.Errorf("Finish = %s, want %s", gj, wj)
			}
		})
	}
	t.Run("no result", func(t *testing.T) {
		got := rf.Finish(Run{Stdout: []byte("garbage"), Stderr: []byte("panic: boom"), ExitCode: 2})
		if got.Error == nil || got.Error.Type != call.ErrInternal || !strings.Contains(got.Output, "panic: boom") || !strings.Contains(got.Output, "exited with code 2") {
			t.Errorf("Finish = %+v", got)
		}
	})
	t.Run("over the policy cap", func(t *testing.T) {
		big := strings.Repeat("line of text\n", 1000)
		b, _ := json.Marshal(incontainer.RunnerResult{Output: big})
		got := rf.Finish(Run{Stdout: b, OutputBytes: 2000})
		if !got.Truncated || len(got.Output) > 2000 || !strings.Contains(got.Output, "bytes of output cut here") {
			t.Errorf("Finish = truncated %v, %d bytes:\n%s", got.Truncated, len(got.Output), got.Output)
		}
	})
}

func TestFinishShell(t *testing.T) {
	reg := mustRegistry(t)
	sh, _ := reg.Lookup("run_shell")
	tests := []struct {
		name      string
		run       Run
		want      string
		wantType  string
		truncated bool
	}{
		{"stdout only", Run{Stdout: []byte("hello\n")}, "hello\n", "", false},
		{"no output", Run{}, "[no output]", "", false},
		{"stderr and exit code", Run{Stdout: []byte("out"), Stderr: []byte("bad thing\n"), ExitCode: 2}, "out\n[stderr]\nbad thing\n[exit code 2]", call.ErrExitCode, false},
		{"exit code only", Run{ExitCode: 1}, "[exit code 1]", call.ErrExitCode, false},
		{"cut by sandbox", Run{Stdout: []byte("abc"), StdoutBytes: 10}, "abc\n[... 7 bytes of stdout cut here (10 bytes in all); to see them: rerun with less output", "", true},
		{"cut by sandbox, kept in full", Run{Stdout: []byte("abc"), StdoutTail: []byte("xyz"), StdoutBytes: 10, CallID: "c_x", StdoutKept: 10},
			"abc\n[... 4 bytes of stdout cut here (10 bytes in all); read them with read_output {\"call_id\":\"c_x\",\"stream\":\"stdout\",\"offset\":3,\"limit\":4} or GET /v1/calls/c_x/stdout?offset=3&limit=4 ...]\nxyz", "", true},
		{"cut by sandbox, kept in part", Run{Stdout: []byte("abc"), StdoutTail: []byte("xyz"), StdoutBytes: 10, CallID: "c_x", StdoutKept: 5},
			"abc\n[... 4 bytes of stdout cut here (10 bytes in all); read them with read_output {\"call_id\":\"c_x\",\"stream\":\"stdout\",\"offset\":3,\"limit\":2} or GET /v1/calls/c_x/stdout?offset=3&limit=2 (only the first 5 bytes of stdout were kept) ...]\nxyz", "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := sh.Finish(tt.run)
			if !strings.HasPrefix(got.Output, tt.want) {
				t.Errorf("Output = %q, want prefix %q", got.Output, tt.want)
			}
			gotType := ""
			if got.Error != nil {
				gotType = got.Error.Type
			}
			if gotType != tt.wantType || got.Truncated != tt.truncated {
				t.Errorf("error %q truncated %v, want %q %v", gotType, got.Truncated, tt.wantType, tt.truncated)
			}
			if got.ExitCode == nil || *got.ExitCode != tt.run.ExitCode {
				t.Errorf("ExitCode = %v", got.ExitCode)
			}
		})
	}
	t.Run("head and tail kept", func(t *testing.T) {
		var b strings.Builder
		for i := range 20000 {
			b.WriteString("line ")
			b.WriteString(strings.Repeat("x", i%7))
			b.WriteString("\n")
		}
		b.WriteString("THE END\n")
		got := sh.Finish(Run{Stdout: []byte("FIRST\n" + b.String()), Stderr: []byte("warn\n"), ExitCode: 3, OutputBytes: 4096})
		if len(got.Output) > 4096+100 {
			t.Errorf("output is %d bytes, cap 4096", len(got.Output))
		}
		for _, f := range []string{"FIRST\n", "THE END\n", "bytes of stdout cut here", "pipe through head", "[stderr]\nwarn\n", "[exit code 3]"} {
			if !strings.Contains(got.Output, f) {
				t.Errorf("output lacks %q:\n%s", f, got.Output)
			}
		}
		if !got.Truncated {
			t.Error("not marked truncated")
		}
	})
	t.Run("apply", func(t *testing.T) {
		var r call.Result
		sh.Finish(Run{Stdout: []byte("x"), ExitCode: 1}).Apply(&r)
		if r.Status != call.StatusError || r.Error.Type != call.ErrExitCode || *r.ExitCode != 1 || r.Stdout != "x" {
			t.Errorf("Apply: %+v", r)
		}
	})
}

func TestCutMiddle(t *testing.T) {
	s := strings.Repeat("é", 1000) // 2 bytes per rune
	for _, max := range []int{0, 50, 200, 333, 1999} {
		got := cutMiddle(s, max, "output", "hint")
		if !strings.Contains(got, "cut here") {
			t.Errorf("max %d: no note", max)
		}
		if !utf8Valid(got) {
			t.Errorf("max %d: invalid UTF-8", max)
		}
	}
	if got := cutMiddle("short", 10, "x", ""); got != "short" {
		t.Errorf("short string changed: %q", got)
	}
}

func utf8Valid(s string) bool { return strings.ToValidUTF8(s, "") == s }

// TestFinishShellFitsTheCap: however the streams, labels and exit code add up, the output stays within
// the cap.
func TestFinishShellFitsTheCap(t *testing.T) {
	sh, _ := mustRegistry(t).Lookup("run_shell")
	for _, errLen := range []int{0, 5, 3000, 100000} {
		for _, code := range []int{0, 1, -2147483648} {
			out := bytes.Repeat([]byte("o\xff"), 50000)
			errs := bytes.Repeat([]byte("e"), errLen)
			got := sh.Finish(Run{Stdout: out, Stderr: errs, ExitCode: code, OutputBytes: 30000, CallID: "c_x", StdoutKept: int64(len(out)), StderrKept: int64(len(errs))})
			if len(got.Output) > 30000 || len(got.Stdout) > 30000 || len(got.Stderr) > 30000 || !got.Truncated {
				t.Errorf("stderr %d, exit %d: output %d bytes (stdout %d, stderr %d), truncated %v", errLen, code, len(got.Output), len(got.Stdout), len(got.Stderr), got.Truncated)
			}
		}
	}
}
