package deniedpath

import (
	"errors"
	"fmt"
	"io/fs"
	"math/rand"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// testGlobs are the shipped default's denied globs and a few shapes it lacks.
var testGlobs = []string{"**/.env", "**/.env.*", "**/*.pem", "**/*.key", "**/id_rsa", "**/id_ed25519", "~/.ssh/**",
	"**/.ssh/**", "~/.aws/**", "~/.docker/config.json", "**/.netrc", "**/.git/config", "**/.git/hooks/**",
	"secrets/*", "/a/**/z", "**/x/**/y", "**/id_?sa", "**/*.p[eE]m", "build/", "/etc/**"}

// bruteFind is Find by definition: every path, matched whole, not entering a directory that matches.
func bruteFind(t *testing.T, d *Set, root string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
		if err != nil || p == root {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if _, ok := d.Match(WorkspaceRoot + "/" + filepath.ToSlash(rel)); ok {
			out = append(out, rel)
			if e.IsDir() {
				return filepath.SkipDir
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func mkfiles(t *testing.T, root string, files ...string) {
	t.Helper()
	for _, f := range files {
		p := filepath.Join(root, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestFind: the denied paths of a tree, nested and dot-directories included, directories listed whole.
func TestFind(t *testing.T) {
	d, err := Compile(testGlobs)
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	mkfiles(t, root, ".env", "a/b/.env", "a/b/.env.local", "a/.envrc", ".ssh/id_rsa", "nested/.ssh/known_hosts",
		"x.pem", "deep/er/y.PEM", "deep/er/y.pEm", ".git/config", ".git/HEAD", ".git/hooks/pre-commit",
		"sub/.git/config", "sub/.git/hooks/post-checkout", ".aws/credentials", "a/.aws/credentials",
		".docker/config.json", "secrets/db", "a/secrets/db", "a/q/z", "a/z", "x/1/2/y", "id_dsa", "build/out",
		"src/main.go", "README")
	if err := os.Symlink("/etc/passwd", filepath.Join(root, "link.pem")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(root, filepath.Join(root, "loop")); err != nil {
		t.Fatal(err)
	}
	got, err := d.Find(root, 0)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{".aws", ".docker/config.json", ".env", ".git/config", ".git/hooks", ".ssh", "a/b/.env", "a/b/.env.local",
		"build", "deep/er/y.PEM", "deep/er/y.pEm", "id_dsa", "link.pem", "nested/.ssh", "secrets/db", "sub/.git/config", "sub/.git/hooks",
		"x.pem", "x/1/2/y"}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("Find = %q\nwant   %q", got, want)
	}
	if brute := bruteFind(t, d, root); !slices.Equal(sorted(brute), want) {
		t.Errorf("the brute force finds %q", brute)
	}
	if _, err := d.Find(root, 3); !errors.Is(err, ErrTooMany) {
		t.Errorf("Find with limit 3: %v, want ErrTooMany", err)
	}
	if got, err := (*Set)(nil).Find(root, 0); got != nil || err != nil {
		t.Errorf("nil set: %q %v", got, err)
	}
	if got, err := mustCompile(t, "/etc/**").Find(root, 0); got != nil || err != nil {
		t.Errorf("a glob outside the workspace finds %q %v", got, err)
	}
}

// TestFindMatchesMatch: on random trees, Find finds what matching every path finds.
func TestFindMatchesMatch(t *testing.T) {
	d, err := Compile(testGlobs)
	if err != nil {
		t.Fatal(err)
	}
	names := []string{".env", ".env.x", "a", "b", ".ssh", ".git", "config", "hooks", "x", "y", "z", "k.pem", "id_rsa", "secrets", ".aws", "build", "q"}
	r := rand.New(rand.NewSource(1))
	for i := range 50 {
		root := t.TempDir()
		for range 40 {
			depth := 1 + r.Intn(5)
			p := ""
			for j := range depth {
				if j > 0 {
					p += "/"
				}
				p += names[r.Intn(len(names))]
			}
			full := filepath.Join(root, p)
			if os.MkdirAll(filepath.Dir(full), 0o755) == nil {
				_ = os.WriteFile(full, nil, 0o644) // fails when a directory is there already: fine
			}
		}
		got, err := d.Find(root, 0)
		if err != nil {
			t.Fatal(err)
		}
		slices.Sort(got)
		if want := sorted(bruteFind(t, d, root)); !slices.Equal(got, want) {
			t.Fatalf("tree %d: Find = %q, want %q", i, got, want)
		}
	}
}

func mustCompile(t *testing.T, p ...string) *Set {
	t.Helper()
	d, err := Compile(p)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// defaultGlobs are the shipped policy's denied globs (internal/policy/default.yaml).
var defaultGlobs = []string{"**/.env", "**/.env.*", "**/*.pem", "**/*.key", "**/*.p12", "**/*.pfx", "**/*.keystore",
	"**/*.jks", "**/id_rsa", "**/id_dsa", "**/id_ecdsa", "**/id_ed25519", "~/.ssh/**", "**/.ssh/**", "~/.aws/**",
	"~/.gnupg/**", "~/.docker/config.json", "~/.kube/config", "**/.netrc", "**/.git-credentials", "**/.pgpass",
	"**/.npmrc", "**/.pypirc", "**/.git/config", "**/.git/hooks/**"}

// BenchmarkFind10k: the shipped globs over a 10k-file tree (100 directories of 100 files, some
// dot-directories).
func BenchmarkFind10k(b *testing.B) {
	d, err := Compile(defaultGlobs)
	if err != nil {
		b.Fatal(err)
	}
	root := tree10k(b)
	for b.Loop() {
		if _, err := d.Find(root, 0); err != nil {
			b.Fatal(err)
		}
	}
}

func sorted(s []string) []string {
	slices.Sort(s)
	return s
}

// TestFinderRemembers: a Finder answers what Find answers; a second walk of an unchanged tree reads no
// directory, and one whose directories changed reads those again and finds what is new in them.
func TestFinderRemembers(t *testing.T) {
	d := mustCompile(t, testGlobs...)
	root := t.TempDir()
	mkfiles(t, root, ".env", "a/b/c/x.go", "a/b/d/y.go", "e/f.go", ".git/config", ".git/HEAD")
	fi := &Finder{racy: -time.Hour} // every reading is kept, however recent
	check := func(wantReads int) {
		t.Helper()
		got, err := fi.Find(d, root, 0)
		if err != nil {
			t.Fatal(err)
		}
		want, err := d.Find(root, 0)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(sorted(got), sorted(want)) {
			t.Errorf("Finder.Find = %q, Find = %q", got, want)
		}
		if reads := fi.trees[root+"\x00"+strings.Join(testGlobs, "\x00")].cache.reads; wantReads >= 0 && reads != wantReads {
			t.Errorf("the walk read %d directories, want %d", reads, wantReads)
		}
	}
	check(-1)
	check(0)
	// A new secret deep down: its directory changed (its times are set apart, so that a coarse clock
	// cannot hide the change), the others did not.
	mkfiles(t, root, "a/b/d/.env")
	if err := os.Chtimes(filepath.Join(root, "a/b/d"), time.Unix(1, 0), time.Unix(1, 0)); err != nil {
		t.Fatal(err)
	}
	check(1)
	// A directory replaced by a file of the same name, and a new directory with a secret.
	if err := os.RemoveAll(filepath.Join(root, "e")); err != nil {
		t.Fatal(err)
	}
	mkfiles(t, root, "e", "n/.ssh/id_rsa")
	if err := os.Chtimes(root, time.Unix(2, 0), time.Unix(2, 0)); err != nil {
		t.Fatal(err)
	}
	check(-1)
	check(0)
	// Fresh directories are not kept under the default rule: every walk reads them.
	fresh := &Finder{}
	for range 2 {
		if _, err := fresh.Find(d, root, 0); err != nil {
			t.Fatal(err)
		}
	}
	if reads := fresh.trees[root+"\x00"+strings.Join(testGlobs, "\x00")].cache.reads; reads == 0 {
		t.Errorf("directories changed a moment ago were taken from the cache")
	}
}

// BenchmarkFinder10k is BenchmarkFind10k with the Finder's memory, on a tree that does not change.
func BenchmarkFinder10k(b *testing.B) {
	d, err := Compile(defaultGlobs)
	if err != nil {
		b.Fatal(err)
	}
	root := tree10k(b)
	fi := &Finder{racy: -time.Hour}
	for b.Loop() {
		if _, err := fi.Find(d, root, 0); err != nil {
			b.Fatal(err)
		}
	}
}

// tree10k makes 100 directories of 100 files, some of them dot-directories.
func tree10k(b *testing.B) string {
	root := b.TempDir()
	for i := range 100 {
		dir := filepath.Join(root, fmt.Sprintf("pkg%d/sub", i))
		if i%10 == 0 {
			dir = filepath.Join(root, fmt.Sprintf(".hidden%d", i))
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			b.Fatal(err)
		}
		for j := range 100 {
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%d.go", j)), nil, 0o644); err != nil {
				b.Fatal(err)
			}
		}
	}
	return root
}

// TestFindHardLinks: every other name of a file that matches, or that a matching directory holds, is
// found too, wherever it is, and through a Finder's cache; a copy, a symbolic link and an unrelated file
// are not.
func TestFindHardLinks(t *testing.T) {
	d, err := Compile(testGlobs)
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	mkfiles(t, root, ".env", ".ssh/keys/id_x", "docs/readme.md", "copy.txt")
	for _, l := range [][2]string{{".env", "notes.txt"}, {".env", "docs/deep/env-backup"}, {".ssh/keys/id_x", "key.txt"},
		{"docs/readme.md", "readme-link.md"}} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, l[1])), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Link(filepath.Join(root, l[0]), filepath.Join(root, l[1])); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(".env", filepath.Join(root, "sym")); err != nil {
		t.Fatal(err)
	}
	want := []string{".env", ".ssh", "docs/deep/env-backup", "key.txt", "notes.txt"}
	got, err := d.Find(root, 0)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("Find = %q, want %q", got, want)
	}
	fi := &Finder{racy: time.Nanosecond}
	for i := range 2 {
		got, err := fi.Find(d, root, 0)
		if err != nil {
			t.Fatal(err)
		}
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Errorf("Finder walk %d = %q, want %q", i, got, want)
		}
	}
	// A second name made after a walk is found by the next one.
	if err := os.Link(filepath.Join(root, ".env"), filepath.Join(root, "docs/later")); err != nil {
		t.Fatal(err)
	}
	got, err = fi.Find(d, root, 0)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(got, "docs/later") {
		t.Errorf("Finder after a new link = %q, want docs/later among them", got)
	}
	// The links count against the limit like the matches.
	if _, err := d.Find(root, 3); !errors.Is(err, ErrTooMany) {
		t.Errorf("Find with limit 3: %v, want ErrTooMany", err)
	}
}

// TestFindCaseVariants: names match the globs in any case, as a case-insensitive file system serves them:
// .ENV is .env there, ID_RSA is id_rsa, .SSH/config is under ~/.ssh.
func TestFindCaseVariants(t *testing.T) {
	d, err := Compile([]string{"**/.env", "**/id_rsa", "~/.ssh/**", "**/.git/config", "**/*.pem"})
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	mkfiles(t, root, ".ENV", "a/.Env", "ID_RSA", ".SSH/config", ".Git/CONFIG", "k.PEM", "README.md", "Envoy.txt")
	want := []string{".ENV", ".Git/CONFIG", ".SSH", "ID_RSA", "a/.Env", "k.PEM"}
	for _, find := range []func() ([]string, error){
		func() ([]string, error) { return d.Find(root, 0) },
		func() ([]string, error) { return (&Finder{}).Find(d, root, 0) },
	} {
		got, err := find()
		if err != nil {
			t.Fatal(err)
		}
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Errorf("Find = %q, want %q", got, want)
		}
	}
	for _, p := range []string{"/workspace/.ENV", "/workspace/x/ID_RSA", "/workspace/.Ssh/id", "/workspace/.GIT/Config"} {
		if _, ok := d.Match(p); !ok {
			t.Errorf("Match(%q) = false, want true", p)
		}
	}
	if _, ok := d.Match("/workspace/envoy"); ok {
		t.Error("Match(/workspace/envoy) = true, want false")
	}
}
