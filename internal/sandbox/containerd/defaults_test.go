package containerd

import (
	"testing"
	"time"
)

// TestPoolConfigDefaults pins the warm pool's defaults: the pool cmd/worker runs, and what a pool fills
// into the zero fields of its config (explicit values are kept).
func TestPoolConfigDefaults(t *testing.T) {
	want := PoolConfig{MaxSize: 8, MemoryBytes: 256 << 20, MaxAge: 10 * time.Minute, Fillers: 2, MaxProfiles: 4}
	if got := DefaultPoolConfig(); got.MaxSize != want.MaxSize || got.MemoryBytes != want.MemoryBytes || got.MaxAge != want.MaxAge ||
		got.Fillers != want.Fillers || got.MaxProfiles != want.MaxProfiles {
		t.Errorf("DefaultPoolConfig() = %+v, want %+v", got, want)
	}
	got := PoolConfig{MaxSize: 3, MaxAge: time.Minute}.withDefaults()
	if got.MaxSize != 3 || got.MemoryBytes != 0 || got.MaxAge != time.Minute || got.Fillers != 2 || got.MaxProfiles != 4 {
		t.Errorf("withDefaults kept or filled the wrong fields: %+v", got)
	}
}
