package ctrtest

import (
	"slices"
	"strings"
	"testing"
)

// The mountinfo of the three kinds of host: cgroup v1 only (legacy), v1 controllers with a v2 mount for
// process tracking (hybrid, this project's CI VM), and v2 alone (unified, most distributions since 2021).
const (
	legacyMountinfo = `22 1 0:21 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
30 22 0:27 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
31 30 0:28 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime shared:10 - cgroup cgroup rw,xattr,name=systemd
34 30 0:31 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:14 - cgroup cgroup rw,memory
35 30 0:32 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:15 - cgroup cgroup rw,cpu,cpuacct
38 30 0:35 / /sys/fs/cgroup/pids rw,nosuid,nodev,noexec,relatime shared:18 - cgroup cgroup rw,pids
`
	hybridMountinfo = `30 22 0:27 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
31 30 0:28 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
34 30 0:31 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
38 30 0:35 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 30 0:37 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
`
	unifiedMountinfo = `25 22 0:23 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
27 25 0:25 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
28 25 0:26 / /sys/fs/bpf rw,nosuid,nodev,noexec,relatime shared:10 - bpf bpf rw,mode=700
`
	// A worker in a container with its own cgroup namespace: the mount's root is not "/", and the
	// mount point has a space (escaped as \040). Optional fields come before the separator.
	nestedMountinfo = `600 590 0:25 /.. /sys/fs/cgroup ro,nosuid,nodev,noexec,relatime master:9 shared:3 - cgroup2 cgroup2 rw
601 590 0:40 / /mnt/my\040cgroups rw,relatime - cgroup2 cgroup2 rw
602 590 0:41 / /mnt/cgroup-like rw,relatime - tmpfs cgroup rw
`
)

// TestCgroupDirs checks where the leak checks look for a container's cgroup, on each kind of host.
func TestCgroupDirs(t *testing.T) {
	tests := []struct {
		name, mountinfo string
		want            []string
	}{
		{"cgroup v1 only", legacyMountinfo, []string{"/sys/fs/cgroup/systemd/ns/c1", "/sys/fs/cgroup/memory/ns/c1",
			"/sys/fs/cgroup/cpu,cpuacct/ns/c1", "/sys/fs/cgroup/pids/ns/c1"}},
		{"hybrid", hybridMountinfo, []string{"/sys/fs/cgroup/cpu/ns/c1", "/sys/fs/cgroup/memory/ns/c1",
			"/sys/fs/cgroup/pids/ns/c1", "/sys/fs/cgroup/unified/ns/c1"}},
		{"cgroup v2 only", unifiedMountinfo, []string{"/sys/fs/cgroup/ns/c1"}},
		{"nested, escaped, and a tmpfs named cgroup", nestedMountinfo, []string{"/sys/fs/cgroup/ns/c1", "/mnt/my cgroups/ns/c1"}},
		{"no cgroup file system", "25 22 0:23 / /sys rw - sysfs sysfs rw\n", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := cgroupDirs(strings.NewReader(tt.mountinfo), "/ns/c1")
			if err != nil || !slices.Equal(got, tt.want) {
				t.Errorf("cgroupDirs = %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

// TestInCgroup checks how a process is found in a container's cgroup from its /proc/PID/cgroup.
func TestInCgroup(t *testing.T) {
	tests := []struct {
		name, content string
		want          bool
	}{
		{"v1 memory hierarchy", "12:pids:/\n4:memory:/ns/c1\n0::/\n", true},
		{"v1 named hierarchy", "1:name=systemd:/ns/c1\n", true},
		{"v2", "0::/ns/c1\n", true},
		{"v2 below it", "0::/ns/c1/sub\n", true},
		{"another container with a longer id", "0::/ns/c10\n4:memory:/ns/c1x\n", false},
		{"the namespace itself", "0::/ns\n", false},
		{"the host", "12:pids:/\n0::/init.scope\n", false},
		{"empty", "", false},
	}
	for _, tt := range tests {
		if got := inCgroup(tt.content, "/ns/c1"); got != tt.want {
			t.Errorf("%s: inCgroup(%q) = %v, want %v", tt.name, tt.content, got, tt.want)
		}
	}
}

// TestUnifiedHost checks how a cgroup v2 only host is told from a v1 or hybrid one (where runc uses v1).
func TestUnifiedHost(t *testing.T) {
	for _, tt := range []struct {
		name, mountinfo string
		want            bool
	}{
		{"cgroup v1 only", legacyMountinfo, false},
		{"hybrid", hybridMountinfo, false},
		{"cgroup v2 only", unifiedMountinfo, true},
		{"nested", nestedMountinfo, true},
	} {
		if got := unifiedHost(tt.mountinfo); got != tt.want {
			t.Errorf("%s: unifiedHost = %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestKernelAtLeast(t *testing.T) {
	for _, tt := range []struct {
		release string
		want    bool
	}{
		{"6.18.0-1-amd64", true}, {"5.19.0", true}, {"5.18.19-generic", false}, {"5.4.0", false}, {"4.19.0", false}, {"garbage", false},
	} {
		if got := kernelAtLeast(tt.release, 5, 19); got != tt.want {
			t.Errorf("kernelAtLeast(%q, 5, 19) = %v, want %v", tt.release, got, tt.want)
		}
	}
}
