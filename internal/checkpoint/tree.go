package checkpoint

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"unicode/utf8"
)

// Entry types of a tree.
const (
	typeFile    = "f"
	typeDir     = "d"
	typeSymlink = "l"
)

// entry is one name of a directory, as its tree object lists it.
type entry struct {
	Name   string   `json:"n"`
	Type   string   `json:"y"`
	Mode   uint32   `json:"m,omitempty"` // permission bits
	Size   int64    `json:"s,omitempty"`
	MTime  int64    `json:"t,omitempty"` // Unix nanoseconds
	Chunks []string `json:"c,omitempty"` // a file's
	// Pack and Off say where a packed file's bytes are: Size bytes at offset Off of the pack object
	// Pack (its digest). A packed file has exactly one chunk, the digest of its bytes, which Restore
	// checks; it has no chunk object of its own.
	Pack   string `json:"p,omitempty"`
	Off    int64  `json:"o,omitempty"`
	Tree   string `json:"r,omitempty"` // a directory's
	Target string `json:"l,omitempty"` // a symlink's
	// RawName and RawTarget hold a name or target that is not valid UTF-8 (which JSON would not keep),
	// in place of Name and Target.
	RawName   []byte `json:"bn,omitempty"`
	RawTarget []byte `json:"bl,omitempty"`
}

// wire returns e as encoded: a name or target that is not UTF-8 moved to its raw field.
func (e entry) wire() entry {
	if !utf8.ValidString(e.Name) {
		e.RawName, e.Name = []byte(e.Name), ""
	}
	if !utf8.ValidString(e.Target) {
		e.RawTarget, e.Target = []byte(e.Target), ""
	}
	return e
}

// unwire undoes wire.
func (e entry) unwire() entry {
	if e.RawName != nil {
		e.Name, e.RawName = string(e.RawName), nil
	}
	if e.RawTarget != nil {
		e.Target, e.RawTarget = string(e.RawTarget), nil
	}
	return e
}

// encodeTree returns a directory's tree object (its entries sorted by name) and its digest.
func encodeTree(entries []entry) ([]byte, string) {
	sort.Slice(entries, func(i, j int) bool { return entries[i].Name < entries[j].Name })
	w := make([]entry, len(entries))
	for i, e := range entries {
		w[i] = e.wire()
	}
	b, _ := json.Marshal(w) // plain strings and numbers: never fails
	sum := sha256.Sum256(b)
	return b, hex.EncodeToString(sum[:])
}

// emptyTree is the digest of a directory with no entries.
var _, emptyTree = encodeTree(nil)

// readObject reads the whole object name, at most limit bytes, and checks that its SHA-256 is digest.
func readObject(ctx context.Context, s Store, name, digest string, limit int64) ([]byte, error) {
	rc, err := s.Open(ctx, name)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, limit+1))
	if err != nil {
		return nil, fmt.Errorf("read object %s: %w", name, err)
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("read object %s: larger than %d bytes", name, limit)
	}
	if sum := sha256.Sum256(b); hex.EncodeToString(sum[:]) != digest {
		return nil, fmt.Errorf("read object %s: its content does not match its digest (corrupt store)", name)
	}
	return b, nil
}

// maxTreeBytes bounds a tree object read back: a directory of a million entries.
const maxTreeBytes = 512 << 20

// getTree reads and checks the tree object of digest.
func (c *Checkpointer) getTree(ctx context.Context, tenant, digest string) ([]entry, error) {
	if digest == emptyTree {
		return nil, nil
	}
	b, err := readObject(ctx, c.store, treeName(tenant, digest), digest, maxTreeBytes)
	if err != nil {
		return nil, fmt.Errorf("read tree: %w", err)
	}
	var entries []entry
	if err := json.Unmarshal(b, &entries); err != nil {
		return nil, fmt.Errorf("read tree %s: %w", digest, err)
	}
	seen := make(map[string]bool, len(entries))
	for i, e := range entries {
		e = e.unwire()
		entries[i] = e
		if err := checkEntry(e); err != nil {
			return nil, fmt.Errorf("read tree %s: %w", digest, err)
		}
		if seen[e.Name] {
			return nil, fmt.Errorf("read tree %s: names %q twice", digest, e.Name)
		}
		seen[e.Name] = true
	}
	return entries, nil
}

// checkEntry refuses an entry that could not have been saved: a name that is not one path component,
// an unknown type, a digest that is not one.
func checkEntry(e entry) error {
	if e.Name == "" || e.Name == "." || e.Name == ".." || strings.ContainsAny(e.Name, "/\x00") {
		return fmt.Errorf("bad entry name %q", e.Name)
	}
	switch e.Type {
	case typeFile:
		for _, d := range e.Chunks {
			if !isDigest(d) {
				return fmt.Errorf("entry %q: bad chunk digest %q", e.Name, d)
			}
		}
		if e.Pack != "" && (!isDigest(e.Pack) || len(e.Chunks) != 1 || e.Off < 0 || e.Size <= 0 || e.Off+e.Size > MaxPackBytes) {
			return fmt.Errorf("entry %q: bad pack reference (pack %q, offset %d, size %d, %d chunks)", e.Name, e.Pack, e.Off, e.Size, len(e.Chunks))
		}
	case typeDir:
		if !isDigest(e.Tree) {
			return fmt.Errorf("entry %q: bad tree digest %q", e.Name, e.Tree)
		}
	case typeSymlink:
		if e.Target == "" || strings.Contains(e.Target, "\x00") {
			return fmt.Errorf("entry %q: bad symlink target", e.Name)
		}
	default:
		return fmt.Errorf("entry %q: unknown type %q", e.Name, e.Type)
	}
	return nil
}

func isDigest(s string) bool {
	if len(s) != 64 {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}

// putObject stores b under name unless this worker wrote it within half the grace (a tree is small: it
// is written again rather than looked up).
func (c *Checkpointer) putObject(ctx context.Context, name string, b []byte) error {
	if c.isFresh(name) {
		return nil
	}
	before := c.cfg.Now()
	if err := c.store.Put(ctx, name, bytes.NewReader(b)); err != nil {
		return fmt.Errorf("store %s: %w", name, err)
	}
	c.learn(name, before)
	return nil
}

// readHead reads the workspace's head and its revision in Heads; ok is false when it has none. A
// workspace whose head Heads does not have may have one an earlier version stored as an object: it is
// read at revision 0, so that the next Save moves it into Heads.
func (c *Checkpointer) readHead(ctx context.Context, tenant, name string) (h Head, rev uint64, ok bool, err error) {
	b, rev, err := c.heads.GetHead(ctx, tenant, name)
	if err != nil {
		return Head{}, 0, false, fmt.Errorf("read checkpoint head of %s/%s: %w", tenant, name, err)
	}
	if b == nil {
		rc, err := c.store.Open(ctx, headName(tenant, name))
		if errors.Is(err, os.ErrNotExist) {
			return Head{}, 0, false, nil
		}
		if err != nil {
			return Head{}, 0, false, fmt.Errorf("read checkpoint head of %s/%s: %w", tenant, name, err)
		}
		defer rc.Close()
		if b, err = io.ReadAll(io.LimitReader(rc, 1<<20)); err != nil {
			return Head{}, 0, false, fmt.Errorf("read checkpoint head of %s/%s: %w", tenant, name, err)
		}
	}
	if err := json.Unmarshal(b, &h); err != nil {
		return Head{}, 0, false, fmt.Errorf("read checkpoint head of %s/%s: %w", tenant, name, err)
	}
	if !isDigest(h.Tree) {
		return Head{}, 0, false, fmt.Errorf("read checkpoint head of %s/%s: bad tree digest %q", tenant, name, h.Tree)
	}
	return h, rev, true, nil
}
