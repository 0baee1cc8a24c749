package policy

import (
	_ "embed"
	"slices"
	"sync"
)

//go:embed default.yaml
var defaultYAML []byte

// defaultPolicy parses the embedded default once; it is immutable like every Policy.
var defaultPolicy = sync.OnceValue(func() *Policy {
	p, err := Parse(defaultYAML, "default.yaml")
	if err != nil {
		panic("the embedded default policy does not parse: " + err.Error()) // caught by TestDefaultParses
	}
	return p
})

// Default returns the shipped default policy (default.yaml, embedded). The same immutable Policy is
// returned on every call.
func Default() *Policy { return defaultPolicy() }

// DefaultYAML returns a copy of the shipped default policy file, to print, edit and load with Load.
func DefaultYAML() []byte { return slices.Clone(defaultYAML) }
