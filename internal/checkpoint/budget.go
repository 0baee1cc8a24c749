// Budgets: a tenant's checkpoint bytes are reserved by compare-and-set on one usage key per tenant before
// any head moves, so that saves running at once on several workers never take the tenant past its budget.

package checkpoint

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
)

// usageName is the Heads name of a tenant's usage: a name no workspace can have (names never begin with
// "."). It is no workspace's head: tenantHeads leaves it out.
const usageName = ".usage"

// usage is a tenant's checkpoint bytes, by workspace: each workspace's latest checkpoint, or what a save,
// fork or restore in progress reserved for it.
type usage struct {
	Bytes map[string]int64 `json:"bytes"`
}

// maxReserveTries bounds the compare-and-set retries of one reservation (each lost to another save of
// the tenant that moved the usage meanwhile).
const maxReserveTries = 100

// reserve checks that workspace name of tenant may be checkpointed with total bytes of files (under the
// workspace's budget and, with the tenant's other workspaces, under the tenant's) and, with a tenant's
// budget, records total as the workspace's bytes in the tenant's usage, by compare-and-set: of saves
// running at once, each counts what the others reserved, so together they never pass the budget. undo
// (nil when nothing was recorded) gives the reservation back when the head is not written after all. A
// workspace of 0 bytes (deleted, or emptied) is never refused, and frees what it held.
func (c *Checkpointer) reserve(ctx context.Context, tenant, name string, total int64) (undo func(), err error) {
	if max := c.cfg.MaxWorkspaceBytes; max > 0 && total > max {
		return nil, fmt.Errorf("%w of a workspace: its files hold %d bytes, %d over the budget of %d (checkpoints.max_workspace_bytes): remove files from it",
			ErrOverBudget, total, total-max, max)
	}
	max := c.cfg.MaxTenantBytes
	if max <= 0 {
		return nil, nil
	}
	for range maxReserveTries {
		u, rev, err := c.readUsage(ctx, tenant)
		if err != nil {
			return nil, fmt.Errorf("count the checkpoints of tenant %s against its budget: %w", tenant, err)
		}
		prev, had := u.Bytes[name]
		if prev == total {
			return nil, nil // as recorded already
		}
		var others int64
		for ws, b := range u.Bytes {
			if ws != name {
				others += b
			}
		}
		if total > 0 && others+total > max {
			return nil, fmt.Errorf("%w of tenant %s: its workspaces' checkpoints would hold %d bytes (this one %d, the others %d), %d over the budget of %d (checkpoints.max_tenant_bytes): remove files or workspaces",
				ErrOverBudget, tenant, others+total, total, others, others+total-max, max)
		}
		set(u.Bytes, name, total)
		swapped, err := c.writeUsage(ctx, tenant, u, rev)
		if err != nil {
			return nil, fmt.Errorf("reserve checkpoint bytes of tenant %s: %w", tenant, err)
		}
		if swapped {
			return func() { c.unreserve(tenant, name, total, prev, had) }, nil
		}
	}
	return nil, fmt.Errorf("reserve checkpoint bytes of tenant %s: %d other checkpoints of the tenant moved its usage meanwhile: try again", tenant, maxReserveTries)
}

// unreserve gives back a reservation of total bytes for workspace name whose head was not written: the
// workspace counts prev again (nothing, when !had). A reservation replaced since (another worker's save
// of the workspace) is left as it is. It runs on a fresh bounded context; should it fail, the workspace
// counts total until its next save, which records its bytes again.
func (c *Checkpointer) unreserve(tenant, name string, total, prev int64, had bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for range maxReserveTries {
		u, rev, err := c.readUsage(ctx, tenant)
		if err != nil || u.Bytes[name] != total {
			return
		}
		if had {
			u.Bytes[name] = prev
		} else {
			delete(u.Bytes, name)
		}
		if swapped, err := c.writeUsage(ctx, tenant, u, rev); err != nil || swapped {
			return
		}
	}
}

// set records bytes as ws's, or drops ws at 0.
func set(m map[string]int64, ws string, bytes int64) {
	if bytes == 0 {
		delete(m, ws)
		return
	}
	m[ws] = bytes
}

// readUsage returns tenant's usage and its revision; a tenant that has none yet (its first save under a
// budget, or heads of an earlier version) starts from its workspaces' heads, at revision 0.
func (c *Checkpointer) readUsage(ctx context.Context, tenant string) (usage, uint64, error) {
	b, rev, err := c.heads.GetHead(ctx, tenant, usageName)
	if err != nil {
		return usage{}, 0, err
	}
	u := usage{Bytes: map[string]int64{}}
	if b != nil {
		if err := json.Unmarshal(b, &u); err != nil {
			return usage{}, 0, fmt.Errorf("read the usage of tenant %s: %w", tenant, err)
		}
		if u.Bytes == nil {
			u.Bytes = map[string]int64{}
		}
		return u, rev, nil
	}
	heads, err := c.tenantHeads(ctx, tenant)
	if err != nil {
		return usage{}, 0, err
	}
	for ws, hb := range heads {
		var h Head
		if json.Unmarshal(hb, &h) == nil && !h.Deleted {
			set(u.Bytes, ws, h.Bytes)
		}
	}
	return u, 0, nil
}

// writeUsage stores u as tenant's usage if it is still at revision rev.
func (c *Checkpointer) writeUsage(ctx context.Context, tenant string, u usage, rev uint64) (bool, error) {
	b, _ := json.Marshal(u)
	_, swapped, err := c.heads.SwapHead(ctx, tenant, usageName, b, rev)
	return swapped, err
}

// tenantHeads is Heads.TenantHeads without the tenant's usage.
func (c *Checkpointer) tenantHeads(ctx context.Context, tenant string) (map[string][]byte, error) {
	heads, err := c.heads.TenantHeads(ctx, tenant)
	delete(heads, usageName)
	return heads, err
}
