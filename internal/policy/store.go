package policy

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/policy/shell"
)

// AllowRule is an "approve always" rule: where policy would ask, calls of Tool by Tenant are allowed
// when their command starts with ArgvPrefix (run_shell), or always when ArgvPrefix is empty (other
// tools). It never overrides a deny, nor an ask from a built-in safety rule (unresolved, dangerous-flags,
// redirect-write...): it only answers the question a command rule or tool action asked.
type AllowRule struct {
	Tenant     string   `json:"tenant"`
	Tool       string   `json:"tool"`
	ArgvPrefix []string `json:"argv_prefix,omitempty"`
}

// Store holds the current Policy and the "approve always" rules, and decides calls with both. Policy
// swaps are atomic: a Decide sees either the old or the new policy, never a mix. All methods are safe
// for concurrent use. The store keeps approve-always rules in memory only: the caller persists them
// (AllowRules) and restores them at start (SetAllowRules).
type Store struct {
	policy atomic.Pointer[Policy]
	rules  atomic.Pointer[[]AllowRule] // an immutable snapshot, replaced under mu
	mu     sync.Mutex
	opts   []ParseOption
}

// NewStore returns a store holding p, which must not be nil; Reload parses with opts.
func NewStore(p *Policy, opts ...ParseOption) *Store {
	s := &Store{opts: opts}
	s.policy.Store(p)
	s.rules.Store(&[]AllowRule{})
	return s
}

// Policy returns the current policy.
func (s *Store) Policy() *Policy { return s.policy.Load() }

// Replace makes p the current policy.
func (s *Store) Replace(p *Policy) { s.policy.Store(p) }

// Decide judges r with the current policy and the approve-always rules.
func (s *Store) Decide(ctx context.Context, r Request) Decision {
	d, _ := s.policy.Load().decide(r, *s.rules.Load())
	return d
}

// ToolEnabled is Policy.ToolEnabled on the current policy.
func (s *Store) ToolEnabled(tenant, tool string, requestTools map[string]bool) bool {
	return s.policy.Load().ToolEnabled(tenant, tool, requestTools)
}

// CheckImage asks the current policy whether tenant's call of tool may run on image ref (Policy.CheckImage).
func (s *Store) CheckImage(tenant, tool, ref string) (ImageVerdict, error) {
	return s.policy.Load().CheckImage(tenant, tool, ref)
}

// Reload loads the policy at path and makes it current. When the file does not load or validate, the
// current policy stays and the error names the file, line and field.
func (s *Store) Reload(path string) error {
	p, err := Load(path, s.opts...)
	if err != nil {
		return err
	}
	s.policy.Store(p)
	return nil
}

// Watch polls the policy file at path, and the tenant files the current policy names, every interval,
// and reloads when their content changes; it reports each reload's result (nil on success) to onResult.
// Changes are detected by content hash, so a Kubernetes ConfigMap update (a symlink swap) is seen, and a
// touch without a change is not. A file that cannot be read is reported once, not on every poll. Watch
// compares against the content the current policy was loaded from (so a change between Load and Watch
// is not missed; a policy from Parse is reloaded on the first poll), blocks until ctx is done and
// returns ctx.Err().
func (s *Store) Watch(ctx context.Context, path string, interval time.Duration, onResult func(error)) error {
	if interval <= 0 {
		return fmt.Errorf("watch policy %s: interval %v is not positive", path, interval)
	}
	var last [sha256.Size]byte
	if p := s.policy.Load(); p != nil && p.source == path {
		last = p.digest
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		fp := fingerprint(s.watched(path))
		if fp == last {
			continue
		}
		last = fp
		err := s.Reload(path)
		if onResult != nil {
			onResult(err)
		}
	}
}

// watched lists the files a reload of path reads: path itself and, when the current policy came from
// path, its tenant files.
func (s *Store) watched(path string) []string {
	files := []string{path}
	if p := s.policy.Load(); p != nil && p.source == path {
		files = append(files, p.sources[1:]...)
	}
	return files
}

// fingerprint hashes the content of files as they are now; a file that cannot be read contributes its
// error, so that an unreadable file is reported once, not on every poll.
func fingerprint(files []string) [sha256.Size]byte {
	d := newDigest()
	for _, f := range files {
		data, err := os.ReadFile(f)
		d.add(f, data, err)
	}
	return d.sum()
}

// digest hashes named file contents in a form that cannot be confused between files.
type digest struct{ h hash.Hash }

func newDigest() digest { return digest{sha256.New()} }

func (d digest) add(name string, data []byte, err error) {
	fmt.Fprintf(d.h, "%d:%s\x00", len(name), name)
	if err != nil {
		fmt.Fprintf(d.h, "error:%v\x00", err)
		return
	}
	fmt.Fprintf(d.h, "%d:", len(data))
	d.h.Write(data)
}

func (d digest) sum() [sha256.Size]byte {
	var out [sha256.Size]byte
	copy(out[:], d.h.Sum(nil))
	return out
}

// AddAllowRule records that tenant approved tool for always: for run_shell, commands starting with
// argvPrefix (the program's name without a directory, then literal words: ["npm", "test"]); for other
// tools, argvPrefix is empty and stands for every call. Adding a rule twice changes nothing.
func (s *Store) AddAllowRule(tenant, tool string, argvPrefix []string) error {
	r := AllowRule{Tenant: tenant, Tool: tool, ArgvPrefix: slices.Clone(argvPrefix)}
	if err := validateAllowRule(r); err != nil {
		return fmt.Errorf("add allow rule: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	cur := *s.rules.Load()
	for _, c := range cur {
		if c.Tenant == r.Tenant && c.Tool == r.Tool && slices.Equal(c.ArgvPrefix, r.ArgvPrefix) {
			return nil
		}
	}
	next := append(slices.Clone(cur), r)
	s.rules.Store(&next)
	return nil
}

// AllowRules returns a copy of the approve-always rules, for the caller to persist.
func (s *Store) AllowRules() []AllowRule {
	cur := *s.rules.Load()
	out := make([]AllowRule, len(cur))
	for i, r := range cur {
		out[i] = AllowRule{Tenant: r.Tenant, Tool: r.Tool, ArgvPrefix: slices.Clone(r.ArgvPrefix)}
	}
	return out
}

// SetAllowRules replaces the approve-always rules (to restore persisted ones). It validates every rule
// first and changes nothing when one is invalid.
func (s *Store) SetAllowRules(rules []AllowRule) error {
	next := make([]AllowRule, 0, len(rules))
	for i, r := range rules {
		if err := validateAllowRule(r); err != nil {
			return fmt.Errorf("set allow rules: rule %d: %w", i, err)
		}
		next = append(next, AllowRule{Tenant: r.Tenant, Tool: r.Tool, ArgvPrefix: slices.Clone(r.ArgvPrefix)})
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rules.Store(&next)
	return nil
}

func validateAllowRule(r AllowRule) error {
	if err := call.ValidateName("tenant", r.Tenant); err != nil {
		return err
	}
	if err := call.ValidateName("tool", r.Tool); err != nil {
		return err
	}
	if r.Tool == "run_shell" && len(r.ArgvPrefix) == 0 {
		return errors.New("approving run_shell always needs a command prefix such as [\"npm\", \"test\"]")
	}
	for i, w := range r.ArgvPrefix {
		switch {
		case w == "":
			return fmt.Errorf("word %d of the command prefix is empty", i)
		case strings.ContainsAny(w, " \t\n\x00"):
			return fmt.Errorf("word %d of the command prefix, %q, holds white space: give one word per element", i, w)
		case i == 0 && strings.Contains(w, "/"):
			return fmt.Errorf("name the program without a directory (%q, not %q)", shell.CommandBase(w), w)
		}
	}
	return nil
}
