package containerd_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	ctdclient "github.com/containerd/containerd"
	"github.com/containerd/containerd/images"
	"github.com/containerd/containerd/namespaces"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/toolpool/toolpool/internal/sandbox"
	"github.com/toolpool/toolpool/internal/sandbox/containerd"
	"github.com/toolpool/toolpool/internal/sandbox/containerd/ctrtest"
)

// TestRegistryCredentialsPerTenant: registry credentials bound to a tenant serve that tenant's calls
// only. A tenant with no entry for a host whose credentials are bound to others is refused with a
// message that says what to do, before anything is asked of the registry, also once the image is stored;
// a tenant whose own credentials (the host's entry for every tenant, here a wrong password) do not give
// it the image gets the registry's 401 even after another tenant pulled it; the bound tenant's calls run.
func TestRegistryCredentialsPerTenant(t *testing.T) {
	rt, _, reg := pullRuntime(t, func(c *containerd.PullConfig, reg *ctrtest.Registry) {
		bound := c.Registries[0]
		bound.Tenants = []string{"acme"}
		c.Registries = []containerd.RegistryConfig{
			bound,
			{Host: reg.Host, Username: "tenant-a", Password: "wrong", PlainHTTP: true}, // every tenant's
			{Host: anonymousHost(reg), Username: "tenant-a", PasswordFile: bound.PasswordFile, PlainHTTP: true, Tenants: []string{"acme"}},
		}
	})
	ref := ctrtest.PushShellImage(t, reg, "tools/shell:tenants")
	onlyAcme := strings.Replace(ref, reg.Host, anonymousHost(reg), 1)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	run := func(tenant, image string) (sandbox.Outcome, error) {
		spec := imageCall(image, workspace(t), "/usr/bin/id", "-u")
		spec.Tenant = tenant
		return rt.Run(ctx, spec)
	}
	unbound := func(when string) {
		t.Helper()
		before := reg.ManifestResolves()
		_, err := run("globex", onlyAcme)
		if !errors.Is(err, sandbox.ErrImageRefused) || !errors.Is(err, sandbox.ErrNotStarted) ||
			!strings.Contains(err.Error(), "registry "+anonymousHost(reg)+"'s credentials on this worker are bound to other tenants, and tenant globex has none") ||
			!strings.Contains(err.Error(), "images.registries") {
			t.Errorf("%s: a tenant without a binding: %v; want the image refused, saying how to bind it", when, err)
		}
		if n := reg.ManifestResolves() - before; n != 0 {
			t.Errorf("%s: the registry was asked %d times for a tenant with no credentials there", when, n)
		}
	}
	refusedCreds := func(when string) {
		t.Helper()
		_, err := run("globex", ref)
		if !errors.Is(err, sandbox.ErrImagePull) || !strings.Contains(err.Error(), "refused this worker's credentials") {
			t.Errorf("%s: a tenant whose credentials the registry refuses: %v; want image_pull_failed, credentials refused", when, err)
		}
	}

	unbound("before any pull")
	refusedCreds("before any pull")
	for _, image := range []string{ref, onlyAcme} {
		if out, err := run("acme", image); err != nil || out.ExitCode != 0 || out.Stdout.String() != "65532\n" {
			t.Fatalf("the bound tenant's call on %s: %v (exit %d, %q)", image, err, out.ExitCode, out.Stderr.String())
		}
	}
	unbound("once the image is stored")
	refusedCreds("once the image is stored")
	if out, err := run("acme", ref); err != nil || out.ExitCode != 0 {
		t.Errorf("the bound tenant's call on the stored image: %v", err)
	}
}

// TestRegistryBindingsValidate: one entry for every tenant per host, no tenant in two entries of a host.
func TestRegistryBindingsValidate(t *testing.T) {
	for _, tt := range []struct {
		regs []containerd.RegistryConfig
		want string
	}{
		{[]containerd.RegistryConfig{{Host: "r.example"}, {Host: "r.example", Tenants: []string{"a"}}, {Host: "r.example", Tenants: []string{"b"}}}, ""},
		{[]containerd.RegistryConfig{{Host: "r.example"}, {Host: "r.example"}}, "host r.example has two entries for every tenant"},
		{[]containerd.RegistryConfig{{Host: "r.example", Tenants: []string{"a"}}, {Host: "r.example", Tenants: []string{"b", "a"}}}, "tenant a has two entries for host r.example"},
		{[]containerd.RegistryConfig{{Host: "r.example", Tenants: []string{""}}}, "is not a tenant name"},
	} {
		c := containerd.PullConfig{Registries: tt.regs}
		err := c.Validate()
		if (tt.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tt.want)) {
			t.Errorf("%+v: %v, want %q", tt.regs, err, tt.want)
		}
	}
}

// TestImageReplacedUnderItsName: what a call learns of a stored image (its snapshots, its environment) is
// kept by the image's manifest, never by its name: an image deleted and pulled again under the same name
// with other content serves the next call with the new content and environment.
func TestImageReplacedUnderItsName(t *testing.T) {
	rt, d, reg := pullRuntime(t, nil)
	client, err := ctdclient.New(d.Address())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	ctx := namespaces.WithNamespace(context.Background(), "toolpool-test")
	base := ctrtest.BaseLayer(t)
	for _, mark := range []string{"first", "second"} {
		ref := ctrtest.PushImage(t, reg, "tools/replaced:1", v1.Config{Env: []string{"MARK=" + mark}}, base, randomLayer(t))
		out, err := rt.Run(ctx, imageCall(ref, workspace(t), "/bin/sh", "-c", `echo "$MARK"`))
		if err != nil || out.Stdout.String() != mark+"\n" {
			t.Fatalf("call on the %s image: %v, stdout %q (stderr %q)", mark, err, out.Stdout.String(), out.Stderr.String())
		}
		rt.WaitCleanups()
		name, err := containerd.ParseImageRef(ref)
		if err != nil {
			t.Fatal(err)
		}
		if err := client.ImageService().Delete(ctx, name, images.SynchronousDelete()); err != nil {
			t.Fatal(err)
		}
	}
}
