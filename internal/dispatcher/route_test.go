package dispatcher

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/call"
)

// fakeResidence answers from maps and counts its reads.
type fakeResidence struct {
	resident      map[string]string // tenant/workspace -> worker
	alive         map[string]bool
	err           error
	hang          bool
	reads, alives int
}

func (f *fakeResidence) ResidentOf(ctx context.Context, tenant, workspace string) (string, error) {
	f.reads++
	if f.hang {
		<-ctx.Done() // a read NATS does not answer (a leader election)
		return "", ctx.Err()
	}
	return f.resident[tenant+"/"+workspace], f.err
}

func (f *fakeResidence) Alive(ctx context.Context, worker string) (bool, error) {
	f.alives++
	return f.alive[worker], nil
}

// fakeRoutedQueue notes where each call went: "" for the shared lanes.
type fakeRoutedQueue struct{ to map[string]string }

func (q *fakeRoutedQueue) Publish(ctx context.Context, c *call.Call) error {
	q.to[c.ID] = ""
	return nil
}

func (q *fakeRoutedQueue) PublishTo(ctx context.Context, c *call.Call, worker string) error {
	q.to[c.ID] = worker
	return nil
}

// TestHomeRouter: a call naming a workspace goes to its resident while the resident is alive; a call
// naming none, a workspace without a resident, one whose resident is gone, and a failed read go to the
// shared lanes. A worker's presence is read at most once per presenceCacheFor.
func TestHomeRouter(t *testing.T) {
	res := &fakeResidence{
		resident: map[string]string{"acme/repo": "worker-a", "acme/old": "worker-gone", "other/repo": "worker-b"},
		alive:    map[string]bool{"worker-a": true, "worker-b": true},
	}
	q := &fakeRoutedQueue{to: map[string]string{}}
	r := NewHomeRouter(q, res)
	now := time.Unix(1000, 0)
	r.now = func() time.Time { return now }
	ctx := context.Background()
	publish := func(id, tenant, workspace string) string {
		t.Helper()
		if err := r.Publish(ctx, &call.Call{ID: id, Tenant: tenant, Workspace: workspace}); err != nil {
			t.Fatal(err)
		}
		return q.to[id]
	}

	if to := publish("c1", "acme", ""); to != "" || res.reads != 0 {
		t.Fatalf("a call naming no workspace went to %q after %d reads; want the shared lanes, no read", to, res.reads)
	}
	if to := publish("c2", "acme", "repo"); to != "worker-a" {
		t.Fatalf("a call of a workspace with a live resident went to %q; want worker-a", to)
	}
	if to := publish("c3", "other", "repo"); to != "worker-b" {
		t.Fatalf("the same workspace name of another tenant went to %q; want worker-b", to)
	}
	if to := publish("c4", "acme", "new"); to != "" {
		t.Fatalf("a call of a workspace without a resident went to %q; want the shared lanes", to)
	}
	if to := publish("c5", "acme", "old"); to != "" {
		t.Fatalf("a call of a workspace whose resident is gone went to %q; want the shared lanes", to)
	}

	// Presence is cached: worker-a dies, and calls go to it until the cache expires.
	alives := res.alives
	res.alive["worker-a"] = false
	if to := publish("c6", "acme", "repo"); to != "worker-a" || res.alives != alives {
		t.Fatalf("within the cache: went to %q after %d presence reads; want worker-a and none", to, res.alives-alives)
	}
	now = now.Add(presenceCacheFor)
	if to := publish("c7", "acme", "repo"); to != "" {
		t.Fatalf("after the cache expired: went to %q; want the shared lanes (worker-a is gone)", to)
	}

	res.err = errors.New("nats: timeout")
	if to := publish("c8", "other", "repo"); to != "" {
		t.Fatalf("a failed read went to %q; want the shared lanes", to)
	}
	res.err, res.hang = nil, true
	start := time.Now()
	if to := publish("c9", "other", "repo"); to != "" || time.Since(start) > 3*routeReadTimeout {
		t.Fatalf("a read that hangs: went to %q after %s; want the shared lanes after %s", to, time.Since(start), routeReadTimeout)
	}
	if routed, shared := r.Counts(); routed != 3 || shared != 6 {
		t.Fatalf("Counts = %d routed, %d shared; want 3 and 6", routed, shared)
	}
}
