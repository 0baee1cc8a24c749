package containerd

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/sandbox"
)

// TestCgroup2MemoryPeak checks that the peak is read from the cgroup the spec puts the container in, below
// the cgroup v2 root, and that a kernel without memory.peak reads as unknown, not as zero.
func TestCgroup2MemoryPeak(t *testing.T) {
	s := generate(t, sandbox.Spec{ID: "c1", Argv: []string{"/bin/true"}})
	r := &Runtime{cfg: Config{Namespace: "ns"}}
	if s.Linux.CgroupsPath != r.cgroupsPath("c1") || s.Linux.CgroupsPath != "/ns/c1" {
		t.Fatalf("the spec's cgroupsPath %q is not where the peak is read (%q)", s.Linux.CgroupsPath, r.cgroupsPath("c1"))
	}
	root := t.TempDir()
	dir := filepath.Join(root, "ns", "c1")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, ok := cgroup2MemoryPeak(root, s.Linux.CgroupsPath); ok {
		t.Error("a cgroup without memory.peak (Linux before 5.19) gave a peak")
	}
	tests := []struct {
		content string
		peak    int64
		ok      bool
	}{
		{"67174400\n", 67174400, true},
		{"0\n", 0, true},
		{"max\n", 0, false},
		{"", 0, false},
	}
	for _, tt := range tests {
		if err := os.WriteFile(filepath.Join(dir, "memory.peak"), []byte(tt.content), 0o644); err != nil {
			t.Fatal(err)
		}
		if peak, ok := cgroup2MemoryPeak(root, s.Linux.CgroupsPath); peak != tt.peak || ok != tt.ok {
			t.Errorf("memory.peak %q: %d, %v; want %d, %v", tt.content, peak, ok, tt.peak, tt.ok)
		}
	}
}

// TestCgroupFileUsage checks that a call's usage is read from its cgroup's files in the cgroup v1 and v2
// layouts, and that a layout missing a file reads as unknown (the shim is asked then), never as zero.
func TestCgroupFileUsage(t *testing.T) {
	const cg = "/ns/c1"
	tests := []struct {
		name  string
		files map[string]string // below the root
		want  cgroupUsage
		ok    bool
	}{
		{name: "v1", files: map[string]string{
			"memory/ns/c1/memory.max_usage_in_bytes": "67174400\n",
			"cpuacct/ns/c1/cpuacct.usage":            "1500000\n",
			"memory/ns/c1/memory.oom_control":        "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
		}, want: cgroupUsage{maxRSS: 67174400, cpu: 1500 * time.Microsecond, oomKilled: true}, ok: true},
		{name: "v1 kernel without oom_kill", files: map[string]string{
			"memory/ns/c1/memory.max_usage_in_bytes": "4096\n",
			"cpuacct/ns/c1/cpuacct.usage":            "7\n",
			"memory/ns/c1/memory.oom_control":        "oom_kill_disable 0\nunder_oom 0\n",
		}, want: cgroupUsage{maxRSS: 4096, cpu: 7}, ok: true},
		{name: "v1 without cpuacct", files: map[string]string{
			"memory/ns/c1/memory.max_usage_in_bytes": "4096\n",
			"memory/ns/c1/memory.oom_control":        "oom_kill 0\n",
		}, ok: false},
		{name: "v2", files: map[string]string{
			"ns/c1/memory.peak":   "8192\n",
			"ns/c1/cpu.stat":      "usage_usec 2500\nuser_usec 2000\nsystem_usec 500\n",
			"ns/c1/memory.events": "low 0\nhigh 0\nmax 3\noom 1\noom_kill 0\n",
		}, want: cgroupUsage{maxRSS: 8192, cpu: 2500 * time.Microsecond}, ok: true},
		{name: "v2 before memory.peak", files: map[string]string{
			"ns/c1/cpu.stat":      "usage_usec 2500\n",
			"ns/c1/memory.events": "oom_kill 1\n",
		}, ok: false},
		{name: "nothing", ok: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			for name, content := range tt.files {
				if err := os.MkdirAll(filepath.Dir(filepath.Join(root, name)), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(root, name), []byte(content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			got, ok := cgroupFileUsage(root, cg)
			if ok != tt.ok || ok && got != tt.want {
				t.Errorf("cgroupFileUsage = %+v, %v; want %+v, %v", got, ok, tt.want, tt.ok)
			}
		})
	}
}
