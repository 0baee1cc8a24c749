package jetstream

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// TestWhileClusterForms: a provision refused because a peer of a forming cluster is offline is tried
// again until it succeeds; a refusal that waiting cannot change (too few servers for the replicas, any
// other error) returns at once; and the wait is bounded.
func TestWhileClusterForms(t *testing.T) {
	offline := fmt.Errorf("create bucket b: %w", &jetstream.APIError{Code: 400, ErrorCode: 10005,
		Description: "no suitable peers for placement, peer offline"})
	tooFew := fmt.Errorf("create stream s: %w", &jetstream.APIError{Code: 400, ErrorCode: 10005,
		Description: "no suitable peers for placement"})
	other := errors.New("connection closed")
	// What a request gets while the cluster has no meta leader: no answer within the API timeout.
	noAnswer := fmt.Errorf("create consumer workers_lane1: %w", context.DeadlineExceeded)
	for _, tt := range []struct {
		name      string
		errs      []error // what each try returns; nil ends
		wait      time.Duration
		wantTries int
		want      error
	}{
		{"a peer comes online", []error{offline, offline, nil}, 30 * time.Second, 3, nil},
		{"a meta leader is elected", []error{noAnswer, noAnswer, nil}, 30 * time.Second, 3, nil},
		{"too few servers for the replicas", []error{tooFew, nil}, 30 * time.Second, 1, tooFew},
		{"another error", []error{other, nil}, 30 * time.Second, 1, other},
		{"the peer never comes", []error{offline, offline, offline, offline, offline, offline, offline, offline}, 500 * time.Millisecond, 3, offline},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tries := 0
			err := whileClusterForms(context.Background(), tt.wait, func() error {
				tries++
				return tt.errs[min(tries, len(tt.errs))-1]
			})
			if !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) || tries != tt.wantTries {
				t.Errorf("after %d tries: %v; want %d tries and %v", tries, err, tt.wantTries, tt.want)
			}
		})
	}
	t.Run("the caller's context ends", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		tries := 0
		err := whileClusterForms(ctx, 30*time.Second, func() error {
			tries++
			cancel()
			return noAnswer
		})
		if !errors.Is(err, context.DeadlineExceeded) || tries != 1 {
			t.Errorf("after %d tries: %v; want 1 try, the last error", tries, err)
		}
	})
}
