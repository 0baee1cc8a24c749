// Package checkpoint keeps tenants' workspaces in object storage, so that a workspace lives on without a
// filesystem shared between workers: Save writes what changed in a workspace since its last checkpoint,
// Restore brings a worker's copy of a workspace to its latest checkpoint, whichever worker wrote it.
//
// Checkpoints are content-addressed and incremental. A file is cut into chunks of Config.ChunkBytes, each
// stored once per tenant under the SHA-256 of its bytes (so the chunks of a tenant's workspaces are
// shared); a small file (under Config.PackFilesUnder) that a Save finds new is instead written with the
// Save's other new small files into a pack object of up to PackBytes, stored under the SHA-256 of the
// pack, and its tree entry says where its bytes are (pack, offset, size) beside their digest: a Save of
// many small files stores a few objects rather than one per file, and a file that did not change keeps
// its entry, packed or not. A directory is a tree object listing its entries (name, type, mode, size, modification time,
// and a file's chunks, a symlink's target or a subdirectory's tree), stored under the SHA-256 of its
// encoding; the workspace's head names its root tree. Saving a one-file change reads that one file and
// writes its new chunks, the trees on its path to the root and the head; the rest of the tree is known by
// its files' stat (inode, size, modification and change times, mode) since the last Save or Restore.
// Restore skips every subtree whose digest the local copy already has, and rewrites only the files whose
// chunks differ.
//
// Object names, per tenant: <tenant>/chunks/<sha256>, <tenant>/packs/<sha256>, <tenant>/trees/<sha256>. The head of each workspace
// is in Heads, written only by compare-and-set on the revision the copy was restored or last saved at: a
// worker whose copy is older than the latest checkpoint (its hold on the workspace lapsed while another
// worker wrote) gets ErrStale and never replaces it. (Heads written by an earlier version, as the object
// <tenant>/heads/<workspace>, are read when Heads has none.)
//
// Only regular files, directories and symlinks are kept (FIFOs, sockets and devices are left out);
// permission bits are kept, and files' modification times; owners are not (everything restored is the sandbox
// user's). Every path inside a workspace is resolved beneath it without following a symlink
// (openat2 RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS), and every object read is checked against its digest.
package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Store is the object storage checkpoints live in: an object is written whole under a name and read
// whole. Implementations: the JetStream object store (internal/queue/jetstream, the default) and an
// S3-compatible bucket (internal/checkpoint/s3). Safe for concurrent use.
type Store interface {
	// Put stores what r yields under name, replacing any object of that name.
	Put(ctx context.Context, name string, r io.Reader) error
	// Open returns a reader of the object name, which the caller closes; an error wrapping
	// os.ErrNotExist when there is none.
	Open(ctx context.Context, name string) (io.ReadCloser, error)
	// Has reports whether there is an object name.
	Has(ctx context.Context, name string) (bool, error)
	// Stat returns the object name's size and when it was last written (Put), by the store's clock; ok
	// is false when there is none.
	Stat(ctx context.Context, name string) (size int64, modified time.Time, ok bool, err error)
	// List calls fn with the name, size and time of last write of every object whose name begins with
	// prefix, in no set order; an error of fn stops the listing and is returned.
	List(ctx context.Context, prefix string, fn func(name string, size int64, modified time.Time) error) error
	// Delete removes the object name; one that is not there is not an error.
	Delete(ctx context.Context, name string) error
}

// Heads holds each workspace's head. Implementation: a JetStream key-value bucket
// (internal/queue/jetstream), whichever Store holds the chunks and trees. Safe for concurrent use.
type Heads interface {
	// GetHead returns tenant's workspace's head and its revision; nil and 0 when it has none.
	GetHead(ctx context.Context, tenant, name string) ([]byte, uint64, error)
	// SwapHead stores value as the head if it is still at revision rev (0: none) and returns the new
	// revision; swapped is false, and nothing is written, when it moved on since rev.
	SwapHead(ctx context.Context, tenant, name string, value []byte, rev uint64) (newRev uint64, swapped bool, err error)
	// TenantHeads returns every head of tenant's workspaces, by workspace name (never a snapshot), and the
	// tenant's usage (name ".usage", which SwapHead and GetHead write and read like a head).
	TenantHeads(ctx context.Context, tenant string) (map[string][]byte, error)
	// CreateSnapshot stores value as snapshot snap of tenant's workspace name; created is false, and
	// nothing is written, when the workspace has a snapshot of that name.
	CreateSnapshot(ctx context.Context, tenant, name, snap string, value []byte) (created bool, err error)
	// Snapshots returns every snapshot of tenant's workspaces, by workspace and snapshot name.
	Snapshots(ctx context.Context, tenant string) (map[string]map[string][]byte, error)
	// DeleteSnapshots removes every snapshot of tenant's workspace name.
	DeleteSnapshots(ctx context.Context, tenant, name string) error
	// Tenants returns every tenant that has a head, each once.
	Tenants(ctx context.Context) ([]string, error)
}

// ErrStale reports a Save refused because another worker checkpointed the workspace since this worker's
// copy was restored or last saved: the copy's changes are not kept, and the next Restore makes the copy
// the latest checkpoint.
var ErrStale = errors.New("another worker checkpointed the workspace since this copy was restored")

// ErrOverBudget reports a Save refused because the workspace holds more bytes than Config.MaxWorkspaceBytes,
// or would take its tenant past Config.MaxTenantBytes: nothing was stored, and the copy's changes wait
// on this worker for a Save under the budget.
var ErrOverBudget = errors.New("over the checkpoint budget")

// Config configures a Checkpointer.
type Config struct {
	// Dir holds every tenant's workspaces, as Dir/<tenant>/<workspace> (the worker's workspaces directory).
	Dir string
	// UID and GID own everything Restore writes, when this process is root.
	UID, GID int
	// Worker names this worker in the heads it writes.
	Worker string
	// ChunkBytes is the size of the pieces files are cut into; default DefaultChunkBytes.
	ChunkBytes int
	// Parallel is how many files are read and stored, or fetched and written, at once; default
	// DefaultParallel.
	Parallel int
	// Now is the clock of the heads' timestamps; default time.Now.
	Now func() time.Time
	// MaxWorkspaceBytes is the checkpoint budget of one workspace: the most bytes its files may hold for
	// Save to checkpoint it (ErrOverBudget beyond, with nothing stored); 0: no budget.
	MaxWorkspaceBytes int64
	// MaxTenantBytes is the checkpoint budget of a tenant: the most bytes the latest checkpoints of all
	// its workspaces may hold together; 0: no budget. Strict under concurrent saves: each reserves its
	// workspace's bytes in the tenant's usage (in Heads, by compare-and-set) before its head moves.
	MaxTenantBytes int64
	// Grace is how long an object no head names is kept (Collect): a Save in progress stores its chunks
	// and trees before its head. A Save trusts an object it did not write only when it was written within
	// Grace/2 (else it writes it again), so Grace/2 must exceed the longest Save and the skew between the
	// clocks of the store and of Now. Default DefaultGrace; a worker's config allows no less than
	// MinGrace (tests use seconds). Every worker of a pool should have the same.
	Grace time.Duration
	// PackFilesUnder: a file a Save reads whose bytes are fewer than this (and than ChunkBytes and
	// PackBytes), and which the workspace's previous checkpoint does not already hold, is written into a
	// pack object with the other such files of the Save rather than as a chunk object of its own; default
	// DefaultPackFilesUnder; negative: never (every file its own chunks, as before packs).
	PackFilesUnder int64
	// Observe, if set, is called after every Save (op "save") and Restore (op "restore") with its result,
	// how long it took and its error: the worker's metrics.
	Observe func(op string, r Result, took time.Duration, err error)
}

// Defaults and bounds of Config.
const (
	DefaultChunkBytes = 4 << 20
	DefaultParallel   = 16
	// MinChunkBytes and MaxChunkBytes bound ChunkBytes; Restore reads chunks of up to MaxChunkBytes,
	// whatever the ChunkBytes of the worker that wrote them.
	MinChunkBytes = 64 << 10
	MaxChunkBytes = 64 << 20
	// DefaultPackFilesUnder is Config.PackFilesUnder's default.
	DefaultPackFilesUnder = 256 << 10
	// PackBytes is how many bytes a pack object holds before it is sealed and stored (it holds fewer
	// when a Save's small files are fewer); MaxPackBytes bounds a pack Restore reads, whatever the
	// PackBytes of the worker that wrote it.
	PackBytes    = 4 << 20
	MaxPackBytes = 16 << 20
)

// Head is a workspace's latest checkpoint.
type Head struct {
	// Tree is the digest of the workspace's root tree.
	Tree string `json:"tree"`
	// Seq counts the checkpoints of the workspace, as the worker that wrote this one knew them.
	Seq uint64 `json:"seq"`
	// Deleted is set when the workspace was deleted: a worker that holds a copy removes it.
	Deleted bool `json:"deleted,omitempty"`
	// Worker wrote it, At (a snapshot's: when it was taken).
	Worker string    `json:"worker"`
	At     time.Time `json:"at"`
	// Files and Bytes count the workspace's regular files and their bytes.
	Files int   `json:"files"`
	Bytes int64 `json:"bytes"`
	// Created is when the workspace was first checkpointed (zero in heads of earlier versions).
	Created time.Time `json:"created,omitzero"`
	// Image is the workspace's default image ("" for none) when ImageKept; heads of earlier versions, and
	// of workspaces whose image was never recorded (SetImage), do not keep one. Every Save carries it on.
	Image     string `json:"image,omitempty"`
	ImageKept bool   `json:"image_kept,omitempty"`
}

// Result says what a Save or a Restore did.
type Result struct {
	// Changed is false when the workspace was already at its latest checkpoint: nothing was written.
	Changed bool
	// Moved is set by a Restore that brought this worker's copy to a checkpoint another worker wrote: the
	// workspace moved to this worker (a re-home).
	Moved bool
	// Head is the workspace's latest checkpoint after the Save or Restore (zero when it has none).
	Head Head
	// Files is how many files were read and stored (Save) or fetched and written (Restore).
	Files int
	// Chunks and Bytes are how many objects of data (chunks and packs) and bytes travelled to or from the
	// store.
	Chunks int
	Bytes  int64
	// Took is how long it took.
	Took time.Duration
}

// Checkpointer saves workspaces to a Store and restores them from it. Safe for concurrent use: the Saves
// and Restores of one workspace are serialized.
type Checkpointer struct {
	cfg   Config
	store Store
	heads Heads
	chown bool

	mu sync.Mutex
	ws map[string]*wsState // by tenant/workspace
	// known holds objects known to be in the store, with when they were last written (at the latest).
	known map[string]time.Time
}

// wsState is what this worker knows of its copy of a workspace.
type wsState struct {
	// unsavedSince is when a Save of this copy first failed since the last that succeeded (Unix
	// nanoseconds; zero: none failed): the copy holds changes no checkpoint has.
	unsavedSince atomic.Int64

	mu sync.Mutex
	// head is the checkpoint the local copy was at after the last Save or Restore (zero: none known), and
	// headRev its revision in Heads (0: none there), which the next Save's compare-and-set expects.
	head    Head
	headRev uint64
	// files are the local copy's files as of then, by slash-separated path: their stat and chunks.
	files map[string]fileState
	// dirs are its directories' entries and tree digests as of then, by path: a directory whose entries
	// are the same again keeps its digest without being encoded again.
	dirs map[string]dirState
}

// dirState is a directory as last saved or restored: its entries, sorted by name, and its tree digest.
type dirState struct {
	entries []entry
	digest  string
}

// fileState is a file as last read or written: its stat, and its content's chunks.
type fileState struct {
	sig    statSig
	chunks []string
	// pack and off locate a packed file's bytes (entry.Pack, entry.Off); pack is "" for a file of chunk
	// objects.
	pack string
	off  int64
}

// statSig identifies a file's content without reading it: it changes whenever the content may have.
type statSig struct {
	ino          uint64
	size         int64
	mtime, ctime int64
	mode         uint32
}

// New returns a Checkpointer of the workspaces under cfg.Dir, keeping them in store, their heads in heads.
func New(cfg Config, store Store, heads Heads) (*Checkpointer, error) {
	if cfg.Dir == "" || !filepath.IsAbs(cfg.Dir) {
		return nil, fmt.Errorf("new checkpointer: workspaces dir %q must be an absolute path", cfg.Dir)
	}
	if store == nil {
		return nil, errors.New("new checkpointer: no object store")
	}
	if heads == nil {
		return nil, errors.New("new checkpointer: no heads store")
	}
	if cfg.ChunkBytes <= 0 {
		cfg.ChunkBytes = DefaultChunkBytes
	}
	cfg.ChunkBytes = min(max(cfg.ChunkBytes, MinChunkBytes), MaxChunkBytes)
	if cfg.Parallel <= 0 {
		cfg.Parallel = DefaultParallel
	}
	if cfg.PackFilesUnder == 0 {
		cfg.PackFilesUnder = DefaultPackFilesUnder
	}
	cfg.PackFilesUnder = min(cfg.PackFilesUnder, int64(cfg.ChunkBytes), PackBytes)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Grace < 0 {
		return nil, fmt.Errorf("new checkpointer: grace %s is negative", cfg.Grace)
	}
	if cfg.Grace == 0 {
		cfg.Grace = DefaultGrace
	}
	return &Checkpointer{cfg: cfg, store: store, heads: heads, chown: os.Geteuid() == 0, ws: map[string]*wsState{}, known: map[string]time.Time{}}, nil
}

// state returns the workspace's state, locked; the caller unlocks it.
func (c *Checkpointer) state(tenant, name string) *wsState {
	c.mu.Lock()
	st, ok := c.ws[tenant+"/"+name]
	if !ok {
		st = &wsState{}
		c.ws[tenant+"/"+name] = st
	}
	c.mu.Unlock()
	st.mu.Lock()
	return st
}

// OldestUnsaved returns how long ago the oldest change that no checkpoint holds was left by a failed Save
// (zero when every Save since the last failure of each workspace succeeded).
func (c *Checkpointer) OldestUnsaved() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	var oldest int64
	for _, st := range c.ws {
		if t := st.unsavedSince.Load(); t != 0 && (oldest == 0 || t < oldest) {
			oldest = t
		}
	}
	if oldest == 0 {
		return 0
	}
	return c.cfg.Now().Sub(time.Unix(0, oldest))
}

// Workspace names one tenant's workspace.
type Workspace struct{ Tenant, Name string }

// Unsaved returns the workspaces whose last Save failed: their copies hold changes no checkpoint has. A
// worker saves them again from time to time, and once more when it stops, so that the changes reach
// object storage without waiting for another call.
func (c *Checkpointer) Unsaved() []Workspace {
	c.mu.Lock()
	defer c.mu.Unlock()
	var ws []Workspace
	for k, st := range c.ws {
		if st.unsavedSince.Load() != 0 {
			tenant, name, _ := strings.Cut(k, "/")
			ws = append(ws, Workspace{Tenant: tenant, Name: name})
		}
	}
	return ws
}

// isFresh reports whether object name is known to be in the store and to have been written within half
// the grace: a Save may name it without writing it (Collect never sweeps it before the Save's head is
// written).
func (c *Checkpointer) isFresh(name string) bool {
	c.mu.Lock()
	t, ok := c.known[name]
	c.mu.Unlock()
	return ok && c.cfg.Now().Sub(t) < c.cfg.Grace/2
}

// learn notes that object name is in the store, last written at modified.
func (c *Checkpointer) learn(name string, modified time.Time) {
	c.mu.Lock()
	if modified.After(c.known[name]) {
		c.known[name] = modified
	}
	c.mu.Unlock()
}

// forget drops what is known of object name: Collect is deleting it.
func (c *Checkpointer) forget(name string) {
	c.mu.Lock()
	delete(c.known, name)
	c.mu.Unlock()
}

func chunkName(tenant, digest string) string { return tenant + "/chunks/" + digest }
func treeName(tenant, digest string) string  { return tenant + "/trees/" + digest }
func packName(tenant, digest string) string  { return tenant + "/packs/" + digest }
func headName(tenant, name string) string    { return tenant + "/heads/" + name }
