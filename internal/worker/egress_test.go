package worker

import (
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"

	"github.com/toolpool/toolpool/internal/tools/egress"
)

// TestEgressRules: the worker's base allowlist, policy's and the call's intersect; none of them can
// widen another.
func TestEgressRules(t *testing.T) {
	tests := []struct {
		name     string
		base     []string
		lists    [][]string
		want     []string
		wantNone bool
	}{
		{name: "no lists", base: nil, want: nil},
		{name: "base only", base: []string{"*.example.com"}, lists: [][]string{nil}, want: []string{"*.example.com"}},
		{name: "policy only", base: nil, lists: [][]string{{"docs.python.org"}}, want: []string{"docs.python.org"}},
		{name: "policy cannot widen the base", base: []string{"*.example.com"}, lists: [][]string{{"docs.example.com", "evil.com"}},
			want: []string{"docs.example.com"}},
		{name: "base narrower than policy", base: []string{"a.example.com"}, lists: [][]string{{"*.example.com"}}, want: []string{"a.example.com"}},
		{name: "wildcards narrow", base: []string{"*.x.com"}, lists: [][]string{{"*.a.x.com"}}, want: []string{"*.a.x.com"}},
		{name: "three lists", base: []string{"*.com"}, lists: [][]string{{"a.com", "b.com"}, {"b.com", "c.org"}}, want: []string{"b.com"}},
		{name: "policy allows no domain", base: []string{"a.com"}, lists: [][]string{{}}, want: []string{}, wantNone: true},
		{name: "nothing in common", base: []string{"a.com"}, lists: [][]string{{"b.com"}}, want: []string{}, wantNone: true},
		{name: "case and trailing dot", base: []string{"Example.COM."}, lists: [][]string{{"example.com"}}, want: []string{"example.com"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			base := egress.Rules{AllowDomains: tt.base, DenyDomains: []string{"*.internal"}, AllowPorts: []int{443}}
			got := egressRules(base, tt.lists...)
			if !slices.Equal(got.AllowDomains, tt.want) || got.AllowNone != tt.wantNone {
				t.Errorf("allow %q none %v, want %q none %v", got.AllowDomains, got.AllowNone, tt.want, tt.wantNone)
			}
			if !slices.Equal(got.DenyDomains, base.DenyDomains) || !slices.Equal(got.AllowPorts, base.AllowPorts) {
				t.Errorf("deny %v ports %v changed", got.DenyDomains, got.AllowPorts)
			}
		})
	}
}

// TestEgressAllowNone: rules that leave no domain refuse every destination.
func TestEgressAllowNone(t *testing.T) {
	p, err := egress.New(egressRules(egress.Rules{AllowDomains: []string{"a.com"}}, []string{"b.com"}))
	if err != nil {
		t.Fatal(err)
	}
	req := httptest.NewRequest(http.MethodGet, "http://a.com/", nil)
	rec := httptest.NewRecorder()
	p.ServeHTTP(rec, req)
	if rec.Code != http.StatusForbidden || rec.Header().Get(egress.RefusedHeader) == "" {
		t.Errorf("status %d, refused %q; want 403 with a reason", rec.Code, rec.Header().Get(egress.RefusedHeader))
	}
}
