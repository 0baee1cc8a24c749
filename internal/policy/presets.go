package policy

import (
	"fmt"
	"slices"
	"strings"
)

// egressPresets are named domain lists for common needs, which a tool layer names in egress_presets instead
// of spelling out the hosts. Each is the set of hosts the usual client reaches with its default
// configuration; a redirect elsewhere (a mirror, a CDN) needs that host allowed too.
var egressPresets = map[string][]string{
	// The Go module proxy and checksum database (GOPROXY and GOSUMDB defaults).
	"go": {"proxy.golang.org", "sum.golang.org"},
	// The npm registry: metadata and tarballs.
	"npm": {"registry.npmjs.org"},
	// The Python Package Index: the simple index and the files it links to.
	"pypi": {"pypi.org", "files.pythonhosted.org"},
	// crates.io: the sparse index, the API and the crate downloads.
	"crates": {"crates.io", "index.crates.io", "static.crates.io"},
	// Debian's archive and security updates (apt; plain http on port 80 by default).
	"debian": {"deb.debian.org", "security.debian.org"},
	// GitHub: git over https, the API, archives, release assets and raw files.
	"github": {"github.com", "api.github.com", "codeload.github.com", "objects.githubusercontent.com", "raw.githubusercontent.com"},
}

// EgressPresets returns the names of the egress presets, sorted.
func EgressPresets() []string {
	names := make([]string, 0, len(egressPresets))
	for n := range egressPresets {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// presetDomains returns the domains of the named preset.
func presetDomains(name string) ([]string, error) {
	d, ok := egressPresets[strings.ToLower(name)]
	if !ok {
		return nil, fmt.Errorf("%q is not an egress preset: use one of %s, or list the hosts in allowed_domains", name, strings.Join(EgressPresets(), ", "))
	}
	return d, nil
}
