package call

import (
	"errors"
	"fmt"
	"testing"
)

// TestKinds checks that Kinds lists every Kind once, each with its own name, so that a transport's
// mapping test that walks Kinds sees a new Kind.
func TestKinds(t *testing.T) {
	seen := map[Kind]bool{}
	names := map[string]bool{}
	for _, k := range Kinds {
		if seen[k] || names[k.String()] || k.String() == "unclassed" {
			t.Errorf("kind %d (%s) is listed twice or has no name of its own", k, k)
		}
		seen[k], names[k.String()] = true, true
	}
	for k := Kind(1); k <= KindTimeout; k++ {
		if !seen[k] {
			t.Errorf("kind %d (%s) is not in Kinds", k, k)
		}
	}
	if Kind(0).String() != "unclassed" {
		t.Errorf("the zero Kind is %s", Kind(0))
	}
}

func TestRejection(t *testing.T) {
	err := fmt.Errorf("submit: %w", Reject(KindNotFound, ErrNotFound, "no call c_x"))
	var rej *Rejection
	if !errors.As(err, &rej) || rej.Kind != KindNotFound || rej.Error() != "not_found: no call c_x" {
		t.Fatalf("%v: %+v", err, rej)
	}
}
