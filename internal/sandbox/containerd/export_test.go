package containerd

import (
	"context"
	"time"
)

// MeasurePool measures the pool's memory now (the pool does every few ticks), for a benchmark that reads
// PoolStats right after a short run.
func (r *Runtime) MeasurePool() { r.pool.measure() }

// RuncVersion and RuncTooOld let the external tests compare Runtime.Warnings with the version check itself.
var (
	RuncVersion = runcVersion
	RuncTooOld  = runcTooOld
)

// CrunTooOld reports whether the crun at binary is older than MinCrunVersion (or names no version).
func CrunTooOld(ctx context.Context, binary string) bool {
	return !crunVersion(ctx, binary).atLeast(minCrun.major, minCrun.minor)
}

// SetPoolOwnerStale shortens PoolOwnerStale for a test, until the returned func restores it.
func SetPoolOwnerStale(d time.Duration) (restore func()) {
	old := poolOwnerStale
	poolOwnerStale = d
	return func() { poolOwnerStale = old }
}
