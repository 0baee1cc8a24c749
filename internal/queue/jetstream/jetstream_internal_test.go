package jetstream

import (
	"slices"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
)

// TestLaneOrder: an idle worker fetches first from the lanes whose bell rang, in rotation order from its
// turn, then from the others; a lane's bell is forgotten once the lane is tried.
func TestLaneOrder(t *testing.T) {
	f := &laneFetcher{consumers: make([]jetstream.Consumer, 6), rung: make([]bool, 6), turn: 4}
	if got := f.order(); !slices.Equal(got, []int{4, 5, 0, 1, 2, 3}) {
		t.Fatalf("no bell: %v, want the rotation from lane 4", got)
	}
	f.ring(2)
	f.ring(5)
	f.ring(99) // a lane this worker does not know: ignored
	if got := f.order(); !slices.Equal(got, []int{5, 2, 4, 0, 1, 3}) {
		t.Fatalf("bells on 2 and 5: %v, want 5 and 2 first (rotation from 4), then the rest", got)
	}
	f.tried(5)
	if got := f.order(); !slices.Equal(got, []int{2, 4, 5, 0, 1, 3}) {
		t.Fatalf("after trying 5: %v, want only 2's bell left", got)
	}
}
