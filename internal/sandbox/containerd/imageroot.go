package containerd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/content"
	"github.com/containerd/containerd/namespaces"

	"github.com/toolpool/toolpool/internal/sandbox"
)

// prepareImage makes spec's image ready to run: pulled and unpacked when the store lacks it (pull.go),
// spec.Image set to its full stored name, and the image's safe environment (imageEnv) put before the
// call's own. It returns the image's name by digest, for the Outcome, and the function that ends the
// image's use by this call (an image in use is never evicted).
//
// Of an image's config only Env is used. User, Entrypoint, Cmd, WorkingDir, ExposedPorts, Volumes,
// StopSignal, Healthcheck and Labels are ignored: the call runs its own argv as the sandbox user in
// /workspace with no capabilities, exactly as on the host view.
func (r *Runtime) prepareImage(ctx context.Context, spec *sandbox.Spec) (digest string, release func(), err error) {
	img, release, err := r.images.ensure(ctx, spec.Image, spec.Tenant, spec.OnPull)
	if err != nil {
		return "", nil, err
	}
	spec.Image = img.Name()
	env, err := r.images.env(ctx, img)
	if err != nil {
		release()
		return "", nil, fmt.Errorf("%w: %w", sandbox.ErrImagePull, err)
	}
	spec.Env = append(env, spec.Env...)
	return byDigest(img), release, nil
}

// PullAhead brings the images refs name into the store before any call needs them (a worker passes its
// pinned images and its default image when it starts) and, with a pool, makes the pool keep a container
// of each ready (Prewarm, with the default limits), so that the first call on one is warm. Each image is
// pulled as a call of no tenant pulls it: with its registry's entry for every tenant (an image of a
// registry whose entries are all bound to tenants is refused, sandbox.ErrImageRefused). Images are pulled
// one at a time, in order; a pull of the same image that a call started meanwhile is joined, not
// repeated. An empty ref is skipped. It blocks until every pull has ended, or ctx ends, and returns an
// error naming each image it could not have; the others are pulled and warm all the same.
func (r *Runtime) PullAhead(ctx context.Context, refs ...string) error {
	ctx = namespaces.WithNamespace(ctx, r.cfg.Namespace)
	var errs []error
	for _, ref := range refs {
		if ref == "" {
			continue
		}
		if err := ctx.Err(); err != nil {
			return errors.Join(append(errs, fmt.Errorf("pull images ahead: %w", err))...)
		}
		img, release, err := r.images.ensure(ctx, ref, "", nil)
		if err != nil {
			errs = append(errs, fmt.Errorf("pull image %s ahead: %w", ref, err))
			continue
		}
		release()
		r.Prewarm(sandbox.Spec{Image: img.Name()})
	}
	return errors.Join(errs...)
}

// byDigest names img as repository@digest.
func byDigest(img containerd.Image) string {
	name := img.Name()
	if i := strings.LastIndex(name, "@"); i >= 0 {
		name = name[:i]
	} else if i := strings.LastIndex(name, ":"); i > strings.LastIndex(name, "/") {
		name = name[:i]
	}
	return name + "@" + img.Target().Digest.String()
}

// imageEnv returns the variables of img's config that a call may inherit: all but those the runtime
// sets itself (reservedEnv). A call's own variables come after them and win.
func imageEnv(ctx context.Context, img containerd.Image) ([]string, error) {
	desc, err := img.Config(ctx)
	if err != nil {
		return nil, fmt.Errorf("read image config of %s: %w", img.Name(), err)
	}
	var cfg struct {
		Config struct {
			Env []string `json:"Env"`
		} `json:"config"`
	}
	b, err := content.ReadBlob(ctx, img.ContentStore(), desc)
	if err != nil {
		return nil, fmt.Errorf("read image config of %s: %w", img.Name(), err)
	}
	if err := json.Unmarshal(b, &cfg); err != nil {
		return nil, fmt.Errorf("parse image config of %s: %w", img.Name(), err)
	}
	var env []string
	for _, kv := range cfg.Config.Env {
		k, _, ok := strings.Cut(kv, "=")
		if !ok || k == "" || reservedEnv(k) {
			continue
		}
		env = append(env, kv)
	}
	return env, nil
}

// reservedEnv reports whether the runtime or the worker owns variable k, which an image's ENV may then
// not set: the home and temporary directories (the only writable places besides the workspace), the
// identity variables, the proxy variables (egress goes only where policy says) and the CA-bundle
// variables (trust.go).
func reservedEnv(k string) bool {
	switch strings.ToUpper(k) {
	case "HOME", "TMPDIR", "USER", "LOGNAME", "HOSTNAME", "PWD", "SHELL",
		"HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "FTP_PROXY",
		"SSL_CERT_FILE", "SSL_CERT_DIR", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO", "REQUESTS_CA_BUNDLE", "PIP_CERT", "NODE_EXTRA_CA_CERTS":
		return true
	}
	return false
}
