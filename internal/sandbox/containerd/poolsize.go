package containerd

import (
	"slices"
	"time"
)

// The pool's sizing policy: from each profile's demand (its busiest second of the last demandWindow
// seconds), the memory budget and MaxAge, how many containers to keep ready, which to discard and which to
// create. It touches no container: it decides over the pool's books, under the pool's lock, at a time
// given to it.

const (
	// demandWindow is how many seconds of claims the pool remembers to size itself.
	demandWindow = 30
	// idleAfter is how long a profile without a claim keeps containers; after it, none and it is forgotten.
	idleAfter = 5 * time.Minute
	// defaultSlotBytes is the memory assumed for one ready container until one has been measured.
	defaultSlotBytes = 16 << 20
)

// profileKey is what a pooled container is made for: the calls it can serve. Memory, pids, CPU, open files
// and the file size limit are bound at claim time and are not part of it.
type profileKey struct {
	image string
	tmp   int64
}

type profile struct {
	key      profileKey
	ready    []*slot // oldest first
	creating int
	claims   [demandWindow]int // claims per second, claims[sec%demandWindow]
	claimSec int64             // the second the newest entry of claims counts
	lastUsed time.Time
	failures int
	retryAt  time.Time
}

// note counts one call of this profile at now.
func (p *profile) note(now time.Time) {
	p.advance(now)
	p.claims[p.claimSec%demandWindow]++
	p.lastUsed = now
}

func (p *profile) advance(now time.Time) {
	sec := now.Unix()
	if sec-p.claimSec >= demandWindow {
		p.claims = [demandWindow]int{}
		p.claimSec = sec
	}
	for p.claimSec < sec {
		p.claimSec++
		p.claims[p.claimSec%demandWindow] = 0
	}
}

// target is how many ready containers the profile wants: as many as its busiest second of the last
// demandWindow seconds claimed, at least one while it has been used within idleAfter, none after.
func (p *profile) target(now time.Time) int {
	if now.Sub(p.lastUsed) > idleAfter {
		return 0
	}
	p.advance(now)
	return max(1, slices.Max(p.claims[:]))
}

// sizeBudget is how many ready containers a pool of cfg may hold in all: MaxSize, or fewer when the memory
// budget (MemoryBytes) holds fewer of slotBytes each; while nothing is measured (memBytes 0), at least one,
// to learn what one holds.
func sizeBudget(cfg PoolConfig, slotBytes, memBytes int64) int {
	budget := cfg.MaxSize
	if cfg.MemoryBytes > 0 {
		fits := int(cfg.MemoryBytes / max(slotBytes, 1))
		if memBytes == 0 {
			fits = max(fits, 1) // nothing measured yet: one container, to learn what one holds
		}
		budget = min(budget, fits)
	}
	return budget
}

// plan recomputes the targets and returns the ready containers to discard: those past MaxAge, and the
// oldest beyond their profile's target. It forgets idle profiles.
func (p *pool) plan(now time.Time) (discard []*slot) {
	p.mu.Lock()
	defer p.mu.Unlock()
	budget := sizeBudget(p.cfg, p.slotBytes, p.memBytes)
	if p.disabled != "" {
		budget = 0
	}
	// The most recently used profiles first: under a tight budget they keep their containers.
	list := make([]*profile, 0, len(p.profiles))
	for _, pr := range p.profiles {
		list = append(list, pr)
	}
	slices.SortFunc(list, func(a, b *profile) int { return b.lastUsed.Compare(a.lastUsed) })
	total := 0
	for _, pr := range list {
		keep := pr.ready[:0]
		for _, s := range pr.ready {
			if now.Sub(s.created) >= p.cfg.MaxAge {
				p.discarded["max_age"]++
				discard = append(discard, s)
				continue
			}
			keep = append(keep, s)
		}
		pr.ready = keep
		want := min(pr.target(now), budget-total)
		total += want
		for len(pr.ready) > want {
			p.discarded["shrink"]++
			discard = append(discard, pr.ready[0])
			pr.ready = pr.ready[1:]
		}
		if want == 0 && len(pr.ready) == 0 && pr.creating == 0 && now.Sub(pr.lastUsed) > idleAfter {
			delete(p.profiles, pr.key)
		}
	}
	p.target = total
	return discard
}

// toCreate returns the profiles to start one creation for each (a profile may appear several times),
// within Fillers creations at once.
func (p *pool) toCreate(now time.Time) []profileKey {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	budget := p.target
	var keys []profileKey
	list := make([]*profile, 0, len(p.profiles))
	for _, pr := range p.profiles {
		list = append(list, pr)
	}
	slices.SortFunc(list, func(a, b *profile) int { return b.lastUsed.Compare(a.lastUsed) })
	for _, pr := range list {
		want := min(pr.target(now), budget)
		budget -= want
		if now.Before(pr.retryAt) {
			continue
		}
		for len(pr.ready)+pr.creating < want && p.creating < p.cfg.Fillers {
			pr.creating++
			p.creating++
			keys = append(keys, pr.key)
		}
	}
	return keys
}
