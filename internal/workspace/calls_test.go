package workspace

import (
	"errors"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/call"
)

const testUID, testGID = 65532, 65532

func newWorkspaces(t *testing.T, quota int64) (*Manager, string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "workspaces")
	w, err := New(Config{Dir: dir, UID: testUID, GID: testGID, Quota: quota})
	if err != nil {
		t.Fatal(err)
	}
	return w, dir
}

// tree lists every path under dir, for proving that a refused call created nothing.
func tree(t *testing.T, dir string) []string {
	t.Helper()
	var paths []string
	filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if err == nil {
			paths = append(paths, p)
		}
		return nil
	})
	sort.Strings(paths)
	return paths
}

func TestPrepareCreatesAndChowns(t *testing.T) {
	w, dir := newWorkspaces(t, 0)
	ws, err := w.Prepare("acme", "ws1")
	if err != nil {
		t.Fatal(err)
	}
	if ws.Dir != filepath.Join(dir, "acme", "ws1") || ws.Bytes != -1 {
		t.Errorf("workspace %+v", ws)
	}
	fi, err := os.Lstat(ws.Dir)
	if err != nil || !fi.IsDir() {
		t.Fatalf("workspace not created: %v", err)
	}
	if os.Geteuid() == 0 {
		st := fi.Sys().(*syscall.Stat_t)
		if st.Uid != testUID || st.Gid != testGID {
			t.Errorf("workspace owned by %d:%d", st.Uid, st.Gid)
		}
	}
	if _, err := w.Prepare("acme", "ws1"); err != nil {
		t.Errorf("prepare again: %v", err)
	}
}

// TestPrepareHostileNames feeds names an attacker would try: each is refused and nothing is created.
func TestPrepareHostileNames(t *testing.T) {
	w, dir := newWorkspaces(t, 0)
	before := tree(t, filepath.Dir(dir))
	tests := []struct{ name, tenant, workspace string }{
		{"dot-dot workspace", "acme", ".."},
		{"dot workspace", "acme", "."},
		{"path in workspace", "acme", "a/b"},
		{"climbing workspace", "acme", "../../etc"},
		{"absolute workspace", "acme", "/etc"},
		{"empty workspace", "acme", ""},
		{"NUL in workspace", "acme", "ws\x00"},
		{"hidden workspace", "acme", ".ssh"},
		{"option-like workspace", "acme", "-rf"},
		{"too long workspace", "acme", strings.Repeat("a", 65)},
		{"non-ASCII workspace", "acme", "wś"},
		{"newline in workspace", "acme", "ws\n"},
		{"dot-dot tenant", "..", "ws"},
		{"dotted tenant", "ac.me", "ws"},
		{"slash tenant", "a/b", "ws"},
		{"empty tenant", "", "ws"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := w.Prepare(tt.tenant, tt.workspace); err == nil {
				t.Errorf("Prepare(%q, %q) succeeded", tt.tenant, tt.workspace)
			}
		})
	}
	if after := tree(t, filepath.Dir(dir)); strings.Join(after, "\n") != strings.Join(before, "\n") {
		t.Errorf("hostile names changed the tree:\n%s\nbefore:\n%s", strings.Join(after, "\n"), strings.Join(before, "\n"))
	}
}

// TestPrepareNeverFollowsSymlinks plants symlinks where the tenant and workspace directories go (as a
// compromised host process, or a bug, could): Prepare refuses them and touches nothing they point at.
func TestPrepareNeverFollowsSymlinks(t *testing.T) {
	w, dir := newWorkspaces(t, 1<<30)
	victim := filepath.Join(t.TempDir(), "victim")
	if err := os.Mkdir(victim, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(victim, "secret"), make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Prepare("other", "ws"); err != nil {
		t.Fatal(err)
	}
	for _, plant := range []struct{ link, target string }{
		{filepath.Join(dir, "evil"), victim},                        // tenant dir -> outside
		{filepath.Join(dir, "sneaky"), filepath.Join(dir, "other")}, // tenant dir -> another tenant
	} {
		if err := os.Symlink(plant.target, plant.link); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(dir, "acme"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, filepath.Join(dir, "acme", "ws")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "acme", "file"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct{ name, tenant, workspace string }{
		{"tenant dir is a symlink out", "evil", "ws"},
		{"tenant dir is a symlink to another tenant", "sneaky", "ws"},
		{"workspace is a symlink out", "acme", "ws"},
		{"workspace is a file", "acme", "file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := w.Prepare(tt.tenant, tt.workspace); err == nil || !strings.Contains(err.Error(), "not a directory") {
				t.Errorf("Prepare: %v, want a refusal", err)
			}
		})
	}
	fi, err := os.Stat(victim)
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Uid == testUID || fi.Mode().Perm() != 0o700 {
		t.Errorf("the symlink's target was changed: %v uid %d", fi.Mode(), st.Uid)
	}
	if _, err := os.Stat(filepath.Join(victim, "ws")); err == nil {
		t.Error("a workspace was created inside the symlink's target")
	}
	if entries, _ := os.ReadDir(filepath.Join(dir, "other")); len(entries) != 1 {
		t.Errorf("another tenant's dir changed: %v", entries)
	}
}

func TestPrepareQuota(t *testing.T) {
	w, dir := newWorkspaces(t, 4<<20)
	ws, err := w.Prepare("acme", "ws")
	if err != nil {
		t.Fatal(err)
	}
	if ws.Bytes < 0 || ws.Bytes > 64<<10 {
		t.Errorf("an empty workspace measures %d bytes", ws.Bytes)
	}
	outside := filepath.Join(filepath.Dir(dir), "big")
	if err := os.WriteFile(outside, make([]byte, 8<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	// A symlink to a big file outside and a big sparse file: neither uses the workspace's disk.
	if err := os.Symlink(outside, filepath.Join(ws.Dir, "link")); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(ws.Dir, "sparse"))
	if err != nil {
		t.Fatal(err)
	}
	f.Truncate(1 << 40)
	f.Close()
	if ws, err := w.Prepare("acme", "ws"); err != nil || ws.Bytes > 64<<10 {
		t.Fatalf("Prepare: %+v %v; symlinks and holes must not count", ws, err)
	}
	if err := os.WriteFile(filepath.Join(ws.Dir, "data"), make([]byte, 5<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	ws, err = w.Prepare("acme", "ws")
	var qe *Error
	if !errors.As(err, &qe) || qe.Type != call.ErrQuota || ws.Bytes < 5<<20 || ws.Dir == "" {
		t.Fatalf("Prepare over quota: %+v, %v", ws, err)
	}
	for _, want := range []string{`workspace "ws" uses 5.0 MiB`, "over its quota of 4.0 MiB", "refused until files are deleted"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("message %q lacks %q", err.Error(), want)
		}
	}
	if err := os.Remove(filepath.Join(ws.Dir, "data")); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Prepare("acme", "ws"); err != nil {
		t.Errorf("back under quota: %v", err)
	}
}

func TestPrepareTooDeep(t *testing.T) {
	w, _ := newWorkspaces(t, 1<<30)
	ws, err := w.Prepare("acme", "ws")
	if err != nil {
		t.Fatal(err)
	}
	d, err := os.Open(ws.Dir)
	if err != nil {
		t.Fatal(err)
	}
	for range 300 {
		if err := syscall.Mkdirat(int(d.Fd()), "d", 0o755); err != nil {
			t.Fatal(err)
		}
		fd, err := syscall.Openat(int(d.Fd()), "d", syscall.O_RDONLY|syscall.O_DIRECTORY, 0)
		d.Close()
		if err != nil {
			t.Fatal(err)
		}
		d = os.NewFile(uintptr(fd), "d")
	}
	d.Close()
	_, err = w.Prepare("acme", "ws")
	var qe *Error
	if !errors.As(err, &qe) || qe.Type != call.ErrQuota || !strings.Contains(err.Error(), "deeper than") {
		t.Fatalf("Prepare: %v, want a too-deep quota error", err)
	}
}

func TestFormatBytes(t *testing.T) {
	for n, want := range map[int64]string{0: "0 bytes", 1023: "1023 bytes", 1024: "1.0 KiB", 5 << 20: "5.0 MiB", 3 << 29: "1.5 GiB", 2 << 40: "2.0 TiB"} {
		if got := FormatBytes(n); got != want {
			t.Errorf("formatBytes(%d) = %q, want %q", n, got, want)
		}
	}
}

// TestRecordedSizeSkipsTheWalk: a size recorded at the end of a call stands for the workspace until it is
// SizeTTL old; after that, Prepare measures again.
func TestRecordedSizeSkipsTheWalk(t *testing.T) {
	now := time.Unix(1000, 0)
	w, err := New(Config{Dir: t.TempDir(), UID: os.Getuid(), GID: os.Getgid(), Quota: 1 << 20,
		SizeTTL: 10 * time.Second, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Prepare("acme", "ws"); err != nil {
		t.Fatal(err)
	}
	// The last call left it over quota (as recorded): the next call is refused without a walk.
	w.RecordSize("acme", "ws", 2<<20)
	var over *Error
	if ws, err := w.Prepare("acme", "ws"); !errors.As(err, &over) || over.Type != call.ErrQuota || ws.Bytes != 2<<20 {
		t.Fatalf("within the TTL: %v, want the recorded size over quota", err)
	}
	// Once the record is stale, the real (empty) tree is measured again.
	now = now.Add(11 * time.Second)
	ws, err := w.Prepare("acme", "ws")
	if err != nil || ws.Bytes >= 1<<20 {
		t.Fatalf("after the TTL: %+v %v, want a fresh measurement under quota", ws, err)
	}
}

// TestForgetSize: a workspace changed outside a call (restored from a checkpoint) is measured again by the
// next Prepare, even within the recorded size's TTL.
func TestForgetSize(t *testing.T) {
	w, err := New(Config{Dir: t.TempDir(), UID: os.Getuid(), GID: os.Getgid(), Quota: 1 << 20, SizeTTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ws, err := w.Prepare("acme", "ws")
	if err != nil {
		t.Fatal(err)
	}
	w.RecordSize("acme", "ws", 10)
	if err := os.WriteFile(filepath.Join(ws.Dir, "restored"), make([]byte, 2<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	w.ForgetSize("acme", "ws")
	var over *Error
	if ws, err := w.Prepare("acme", "ws"); !errors.As(err, &over) || over.Type != call.ErrQuota || ws.Bytes < 2<<20 {
		t.Fatalf("after ForgetSize: %+v, %v; want the restored 2 MiB measured, over quota", ws, err)
	}
}
