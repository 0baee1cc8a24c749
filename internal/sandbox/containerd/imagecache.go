package containerd

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/containerd/containerd/images"
	"github.com/containerd/containerd/platforms"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// labelPulled marks the images this package pulled: only those count against the cache budget and may be
// evicted; an image imported by hand (worker import-image) is the operator's to remove.
const labelPulled = "toolpool.pulled"

// use records that a call is about to run on image name and returns the function that records its end.
// An image in use is never evicted.
func (p *imagePuller) use(name string) (release func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.inUse[name]++
	p.lastUsed[name] = time.Now()
	return func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.inUse[name]--; p.inUse[name] <= 0 {
			delete(p.inUse, name)
		}
	}
}

// evictable reports whether image name may be evicted now: pulled by toolpool, neither pinned, in use nor
// keep (the image just pulled).
func (p *imagePuller) evictable(img images.Image, keep string) bool {
	if img.Labels[labelPulled] == "" || img.Name == keep || slices.Contains(p.pinned, img.Name) {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.inUse[img.Name] == 0
}

// lastUse is when img was last used by a call of this process, else when it was last written.
func (p *imagePuller) lastUse(img images.Image) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	if t, ok := p.lastUsed[img.Name]; ok {
		return t
	}
	return img.UpdatedAt
}

// evict reports the pulled images' content (OnCacheBytes) and keeps it within the cache budget
// (PullConfig.CacheBytes): while their content
// (layers shared between images counted once) is over it, it deletes the least recently used one that
// may be evicted, with its content and snapshots that no other image or container holds. It never
// evicts keep, a pinned image or one in use; when only those are left it stops over the budget and
// says so in its error, which the pull that called it only logs.
func (p *imagePuller) evict(ctx context.Context, keep string) error {
	if p.cfg.CacheBytes <= 0 && p.cfg.OnCacheBytes == nil {
		return nil
	}
	store := p.client.ImageService()
	for {
		imgs, err := store.List(ctx, "labels."+labelPulled)
		if err != nil {
			return fmt.Errorf("list pulled images: %w", err)
		}
		total, err := p.cacheBytes(ctx, imgs)
		if err != nil {
			return err
		}
		if p.cfg.OnCacheBytes != nil {
			p.cfg.OnCacheBytes(total)
		}
		if p.cfg.CacheBytes <= 0 || total <= p.cfg.CacheBytes {
			return nil
		}
		var victim *images.Image
		for i := range imgs {
			if p.evictable(imgs[i], keep) && (victim == nil || p.lastUse(imgs[i]).Before(p.lastUse(*victim))) {
				victim = &imgs[i]
			}
		}
		if victim == nil {
			return fmt.Errorf("the pulled images hold %d bytes, over the cache budget of %d (images.cache_bytes), and every one is pinned or in use", total, p.cfg.CacheBytes)
		}
		if err := store.Delete(ctx, victim.Name, images.SynchronousDelete()); err != nil {
			return fmt.Errorf("evict image %s: %w", victim.Name, err)
		}
		p.mu.Lock()
		delete(p.lastUsed, victim.Name)
		delete(p.seen, victim.Target.Digest.String())
		p.evicted++
		p.mu.Unlock()
	}
}

// cacheBytes is the size of imgs' content for this platform, each blob counted once.
func (p *imagePuller) cacheBytes(ctx context.Context, imgs []images.Image) (int64, error) {
	cs := p.client.ContentStore()
	seen := map[digest.Digest]bool{}
	var total int64
	for _, img := range imgs {
		m, err := images.Manifest(ctx, cs, img.Target, platforms.Default())
		if err != nil {
			return 0, fmt.Errorf("read manifest of %s: %w", img.Name, err)
		}
		for _, d := range append([]ocispec.Descriptor{img.Target, m.Config}, m.Layers...) {
			if !seen[d.Digest] {
				seen[d.Digest] = true
				total += d.Size
			}
		}
	}
	return total, nil
}
