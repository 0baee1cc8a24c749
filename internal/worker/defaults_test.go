package worker

import (
	"os"
	"testing"
	"time"
)

// TestConfigDefaults pins what New fills into a zero Config field: the lease is three heartbeats and at
// least MinLease (cmd/worker's default too), an explicit lease is kept, and every other default is its
// named constant.
func TestConfigDefaults(t *testing.T) {
	for _, tc := range []struct {
		heartbeat, lease, want time.Duration
	}{
		{heartbeat: 5 * time.Second, want: 15 * time.Second},
		{heartbeat: 100 * time.Millisecond, want: time.Second}, // three heartbeats are below the server's 1s
		{heartbeat: 400 * time.Millisecond, want: 1200 * time.Millisecond},
		{heartbeat: 100 * time.Millisecond, lease: 500 * time.Millisecond, want: 500 * time.Millisecond},
	} {
		got := Config{Heartbeat: tc.heartbeat, Lease: tc.lease}.withDefaults().Lease
		if got != tc.want {
			t.Errorf("heartbeat %s lease %s: lease %s, want %s", tc.heartbeat, tc.lease, got, tc.want)
		}
		if tc.lease == 0 && DefaultLease(tc.heartbeat) != tc.want {
			t.Errorf("DefaultLease(%s) = %s, want %s", tc.heartbeat, DefaultLease(tc.heartbeat), tc.want)
		}
	}
	c := Config{Heartbeat: DefaultHeartbeat}.withDefaults()
	if c.RetryDelay != time.Second || c.InlineBytes != 64<<10 || c.CaptureBytes != 1<<20 || c.FullOutputBytes != 64<<20 ||
		c.SpoolDir != os.TempDir() || c.Now == nil || c.Lease != 15*time.Second {
		t.Errorf("defaults: %+v", c)
	}
	if c := (Config{FullOutputBytes: -1}).withDefaults(); c.FullOutputBytes != -1 {
		t.Errorf("a negative FullOutputBytes (keep none) became %d", c.FullOutputBytes)
	}
}
