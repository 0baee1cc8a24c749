package jetstream

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/toolpool/toolpool/internal/queue"
)

// Residents is where workspaces live and which workers are alive (queue.Residents), in the leases bucket:
// resident.<tenant>.<workspace> holds the resident worker's id (the bucket forgets it an hour after its
// last write), and worker.<id> a worker's presence, written like a lease ("<worker> <token> <ttl>") with
// a per-message TTL, so that the server removes it once the worker stops announcing itself, and a reader
// counts it gone by the server's clock even before. Names are base64url-encoded, as in homes. Safe for
// concurrent use; it lives as long as its Conn.
type Residents struct {
	leases *Leases
}

var _ queue.Residents = (*Residents)(nil)

// Residents is where workspaces live and which workers are alive.
func (c *Conn) Residents() *Residents { return &Residents{leases: c.leases} }

// token encodes a name as a key or subject token: base64url without padding, which makes every name a
// valid token and no two names the same.
func token(name string) string { return base64.RawURLEncoding.EncodeToString([]byte(name)) }

func residentKey(tenant, workspace string) string {
	return "resident." + token(tenant) + "." + token(workspace)
}

func presenceKey(worker string) string { return "worker." + token(worker) }

// SetResident records worker as tenant's workspace's resident.
func (r *Residents) SetResident(ctx context.Context, tenant, workspace, worker string) error {
	if worker == "" {
		return fmt.Errorf("set resident of workspace %s/%s: no worker named", tenant, workspace)
	}
	if _, err := r.leases.kv.Put(ctx, residentKey(tenant, workspace), []byte(worker)); err != nil {
		return fmt.Errorf("set resident of workspace %s/%s: %w", tenant, workspace, err)
	}
	return nil
}

// ResidentOf returns tenant's workspace's resident, "" when none is recorded. It reads from the stream's
// leader.
func (r *Residents) ResidentOf(ctx context.Context, tenant, workspace string) (string, error) {
	e, err := r.leases.current(ctx, residentKey(tenant, workspace))
	if err != nil || e == nil {
		return "", wrapErr(err, "read resident of workspace %s/%s", tenant, workspace)
	}
	return string(e.Value()), nil
}

// Alive reports whether worker announced itself within its presence TTL, on the server's clock, and did
// not withdraw since.
func (r *Residents) Alive(ctx context.Context, worker string) (bool, error) {
	e, err := r.leases.current(ctx, presenceKey(worker))
	return e != nil, wrapErr(err, "read presence of worker %s", worker)
}

// current reads key of the leases bucket from the stream's leader: nil when it has no value, or holds a
// lease (or presence) that lapsed on the server's clock.
func (s *Leases) current(ctx context.Context, key string) (jetstream.KeyValueEntry, error) {
	e, err := s.kv.Get(ctx, key)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted):
		return nil, nil
	case err != nil:
		return nil, err
	case s.lapsed(e):
		return nil, nil
	}
	return e, nil
}

// wrapErr wraps err as "<what>: err", nil when err is nil.
func wrapErr(err error, format string, args ...any) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf(format+": %w", append(args, err)...)
}

// announce writes worker's presence for ttl (at least a second), from now on the server's clock.
func (r *Residents) announce(ctx context.Context, worker string, ttl time.Duration) error {
	msg := nats.NewMsg("$KV." + r.leases.cfg.leaseBucket() + "." + presenceKey(worker))
	msg.Data = []byte(worker + " " + nuid.Next() + " " + strconv.FormatInt(int64(ttl), 10))
	if _, err := r.leases.js.PublishMsg(ctx, msg, jetstream.WithMsgTTL(ttl)); err != nil {
		return fmt.Errorf("announce worker %s: %w", worker, err)
	}
	return nil
}

// withdraw removes worker's presence: it stopped fetching calls.
func (r *Residents) withdraw(ctx context.Context, worker string) error {
	if err := r.leases.kv.Delete(ctx, presenceKey(worker)); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("withdraw worker %s: %w", worker, err)
	}
	return nil
}
