// Removal: Delete, and Sweep, which expires workspaces left idle.

package workspace

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/toolpool/toolpool/internal/call"
)

// Delete removes workspace name with its snapshots. It waits for running calls in it to end.
func (m *Manager) Delete(ctx context.Context, tenant, name string) error {
	if err := checkNames(tenant, name); err != nil {
		return err
	}
	l, err := m.lockWorkspace(ctx, tenant, name, true)
	if err != nil {
		return err
	}
	defer l.release()
	if ok, err := m.exists(tenant, name); err != nil || !ok {
		if err == nil {
			err = notFound(name)
		}
		l.remove()
		return err
	}
	return m.remove(tenant, name, l)
}

// remove deletes a workspace whose lock l is held exclusively: the tree is moved to the trash first, so
// that it vanishes from its name at once.
func (m *Manager) remove(tenant, name string, l *lock) error {
	var b [8]byte
	rand.Read(b[:])
	trash := filepath.Join(m.trashDir(tenant), "rm-"+hex.EncodeToString(b[:]))
	if err := os.Rename(m.wsDir(tenant, name), trash); err != nil {
		return fmt.Errorf("delete workspace %s: %w", name, err)
	}
	if err := os.RemoveAll(trash); err != nil {
		return fmt.Errorf("delete workspace %s: %w", name, err)
	}
	if err := os.RemoveAll(m.snapDir(tenant, name)); err != nil {
		return fmt.Errorf("delete snapshots of %s: %w", name, err)
	}
	os.Remove(m.metaPath(tenant, name))
	l.remove()
	return nil
}

// Sweep removes every workspace unused for longer than IdleTTL (by its lock's modification time, or the
// directory's when it has never been locked) and returns their tenant/name. A workspace in use (its
// lock held) is left for the next sweep. It does nothing when IdleTTL is zero.
func (m *Manager) Sweep(ctx context.Context) ([]string, error) {
	if m.cfg.IdleTTL == 0 {
		return nil, nil
	}
	tenants, err := os.ReadDir(m.cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("list tenants: %w", err)
	}
	var removed []string
	for _, t := range tenants {
		if !t.IsDir() || call.ValidateTenant(t.Name()) != nil {
			continue
		}
		names, err := m.names(t.Name())
		if err != nil {
			continue
		}
		for _, n := range names {
			if ctx.Err() != nil {
				return removed, ctx.Err()
			}
			if !m.idle(t.Name(), n) {
				continue
			}
			if err := m.prepareTenant(t.Name()); err != nil {
				return removed, err
			}
			l, ok, err := tryAcquire(m.lockPath(t.Name(), n))
			if err != nil || !ok {
				continue // in use now
			}
			if m.idle(t.Name(), n) { // still, now that nobody else can use it
				if err := m.remove(t.Name(), n, l); err == nil {
					removed = append(removed, t.Name()+"/"+n)
				}
			}
			l.release()
		}
	}
	slices.Sort(removed)
	return removed, nil
}

// idle reports whether workspace name was last used more than IdleTTL ago.
func (m *Manager) idle(tenant, name string) bool {
	st, err := os.Lstat(m.lockPath(tenant, name))
	if err != nil {
		if st, err = os.Lstat(m.wsDir(tenant, name)); err != nil {
			return false
		}
	}
	return m.cfg.Now().Sub(st.ModTime()) > m.cfg.IdleTTL
}
