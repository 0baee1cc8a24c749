package sandbox

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
)

func TestCapWriter(t *testing.T) {
	tests := []struct {
		name      string
		limit     int64
		writes    []string
		wantHead  string
		wantTail  string
		truncated bool
	}{
		{name: "under limit", limit: 10, writes: []string{"abc"}, wantHead: "abc", wantTail: ""},
		{name: "exactly limit", limit: 6, writes: []string{"abcdef"}, wantHead: "abc", wantTail: "def"},
		{name: "over limit one write", limit: 6, writes: []string{"abcdefghij"}, wantHead: "abc", wantTail: "hij", truncated: true},
		{name: "over limit many small writes", limit: 6, writes: []string{"a", "b", "c", "d", "e", "f", "g", "h"}, wantHead: "abc", wantTail: "fgh", truncated: true},
		{name: "wraps ring", limit: 8, writes: []string{"0123", "456", "789ab", "cd"}, wantHead: "0123", wantTail: "abcd", truncated: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := NewCapWriter(tt.limit)
			var total int
			for _, s := range tt.writes {
				n, err := w.Write([]byte(s))
				if err != nil || n != len(s) {
					t.Fatalf("Write(%q) = %d, %v", s, n, err)
				}
				total += n
			}
			c := w.Captured()
			if string(c.Head) != tt.wantHead || string(c.Tail) != tt.wantTail {
				t.Errorf("head, tail = %q, %q; want %q, %q", c.Head, c.Tail, tt.wantHead, tt.wantTail)
			}
			if c.Total != int64(total) || c.Truncated() != tt.truncated {
				t.Errorf("total %d truncated %v; want %d %v", c.Total, c.Truncated(), total, tt.truncated)
			}
			if tt.truncated && !strings.Contains(c.String(), "bytes omitted") {
				t.Errorf("String() = %q lacks the omission marker", c.String())
			}
		})
	}
}

func TestCapWriterFloodKeepsMemoryFixed(t *testing.T) {
	w := NewCapWriter(1024)
	chunk := bytes.Repeat([]byte("x"), 64<<10)
	for range 1600 { // 100 MiB
		w.Write(chunk)
	}
	w.Write([]byte("END"))
	c := w.Captured()
	if c.Total != 1600*64<<10+3 || !bytes.HasSuffix(c.Tail, []byte("END")) || len(c.Head)+len(c.Tail) != 1024 {
		t.Fatalf("total %d, kept %d, tail suffix %q", c.Total, len(c.Head)+len(c.Tail), c.Tail[len(c.Tail)-3:])
	}
	if cap(w.ring) > 1024 || cap(w.head) > 1024 {
		t.Fatalf("buffers grew: head cap %d ring cap %d", cap(w.head), cap(w.ring))
	}
}

type failingWriter struct{ got []byte }

func (f *failingWriter) Write(p []byte) (int, error) {
	f.got = append(f.got, p...)
	return 0, errors.New("gone")
}

// TestTee: the live copy gets every byte, and its failures never reach the process's stream.
func TestTee(t *testing.T) {
	w := NewCapWriter(8)
	live := &failingWriter{}
	tw := Tee(w, live)
	for _, s := range []string{"hello ", "world, and more"} {
		if n, err := tw.Write([]byte(s)); n != len(s) || err != nil {
			t.Fatalf("Write(%q) = %d, %v; want every byte and no error", s, n, err)
		}
	}
	if string(live.got) != "hello world, and more" || w.Captured().Total != 21 {
		t.Errorf("live %q, captured %d bytes", live.got, w.Captured().Total)
	}
	if Tee(w, nil) != io.Writer(w) {
		t.Error("Tee with no live writer is not the writer itself")
	}
}
