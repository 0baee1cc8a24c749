package containerd

import (
	"slices"
	"testing"
	"time"
)

// TestProfileTarget checks how a profile sizes itself from its claims: its busiest second of the last
// demandWindow seconds, at least one while used within idleAfter, none after.
func TestProfileTarget(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	tests := []struct {
		name   string
		claims []time.Duration // offsets from t0
		at     time.Duration
		want   int
	}{
		{name: "never used", at: 0, want: 0},
		{name: "one claim", claims: []time.Duration{0}, at: time.Second, want: 1},
		{name: "a burst of six in one second", claims: ms(0, 100, 200, 300, 400, 500), at: 2 * time.Second, want: 6},
		{name: "the burst is remembered within the window", claims: ms(0, 100, 200), at: 29 * time.Second, want: 3},
		{name: "the burst is forgotten after the window", claims: ms(0, 100, 200), at: 40 * time.Second, want: 1},
		{name: "steady two per second", claims: ms(0, 500, 1000, 1500, 2000, 2500), at: 3 * time.Second, want: 2},
		{name: "idle profile keeps none", claims: []time.Duration{0}, at: idleAfter + time.Second, want: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var p profile
			for _, c := range tt.claims {
				p.note(t0.Add(c))
			}
			if got := p.target(t0.Add(tt.at)); got != tt.want {
				t.Errorf("target %d, want %d", got, tt.want)
			}
		})
	}
}

func ms(v ...int) []time.Duration {
	var d []time.Duration
	for _, n := range v {
		d = append(d, time.Duration(n)*time.Millisecond)
	}
	return d
}

// TestPlanBudget checks that the pool never plans more ready containers than its memory budget holds,
// keeps the most recently used profiles first, and discards what is past MaxAge or beyond the target.
func TestPlanBudget(t *testing.T) {
	now := time.Now()
	p := &pool{cfg: PoolConfig{MaxSize: 10, MemoryBytes: 3 * defaultSlotBytes, MaxAge: time.Minute, Fillers: 8, MaxProfiles: 4},
		slotBytes: defaultSlotBytes, profiles: map[profileKey]*profile{}, discarded: map[string]uint64{}}
	busy, quiet := &profile{key: profileKey{tmp: 1}}, &profile{key: profileKey{tmp: 2}}
	for range 5 {
		busy.note(now)
	}
	quiet.note(now.Add(-time.Minute))
	old := &slot{id: "old", created: now.Add(-2 * time.Minute)}
	quiet.ready = []*slot{old, {id: "q1", created: now}, {id: "q2", created: now}}
	p.profiles[busy.key], p.profiles[quiet.key] = busy, quiet

	discard := p.plan(now)
	if p.target != 3 {
		t.Errorf("target %d, want the budget's 3", p.target)
	}
	var ids []string
	for _, s := range discard {
		ids = append(ids, s.id)
	}
	// busy wants 5 and gets all 3 of the budget; quiet gets none: its old container goes for its age,
	// the two others because they are beyond its share.
	if !slices.Equal(ids, []string{"old", "q1", "q2"}) || p.discarded["max_age"] != 1 || p.discarded["shrink"] != 2 {
		t.Errorf("discarded %v (%v)", ids, p.discarded)
	}
	keys := p.toCreate(now)
	if len(keys) != 3 || slices.ContainsFunc(keys, func(k profileKey) bool { return k != busy.key }) {
		t.Errorf("creations %v, want three for the busy profile", keys)
	}
}

// TestSizeBudget checks how many ready containers the pool may hold in all: MaxSize, fewer when the memory
// budget holds fewer, one while nothing is measured (to learn what one holds).
func TestSizeBudget(t *testing.T) {
	for _, tt := range []struct {
		name                string
		maxSize             int
		memory              int64
		slotBytes, memBytes int64
		want                int
	}{
		{name: "no memory budget", maxSize: 8, slotBytes: 1 << 30, memBytes: 1 << 30, want: 8},
		{name: "the memory budget holds fewer", maxSize: 8, memory: 3 << 20, slotBytes: 1 << 20, memBytes: 1 << 20, want: 3},
		{name: "MaxSize holds fewer", maxSize: 2, memory: 3 << 20, slotBytes: 1 << 20, memBytes: 1 << 20, want: 2},
		{name: "not one fits once measured", maxSize: 8, memory: 1 << 20, slotBytes: 2 << 20, memBytes: 2 << 20, want: 0},
		{name: "one while nothing is measured", maxSize: 8, memory: 1 << 20, slotBytes: 2 << 20, want: 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := PoolConfig{MaxSize: tt.maxSize, MemoryBytes: tt.memory}
			if got := sizeBudget(cfg, tt.slotBytes, tt.memBytes); got != tt.want {
				t.Errorf("sizeBudget = %d, want %d", got, tt.want)
			}
		})
	}
}
