package egress

import (
	"errors"
	"fmt"
	"net/netip"
)

type blockedRange struct {
	prefix netip.Prefix
	what   string
}

// blockedRanges are the non-public address ranges, most specific first.
var blockedRanges = func() []blockedRange {
	var out []blockedRange
	for _, r := range []struct{ cidr, what string }{
		{"169.254.169.254/32", "a cloud metadata address"},
		{"169.254.170.2/32", "a cloud metadata address"},
		{"100.100.100.200/32", "a cloud metadata address"},
		{"fd00:ec2::254/128", "a cloud metadata address"},
		{"0.0.0.0/8", "an unspecified (this network) address"},
		{"10.0.0.0/8", "a private address"},
		{"100.64.0.0/10", "a carrier-grade NAT address"},
		{"127.0.0.0/8", "a loopback address"},
		{"169.254.0.0/16", "a link-local address"},
		{"172.16.0.0/12", "a private address"},
		{"192.0.0.0/24", "a reserved (IETF protocol) address"},
		{"192.0.2.0/24", "a documentation address"},
		{"192.88.99.0/24", "a reserved (6to4 relay) address"},
		{"192.168.0.0/16", "a private address"},
		{"198.18.0.0/15", "a reserved (benchmarking) address"},
		{"198.51.100.0/24", "a documentation address"},
		{"203.0.113.0/24", "a documentation address"},
		{"224.0.0.0/4", "a multicast address"},
		{"240.0.0.0/4", "a reserved or broadcast address"},
		{"::/128", "an unspecified address"},
		{"::1/128", "a loopback address"},
		{"::/96", "a reserved (IPv4-compatible) address"},
		{"64:ff9b:1::/48", "a local NAT64 address"},
		{"100::/64", "a discard-only address"},
		{"2001::/32", "a Teredo tunnel address"},
		{"2001:db8::/32", "a documentation address"},
		{"fc00::/7", "a private (unique local) address"},
		{"fe80::/10", "a link-local address"},
		{"fec0::/10", "a site-local address"},
		{"ff00::/8", "a multicast address"},
	} {
		out = append(out, blockedRange{netip.MustParsePrefix(r.cidr), r.what})
	}
	return out
}()

var (
	nat64     = netip.MustParsePrefix("64:ff9b::/96")
	sixToFour = netip.MustParsePrefix("2002::/16")
)

// CheckAddr returns an error saying what kind of address a is when it is not a public unicast address.
func CheckAddr(a netip.Addr) error {
	if !a.IsValid() {
		return errors.New("an invalid address")
	}
	a = a.WithZone("").Unmap()
	for _, r := range blockedRanges {
		if r.prefix.Contains(a) {
			return errors.New(r.what)
		}
	}
	// IPv6 forms that embed an IPv4 address reach that address: check it.
	if nat64.Contains(a) || sixToFour.Contains(a) {
		b := a.As16()
		var v4 [4]byte
		if nat64.Contains(a) {
			copy(v4[:], b[12:16])
		} else {
			copy(v4[:], b[2:6])
		}
		if err := CheckAddr(netip.AddrFrom4(v4)); err != nil {
			return fmt.Errorf("an IPv6 address embedding %s, %w", netip.AddrFrom4(v4), err)
		}
	}
	return nil
}
