package containerd

import (
	"strings"
	"testing"
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
