package containerd

import "time"

// PoolStats is a snapshot of the pool for metrics.
type PoolStats struct {
	// Ready containers wait for a call; Creating are being made; Target is how many the pool aims to
	// keep ready now (after MaxSize and the memory budget).
	Ready, Creating, Target int
	// MemoryBytes is what the ready containers hold, as last measured; SlotBytes the estimate for one.
	MemoryBytes, SlotBytes int64
	// OldestAge is the age of the oldest ready container.
	OldestAge time.Duration
	// Profiles is how many profiles the pool keeps warm.
	Profiles int
	// Created counts the containers made for the pool; CreateFailures the attempts that failed;
	// Discarded the containers destroyed without serving a call, by reason: max_age, shrink, drain.
	Created, CreateFailures uint64
	Discarded               map[string]uint64
	// Disabled, when not empty, says why the pool stopped serving calls (a host that does not propagate
	// the workspace into a container).
	Disabled string
}

// stats returns a snapshot of the pool.
func (p *pool) stats() PoolStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := PoolStats{Creating: p.creating, Target: p.target, MemoryBytes: p.memBytes, SlotBytes: p.slotBytes,
		Profiles: len(p.profiles), Created: p.created, CreateFailures: p.failures, Discarded: map[string]uint64{}, Disabled: p.disabled}
	for k, v := range p.discarded {
		st.Discarded[k] = v
	}
	now := time.Now()
	for _, pr := range p.profiles {
		st.Ready += len(pr.ready)
		if len(pr.ready) > 0 {
			st.OldestAge = max(st.OldestAge, now.Sub(pr.ready[0].created))
		}
	}
	return st
}

// measure has the slotMaker measure what the ready containers hold, and sizes one container by it.
func (p *pool) measure() {
	p.mu.Lock()
	var ready []*slot
	for _, pr := range p.profiles {
		ready = append(ready, pr.ready...)
	}
	if len(ready) == 0 {
		p.memBytes = 0 // nothing ready holds nothing; slotBytes keeps the last estimate
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	total := p.slots.measure(ready)
	p.mu.Lock()
	p.memBytes = total
	p.slotBytes = max(total/int64(len(ready)), 1<<20)
	p.mu.Unlock()
}
