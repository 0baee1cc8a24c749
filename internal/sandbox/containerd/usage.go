package containerd

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	cgroup1stats "github.com/containerd/cgroups/v3/cgroup1/stats"
	cgroup2stats "github.com/containerd/cgroups/v3/cgroup2/stats"
	"github.com/containerd/containerd"
	"github.com/containerd/typeurl/v2"

	"github.com/toolpool/toolpool/internal/sandbox"
)

// Usage reading: what a container's cgroup (and its shim's process) says it used, read from the cgroup's
// files where the layout is known, or asked of the shim.

// collectUsage reads the container's cgroup: peak memory, CPU time, and whether the OOM killer struck. A
// runc container's cgroup is read from its files (cgroupFileUsage), which spares a round trip through
// containerd and the shim on every call's path; other runtimes' (and a layout it does not know) are asked
// of the shim.
func (r *Runtime) collectUsage(ctx context.Context, task containerd.Task, runtime string, out *sandbox.Outcome) {
	if be, err := r.backendFor(runtime); err == nil && be.runc {
		if u, ok := cgroupFileUsage(cgroup2Root, r.cgroupsPath(task.ID())); ok {
			out.MaxRSSBytes, out.CPUTime, out.OOMKilled = u.maxRSS, u.cpu, u.oomKilled
			return
		}
	}
	mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	m, err := task.Metrics(mctx)
	if err != nil || m == nil || m.Data == nil {
		return
	}
	v, err := typeurl.UnmarshalAny(m.Data)
	if err != nil {
		return
	}
	switch s := v.(type) {
	case *cgroup1stats.Metrics:
		if s.Memory != nil && s.Memory.Usage != nil {
			out.MaxRSSBytes = int64(s.Memory.Usage.Max)
		}
		if s.CPU != nil && s.CPU.Usage != nil {
			out.CPUTime = time.Duration(s.CPU.Usage.Total)
		}
		if s.MemoryOomControl != nil && s.MemoryOomControl.OomKill > 0 {
			out.OOMKilled = true
		}
	case *cgroup2stats.Metrics:
		// cgroup v2's stats carry no peak (containerd's shims report memory.current): read memory.peak
		// (Linux 5.19 and later) from the cgroup itself, which runc creates at the mount point plus the
		// spec's cgroupsPath and removes only when the task is deleted, after this.
		if peak, ok := cgroup2MemoryPeak(cgroup2Root, r.cgroupsPath(task.ID())); ok {
			out.MaxRSSBytes = peak
		} else if s.Memory != nil {
			out.MaxRSSBytes = int64(s.Memory.Usage) // the usage at the end: all an older kernel tells
		}
		if s.CPU != nil {
			out.CPUTime = time.Duration(s.CPU.UsageUsec) * time.Microsecond
		}
		if s.MemoryEvents != nil && s.MemoryEvents.OomKill > 0 {
			out.OOMKilled = true
		}
	}
}

// cgroupUsage is what a call's cgroup says of it when the call is over.
type cgroupUsage struct {
	maxRSS    int64
	cpu       time.Duration
	oomKilled bool
}

// cgroupFileUsage reads the usage of the cgroup at cgroupsPath from its files below root (where runc puts
// it): cgroup v1's memory and cpuacct hierarchies (memory.max_usage_in_bytes, cpuacct.usage,
// memory.oom_control), which a hybrid host uses too, or else cgroup v2's (memory.peak, cpu.stat,
// memory.events). ok is false when a file it needs is missing or unreadable (another layout, cgroup v2
// before Linux 5.19 keeps no peak): ask the shim then.
func cgroupFileUsage(root, cgroupsPath string) (u cgroupUsage, ok bool) {
	readInt := func(file string) (int64, bool) {
		b, err := os.ReadFile(file)
		if err != nil {
			return 0, false
		}
		n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		return n, err == nil && n >= 0
	}
	// field reads "key value" lines; a missing key (an older kernel's memory.oom_control) is 0.
	field := func(file, key string) (int64, bool) {
		b, err := os.ReadFile(file)
		if err != nil {
			return 0, false
		}
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, found := strings.Cut(l, " "); found && k == key {
				n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				return n, err == nil
			}
		}
		return 0, true
	}
	mem := filepath.Join(root, "memory", cgroupsPath)
	if peak, ok := readInt(filepath.Join(mem, "memory.max_usage_in_bytes")); ok {
		cpu, okCPU := readInt(filepath.Join(root, "cpuacct", cgroupsPath, "cpuacct.usage"))
		oom, okOOM := field(filepath.Join(mem, "memory.oom_control"), "oom_kill")
		return cgroupUsage{maxRSS: peak, cpu: time.Duration(cpu), oomKilled: oom > 0}, okCPU && okOOM
	}
	dir := filepath.Join(root, cgroupsPath)
	peak, okPeak := cgroup2MemoryPeak(root, cgroupsPath)
	usec, okCPU := field(filepath.Join(dir, "cpu.stat"), "usage_usec")
	oom, okOOM := field(filepath.Join(dir, "memory.events"), "oom_kill")
	return cgroupUsage{maxRSS: peak, cpu: time.Duration(usec) * time.Microsecond, oomKilled: oom > 0}, okPeak && okCPU && okOOM
}

// cgroup2Root is where runc's cgroup v2 manager puts a container's cgroup: here, joined with its
// cgroupsPath (an absolute one, as cgroupsPath returns, is not relative to runc's own cgroup).
const cgroup2Root = "/sys/fs/cgroup"

// cgroupsPath is the cgroup of call id's container: /<namespace>/<id>, below every hierarchy.
func (r *Runtime) cgroupsPath(id string) string { return "/" + r.cfg.Namespace + "/" + id }

// usageBefore readies a pooled container's cgroup for its call, whose usage must not count what the init
// did while it waited: it resets cgroup v1's peak memory to the current usage, and returns the CPU time
// used so far (0 when the layout is not v1's or v2's, or unreadable). Under cgroup v2 the peak, which only
// a reader's own descriptor can reset, still counts the init's start-up.
func usageBefore(root, cgroupsPath string) time.Duration {
	mem := filepath.Join(root, "memory", cgroupsPath)
	if err := os.WriteFile(filepath.Join(mem, "memory.max_usage_in_bytes"), []byte("0"), 0); err == nil {
		if b, err := os.ReadFile(filepath.Join(root, "cpuacct", cgroupsPath, "cpuacct.usage")); err == nil {
			if n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil && n > 0 {
				return time.Duration(n)
			}
		}
		return 0
	}
	b, err := os.ReadFile(filepath.Join(root, cgroupsPath, "cpu.stat"))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "usage_usec "); ok {
			if n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil && n > 0 {
				return time.Duration(n) * time.Microsecond
			}
		}
	}
	return 0
}

// cgroup2MemoryPeak reads memory.peak, the most memory the cgroup at cgroupsPath below the cgroup v2 mount
// root has used since it was created; ok is false when the file is missing (kernels before 5.19) or
// unreadable.
func cgroup2MemoryPeak(root, cgroupsPath string) (peak int64, ok bool) {
	b, err := os.ReadFile(filepath.Join(root, cgroupsPath, "memory.peak"))
	if err != nil {
		return 0, false
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n, err == nil && n >= 0
}

// cgroupMemory is the memory charged to container id's cgroup (v2 memory.current, v1
// memory.usage_in_bytes), 0 when unknown.
func cgroupMemory(namespace, id string) int64 {
	for _, f := range []string{
		filepath.Join("/sys/fs/cgroup", namespace, id, "memory.current"),
		filepath.Join("/sys/fs/cgroup/memory", namespace, id, "memory.usage_in_bytes"),
	} {
		if b, err := os.ReadFile(f); err == nil {
			n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
			return n
		}
	}
	return 0
}

// parentPID is pid's parent, 0 when unknown.
func parentPID(pid int) int {
	if pid <= 0 {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(f[1])
	return ppid
}

// childPIDs lists pid's children (those of each of its threads).
func childPIDs(pid int) []int {
	files, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	var kids []int
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, s := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(s); err == nil {
				kids = append(kids, n)
			}
		}
	}
	return kids
}

// procPSS is pid's proportional set size in bytes (its share of the pages it shares), 0 when unknown.
func procPSS(pid int) int64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "Pss:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}
