package workspace

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/toolpool/toolpool/internal/call"
)

func TestGitCheck(t *testing.T) {
	for _, tc := range []struct {
		name, url, ref string
		host           string // when valid
		msg            string // in the refusal otherwise
	}{
		{"https", "https://git.example.com/o/r.git", "main", "git.example.com", ""},
		{"port and case", "https://Git.Example.COM.:8443/r", "", "git.example.com", ""},
		{"tag with slash", "https://h/r.git", "release/v1.2", "h", ""},
		{"commit", "https://h/r.git", strings.Repeat("ab", 20), "h", ""},
		{"empty", "", "", "", "has no url"},
		{"http", "http://h/r.git", "", "", "plain http"},
		{"ssh scheme", "ssh://git@h/r.git", "", "", "scheme \"ssh\""},
		{"scp-like ssh", "git@github.com:o/r.git", "", "", "ssh address"},
		{"file", "file:///etc/passwd", "", "", "scheme \"file\""},
		{"local path", "/srv/repo.git", "", "", "not a URL"},
		{"credentials", "https://user:tok@h/r.git", "", "", "carries credentials"},
		{"user only", "https://user@h/r.git", "", "", "egress.credentials"},
		{"fragment", "https://h/r.git#main", "", "", "fragment"},
		{"space", "https://h/r .git", "", "", "space or a control"},
		{"newline", "https://h/r.git\n", "", "", "space or a control"},
		{"no host", "https:///r.git", "", "", "no host"},
		{"bad port", "https://h:99999/r.git", "", "", "port"},
		{"option ref", "https://h/r.git", "--upload-pack=touch /tmp/x", "", "starts with '-'"},
		{"dash ref", "https://h/r.git", "-b", "", "read as an option"},
		{"dotdot ref", "https://h/r.git", "a..b", "", `".."`},
		{"colon ref", "https://h/r.git", "HEAD:x", "", "~ ^ : ? * ["},
		{"lock ref", "https://h/r.git", "x.lock", "", ".lock"},
		{"dot component", "https://h/r.git", "a/.b", "", "starting with '.'"},
		{"control ref", "https://h/r.git", "a\tb", "", "control"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			host, err := Git{URL: tc.url, Ref: tc.ref}.Check()
			if tc.msg == "" {
				if err != nil || host != tc.host {
					t.Fatalf("Check = %q, %v; want %q", host, err, tc.host)
				}
				return
			}
			var we *Error
			if !errors.As(err, &we) || we.Type != call.ErrInvalidParams || !strings.Contains(we.Msg, tc.msg) {
				t.Fatalf("Check = %q, %v; want an invalid_params refusal saying %q", host, err, tc.msg)
			}
		})
	}
	if !(Git{Ref: strings.Repeat("0", 40)}).IsCommit() || (Git{Ref: "main"}).IsCommit() || (Git{Ref: strings.Repeat("g", 40)}).IsCommit() {
		t.Error("IsCommit: want true for 40 hex digits only")
	}
}

// TestCreateFrom: a filled tree becomes the workspace, the sandbox user's and without setuid bits; a tree
// over the limits, a failed fill or a name taken meanwhile leaves nothing, not even a lock or a staging
// directory.
func TestCreateFrom(t *testing.T) {
	ctx := context.Background()
	m := newManager(t, Config{Archive: Limits{Files: 5, Bytes: 1000}, MaxWorkspaces: 3})
	write := func(files map[string]string) Fill {
		return func(_ context.Context, dir string, lim Limits) error {
			if lim != m.cfg.Archive {
				t.Errorf("fill got limits %+v, want %+v", lim, m.cfg.Archive)
			}
			for name, body := range files {
				p := filepath.Join(dir, name)
				os.MkdirAll(filepath.Dir(p), 0o755)
				if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
					return err
				}
			}
			return nil
		}
	}
	nothingLeft := func(name string) {
		t.Helper()
		for _, p := range []string{filepath.Join(m.cfg.Dir, "t1", name), m.lockPath("t1", name), m.metaPath("t1", name)} {
			if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s is left behind (%v)", p, err)
			}
		}
		if ents, _ := os.ReadDir(m.trashDir("t1")); len(ents) != 0 {
			t.Errorf("the trash holds %d staging entries", len(ents))
		}
	}

	inf, err := m.CreateFrom(ctx, "t1", "ok", func(ctx context.Context, dir string, lim Limits) error {
		if err := write(map[string]string{"README": "hi", ".git/HEAD": "ref: refs/heads/main\n"})(ctx, dir, lim); err != nil {
			return err
		}
		os.Symlink("README", filepath.Join(dir, "link"))
		os.Lchown(filepath.Join(dir, "README"), 1000, 1000) // already the sandbox user's: a chown would not clear the bit
		return os.Chmod(filepath.Join(dir, "README"), 0o755|os.ModeSetuid)
	})
	if err != nil || inf.Name != "ok" || inf.Files != 3 {
		t.Fatalf("CreateFrom = %+v, %v; want 3 files", inf, err)
	}
	st, err := os.Lstat(filepath.Join(m.cfg.Dir, "t1", "ok", "README"))
	if err != nil {
		t.Fatal(err)
	}
	if sys := st.Sys().(*syscall.Stat_t); os.Geteuid() == 0 && (sys.Uid != 1000 || sys.Gid != 1000) {
		t.Errorf("README is owned by %d:%d, want the sandbox user 1000:1000", sys.Uid, sys.Gid)
	}
	if st.Mode()&os.ModeSetuid != 0 {
		t.Errorf("README kept its setuid bit: %v", st.Mode())
	}
	_, err = m.CreateFrom(ctx, "t1", "ok", write(nil))
	wantErr(t, err, TypeExists, "exists already")

	_, err = m.CreateFrom(ctx, "t1", "many", write(map[string]string{"a": "", "b": "", "c": "", "d": "", "e": "", "f": ""}))
	wantErr(t, err, TypeTooLarge, "more than 5 entries")
	nothingLeft("many")
	_, err = m.CreateFrom(ctx, "t1", "big", write(map[string]string{"a": strings.Repeat("x", 1001)}))
	wantErr(t, err, TypeTooLarge, "more than 1000 bytes")
	nothingLeft("big")
	_, err = m.CreateFrom(ctx, "t1", "failed", func(context.Context, string, Limits) error {
		return &Error{Type: call.ErrNotFound, Msg: "no such ref"}
	})
	wantErr(t, err, call.ErrNotFound, "no such ref")
	nothingLeft("failed")
	_, err = m.CreateFrom(ctx, "t1", "raced", func(ctx context.Context, dir string, lim Limits) error {
		_, err := m.Create(ctx, "t1", "raced", nil) // the name is taken while the clone runs
		return err
	})
	wantErr(t, err, TypeExists, "exists already")
	if ents, _ := os.ReadDir(m.trashDir("t1")); len(ents) != 0 {
		t.Errorf("the trash holds %d staging entries", len(ents))
	}
	_, err = m.CreateFrom(ctx, "t1", "fifo", func(_ context.Context, dir string, _ Limits) error {
		return syscall.Mkfifo(filepath.Join(dir, "p"), 0o644)
	})
	wantErr(t, err, call.ErrInvalidParams, "not a file, directory or symlink")
	nothingLeft("fifo")

	if _, err := m.Create(ctx, "t1", "third", nil); err != nil {
		t.Fatal(err)
	}
	filled := false
	_, err = m.CreateFrom(ctx, "t1", "fourth", func(context.Context, string, Limits) error { filled = true; return nil })
	wantErr(t, err, call.ErrQuota, "3 workspaces, its limit")
	if filled {
		t.Error("a tenant at its workspace limit had its clone run before the refusal")
	}
}
