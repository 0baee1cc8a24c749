package incontainer

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/toolpool/toolpool/internal/call"
)

func TestReadFile(t *testing.T) {
	ws := files(t, map[string]string{
		"empty.txt":   "",
		"three.txt":   "one\ntwo\nthree\n",
		"nofinal.txt": "one\ntwo",
		"crlf.txt":    "one\r\ntwo\r\n",
		"unicode.txt": "héllo wörld\n日本語\n🙂\n",
		"binary.bin":  "ELF\x00\x01\x02text",
		"latin1.txt":  strings.Repeat("\xe9t\xe9 ", 100),
		"dir/x.txt":   "x\n",
		"long.txt":    strings.Repeat("a", 5000) + "\nshort\n",
	})
	tests := []struct {
		name     string
		args     map[string]any
		wantType string
		want     string // exact output when wantExact
		exact    bool
		contains []string
	}{
		{name: "empty file", args: map[string]any{"path": "empty.txt"}, want: "[empty.txt is empty: 0 bytes]", exact: true},
		{name: "whole file", args: map[string]any{"path": "three.txt"}, want: "     1\tone\n     2\ttwo\n     3\tthree\n", exact: true},
		{name: "absolute path", args: map[string]any{"path": "/workspace/three.txt"}, want: "     1\tone\n     2\ttwo\n     3\tthree\n", exact: true},
		{name: "no final newline", args: map[string]any{"path": "nofinal.txt"}, want: "     1\tone\n     2\ttwo\n", exact: true},
		{name: "CRLF", args: map[string]any{"path": "crlf.txt"}, want: "     1\tone\n     2\ttwo\n", exact: true},
		{name: "unicode", args: map[string]any{"path": "unicode.txt"}, want: "     1\théllo wörld\n     2\t日本語\n     3\t🙂\n", exact: true},
		{name: "offset and limit", args: map[string]any{"path": "three.txt", "offset": 2, "limit": 1},
			contains: []string{"     2\ttwo\n", "showing lines 2-2 of 3", "offset=3"}},
		{name: "offset to the end", args: map[string]any{"path": "three.txt", "offset": 3}, want: "     3\tthree\n", exact: true},
		{name: "offset past the end", args: map[string]any{"path": "three.txt", "offset": 9}, wantType: call.ErrInvalidParams,
			contains: []string{"offset 9 is past the end of the file: it has 3 lines"}},
		{name: "binary file", args: map[string]any{"path": "binary.bin"}, wantType: call.ErrInvalidParams,
			contains: []string{"binary.bin", "binary file", "run_shell"}},
		{name: "mostly invalid UTF-8", args: map[string]any{"path": "latin1.txt"}, wantType: call.ErrInvalidParams, contains: []string{"binary"}},
		{name: "missing file", args: map[string]any{"path": "nope/missing.txt"}, wantType: call.ErrNotFound,
			contains: []string{"read nope/missing.txt: no such file or directory", "list_files or glob"}},
		{name: "directory", args: map[string]any{"path": "dir"}, wantType: call.ErrInvalidParams,
			contains: []string{"read dir: it is a directory", "use list_files"}},
		{name: "workspace root", args: map[string]any{"path": "/workspace"}, wantType: call.ErrInvalidParams, contains: []string{"directory"}},
		{name: "long line cut", args: map[string]any{"path": "long.txt"},
			contains: []string{"     1\t" + strings.Repeat("a", 2000) + " [... line cut: 3000 more bytes", "     2\tshort\n"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := run(t, ws, "read_file", tt.args)
			wantResult(t, r, tt.wantType, tt.contains...)
			if tt.exact && r.Output != tt.want {
				t.Errorf("output =\n%q\nwant\n%q", r.Output, tt.want)
			}
		})
	}
}

// TestReadFileLarge streams a 40 MB file: the first page, a page in the middle, and the byte cap.
func TestReadFileLarge(t *testing.T) {
	ws := t.TempDir()
	f, err := os.Create(filepath.Join(ws, "big.log"))
	if err != nil {
		t.Fatal(err)
	}
	w := bufio.NewWriter(f)
	const lines = 500_000
	for i := 1; i <= lines; i++ {
		fmt.Fprintf(w, "line %d %s\n", i, strings.Repeat("z", 70))
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	f.Close()

	t.Run("first page", func(t *testing.T) {
		r := run(t, ws, "read_file", map[string]any{"path": "big.log"})
		wantResult(t, r, "", "     1\tline 1 ", "  2000\tline 2000 ", "offset=2001")
		if !r.Truncated || strings.Contains(r.Output, "line 2001 ") {
			t.Errorf("truncated %v; output tail %q", r.Truncated, r.Output[len(r.Output)-200:])
		}
	})
	t.Run("middle page", func(t *testing.T) {
		r := run(t, ws, "read_file", map[string]any{"path": "big.log", "offset": 400_000, "limit": 3})
		wantResult(t, r, "", "400000\tline 400000 ", "400002\tline 400002 ", "offset=400003")
	})
	t.Run("byte cap", func(t *testing.T) {
		r := run(t, ws, "read_file", map[string]any{"path": "big.log", "limit": 10000})
		if len(r.Output) > ReadFileOutputBytes+512 {
			t.Errorf("output %d bytes, cap %d", len(r.Output), ReadFileOutputBytes)
		}
		wantResult(t, r, "", "output capped at 256 KiB", "to read on, call read_file with offset=")
		if !r.Truncated {
			t.Error("not truncated")
		}
	})
}

func TestReadFileCountsTotalLines(t *testing.T) {
	ws := files(t, map[string]string{"f.txt": strings.Repeat("x\n", 2500) + "last"})
	r := run(t, ws, "read_file", map[string]any{"path": "f.txt"})
	wantResult(t, r, "", "showing lines 1-2000 of 2501", "offset=2001")
}
