package workspace

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/toolpool/toolpool/internal/call"
)

// The tests in this file kill the mutants `make mutants` found surviving in the workspace archives and
// quotas (the baseline, scripts/mutants-baseline.txt, names each), and the classes behind them.

// TestArchiveSniffNeedsBothSigns: a tar is recognised by its "ustar" magic, or, for an empty tar, by a
// first block of zeros only; a first block that is merely 512 bytes long, or merely zeros for fewer than
// 512 bytes, or "ustar" at another offset, is no archive, and says so.
func TestArchiveSniffNeedsBothSigns(t *testing.T) {
	notZero := bytes.Repeat([]byte{0}, 1024)
	notZero[100] = 'x'
	misplaced := bytes.Repeat([]byte("a"), 600)
	copy(misplaced[256:], "ustar")
	for name, data := range map[string][]byte{
		"512 bytes of text":           bytes.Repeat([]byte("text "), 120),
		"a zero block with one byte":  notZero,
		"zeros, less than a block":    make([]byte, 511),
		"ustar one byte early":        misplaced,
		"a gzip signature alone":      {0x1f},
		"a zip signature, truncated":  []byte("PK\x03"),
		"ustar at 257 of a short one": append(make([]byte, 257), "usta"...),
	} {
		m := newManager(t, Config{})
		_, err := m.Create(context.Background(), "t1", "ws", tempArchive(t, data))
		if err == nil {
			t.Errorf("%s: accepted as an archive", name)
			continue
		}
		wantErr(t, err, call.ErrInvalidParams, "not a tar, tar.gz or zip")
	}
}

// TestUploadOverWhatTheWorkspaceHolds: each way an archive's entry can meet what the workspace already holds
// at its path is refused with its own reason: a directory entry (or an entry's parent) over a file, a
// directory entry over a symlink, an entry under a symlink, a file over a directory.
func TestUploadOverWhatTheWorkspaceHolds(t *testing.T) {
	ctx := context.Background()
	m := newManager(t, Config{})
	seed := makeTar(t, false, file("f", "x"), dir("d"), file("d/in", "y"), link("l", "d"))
	if _, err := m.Create(ctx, "t1", "ws", tempArchive(t, seed)); err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		entry tent
		msg   string
	}{
		"directory over a file":    {dir("f"), `needs "f" to be a directory`},
		"directory over a symlink": {dir("l"), "a symlink in the workspace"},
		"entry under a file":       {file("f/x", "z"), `needs "f" to be a directory`},
		"entry under a symlink":    {file("l/x", "z"), `written through "l", a symlink`},
		"file over a directory":    {file("d", "z"), `would replace the directory "d"`},
	} {
		_, err := m.Upload(ctx, "t1", "ws", "", tempArchive(t, makeTar(t, false, tc.entry)))
		if err == nil {
			t.Errorf("%s: accepted", name)
			continue
		}
		wantErr(t, err, call.ErrInvalidParams, tc.msg)
	}
}

// TestArchiveNamesAtTheirLimits: a name component of 255 bytes is taken, one of 256 refused; a path of
// 4096 bytes is taken, one of 4097 refused.
func TestArchiveNamesAtTheirLimits(t *testing.T) {
	ctx := context.Background()
	long := func(n int) string { return strings.Repeat("a", n) }
	deep := func(total int) string { // components of 200 bytes, the last one making up the rest
		var parts []string
		for total > 201 {
			parts = append(parts, long(200))
			total -= 201
		}
		return strings.Join(append(parts, long(total)), "/")
	}
	for i, tc := range []struct {
		name string
		ok   bool
		msg  string
	}{
		{long(255), true, ""},
		{long(256), false, "name component longer than 255 bytes"},
		{deep(4096), true, ""},
		{deep(4097), false, "path longer than 4096 bytes"},
	} {
		m := newManager(t, Config{})
		_, err := m.Create(ctx, "t1", fmt.Sprintf("ws%d", i), tempArchive(t, makeTar(t, false, file(tc.name, "x"))))
		switch {
		case tc.ok && err != nil:
			t.Errorf("a name of %d bytes: %v", len(tc.name), err)
		case !tc.ok:
			wantErr(t, err, call.ErrInvalidParams, tc.msg)
		}
	}
}

// TestArchiveNamesAPathOnce: a directory may appear twice in an archive (tar writes a directory's entry
// again when it is given twice), a file may not, nor may a path be a file and a directory.
func TestArchiveNamesAPathOnce(t *testing.T) {
	ctx := context.Background()
	for i, tc := range []struct {
		name string
		ents []tent
		ok   bool
	}{
		{"a directory twice", []tent{dir("a"), file("a/x", "1"), dir("a")}, true},
		{"a file twice", []tent{file("a", "1"), file("a", "2")}, false},
		{"a file, then a directory", []tent{file("a", "1"), dir("a")}, false},
		{"a directory, then a file", []tent{dir("a"), file("a", "1")}, false},
		{"a symlink, then a directory", []tent{link("a", "b"), dir("a")}, false},
	} {
		m := newManager(t, Config{})
		_, err := m.Create(ctx, "t1", fmt.Sprintf("ws%d", i), tempArchive(t, makeTar(t, false, tc.ents...)))
		switch {
		case tc.ok && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case !tc.ok && err == nil:
			t.Errorf("%s: accepted", tc.name)
		case !tc.ok:
			wantErr(t, err, call.ErrInvalidParams, "twice")
		}
	}
}
