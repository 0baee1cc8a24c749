package containerd

import "time"

// DefaultNamespace is the containerd namespace of toolpool's containers when the operator names none
// (cmd/worker's default; New refuses an empty Namespace).
const DefaultNamespace = "toolpool"

// Defaults of PoolConfig. The zero PoolConfig is no pool; with a positive MaxSize, the pool fills each
// zero field named here with its default.
const (
	// DefaultPoolMaxSize and DefaultPoolMemoryBytes are the warm pool cmd/worker runs unless told
	// otherwise (DefaultPoolConfig).
	DefaultPoolMaxSize     = 8
	DefaultPoolMemoryBytes = 256 << 20
	// DefaultPoolMaxAge is MaxAge's default.
	DefaultPoolMaxAge = 10 * time.Minute
	// DefaultPoolFillers is Fillers' default.
	DefaultPoolFillers = 2
	// DefaultPoolMaxProfiles is MaxProfiles' default.
	DefaultPoolMaxProfiles = 4
)

// DefaultPoolConfig returns the warm pool cmd/worker runs unless told otherwise: DefaultPoolMaxSize
// containers within DefaultPoolMemoryBytes, and the defaults of the other fields. InitBinary, InitPath
// and Mounts are the caller's.
func DefaultPoolConfig() PoolConfig {
	return PoolConfig{MaxSize: DefaultPoolMaxSize, MemoryBytes: DefaultPoolMemoryBytes}.withDefaults()
}

// withDefaults returns c with each zero field that has a default filled in.
func (c PoolConfig) withDefaults() PoolConfig {
	if c.MaxAge == 0 {
		c.MaxAge = DefaultPoolMaxAge
	}
	if c.Fillers == 0 {
		c.Fillers = DefaultPoolFillers
	}
	if c.MaxProfiles == 0 {
		c.MaxProfiles = DefaultPoolMaxProfiles
	}
	return c
}
