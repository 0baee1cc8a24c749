package containerd

import (
	"strings"
	"testing"
)

// TestAckFilter: the init's acknowledgement is taken off the head of standard error however the writes
// split it, and anything else at the head is passed on whole.
func TestAckFilter(t *testing.T) {
	const ack = "toolpool-init[abc]: request taken\n"
	for _, tt := range []struct {
		name   string
		writes []string
		want   string
		taken  bool
	}{
		{"alone", []string{ack}, "", true},
		{"with the program's output", []string{ack + "oops\n"}, "oops\n", true},
		{"split", []string{ack[:5], ack[5:20], ack[20:] + "x", "y"}, "xy", true},
		{"absent", []string{"toolpool-init: read request: EOF\n"}, "toolpool-init: read request: EOF\n", false},
		{"a partial match then other bytes", []string{ack[:10], "zz"}, ack[:10] + "zz", false},
		{"nothing written", nil, "", false},
		{"only later", []string{"a", ack}, "a" + ack, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var b strings.Builder
			f := &ackFilter{ack: []byte(ack), next: &b}
			for _, w := range tt.writes {
				if n, err := f.Write([]byte(w)); n != len(w) || err != nil {
					t.Fatalf("Write(%q) = %d, %v", w, n, err)
				}
			}
			if b.String() != tt.want || f.taken() != tt.taken {
				t.Fatalf("passed %q (want %q), taken %v (want %v)", b.String(), tt.want, f.taken(), tt.taken)
			}
		})
	}
}
