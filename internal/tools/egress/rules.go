package egress

import (
	"fmt"
	"slices"
	"strings"
)

// Rules says which destinations the proxy may reach on top of the address checks, which always apply.
type Rules struct {
	// AllowDomains, when not nil, lists the only hosts that may be reached: an exact name ("example.com")
	// or a suffix pattern ("*.example.com", which matches every subdomain of example.com but not
	// example.com itself). An IP address host must be listed exactly. An empty, non-nil list allows no host.
	AllowDomains []string `json:"allow_domains,omitempty" yaml:"allow_domains,omitempty"`
	// DenyDomains lists hosts that may never be reached, in the same syntax; it wins over AllowDomains.
	DenyDomains []string `json:"deny_domains,omitempty" yaml:"deny_domains,omitempty"`
	// AllowPorts, when not nil, lists the only destination ports allowed; an empty, non-nil list allows none.
	AllowPorts []int `json:"allow_ports,omitempty" yaml:"allow_ports,omitempty"`
}

// The rules by which the proxy refuses a destination (RefusedError.Rule) and the ways an allowed one can
// fail (FailedError.Rule): a closed set, so that metrics labelled with them stay bounded.
const (
	RuleDomainNotAllowed = "domain-not-allowed" // not on the allowlist
	RuleDomainDenied     = "domain-denied"      // on the operator's deny list
	RulePortNotAllowed   = "port-not-allowed"   // not among the allowed ports
	RuleBlockedName      = "blocked-name"       // localhost or a cloud metadata name
	RuleNonPublicAddress = "non-public-address" // a private, loopback, link-local, CGNAT, metadata or reserved address
	RuleBadRequest       = "bad-request"        // not a request the proxy serves (a relative URI, not TCP, no port)
	FailResolve          = "resolve-failed"     // the name does not resolve
	FailDial             = "dial-failed"        // no checked address answered
	FailUpstreamTLS      = "upstream-tls"       // a credential host's certificate did not verify
	FailUpstream         = "upstream-failed"    // anything else: the destination closed the connection, sent garbage
)

// RuleNames lists every value of RefusedError.Rule and FailedError.Rule.
var RuleNames = []string{RuleDomainNotAllowed, RuleDomainDenied, RulePortNotAllowed, RuleBlockedName,
	RuleNonPublicAddress, RuleBadRequest, FailResolve, FailDial, FailUpstreamTLS, FailUpstream}

// Validate checks the domain patterns and ports.
func (r Rules) Validate() error {
	for _, list := range [][]string{r.AllowDomains, r.DenyDomains} {
		for _, d := range list {
			name := strings.TrimPrefix(d, "*.")
			if name == "" || strings.ContainsAny(name, "*/:@ ") || strings.HasPrefix(name, ".") {
				return fmt.Errorf("check egress domain %q: write a host name (\"example.com\") or a suffix pattern (\"*.example.com\")", d)
			}
		}
	}
	for _, p := range r.AllowPorts {
		if p < 1 || p > 65535 {
			return fmt.Errorf("check egress port %d: it must be between 1 and 65535", p)
		}
	}
	return nil
}

// Intersect returns rules that allow a destination only when every one of rs allows it: the allowlists
// intersect by pattern (a nil list is no list; an empty one allows nothing, and so does an intersection
// that leaves nothing), the deny lists add up, and the port lists intersect. It is how the operator's base
// rules, the policy's and the call's combine: each can only narrow the others.
func Intersect(rs ...Rules) Rules {
	var out Rules
	for _, r := range rs {
		if r.AllowDomains != nil {
			list := normalizeDomains(r.AllowDomains)
			if out.AllowDomains == nil {
				out.AllowDomains = list
			} else {
				out.AllowDomains = intersectDomains(out.AllowDomains, list)
			}
		}
		for _, d := range normalizeDomains(r.DenyDomains) {
			if !slices.Contains(out.DenyDomains, d) {
				out.DenyDomains = append(out.DenyDomains, d)
			}
		}
		if r.AllowPorts != nil {
			if out.AllowPorts == nil {
				out.AllowPorts = slices.Clone(r.AllowPorts)
			} else {
				out.AllowPorts = slices.DeleteFunc(out.AllowPorts, func(p int) bool { return !slices.Contains(r.AllowPorts, p) })
			}
		}
	}
	return out
}

func normalizeDomains(list []string) []string {
	if list == nil {
		return nil
	}
	out := make([]string, 0, len(list))
	for _, d := range list {
		out = append(out, strings.ToLower(strings.TrimSuffix(d, ".")))
	}
	return out
}

// intersectDomains keeps the patterns of a that b covers and those of b that a covers: "api.x.com" of one
// list survives a "*.x.com" of the other, and so does "*.api.x.com".
func intersectDomains(a, b []string) []string {
	covers := func(list []string, p string) bool {
		if rest, ok := strings.CutPrefix(p, "*."); ok {
			return slices.ContainsFunc(list, func(l string) bool {
				return l == p || strings.HasPrefix(l, "*.") && strings.HasSuffix(rest, l[1:])
			})
		}
		return slices.ContainsFunc(list, func(l string) bool { return matchDomain(l, p) })
	}
	out := []string{}
	for _, list := range [][2][]string{{a, b}, {b, a}} {
		for _, p := range list[0] {
			if covers(list[1], p) && !slices.Contains(out, p) {
				out = append(out, p)
			}
		}
	}
	return out
}

// blockedNames are host names refused before any lookup: cloud metadata services and localhost.
var blockedNames = []string{
	"localhost", "*.localhost", "metadata.google.internal", "metadata.goog", "metadata", "instance-data",
	"instance-data.ec2.internal", "metadata.azure.com",
}

// matchDomain reports whether host matches pattern ("example.com" or "*.example.com").
func matchDomain(pattern, host string) bool {
	pattern = strings.ToLower(strings.TrimSuffix(pattern, "."))
	if suffix, ok := strings.CutPrefix(pattern, "*."); ok {
		return strings.HasSuffix(host, "."+suffix)
	}
	return host == pattern
}

// checkHost returns the rule that refuses host (lower case, no trailing dot) and port, or nil.
func (r Rules) checkHost(host string, port int) *RefusedError {
	if host == "" {
		return &RefusedError{Host: host, Rule: RuleBadRequest, Reason: "the host is empty"}
	}
	if r.AllowPorts != nil && !slices.Contains(r.AllowPorts, port) {
		allowed := "none"
		if len(r.AllowPorts) > 0 {
			allowed = fmt.Sprint(r.AllowPorts)
		}
		return &RefusedError{Host: host, Port: port, Rule: RulePortNotAllowed, Reason: fmt.Sprintf("port %d is not among the allowed ports (%s)", port, allowed)}
	}
	for _, pat := range blockedNames {
		if matchDomain(pat, host) {
			return &RefusedError{Host: host, Port: port, Rule: RuleBlockedName, Reason: "it is a local or cloud metadata name"}
		}
	}
	for _, pat := range r.DenyDomains {
		if matchDomain(pat, host) {
			return &RefusedError{Host: host, Port: port, Rule: RuleDomainDenied, Reason: fmt.Sprintf("it matches the denied domain %q", pat)}
		}
	}
	if r.AllowDomains != nil && !slices.ContainsFunc(r.AllowDomains, func(pat string) bool { return matchDomain(pat, host) }) {
		allowed := "none"
		if len(r.AllowDomains) > 0 {
			allowed = strings.Join(r.AllowDomains, ", ")
		}
		return &RefusedError{Host: host, Port: port, Rule: RuleDomainNotAllowed, Reason: fmt.Sprintf("it is not among the allowed domains (%s)", allowed)}
	}
	return nil
}
