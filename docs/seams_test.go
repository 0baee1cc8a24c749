// Package docs holds the check that the developer docs name only code that exists.
package docs

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// seamDocs are the docs that map the code's seams by name: every identifier they quote must exist.
var seamDocs = []string{"contracts-internal.md", "architecture.md"}

// foreign are names quoted in the seam docs that belong to other projects' APIs, not to toolpool's code.
var foreign = map[string]bool{
	"DiscardNewPerSubject": true, // a JetStream stream setting
	"ObjectStore":          true, // nats.go's JetStream object store
	"KeyValue":             true, // nats.go's JetStream key-value store
}

// decls is every name the repository declares, by package name: top-level types, functions, variables
// and constants, and (under the key "") every method and struct field of any package.
type decls map[string]map[string]bool

func (d decls) add(pkg, name string) {
	if d[pkg] == nil {
		d[pkg] = map[string]bool{}
	}
	d[pkg][name] = true
}

// declared parses every Go file under the repository's internal/ and cmd/ directories.
func declared(t *testing.T, root string) decls {
	t.Helper()
	d := decls{}
	fset := token.NewFileSet()
	for _, dir := range []string{"internal", "cmd", "test"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, e fs.DirEntry, err error) error {
			if err != nil || e.IsDir() || !strings.HasSuffix(path, ".go") {
				return err
			}
			f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
			if err != nil {
				return err
			}
			pkg := f.Name.Name
			for _, decl := range f.Decls {
				switch decl := decl.(type) {
				case *ast.FuncDecl:
					if decl.Recv != nil {
						d.add("", decl.Name.Name)
					} else {
						d.add(pkg, decl.Name.Name)
					}
				case *ast.GenDecl:
					for _, spec := range decl.Specs {
						switch spec := spec.(type) {
						case *ast.TypeSpec:
							d.add(pkg, spec.Name.Name)
							ast.Inspect(spec.Type, func(n ast.Node) bool {
								if f, ok := n.(*ast.Field); ok {
									for _, name := range f.Names {
										d.add("", name.Name)
									}
								}
								return true
							})
						case *ast.ValueSpec:
							for _, name := range spec.Names {
								d.add(pkg, name.Name)
							}
						}
					}
				}
			}
			return nil
		})
		if err != nil {
			t.Fatalf("parse the repository's Go files: %v", err)
		}
	}
	return d
}

// exists reports whether the doc's qualified or bare name is declared: "pkg.Name", "pkg.Type.Member",
// "Type.Member" or "Name".
func (d decls) exists(name string) bool {
	parts := strings.Split(name, ".")
	first := parts[0]
	switch {
	case len(parts) >= 2 && first != "" && first[0] >= 'a' && first[0] <= 'z' && d[first] == nil:
		return true // another project's package (errors.As) or a variable (conn.Records): not ours to check
	case len(parts) >= 2 && d[first] != nil:
		if !d[parts[0]][parts[1]] {
			return false
		}
		for _, member := range parts[2:] {
			if !d[""][member] {
				return false
			}
		}
		return true
	default:
		for _, part := range parts {
			if !d.anywhere(part) {
				return false
			}
		}
		return true
	}
}

func (d decls) anywhere(name string) bool {
	for _, names := range d {
		if names[name] {
			return true
		}
	}
	return false
}

var (
	quoted = regexp.MustCompile("`([^`]+)`")
	// goName is an exported Go identifier, optionally qualified, optionally followed by a call's
	// arguments: Name, pkg.Name, Type.Method(ctx, ...) ...
	goName = regexp.MustCompile(`^((?:[a-z][a-z0-9]*\.)?[A-Z][A-Za-z0-9]*(?:\.[A-Z][A-Za-z0-9]*)*)(?:\(.*)?$`)
	// repoPath is a path into the repository's Go code: internal/..., cmd/..., or a file such as
	// worker/stream.go named from internal/.
	repoPath = regexp.MustCompile(`^(?:(?:internal|cmd|test)/[a-z0-9_/.-]+|[a-z0-9_]+(?:/[a-z0-9_]+)*\.go)$`)
)

// TestSeamDocsNameCodeThatExists fails when a seam doc quotes an identifier or a path that the code no
// longer has: the maps must move with the code.
func TestSeamDocsNameCodeThatExists(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	d := declared(t, root)
	for _, doc := range seamDocs {
		text, err := os.ReadFile(doc)
		if err != nil {
			t.Fatalf("read %s: %v", doc, err)
		}
		for i, line := range strings.Split(string(text), "\n") {
			for _, m := range quoted.FindAllStringSubmatch(line, -1) {
				q := strings.TrimSpace(m[1])
				switch {
				case repoPath.MatchString(q):
					if !pathExists(root, q, packagesOn(line)) {
						t.Errorf("%s:%d: `%s` names a path that does not exist", doc, i+1, q)
					}
				case goName.MatchString(q):
					name := goName.FindStringSubmatch(q)[1]
					if isConstant(name) || foreign[name] {
						continue
					}
					if !d.exists(name) {
						t.Errorf("%s:%d: `%s` names %s, which the code does not declare", doc, i+1, q, name)
					}
				}
			}
		}
	}
}

// isConstant reports names written in capitals (HTTP_PROXY, OTEL_*), which are not Go identifiers here.
func isConstant(name string) bool { return strings.ToUpper(name) == name }

// pathExists looks for a repository path as given, then under internal/ (docs name files such as
// worker/stream.go from there). A bare file name (service.go) is looked for in the packages the same line
// names, or anywhere in the repository when it names none.
func pathExists(root, p string, pkgs []string) bool {
	p = strings.TrimSuffix(p, "/...")
	bases := []string{root, filepath.Join(root, "internal")}
	if !strings.Contains(p, "/") {
		bases = nil
		for _, pkg := range pkgs {
			bases = append(bases, filepath.Join(root, pkg))
		}
		if len(bases) == 0 {
			found := false
			_ = filepath.WalkDir(root, func(path string, e fs.DirEntry, err error) error {
				if err == nil && !e.IsDir() && e.Name() == p {
					found = true
					return filepath.SkipAll
				}
				return nil
			})
			return found
		}
	}
	for _, base := range bases {
		if _, err := os.Stat(filepath.Join(base, p)); err == nil {
			return true
		}
	}
	return false
}

// packagesOn lists the package directories (internal/..., cmd/...) that a line of a doc quotes.
func packagesOn(line string) []string {
	var pkgs []string
	for _, m := range quoted.FindAllStringSubmatch(line, -1) {
		q := strings.TrimSuffix(strings.TrimSpace(m[1]), "/...")
		if (strings.HasPrefix(q, "internal/") || strings.HasPrefix(q, "cmd/")) && !strings.HasSuffix(q, ".go") {
			pkgs = append(pkgs, q)
		}
	}
	return pkgs
}

// TestSeamCheckerHasTeeth pins what the check above accepts and refuses, so that a loosened matcher
// shows here rather than by letting a stale doc through.
func TestSeamCheckerHasTeeth(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	d := declared(t, root)
	for _, c := range []struct {
		name string
		want bool
	}{
		{"queue.Records", true},
		{"queue.Records.Wait", true},
		{"queue.NoSuchContract", false},
		{"call.Result", true},
		{"NoSuchIdentifierAnywhere", false},
		{"errors.As", true},
	} {
		if got := d.exists(c.name); got != c.want {
			t.Errorf("exists(%q) = %v, want %v", c.name, got, c.want)
		}
	}
	for _, c := range []struct {
		path string
		pkgs []string
		want bool
	}{
		{"internal/queue/contracts.go", nil, true},
		{"internal/no/such", nil, false},
		{"contracts.go", []string{"internal/queue"}, true},
		{"contracts.go", []string{"internal/worker"}, false},
		{"no-such-file.go", nil, false},
	} {
		if got := pathExists(root, c.path, c.pkgs); got != c.want {
			t.Errorf("pathExists(%q, %v) = %v, want %v", c.path, c.pkgs, got, c.want)
		}
	}
}
