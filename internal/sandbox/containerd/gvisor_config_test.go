package containerd

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	runcoptions "github.com/containerd/containerd/api/types/runc/options"
)

// TestValidateRuntimes: each runtime misconfiguration is refused with a message that names what to fix, and
// the configurations a worker uses are accepted.
func TestValidateRuntimes(t *testing.T) {
	tests := []struct {
		name string
		edit func(*Config)
		want string // "" accepts
	}{
		{name: "runc alone", edit: func(*Config) {}},
		{name: "gVisor offered, runc the default", edit: func(c *Config) { c.GVisor = &GVisorConfig{} }},
		{name: "gVisor the default", edit: func(c *Config) { c.RuntimeName, c.GVisor = GVisorRuntime, &GVisorConfig{Platform: "kvm"} }},
		{name: "a node's gVisor shim by name", edit: func(c *Config) {
			c.RuntimeName, c.Runtimes = GVisorRuntime, map[string]string{GVisorRuntime: RunscHandler}
		}},
		{name: "a handler as the default", edit: func(c *Config) { c.RuntimeName = "io.containerd.kata.v2" }},
		{name: "gvisor the default but not installed", edit: func(c *Config) { c.RuntimeName = GVisorRuntime },
			want: "gVisor is not installed or configured (install runsc with make gvisor"},
		{name: "gvisor defined twice", edit: func(c *Config) {
			c.GVisor, c.Runtimes = &GVisorConfig{}, map[string]string{GVisorRuntime: RunscHandler}
		}, want: "runtime gvisor is defined twice"},
		{name: "runc redefined", edit: func(c *Config) { c.Runtimes = map[string]string{RuncRuntime: RunscHandler} },
			want: "runtime runc: it is always io.containerd.runc.v2"},
		{name: "an empty handler", edit: func(c *Config) { c.Runtimes = map[string]string{"kata": ""} },
			want: "runtime kata: the containerd runtime handler is empty"},
		{name: "an empty name", edit: func(c *Config) { c.Runtimes = map[string]string{"": "io.containerd.kata.v2"} },
			want: "runtime handler io.containerd.kata.v2 has an empty runtime name"},
		{name: "an unknown gVisor platform", edit: func(c *Config) { c.GVisor = &GVisorConfig{Platform: "kvm2"} },
			want: `gVisor platform "kvm2" is not one of systrap, ptrace, kvm`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Config{Address: "/run/c.sock", Namespace: "ns", RuntimeName: RuncRuntime, StateDir: "/var/lib/x", UID: 1, GID: 1}
			tt.edit(&c)
			err := c.Validate()
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("err %v, want one saying %q", err, tt.want)
			}
		})
	}
}

// TestBackends: a Runtime offers runc always, gvisor when configured, and the names of Runtimes; a Spec
// naming none gets the default, and one naming a runtime not offered is refused with what is offered. The
// gvisor backend is the runc shim running toolpool's runsc wrapper, which carries the hardening flags.
func TestBackends(t *testing.T) {
	state := t.TempDir()
	cfg := Config{RuntimeName: RuncRuntime, StateDir: state, Runtimes: map[string]string{"kata": "io.containerd.kata.v2"},
		GVisor: &GVisorConfig{Runsc: "/bin/true"}}
	all, def, err := backends(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := &Runtime{backends: all, def: def}
	if got := r.offered(); got != "gvisor, kata, runc" {
		t.Errorf("offered %q", got)
	}
	tests := []struct {
		name, handler string
		gvisor        bool
		wantErr       string
	}{
		{name: "", handler: RuncHandler},
		{name: RuncRuntime, handler: RuncHandler},
		{name: "kata", handler: "io.containerd.kata.v2"},
		{name: GVisorRuntime, handler: RuncHandler, gvisor: true},
		{name: "firecracker", wantErr: `runtime "firecracker": this worker offers only gvisor, kata, runc`},
	}
	for _, tt := range tests {
		t.Run("runtime "+tt.name, func(t *testing.T) {
			b, err := r.backendFor(tt.name)
			if tt.wantErr != "" {
				if err == nil || err.Error() != tt.wantErr {
					t.Errorf("err %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || b.handler != tt.handler || b.gvisor != tt.gvisor || (b.options != nil) != tt.gvisor {
				t.Errorf("backend %+v (%v), want handler %s, gvisor %v", b, err, tt.handler, tt.gvisor)
			}
		})
	}
	opts, ok := all[GVisorRuntime].options.(*runcoptions.Options)
	if !ok || opts.Root != filepath.Join(state, "runsc", "state") {
		t.Fatalf("gVisor's shim options %+v", all[GVisorRuntime].options)
	}
	wrapper, err := os.ReadFile(opts.BinaryName)
	if err != nil {
		t.Fatal(err)
	}
	if want := `exec '/bin/true' '--platform=systrap' '--network=none' '--oci-seccomp' '--directfs=false' "$@"`; !strings.Contains(string(wrapper), want) {
		t.Errorf("wrapper %q lacks %q", wrapper, want)
	}
	cfg.RuntimeName, cfg.GVisor = GVisorRuntime, &GVisorConfig{Runsc: "/bin/true", Platform: "ptrace"}
	if _, def, err = backends(cfg); err != nil || !def.gvisor {
		t.Errorf("default gvisor: %+v %v", def, err)
	}

	// RuntimeBinary (crun) is the runc runtime's alone; only the runc runtime is pooled.
	cfg.RuntimeName, cfg.RuntimeBinary = RuncHandler, "crun"
	all, def, err = backends(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if o, ok := def.options.(*runcoptions.Options); !ok || o.BinaryName != "crun" || !def.runc {
		t.Errorf("default %s with crun: %+v", RuncHandler, def)
	}
	if o, ok := all[GVisorRuntime].options.(*runcoptions.Options); !ok || o.BinaryName == "crun" || all[GVisorRuntime].runc {
		t.Errorf("gvisor backend %+v took the runc runtime's binary or pool", all[GVisorRuntime])
	}
	if b := all["kata"]; b.options != nil || b.runc {
		t.Errorf("kata backend %+v", b)
	}
}
