package containerd

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/images"
	"github.com/containerd/containerd/remotes/docker"
	"github.com/distribution/reference"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sync/singleflight"

	"github.com/toolpool/toolpool/internal/sandbox"
)

// RegistryConfig is how the worker reaches one OCI registry (distribution API v2). Its credentials stay
// in the worker: they are sent to that registry only, and never enter a sandbox or a result.
type RegistryConfig struct {
	// Host is the registry's host[:port] as image references name it ("registry.example.com",
	// "localhost:5000"); docker.io for Docker Hub.
	Host string `yaml:"host"`
	// Username and Password are the registry's basic-auth (or token-service) credentials; empty pulls
	// anonymously. PasswordFile, instead of Password, names a file holding it (a mounted secret), read
	// when the Runtime starts; a trailing newline is dropped.
	Username     string `yaml:"username"`
	Password     string `yaml:"password"`
	PasswordFile string `yaml:"password_file"`
	// PlainHTTP talks to the registry over plain HTTP instead of HTTPS (a registry on loopback).
	PlainHTTP bool `yaml:"plain_http"`
	// Tenants, when set, binds the entry's credentials to these tenants' calls; empty means every
	// tenant's. A host may have one entry for every tenant and entries bound to tenants, no tenant in
	// two of them. A tenant's call uses the entry that lists it, else the host's entry for every tenant;
	// with neither, while the host has entries bound to others, its image is refused.
	Tenants []string `yaml:"tenants"`
}

// PullConfig configures how a Runtime brings in images that its store lacks.
type PullConfig struct {
	// Registries configure registries by host; a registry not listed is reached over HTTPS, anonymously.
	Registries []RegistryConfig
	// MaxBytes bounds an image's size as its manifest gives it (config and layers, compressed); a bigger
	// image is refused before any layer is fetched. Zero means DefaultPullMaxBytes.
	MaxBytes int64
	// Timeout bounds one pull, from resolving the reference to the unpacked snapshot. Zero means
	// DefaultPullTimeout.
	Timeout time.Duration
	// CacheBytes bounds the content of the images pulled (compressed, each layer counted once, as the
	// manifests give it): after each pull the least recently used ones go until they fit, never one that
	// a call is running on, a pinned one or the one just pulled. Zero keeps every image.
	CacheBytes int64
	// Pinned are image references never evicted.
	Pinned []string
	// OnWarning, when set, hears what went wrong off a call's path (the cache could not be brought within
	// its budget). Called from any goroutine.
	OnWarning func(msg string)
	// OnPull, when set, hears each pull once, however many calls waited for it: the image's size as its
	// manifest gives it (0 when it failed before), how long it took, and its error (nil; or wrapping
	// sandbox.ErrImagePull or sandbox.ErrImageRefused). OnLookup hears each call's look-up: hit when the
	// image was in the store. OnCacheBytes hears the pulled images' content after each pull's eviction.
	// Called from any goroutine.
	OnPull       func(bytes int64, took time.Duration, err error)
	OnLookup     func(hit bool)
	OnCacheBytes func(bytes int64)
}

// Pull defaults.
const (
	DefaultPullMaxBytes = 4 << 30
	DefaultPullTimeout  = 10 * time.Minute
)

// Validate checks the configuration: each registry host without a scheme or path, with one entry for
// every tenant at most and no tenant in two of its entries; each entry with both credentials or neither;
// no negative bound.
func (c *PullConfig) Validate() error {
	seen := map[string]bool{} // host, and host + "\x00" + tenant
	for i, r := range c.Registries {
		switch {
		case r.Host == "" || strings.ContainsAny(r.Host, "/ "):
			return fmt.Errorf("registries[%d]: host %q must be a registry host[:port], without a scheme or path", i, r.Host)
		case len(r.Tenants) == 0 && seen[r.Host]:
			return fmt.Errorf("registries[%d]: host %s has two entries for every tenant: keep one, or bind the others to tenants (tenants: [...])", i, r.Host)
		case r.Password != "" && r.PasswordFile != "":
			return fmt.Errorf("registries[%d] (%s): set password or password_file, not both", i, r.Host)
		case (r.Username == "") != (r.Password == "" && r.PasswordFile == ""):
			return fmt.Errorf("registries[%d] (%s): set both username and password (or password_file), or neither", i, r.Host)
		}
		if len(r.Tenants) == 0 {
			seen[r.Host] = true
		}
		for _, t := range r.Tenants {
			switch {
			case t == "" || strings.ContainsAny(t, "/ \x00"):
				return fmt.Errorf("registries[%d] (%s): tenants: %q is not a tenant name", i, r.Host, t)
			case seen[r.Host+"\x00"+t]:
				return fmt.Errorf("registries[%d]: tenant %s has two entries for host %s: keep one", i, t, r.Host)
			}
			seen[r.Host+"\x00"+t] = true
		}
	}
	switch {
	case c.MaxBytes < 0:
		return errors.New("image pull max bytes must not be negative")
	case c.Timeout < 0:
		return errors.New("image pull timeout must not be negative")
	case c.CacheBytes < 0:
		return errors.New("image cache bytes must not be negative")
	}
	for i, ref := range c.Pinned {
		if _, err := ParseImageRef(ref); err != nil {
			return fmt.Errorf("pinned[%d]: %w", i, err)
		}
	}
	return nil
}

// imagePuller brings images into the runtime's containerd store and unpacks them into the snapshotter,
// where images share the layers they have in common. Concurrent requests for one image share one pull.
type imagePuller struct {
	client *containerd.Client
	cfg    PullConfig
	flight singleflight.Group
	pinned []string // cfg.Pinned by full name

	mu       sync.Mutex
	verified map[string]time.Time     // when a tenant last showed its access to an image (verify)
	seen     map[string]seenImage     // what is known of stored images, by their manifest's digest (unpacked)
	pulls    map[string]*pullProgress // pulls under way, by full name (pullprogress.go)
	inUse    map[string]int           // calls running on each image, by full name
	lastUsed map[string]time.Time     // when a call of this process last used each image
	evicted  int                      // images evicted, for tests
}

func newImagePuller(client *containerd.Client, cfg PullConfig) (*imagePuller, error) {
	cfg.Registries = slices.Clone(cfg.Registries)
	for i, r := range cfg.Registries {
		if r.PasswordFile == "" {
			continue
		}
		b, err := os.ReadFile(r.PasswordFile)
		if err != nil {
			return nil, fmt.Errorf("read the password of registry %s: %w", r.Host, err)
		}
		cfg.Registries[i].Password = strings.TrimRight(string(b), "\r\n")
	}
	cfg.MaxBytes = cmpOr(cfg.MaxBytes, DefaultPullMaxBytes)
	cfg.Timeout = cmpOr(cfg.Timeout, DefaultPullTimeout)
	p := &imagePuller{client: client, cfg: cfg, verified: map[string]time.Time{}, seen: map[string]seenImage{}, pulls: map[string]*pullProgress{}, inUse: map[string]int{}, lastUsed: map[string]time.Time{}}
	for _, ref := range cfg.Pinned {
		if name, err := ParseImageRef(ref); err == nil {
			p.pinned = append(p.pinned, name)
		}
	}
	return p, nil
}

func (p *imagePuller) warn(msg string) {
	if p.cfg.OnWarning != nil {
		p.cfg.OnWarning(msg)
	}
}

func cmpOr[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// registry returns the entry whose credentials tenant's calls use at host: the one that lists tenant,
// else the host's entry for every tenant, else none (anonymous, over HTTPS). scoped reports that the host
// has entries bound to tenants: then a tenant shows its own access to an image that is stored already
// (verify). It refuses (sandbox.ErrImageRefused) a tenant with neither entry on a host with entries
// bound to others.
func (p *imagePuller) registry(host, tenant string) (r RegistryConfig, scoped bool, err error) {
	var every, bound *RegistryConfig
	for i, e := range p.cfg.Registries {
		if e.Host != host {
			continue
		}
		switch {
		case len(e.Tenants) == 0:
			every = &p.cfg.Registries[i]
		case slices.Contains(e.Tenants, tenant):
			scoped, bound = true, &p.cfg.Registries[i]
		default:
			scoped = true
		}
	}
	switch {
	case bound != nil:
		return *bound, scoped, nil
	case every != nil:
		return *every, scoped, nil
	case scoped:
		who := "tenant " + tenant
		if tenant == "" {
			who = "a call of no tenant (the worker's own)"
		}
		return RegistryConfig{Host: host}, true, fmt.Errorf("%w: registry %s's credentials on this worker are bound to other tenants, and %s has none: "+
			"an operator adds the tenant to the tenants of an images.registries entry for %s (or adds an entry for every tenant), or the call uses another image",
			sandbox.ErrImageRefused, host, who, host)
	}
	return RegistryConfig{Host: host}, false, nil
}

// verifyEvery is how long a tenant's shown access to an image of a registry with credentials bound to
// tenants stands, before its next call on the stored image asks the registry again.
const verifyEvery = 5 * time.Minute

// verify checks that tenant's credentials at the registry of image name give it the image (a resolve of
// its manifest), unless they did within verifyEvery: an image pulled with one tenant's credentials is
// run by another only when the registry would give it to that tenant too.
func (p *imagePuller) verify(ctx context.Context, name, tenant string) error {
	key := tenant + "\x00" + name
	p.mu.Lock()
	at, ok := p.verified[key]
	p.mu.Unlock()
	if ok && time.Since(at) < verifyEvery {
		return nil
	}
	rctx, cancel := context.WithTimeout(ctx, min(p.cfg.Timeout, time.Minute))
	defer cancel()
	resolver := docker.NewResolver(docker.ResolverOptions{Hosts: p.hosts(tenant)})
	if _, _, err := resolver.Resolve(rctx, name); err != nil {
		return pullError(name, reference.Domain(mustNamed(name)), err)
	}
	p.mu.Lock()
	p.verified[key] = time.Now()
	p.mu.Unlock()
	return nil
}

// hosts returns the registry hosts of tenant's resolver: each with its scheme and the credentials bound
// to tenant (registry) from the config.
func (p *imagePuller) hosts(tenant string) docker.RegistryHosts {
	client := &http.Client{Transport: &http.Transport{
		Proxy:                 http.ProxyFromEnvironment, // the worker's own proxy settings, never a call's egress proxy
		DialContext:           (&net.Dialer{Timeout: 10 * time.Second}).DialContext,
		TLSHandshakeTimeout:   10 * time.Second,
		ResponseHeaderTimeout: 30 * time.Second,
	}}
	creds := func(host string) (string, string, error) {
		r, _, err := p.registry(host, tenant)
		return r.Username, r.Password, err
	}
	return docker.ConfigureDefaultRegistries(
		docker.WithClient(client),
		docker.WithAuthorizer(docker.NewDockerAuthorizer(docker.WithAuthClient(client), docker.WithAuthCreds(creds))),
		docker.WithPlainHTTP(func(host string) (bool, error) {
			r, _, _ := p.registry(host, tenant)
			return r.PlainHTTP, nil
		}),
	)
}

// ParseImageRef returns the full name of image reference ref (registry/repository:tag or @digest, with
// docker.io and :latest filled in as Docker does), or an error that says what is wrong with it.
func ParseImageRef(ref string) (string, error) {
	named, err := reference.ParseDockerRef(ref)
	if err != nil {
		return "", fmt.Errorf("image reference %q does not parse (%w): write registry/repository:tag or registry/repository@sha256:<64 hex digits>", ref, err)
	}
	return named.String(), nil
}

// ensure returns the image ref names from the store, pulling and unpacking it first when the store lacks
// it, marked in use (never evicted) until the caller calls release; on an error there is nothing to
// release. ctx ending stops this caller's wait, not a pull other callers share; the pull has its own time
// limit. While it waits for a pull, onPull (when not nil) is told how it goes (sandbox.Spec's OnPull).
// The registry's credentials are those bound to tenant (registry).
func (p *imagePuller) ensure(ctx context.Context, ref, tenant string, onPull func(sandbox.PullProgress)) (_ containerd.Image, release func(), retErr error) {
	name, err := ParseImageRef(ref)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w", sandbox.ErrImageRefused, err)
	}
	release = p.use(name) // before the look-up: no eviction can come between it and the call's container
	defer func() {
		if retErr != nil {
			release()
		}
	}()
	img, err := p.get(ctx, name, tenant, onPull)
	return img, release, err
}

// get returns image name from the store, pulling it (once for all concurrent callers) when it is absent;
// each caller waiting for the pull is told of its progress through its own onPull. On a registry with
// credentials bound to tenants, tenant must have an entry, and its credentials must give it the image
// (verify) before it runs a stored one or joins a pull.
func (p *imagePuller) get(ctx context.Context, name, tenant string, onPull func(sandbox.PullProgress)) (containerd.Image, error) {
	_, scoped, err := p.registry(reference.Domain(mustNamed(name)), tenant)
	if err != nil {
		return nil, err
	}
	if scoped {
		if err := p.verify(ctx, name, tenant); err != nil {
			return nil, err
		}
	}
	if img, err := p.unpacked(ctx, name); err == nil || !errdefs.IsNotFound(err) {
		if err == nil && p.cfg.OnLookup != nil {
			p.cfg.OnLookup(true)
		}
		return img, err
	}
	if p.cfg.OnLookup != nil {
		p.cfg.OnLookup(false)
	}
	st, leave := p.progressOf(name)
	defer leave()
	ch := p.flight.DoChan(name, func() (any, error) {
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.cfg.Timeout)
		defer cancel()
		began := time.Now()
		var size int64
		img, err := p.pull(pctx, name, tenant, &size, st)
		if p.cfg.OnPull != nil {
			p.cfg.OnPull(size, time.Since(began), err)
		}
		return img, err
	})
	rep := progressReporter{onPull: onPull}
	rep.report(st.sample(name))
	tick := time.NewTicker(sandbox.PullReportEvery)
	defer tick.Stop()
	for {
		select {
		case res := <-ch:
			if res.Err != nil {
				return nil, res.Err
			}
			total := st.total.Load()
			rep.report(sandbox.PullProgress{Image: name, Done: total, Total: total, Phase: sandbox.PullDone})
			return res.Val.(containerd.Image), nil
		case <-tick.C:
			rep.report(st.sample(name))
		case <-ctx.Done():
			// The call ended (cancelled, or its worker stopping), not the pull: others may still get it.
			return nil, fmt.Errorf("wait for the pull of %s: %w", name, ctx.Err())
		}
	}
}

// seenUnpacked is how long an image found unpacked is taken to stay so, by its manifest's digest, before
// a call on it checks its snapshots again: the name is looked up for every call, its content is not.
const seenUnpacked = time.Minute

// seenImage is what is known of a stored image by its manifest's digest (content that cannot change):
// when it was last found unpacked, and its environment (imageEnv), once read.
type seenImage struct {
	unpackedAt time.Time
	env        []string
	envRead    bool
}

// unpacked returns the stored image name when it is unpacked for the snapshotter; a NotFound error when it
// is absent or only partly there. The name is looked up every time (an image deleted or imported again
// is seen at once); its snapshots are checked at most every seenUnpacked for one manifest.
func (p *imagePuller) unpacked(ctx context.Context, name string) (containerd.Image, error) {
	img, err := p.client.GetImage(ctx, name)
	if err != nil {
		if errdefs.IsNotFound(err) {
			return nil, err
		}
		return nil, fmt.Errorf("%w: get image %s: %w", sandbox.ErrImagePull, name, err)
	}
	dg := img.Target().Digest.String()
	p.mu.Lock()
	known := time.Since(p.seen[dg].unpackedAt) < seenUnpacked
	p.mu.Unlock()
	if known {
		return img, nil
	}
	ok, err := img.IsUnpacked(ctx, snapshotter)
	if err != nil || !ok {
		return nil, fmt.Errorf("image %s is not unpacked: %w", name, errdefs.ErrNotFound)
	}
	p.mu.Lock()
	si := p.seen[dg]
	si.unpackedAt = time.Now()
	p.seen[dg] = si
	p.mu.Unlock()
	return img, nil
}

// env returns the environment a call inherits from img (imageEnv), read once per manifest.
func (p *imagePuller) env(ctx context.Context, img containerd.Image) ([]string, error) {
	dg := img.Target().Digest.String()
	p.mu.Lock()
	si := p.seen[dg]
	p.mu.Unlock()
	if si.envRead {
		return slices.Clone(si.env), nil
	}
	env, err := imageEnv(ctx, img)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	si = p.seen[dg]
	si.env, si.envRead = env, true
	p.seen[dg] = si
	p.mu.Unlock()
	return slices.Clone(env), nil
}

// pull fetches name, checks its layers and unpacks it. On a failure after its fetch stored the image
// record, it deletes that record, so that nothing half-pulled is ever run. A record this pull did not
// store is left alone: one that was there before (imported by hand, not unpacked), and one another
// process sharing the containerd stored meanwhile while this pull's fetch failed (its own failure, a
// transfer cut or a limit of its own, says nothing of that image); a failed fetch stores no record, and
// containerd collects the content it left.
func (p *imagePuller) pull(ctx context.Context, name, tenant string, size *int64, st *pullProgress) (_ containerd.Image, retErr error) {
	_, err := p.client.ImageService().Get(ctx, name)
	existed := err == nil
	host := reference.Domain(mustNamed(name))
	var total atomic.Int64
	limit := func(h images.Handler) images.Handler {
		return images.HandlerFunc(func(ctx context.Context, desc ocispec.Descriptor) ([]ocispec.Descriptor, error) {
			children, err := h.Handle(ctx, desc)
			if err != nil {
				return children, err
			}
			if !images.IsManifestType(desc.MediaType) {
				st.complete(desc) // fetched, when it is a manifest's config or layer
				return children, nil
			}
			st.expect(children)
			sum := desc.Size
			for _, c := range children {
				sum += c.Size
			}
			n := total.Add(sum)
			*size = n
			if n > p.cfg.MaxBytes {
				return nil, fmt.Errorf("%w: image %s is %d bytes, over this worker's limit of %d (images.max_bytes): use a smaller image, or raise the limit", sandbox.ErrImageRefused, name, n, p.cfg.MaxBytes)
			}
			return children, nil
		})
	}
	stored := false // the fetch stored the image record
	defer func() {
		if retErr != nil && stored && !existed {
			delCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
			defer cancel()
			_ = p.client.ImageService().Delete(delCtx, name, images.SynchronousDelete())
		}
	}()
	sctx, stopSampling := context.WithCancel(ctx)
	defer stopSampling()
	go st.sampleIngests(sctx, p.client.ContentStore())
	resolver := docker.NewResolver(docker.ResolverOptions{Hosts: p.hosts(tenant)})
	img, err := p.client.Pull(ctx, name, containerd.WithResolver(resolver), containerd.WithImageHandlerWrapper(limit),
		containerd.WithPullLabel(labelPulled, "1"))
	if err != nil {
		return nil, pullError(name, host, err)
	}
	stored = true
	if err := checkLayers(ctx, p.client.ContentStore(), img.Target()); err != nil {
		return nil, fmt.Errorf("%w: image %s: %w", sandbox.ErrImageRefused, name, err)
	}
	stopSampling()
	st.unpacking.Store(true)
	if err := img.Unpack(ctx, snapshotter); err != nil {
		return nil, fmt.Errorf("%w: unpack image %s: %w", sandbox.ErrImagePull, name, err)
	}
	if err := p.evict(ctx, name); err != nil {
		p.warn(fmt.Sprintf("keep images within the cache budget after pulling %s: %v", name, err))
	}
	return img, nil
}

func mustNamed(name string) reference.Named {
	n, err := reference.ParseNormalizedNamed(name)
	if err != nil {
		panic(err) // name came from ParseImageRef
	}
	return n
}

// pullError turns a failed pull of name from host into an error that says what to fix.
func pullError(name, host string, err error) error {
	if errors.Is(err, sandbox.ErrImageRefused) {
		return err
	}
	msg := err.Error()
	var hint string
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		hint = "the pull took longer than this worker's limit (images.pull_timeout): use a smaller image, or raise the limit"
	case errdefs.IsNotFound(err) || strings.Contains(msg, "not found"):
		hint = fmt.Sprintf("registry %s has no such image: check the repository name and the tag or digest", host)
	case strings.Contains(msg, "401") || strings.Contains(msg, "nauthorized") || strings.Contains(msg, "authorization"):
		hint = fmt.Sprintf("registry %s refused this worker's credentials: set the worker's images.registries entry for %s (username, password)", host, host)
	case strings.Contains(msg, "connection refused") || strings.Contains(msg, "no such host") || strings.Contains(msg, "i/o timeout"):
		hint = fmt.Sprintf("registry %s cannot be reached: check that it is up and that the worker's images.registries entry for it is right (plain_http for a registry without TLS)", host)
	case strings.Contains(msg, "unexpected commit digest") || strings.Contains(msg, "digest"):
		hint = fmt.Sprintf("content from registry %s did not match its digest: the registry or a proxy on the way corrupted it; push the image again", host)
	default:
		hint = fmt.Sprintf("the transfer from registry %s failed: try again, and check the registry and the network between it and the worker", host)
	}
	return fmt.Errorf("%w: pull %s: %s (%w)", sandbox.ErrImagePull, name, hint, err)
}
