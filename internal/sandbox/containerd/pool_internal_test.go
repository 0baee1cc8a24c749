package containerd

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/sandbox"
)

// TestPoolConfigValidate checks that the pool refuses ahead mounts it could not carry safely: each file
// is a regular file on the host, read-only, at its own clean path under /.toolpool.
func TestPoolConfigValidate(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "bin")
	if err := os.WriteFile(file, nil, 0o755); err != nil {
		t.Fatal(err)
	}
	base := func() PoolConfig { return PoolConfig{MaxSize: 1, InitBinary: file, InitPath: "/.toolpool/init"} }
	tests := []struct {
		name    string
		edit    func(*PoolConfig)
		wantErr string
	}{
		{name: "init only", edit: func(*PoolConfig) {}},
		{name: "init and runner", edit: func(c *PoolConfig) { c.Mounts = []sandbox.Mount{{Source: file, Destination: "/.toolpool/runner"}} }},
		{name: "pool off checks nothing", edit: func(c *PoolConfig) { c.MaxSize, c.InitBinary = 0, "" }},
		{name: "relative init", edit: func(c *PoolConfig) { c.InitBinary = "bin" }, wantErr: "init: binary \"bin\" must be an absolute path"},
		{name: "missing init", edit: func(c *PoolConfig) { c.InitBinary = filepath.Join(dir, "none") }, wantErr: "no such file"},
		{name: "directory", edit: func(c *PoolConfig) { c.Mounts = []sandbox.Mount{{Source: dir, Destination: "/.toolpool/runner"}} }, wantErr: "mount 1: " + dir + " is not a regular file"},
		{name: "outside /.toolpool", edit: func(c *PoolConfig) { c.Mounts = []sandbox.Mount{{Source: file, Destination: "/usr/bin/runner"}} }, wantErr: "clean path under /.toolpool"},
		{name: "not clean", edit: func(c *PoolConfig) { c.Mounts = []sandbox.Mount{{Source: file, Destination: "/.toolpool/../etc/x"}} }, wantErr: "clean path under /.toolpool"},
		{name: "writable", edit: func(c *PoolConfig) {
			c.Mounts = []sandbox.Mount{{Source: file, Destination: "/.toolpool/runner", Writable: true}}
		}, wantErr: "must be read-only"},
		{name: "two at one path", edit: func(c *PoolConfig) { c.Mounts = []sandbox.Mount{{Source: file, Destination: "/.toolpool/init"}} }, wantErr: "a second mount at /.toolpool/init"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := base()
			tt.edit(&c)
			err := c.validate()
			if (err == nil) != (tt.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("validate: %v, want %q", err, tt.wantErr)
			}
		})
	}
}

// TestRefillWaitsForTheClaimedCall: a claim wakes the pool's manager only refillDelay later, so that the
// replacement's creation does not take the CPU the claimed call needs at once; the claim itself does not.
func TestRefillWaitsForTheClaimedCall(t *testing.T) {
	var delays []time.Duration
	var later []func()
	key := profileKey{tmp: 1}
	p := &pool{cfg: PoolConfig{MaxSize: 1, MaxAge: time.Minute, MaxProfiles: 1}, wake: make(chan struct{}, 1),
		profiles:  map[profileKey]*profile{key: {key: key, ready: []*slot{{id: "s1", created: time.Now()}}}},
		discarded: map[string]uint64{},
		after: func(d time.Duration, f func()) *time.Timer {
			delays, later = append(delays, d), append(later, f)
			return nil
		}}
	s, reason, _ := p.take(key, time.Now())
	if s == nil || s.id != "s1" || reason != "" {
		t.Fatalf("take: %v %q", s, reason)
	}
	select {
	case <-p.wake:
		t.Fatal("the claim woke the manager at once")
	default:
	}
	if len(delays) != 1 || delays[0] != refillDelay || refillDelay < 50*time.Millisecond {
		t.Fatalf("wake-ups scheduled after %v, want one after refillDelay (%s, at least 50ms)", delays, refillDelay)
	}
	later[0]()
	select {
	case <-p.wake:
	default:
		t.Fatal("the scheduled wake-up did not wake the manager")
	}
}

// fakeSlots is a slotMaker whose containers are records: create makes one at once, destroy notes it.
type fakeSlots struct {
	mu        sync.Mutex
	made      []string
	destroyed []string
}

func (f *fakeSlots) create(_ context.Context, key profileKey) (*slot, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := &slot{id: fmt.Sprintf("s%d", len(f.made)), key: key, created: time.Now()}
	f.made = append(f.made, s.id)
	return s, nil
}

func (f *fakeSlots) destroy(s *slot) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.destroyed = append(f.destroyed, s.id)
}

func (f *fakeSlots) measure(ready []*slot) int64 { return int64(len(ready)) << 20 }

// TestPoolStartClose: the pool creates nothing before Start, fills a prewarmed profile through its
// slotMaker once started, and Close (called twice at once, then again) stops it, destroys every ready
// container once, and leaves later claims to run cold; a Start after Close does nothing.
func TestPoolStartClose(t *testing.T) {
	f := &fakeSlots{}
	key := profileKey{tmp: 1}
	p := newPool(PoolConfig{MaxSize: 2}, f)
	p.prewarm(key)
	if n, _ := p.readyOf(key); n != 0 || len(f.made) != 0 {
		t.Fatalf("before Start: %d ready, %d made", n, len(f.made))
	}
	p.Start(context.Background())
	p.Start(context.Background()) // a second Start does nothing
	deadline := time.Now().Add(10 * time.Second)
	for n, _ := p.readyOf(key); n == 0; n, _ = p.readyOf(key) {
		if time.Now().After(deadline) {
			t.Fatalf("no container ready after Start: %+v", p.stats())
		}
		time.Sleep(time.Millisecond)
	}

	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.Close()
		}()
	}
	wg.Wait()
	p.Close()
	f.mu.Lock()
	made, destroyed := slices.Sorted(slices.Values(f.made)), slices.Sorted(slices.Values(f.destroyed))
	f.mu.Unlock()
	if len(made) == 0 || !slices.Equal(made, destroyed) {
		t.Errorf("made %v, destroyed %v: Close must destroy each ready container once", made, destroyed)
	}
	if st := p.stats(); st.Ready != 0 || st.Discarded["drain"] != uint64(len(made)) {
		t.Errorf("after Close: %+v", st)
	}
	if s, reason, _ := p.take(key, time.Now()); s != nil || reason != ColdDraining {
		t.Errorf("take after Close: %v %q, want none (%s)", s, reason, ColdDraining)
	}
	if _, disabled := p.readyOf(key); disabled != "it was drained" {
		t.Errorf("readyOf after Close says %q", disabled)
	}

	closed := newPool(PoolConfig{MaxSize: 2}, f)
	closed.Close() // before Start: nothing to wait for
	closed.Start(context.Background())
	if closed.started {
		t.Error("Start after Close started the manager")
	}
}
