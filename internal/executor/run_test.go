package executor

import (
	"fmt"
	"testing"

	"github.com/toolpool/toolpool/internal/tools"
)

// TestMayRunOverQuota: in a workspace over its quota only calls that cannot add data may run: the read,
// search, delete, execute and fetch kinds of built-in tools. A custom tool never may.
func TestMayRunOverQuota(t *testing.T) {
	want := map[tools.Kind]bool{
		tools.KindRead: true, tools.KindSearch: true, tools.KindDelete: true, tools.KindExecute: true, tools.KindFetch: true,
		tools.KindEdit: false, tools.KindMove: false, tools.KindOther: false,
	}
	for _, kind := range tools.Kinds {
		w, ok := want[kind]
		if !ok {
			t.Errorf("kind %s has no expectation here: decide whether it may run over quota", kind)
		}
		for _, custom := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/custom=%v", kind, custom), func(t *testing.T) {
				if got := mayRunOverQuota(&tools.Tool{Name: "x", Kind: kind, Custom: custom}); got != (w && !custom) {
					t.Errorf("mayRunOverQuota = %v, want %v", got, w && !custom)
				}
			})
		}
	}
}
