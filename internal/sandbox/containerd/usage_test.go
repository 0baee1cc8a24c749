package containerd

import (
	"os"
	"path/filepath"
	"testing"

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
