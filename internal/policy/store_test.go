package policy

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

func writeFile(t *testing.T, path, body string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
}

// replaceFile writes path atomically (a temporary file renamed over it), the way editors and Kubernetes
// do, so that a poll never sees a half-written file.
func replaceFile(t *testing.T, path, body string) {
	t.Helper()
	tmp := path + ".tmp"
	writeFile(t, tmp, body)
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func readAction(s *Store) Action {
	return s.Decide(context.Background(), Request{Tool: "read_file"}).Action
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestStoreReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policy.yaml")
	writeFile(t, path, "tools: {read_file: {action: allow}}\n")
	p, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	s := NewStore(p)
	if got := readAction(s); got != Allow {
		t.Fatalf("before reload: %s", got)
	}

	writeFile(t, path, "tools: {read_file: {action: deny}}\n")
	if err := s.Reload(path); err != nil {
		t.Fatalf("Reload: %v", err)
	}
	if got := readAction(s); got != Deny {
		t.Fatalf("after reload: %s, want deny", got)
	}

	writeFile(t, path, "tools:\n  read_file:\n    action: allow\n    colour: blue\n")
	err = s.Reload(path)
	var ce *ConfigError
	if !errors.As(err, &ce) || ce.File != path || ce.Line != 4 || ce.Field != "tools.read_file.colour" {
		t.Fatalf("Reload of an invalid file: %v; want file, line 4 and field tools.read_file.colour", err)
	}
	if got := readAction(s); got != Deny {
		t.Fatalf("a failed reload changed the policy: %s, want deny", got)
	}
	if err := s.Reload(filepath.Join(t.TempDir(), "missing.yaml")); err == nil {
		t.Fatal("Reload of a missing file succeeded")
	}
}

func TestStoreWatch(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policy.yaml")
	writeFile(t, path, "tools: {read_file: {action: allow}}\n")
	p, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	s := NewStore(p)
	results := make(chan error, 16)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- s.Watch(ctx, path, 5*time.Millisecond, func(err error) { results <- err }) }()
	defer func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("Watch returned %v, want context.Canceled", err)
		}
	}()

	next := func() error {
		t.Helper()
		select {
		case err := <-results:
			return err
		case <-time.After(5 * time.Second):
			t.Fatal("no reload reported")
			return nil
		}
	}

	replaceFile(t, path, "tools: {read_file: {action: ask}}\n")
	if err := next(); err != nil {
		t.Fatalf("reload after a change: %v", err)
	}
	if got := readAction(s); got != Ask {
		t.Fatalf("after change: %s, want ask", got)
	}

	replaceFile(t, path, "tools: {read_file: {action: sometimes}}\n")
	if err := next(); err == nil || !strings.Contains(err.Error(), "tools.read_file.action") {
		t.Fatalf("reload of an invalid file reported %v", err)
	}
	if got := readAction(s); got != Ask {
		t.Fatalf("an invalid file changed the policy: %s", got)
	}

	replaceFile(t, path, "tools: {read_file: {action: deny}}\n")
	if err := next(); err != nil {
		t.Fatalf("reload after a fix: %v", err)
	}
	if got := readAction(s); got != Deny {
		t.Fatalf("after fix: %s, want deny", got)
	}

	// Rewriting the same content reloads nothing.
	replaceFile(t, path, "tools: {read_file: {action: deny}}\n")
	select {
	case err := <-results:
		t.Fatalf("unchanged content reloaded: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
}

// TestStoreWatchConfigMap: Kubernetes updates a ConfigMap volume by pointing the ..data symlink at a new
// directory; the file's own path never changes.
func TestStoreWatchConfigMap(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "..v1", "policy.yaml"), "tools: {read_file: {action: allow}}\n")
	if err := os.Symlink("..v1", filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "policy.yaml")
	if err := os.Symlink(filepath.Join("..data", "policy.yaml"), path); err != nil {
		t.Fatal(err)
	}
	p, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	s := NewStore(p)
	results := make(chan error, 4)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.Watch(ctx, path, 5*time.Millisecond, func(err error) { results <- err })

	writeFile(t, filepath.Join(dir, "..v2", "policy.yaml"), "tools: {read_file: {action: deny}}\n")
	tmp := filepath.Join(dir, "..data_tmp")
	if err := os.Symlink("..v2", tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-results:
		if err != nil {
			t.Fatalf("reload after the symlink swap: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the symlink swap was not noticed")
	}
	if got := readAction(s); got != Deny {
		t.Fatalf("after swap: %s, want deny", got)
	}
}

func TestStoreWatchTenantFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "policy.yaml")
	writeFile(t, path, "tenants:\n  acme: {file: acme.yaml}\n")
	writeFile(t, filepath.Join(dir, "acme.yaml"), "tools: {read_file: {action: allow}}\n")
	p, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	s := NewStore(p)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.Watch(ctx, path, 5*time.Millisecond, nil)
	replaceFile(t, filepath.Join(dir, "acme.yaml"), "tools: {read_file: {action: deny}}\n")
	waitFor(t, "the tenant file change to load", func() bool {
		return s.Decide(context.Background(), Request{Tenant: "acme", Tool: "read_file"}).Action == Deny
	})
}

func TestStoreWatchBadInterval(t *testing.T) {
	if err := NewStore(Default()).Watch(context.Background(), "x", 0, nil); err == nil {
		t.Fatal("Watch with a zero interval succeeded")
	}
}

func TestStoreAllowRules(t *testing.T) {
	s := NewStore(Default())
	shell := func(tenant, cmd string) Decision {
		return s.Decide(context.Background(), Request{Tenant: tenant, Tool: "run_shell", Facts: Facts{Command: cmd}})
	}
	if d := shell("acme", "npm install left-pad"); d.Action != Ask {
		t.Fatalf("before approval: %s", d.Action)
	}
	if err := s.AddAllowRule("acme", "run_shell", []string{"npm", "install"}); err != nil {
		t.Fatal(err)
	}
	if err := s.AddAllowRule("acme", "write_file", nil); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		tenant string
		cmd    string
		want   Action
		rule   string
	}{
		{"approved prefix", "acme", "npm install left-pad", Allow, RuleApprovedAlways},
		{"approved prefix through a wrapper", "acme", "timeout 60 npm install", Allow, RuleApprovedAlways},
		{"approved prefix in a list", "acme", "ls && npm install", Allow, ""},
		{"other commands still ask", "acme", "npm run build", Ask, ""},
		{"other tenants still ask", "globex", "npm install", Ask, ""},
		{"built-in safety still asks", "acme", "npm install $PKG", Ask, RuleUnresolved},
		{"redirect still asks", "acme", "npm install > log.txt", Ask, RuleRedirectWrite},
		{"deny is never overridden", "acme", "npm install && sudo x", Deny, "forbidden-commands"},
		{"denied paths still deny", "acme", "npm install .env", Deny, RuleDeniedPath},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := shell(c.tenant, c.cmd)
			if d.Action != c.want || c.rule != "" && d.Rule != c.rule {
				t.Errorf("Decide(%q) = %s by %s (%s); want %s by %q", c.cmd, d.Action, d.Rule, d.Reason, c.want, c.rule)
			}
		})
	}
	if d := s.Decide(context.Background(), Request{Tenant: "acme", Tool: "write_file", Facts: paths("a.txt")}); d.Action != Allow || d.Rule != RuleApprovedAlways {
		t.Errorf("approved write_file: %s by %s", d.Action, d.Rule)
	}
	if d := s.Decide(context.Background(), Request{Tenant: "acme", Tool: "write_file", Facts: paths(".env")}); d.Action != Deny {
		t.Errorf("approved write_file on .env: %s, want deny", d.Action)
	}
	if d := s.Decide(context.Background(), Request{Tenant: "acme", Tool: "write_file", RequestTools: map[string]bool{"write_file": false}}); d.Action != Deny {
		t.Errorf("approved write_file switched off by the request: %s, want deny", d.Action)
	}

	// The rules survive a reload, and can be saved and restored.
	s.Replace(Default())
	if d := shell("acme", "npm install"); d.Action != Allow {
		t.Errorf("after Replace: %s, want allow", d.Action)
	}
	if err := s.AddAllowRule("acme", "run_shell", []string{"npm", "install"}); err != nil {
		t.Fatal(err)
	}
	saved := s.AllowRules()
	if len(saved) != 2 {
		t.Fatalf("AllowRules() = %v, want 2 rules (adding twice changes nothing)", saved)
	}
	saved[0].ArgvPrefix[0] = "changed"
	if s.AllowRules()[0].ArgvPrefix[0] != "npm" {
		t.Error("AllowRules returned the store's own slices")
	}
	restored := NewStore(Default())
	if err := restored.SetAllowRules(s.AllowRules()); err != nil {
		t.Fatal(err)
	}
	if !slices.EqualFunc(restored.AllowRules(), s.AllowRules(), func(a, b AllowRule) bool {
		return a.Tenant == b.Tenant && a.Tool == b.Tool && slices.Equal(a.ArgvPrefix, b.ArgvPrefix)
	}) {
		t.Errorf("restored rules %v, want %v", restored.AllowRules(), s.AllowRules())
	}
}

func TestAllowRuleValidation(t *testing.T) {
	cases := []struct {
		name string
		rule AllowRule
		want string
	}{
		{"no tenant", AllowRule{Tool: "run_shell", ArgvPrefix: []string{"ls"}}, "tenant"},
		{"no tool", AllowRule{Tenant: "a"}, "tool"},
		{"whole shell", AllowRule{Tenant: "a", Tool: "run_shell"}, "command prefix"},
		{"empty word", AllowRule{Tenant: "a", Tool: "run_shell", ArgvPrefix: []string{"npm", ""}}, "empty"},
		{"spaces in a word", AllowRule{Tenant: "a", Tool: "run_shell", ArgvPrefix: []string{"npm install"}}, "white space"},
		{"directory", AllowRule{Tenant: "a", Tool: "run_shell", ArgvPrefix: []string{"/usr/bin/npm"}}, "without a directory"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := NewStore(Default())
			err := s.AddAllowRule(c.rule.Tenant, c.rule.Tool, c.rule.ArgvPrefix)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("AddAllowRule(%+v) = %v, want an error saying %q", c.rule, err, c.want)
			}
			if err := s.SetAllowRules([]AllowRule{{Tenant: "ok", Tool: "write_file"}, c.rule}); err == nil {
				t.Fatal("SetAllowRules accepted an invalid rule")
			}
			if len(s.AllowRules()) != 0 {
				t.Fatal("a failed SetAllowRules changed the rules")
			}
		})
	}
}

// TestStoreConcurrent: decisions, reloads and new rules race freely (run with -race).
func TestStoreConcurrent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policy.yaml")
	writeFile(t, path, string(DefaultYAML()))
	s := NewStore(Default())
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; k < 50; k++ {
				d := s.Decide(context.Background(), Request{Tenant: "a", Tool: "run_shell", Facts: Facts{Command: "ls && npm install"}})
				if !d.Action.Valid() {
					t.Errorf("invalid decision %+v", d)
					return
				}
			}
		}()
	}
	wg.Add(2)
	go func() {
		defer wg.Done()
		for k := 0; k < 10; k++ {
			if err := s.Reload(path); err != nil {
				t.Error(err)
			}
		}
	}()
	go func() {
		defer wg.Done()
		for k := 0; k < 10; k++ {
			if err := s.AddAllowRule("a", "run_shell", []string{"npm", "install"}); err != nil {
				t.Error(err)
			}
			_ = s.AllowRules()
		}
	}()
	wg.Wait()
}
