package egress

import (
	"fmt"
	"slices"
	"testing"

	"github.com/toolpool/toolpool/internal/call"
)

func TestIntersect(t *testing.T) {
	tests := []struct {
		name string
		in   []Rules
		want Rules
	}{
		{"nothing", nil, Rules{}},
		{"nil lists narrow nothing", []Rules{{DenyDomains: []string{"*.internal"}}, {}}, Rules{DenyDomains: []string{"*.internal"}}},
		{"one allowlist", []Rules{{}, {AllowDomains: []string{"Go.Dev."}}}, Rules{AllowDomains: []string{"go.dev"}}},
		{"wildcard keeps the names it covers", []Rules{{AllowDomains: []string{"*.github.com", "pypi.org"}}, {AllowDomains: []string{"api.github.com", "npmjs.org"}}},
			Rules{AllowDomains: []string{"api.github.com"}}},
		{"narrower wildcard survives", []Rules{{AllowDomains: []string{"*.example.com"}}, {AllowDomains: []string{"*.api.example.com", "example.com"}}},
			Rules{AllowDomains: []string{"*.api.example.com"}}},
		{"disjoint allowlists allow nothing", []Rules{{AllowDomains: []string{"a.test"}}, {AllowDomains: []string{"b.test"}}},
			Rules{AllowDomains: []string{}}},
		{"an empty allowlist allows nothing", []Rules{{AllowDomains: []string{"a.test"}}, {AllowDomains: []string{}}},
			Rules{AllowDomains: []string{}}},
		{"deny lists add up", []Rules{{DenyDomains: []string{"a.test"}}, {DenyDomains: []string{"b.test", "a.test"}}},
			Rules{DenyDomains: []string{"a.test", "b.test"}}},
		{"ports intersect", []Rules{{AllowPorts: []int{80, 443}}, {}, {AllowPorts: []int{443, 8443}}}, Rules{AllowPorts: []int{443}}},
		{"disjoint ports allow none", []Rules{{AllowPorts: []int{80}}, {AllowPorts: []int{443}}}, Rules{AllowPorts: []int{}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Intersect(tt.in...)
			if fmt.Sprintf("%#v", got) != fmt.Sprintf("%#v", tt.want) {
				t.Errorf("Intersect = %#v, want %#v", got, tt.want)
			}
		})
	}
}

func TestCheckHost(t *testing.T) {
	r := Intersect(Rules{AllowDomains: []string{"*.corp.test", "go.dev"}, DenyDomains: []string{"secret.corp.test"}, AllowPorts: []int{443}})
	tests := []struct {
		host string
		port int
		want string // the rule, "" when allowed
	}{
		{"git.corp.test", 443, ""},
		{"go.dev", 443, ""},
		{"go.dev", 80, RulePortNotAllowed},
		{"corp.test", 443, RuleDomainNotAllowed},
		{"evil.test", 443, RuleDomainNotAllowed},
		{"secret.corp.test", 443, RuleDomainDenied},
		{"localhost", 443, RuleBlockedName},
		{"x.localhost", 443, RuleBlockedName},
		{"", 443, RuleBadRequest},
	}
	for _, tt := range tests {
		got := ""
		if e := r.checkHost(tt.host, tt.port); e != nil {
			got = e.Rule
		}
		if got != tt.want {
			t.Errorf("checkHost(%q, %d) = %q, want %q", tt.host, tt.port, got, tt.want)
		}
	}
	if e := (Rules{AllowDomains: []string{}}).checkHost("a.test", 443); e == nil || e.Reason != "it is not among the allowed domains (none)" {
		t.Errorf("empty allowlist: %v", e)
	}
}

func TestLog(t *testing.T) {
	var l Log
	l.record(call.EgressConn{Host: "a.test", Port: 443, Decision: call.EgressAllowed, BytesUp: 10, BytesDown: 100})
	l.record(call.EgressConn{Host: "a.test", Port: 443, Decision: call.EgressAllowed, BytesUp: 5, BytesDown: 50, Connections: 99})
	l.record(call.EgressConn{Host: "a.test", Port: 443, Decision: call.EgressAllowed, Credential: "c"})
	l.record(call.EgressConn{Host: "b.test", Port: 443, Decision: call.EgressRefused, Rule: RuleDomainNotAllowed, Reason: "no"})
	got := l.Entries()
	want := []call.EgressConn{
		{Host: "a.test", Port: 443, Decision: call.EgressAllowed, Connections: 2, BytesUp: 15, BytesDown: 150},
		{Host: "a.test", Port: 443, Decision: call.EgressAllowed, Credential: "c", Connections: 1},
		{Host: "b.test", Port: 443, Decision: call.EgressRefused, Rule: RuleDomainNotAllowed, Reason: "no", Connections: 1},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("Entries = %+v, want %+v", got, want)
	}

	var many Log
	for i := range maxLogEntries + 10 {
		many.record(call.EgressConn{Host: fmt.Sprintf("h%d.test", i), Port: 443, Decision: call.EgressAllowed, BytesDown: 1})
	}
	entries := many.Entries()
	last := entries[len(entries)-1]
	if len(entries) != maxLogEntries+1 || last.Host != "*" || last.Connections != 10 || last.BytesDown != 10 {
		t.Fatalf("overflow: %d entries, last %+v", len(entries), last)
	}
}
