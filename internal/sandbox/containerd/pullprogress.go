package containerd

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/containerd/content"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/toolpool/toolpool/internal/sandbox"
)

// ingestPoll is how often a pull samples the content store's ingests (the blobs being written) for the
// bytes of layers not complete yet.
const ingestPoll = 100 * time.Millisecond

// pullProgress is how far one pull of an image is, shared by every call waiting for it (sandbox.Spec's
// OnPull): the bytes of the content the manifests name (total), of the blobs complete (done) and of the
// blobs being written (ingesting, sampled from the content store).
type pullProgress struct {
	total, done, ingesting atomic.Int64
	unpacking              atomic.Bool
	waiters                int // the calls waiting for it, under imagePuller.mu

	mu      sync.Mutex
	pending map[string]bool // digests named by a manifest, not complete yet
}

// progressOf returns the progress of image name's pull, shared with the other calls waiting for it;
// leave ends this call's interest.
func (p *imagePuller) progressOf(name string) (st *pullProgress, leave func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	st = p.pulls[name]
	if st == nil {
		st = &pullProgress{pending: map[string]bool{}}
		p.pulls[name] = st
	}
	st.waiters++
	return st, func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if st.waiters--; st.waiters == 0 && p.pulls[name] == st {
			delete(p.pulls, name)
		}
	}
}

// expect counts the blobs a manifest names (its config and layers) into the pull's total.
func (st *pullProgress) expect(children []ocispec.Descriptor) {
	st.mu.Lock()
	defer st.mu.Unlock()
	for _, c := range children {
		if !st.pending[c.Digest.String()] {
			st.pending[c.Digest.String()] = true
			st.total.Add(c.Size)
		}
	}
}

// complete counts blob desc done, when a manifest named it.
func (st *pullProgress) complete(desc ocispec.Descriptor) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.pending[desc.Digest.String()] {
		delete(st.pending, desc.Digest.String())
		st.done.Add(desc.Size)
	}
}

// sampleIngests sets the bytes written so far of the blobs still pending, from the content store's
// ingests (whose refs end with the blob's digest), until ctx ends.
func (st *pullProgress) sampleIngests(ctx context.Context, cs content.Store) {
	t := time.NewTicker(ingestPoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		statuses, err := cs.ListStatuses(ctx)
		if err != nil {
			continue
		}
		var n int64
		st.mu.Lock()
		for _, s := range statuses {
			if i := strings.LastIndex(s.Ref, "sha256:"); i >= 0 && st.pending[s.Ref[i:]] {
				n += s.Offset
			}
		}
		st.mu.Unlock()
		st.ingesting.Store(n)
	}
}

// sample is the pull's progress now.
func (st *pullProgress) sample(image string) sandbox.PullProgress {
	pp := sandbox.PullProgress{Image: image, Done: st.done.Load() + st.ingesting.Load(), Total: st.total.Load(), Phase: sandbox.PullFetching}
	if st.unpacking.Load() {
		pp.Phase, pp.Done = sandbox.PullUnpacking, pp.Total
	}
	pp.Done = min(pp.Done, pp.Total)
	return pp
}

// progressReporter tells onPull of a pull's progress: only what changed, Done never going back.
type progressReporter struct {
	onPull func(sandbox.PullProgress)
	last   sandbox.PullProgress
	sent   bool
}

func (r *progressReporter) report(pp sandbox.PullProgress) {
	if r.onPull == nil {
		return
	}
	pp.Done = max(pp.Done, r.last.Done)
	if r.sent && pp == r.last {
		return
	}
	r.last, r.sent = pp, true
	r.onPull(pp)
}
