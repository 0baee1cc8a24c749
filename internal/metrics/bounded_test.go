package metrics

import (
	"strings"
	"testing"
)

func TestBounded(t *testing.T) {
	for _, tc := range []struct {
		name string
		max  int
		in   []string
		want []string
	}{
		{"under the cap", 3, []string{"a", "b", "a"}, []string{"a", "b", "a"}},
		{"past the cap", 2, []string{"a", "b", "c", "a", "d"}, []string{"a", "b", Overflow, "a", Overflow}},
		{"empty", 2, []string{""}, []string{"unknown"}},
		{"invalid utf-8 takes no slot", 1, []string{"\xff", "a"}, []string{Overflow, "a"}},
		{"too long takes no slot", 1, []string{strings.Repeat("x", maxLabelLen+1), "a"}, []string{Overflow, "a"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBounded(tc.max)
			for i, v := range tc.in {
				if got := b.value(v); got != tc.want[i] {
					t.Errorf("value(%q) #%d = %q, want %q", v, i, got, tc.want[i])
				}
			}
		})
	}
}

func TestOneOf(t *testing.T) {
	known := map[string]bool{"ok": true}
	for _, tc := range []struct{ in, want string }{{"ok", "ok"}, {"", "none"}, {"weird", Overflow}} {
		if got := oneOf(tc.in, "none", known); got != tc.want {
			t.Errorf("oneOf(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestValidTraceID(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"4bf92f3577b34da6a3ce929d0e0e4736", "4bf92f3577b34da6a3ce929d0e0e4736"},
		{"00000000000000000000000000000000", ""},
		{"4BF92F3577B34DA6A3CE929D0E0E4736", ""},
		{"short", ""},
		{"", ""},
	} {
		if got := validTraceID(tc.in); got != tc.want {
			t.Errorf("validTraceID(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
