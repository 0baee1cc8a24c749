package containerd

// MeasurePool measures the pool's memory now (the pool does every few ticks), for a benchmark that reads
// PoolStats right after a short run.
func (r *Runtime) MeasurePool() { r.measurePool() }

// RuncVersion and RuncTooOld let the external tests compare Runtime.Warnings with the version check itself.
var (
	RuncVersion = runcVersion
	RuncTooOld  = runcTooOld
	CrunVersion = crunVersion
)
