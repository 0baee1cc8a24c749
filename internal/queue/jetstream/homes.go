package jetstream

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/toolpool/toolpool/internal/queue"
)

// Homes is the workspaces' homes (queue.Homes). A home is a lease like a running call's, in the same
// leases bucket and judged the same way on the server's clock, under the key home.<tenant>.<workspace>
// (each base64url-encoded, so that any name makes a valid key and none collides with a call id). Safe for
// concurrent use; it lives as long as its Conn.
type Homes struct {
	leases *Leases
}

var _ queue.Homes = (*Homes)(nil)

// Homes is the workspaces' homes.
func (c *Conn) Homes() *Homes { return &Homes{leases: c.leases} }

// homeKey is the leases bucket's key of a workspace's home.
func homeKey(tenant, workspace string) string {
	return "home." + token(tenant) + "." + token(workspace)
}

// AcquireHome takes the home of tenant's workspace for holder for ttl. queue.ErrExists: another
// acquisition holds it.
func (h *Homes) AcquireHome(ctx context.Context, tenant, workspace, holder string, ttl time.Duration) (queue.Lease, error) {
	if strings.ContainsAny(holder, " \t\n") || holder == "" {
		return nil, fmt.Errorf("acquire home of workspace %s/%s: holder %q must be one word", tenant, workspace, holder)
	}
	l, err := h.leases.AcquireLease(ctx, homeKey(tenant, workspace), holder, ttl)
	if err != nil {
		return nil, fmt.Errorf("acquire home of workspace %s/%s: %w", tenant, workspace, err)
	}
	return l, nil
}

// HomeOf returns the holder of tenant's workspace's home, "" when nobody holds it (released, lapsed on
// the server's clock, or never taken). It reads from the stream's leader.
func (h *Homes) HomeOf(ctx context.Context, tenant, workspace string) (string, error) {
	e, err := h.leases.current(ctx, homeKey(tenant, workspace))
	if err != nil || e == nil {
		return "", wrapErr(err, "read home of workspace %s/%s", tenant, workspace)
	}
	holder, _, _ := strings.Cut(string(e.Value()), " ")
	return holder, nil
}
