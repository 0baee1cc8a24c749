// Garbage collection: a tenant's chunks, packs and trees that no head names any more (a deleted workspace's, a
// file's old versions) are removed by a mark and sweep that is safe while Saves run.

package checkpoint

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
)

// DefaultGrace is Config.Grace's default.
const DefaultGrace = time.Hour

// MinGrace is the least grace a worker's config allows: a Save trusts an object it did not write for half the grace,
// and must write its head within that half (a worker bounds a Save to ten minutes), clocks' skew included.
const MinGrace = 30 * time.Minute

// Collected says what a Collect did.
type Collected struct {
	// Heads counts the heads marked from: workspaces (not deleted) and snapshots.
	Heads int
	// Kept and KeptBytes count the objects a head names.
	Kept      int
	KeptBytes int64
	// Young counts the objects no head names that were written within the grace: a Save may be about to
	// name them. They are swept by a later Collect.
	Young int
	// Swept and SweptBytes count the objects removed.
	Swept      int
	SweptBytes int64
	// Took is how long it took.
	Took time.Duration
}

// Collect removes tenant's chunks, packs and trees that no head names and that were last written longer ago
// than Config.Grace. It marks every object reachable from the tenant's heads (every workspace's that is
// not deleted, every snapshot's, and those of an earlier version's head objects), then lists the tenant's
// chunks, packs and trees and deletes the others. A pack is kept whole while a head names any file in it.
//
// It is safe while Saves run, on this worker or others: a Save writes its chunks, packs and trees before its
// head, and trusts an object it did not write only when the store says it was written within half the
// grace (putChunk, putObject), so every object a head written after the mark names is younger than the
// grace. A Restore of a head that a Save replaced meanwhile may find an object swept: it follows the
// head to the checkpoint that replaced it. Collects of one tenant may run at once (deleting twice is
// harmless); the worker runs one at a time per tenant under a lease, to spare the store.
//
// A head that does not decode, or a tree it names that is missing or corrupt, stops the Collect before
// anything is deleted: garbage is never judged from a store it cannot read whole.
func (c *Checkpointer) Collect(ctx context.Context, tenant string) (res Collected, err error) {
	start := time.Now()
	defer func() { res.Took = time.Since(start) }()
	if tenant == "" || strings.Contains(tenant, "/") {
		return res, fmt.Errorf("collect checkpoints: tenant %q is not a tenant's name", tenant)
	}
	// Objects written after this are never swept: with the grace, this covers every Save whose head the
	// mark below cannot see.
	cutoff := c.cfg.Now().Add(-c.cfg.Grace)
	live, heads, err := c.mark(ctx, tenant)
	if err != nil {
		return res, fmt.Errorf("collect checkpoints of tenant %s: %w", tenant, err)
	}
	res.Heads = heads
	for _, kind := range []string{"chunks", "packs", "trees"} {
		prefix := tenant + "/" + kind + "/"
		var dead []string
		var deadBytes []int64
		err := c.store.List(ctx, prefix, func(name string, size int64, modified time.Time) error {
			switch _, named := live[name]; {
			case named:
				res.Kept++
				res.KeptBytes += size
			case !modified.Before(cutoff):
				res.Young++
			default:
				dead, deadBytes = append(dead, name), append(deadBytes, size)
			}
			return nil
		})
		if err != nil {
			return res, fmt.Errorf("collect checkpoints of tenant %s: %w", tenant, err)
		}
		for i, name := range dead {
			c.forget(name)
			if err := c.store.Delete(ctx, name); err != nil {
				return res, fmt.Errorf("collect checkpoints of tenant %s: %w", tenant, err)
			}
			res.Swept++
			res.SweptBytes += deadBytes[i]
		}
	}
	return res, nil
}

// CollectLock takes the right to collect tenant's garbage now; held is false when another worker has it
// (it collects the tenant, or did a moment ago). The worker's is a lease in NATS held for a whole period
// between collections (AcquireCollect in internal/queue/jetstream).
type CollectLock func(ctx context.Context, tenant string) (held bool, err error)

// CollectAll collects the garbage of every tenant that has a head, each under lock, and reports each
// tenant's Collect to observe (when not nil). A tenant whose lock another worker holds is left to it. It
// goes on past a tenant whose Collect fails and returns every failure joined.
func (c *Checkpointer) CollectAll(ctx context.Context, lock CollectLock, observe func(tenant string, r Collected, err error)) error {
	tenants, err := c.heads.Tenants(ctx)
	if err != nil {
		return fmt.Errorf("collect checkpoints: %w", err)
	}
	var errs []error
	for _, t := range tenants {
		held, err := lock(ctx, t)
		if err != nil {
			errs = append(errs, fmt.Errorf("collect checkpoints of tenant %s: %w", t, err))
			continue
		}
		if !held {
			continue
		}
		r, err := c.Collect(ctx, t)
		if observe != nil {
			observe(t, r, err)
		}
		if err != nil {
			errs = append(errs, err)
		}
		if ctx.Err() != nil {
			break
		}
	}
	return errors.Join(errs...)
}

// mark returns the names of every chunk, pack and tree reachable from tenant's heads, and how many heads it
// marked from.
func (c *Checkpointer) mark(ctx context.Context, tenant string) (map[string]struct{}, int, error) {
	roots := map[string]struct{}{}
	add := func(what string, b []byte) error {
		var h Head
		if err := json.Unmarshal(b, &h); err != nil || !isDigest(h.Tree) {
			return fmt.Errorf("read head %s: not a checkpoint head: collect nothing until it is fixed", what)
		}
		if !h.Deleted {
			roots[h.Tree] = struct{}{}
		}
		return nil
	}
	heads, err := c.tenantHeads(ctx, tenant)
	if err != nil {
		return nil, 0, err
	}
	n := 0
	for name, b := range heads {
		if err := add("of workspace "+name, b); err != nil {
			return nil, 0, err
		}
		n++
	}
	snaps, err := c.heads.Snapshots(ctx, tenant)
	if err != nil {
		return nil, 0, err
	}
	for ws, byName := range snaps {
		for snap, b := range byName {
			if err := add("of snapshot "+ws+"/"+snap, b); err != nil {
				return nil, 0, err
			}
			n++
		}
	}
	// Heads an earlier version stored as objects: a workspace not saved since still names its tree there.
	var old []string
	if err := c.store.List(ctx, tenant+"/heads/", func(name string, _ int64, _ time.Time) error {
		old = append(old, name)
		return nil
	}); err != nil {
		return nil, 0, err
	}
	for _, name := range old {
		rc, err := c.store.Open(ctx, name)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, 0, err
		}
		b, err := io.ReadAll(io.LimitReader(rc, 1<<20))
		rc.Close()
		if err != nil {
			return nil, 0, fmt.Errorf("read %s: %w", name, err)
		}
		if err := add(name, b); err != nil {
			return nil, 0, err
		}
		n++
	}
	live, err := c.reach(ctx, tenant, roots)
	return live, n, err
}

// reach walks the trees of roots, Parallel at a time, and returns the name of every tree, chunk and pack
// they reach (each tree read once however many heads share it).
func (c *Checkpointer) reach(ctx context.Context, tenant string, roots map[string]struct{}) (map[string]struct{}, error) {
	live := map[string]struct{}{}
	var mu sync.Mutex
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(c.cfg.Parallel)
	var visit func(digest string) error
	visit = func(digest string) error {
		name := treeName(tenant, digest)
		mu.Lock()
		_, seen := live[name]
		live[name] = struct{}{}
		mu.Unlock()
		if seen || digest == emptyTree {
			return nil
		}
		read := func() error {
			entries, err := c.getTree(gctx, tenant, digest)
			if err != nil {
				return err
			}
			mu.Lock()
			for _, e := range entries {
				if e.Pack != "" {
					// A pack is live, whole, while any live tree names any of its files.
					live[packName(tenant, e.Pack)] = struct{}{}
					continue
				}
				for _, d := range e.Chunks {
					live[chunkName(tenant, d)] = struct{}{}
				}
			}
			mu.Unlock()
			for _, e := range entries {
				if e.Type == typeDir {
					if err := visit(e.Tree); err != nil {
						return err
					}
				}
			}
			return nil
		}
		// A goroutine when one is free, else here: waiting for a slot from inside the group would
		// deadlock once every slot waits.
		if g.TryGo(read) {
			return nil
		}
		return read()
	}
	for d := range roots {
		if err := visit(d); err != nil {
			g.Wait()
			return nil, err
		}
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return live, nil
}
