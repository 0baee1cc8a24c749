package ctrtest

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Cgroup is what the host holds of one container's cgroup: the directories that exist for it, in every
// cgroup v1 hierarchy and every cgroup v2 mount, and the processes in it.
type Cgroup struct {
	// Path is the container's cgroupsPath, such as /toolpool-test/<id>.
	Path string
	// Dirs are every directory where that cgroup lives on this host while the container runs.
	Dirs []string
	// Existing are the directories of Dirs that exist.
	Existing []string
	// PIDs are the processes whose /proc/PID/cgroup puts them in Path or below it, in any hierarchy.
	PIDs []int
}

// Empty reports that nothing of the cgroup is left: no directory and no process.
func (c Cgroup) Empty() bool { return len(c.Existing) == 0 && len(c.PIDs) == 0 }

// String says what is left, for a failure message.
func (c Cgroup) String() string {
	return fmt.Sprintf("cgroup %s: directories %q (of %d places looked at), processes %v", c.Path, c.Existing, len(c.Dirs), c.PIDs)
}

// ContainerCgroup reads what the host holds of the cgroup of the container id in containerd namespace
// namespace: toolpool gives every container the cgroupsPath /<namespace>/<id>, which runc creates below
// every cgroup v1 hierarchy's mount point (legacy and hybrid hosts) or below the cgroup v2 mount (unified
// and hybrid hosts). Which of these the host has is read from /proc/self/mountinfo, never assumed. Processes
// are found by reading every /proc/PID/cgroup, so a process counts wherever its cgroup directories are.
// It is scoped to one container: other containers, other daemons' included, are not looked at.
func ContainerCgroup(namespace, id string) (Cgroup, error) {
	c := Cgroup{Path: "/" + namespace + "/" + id}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return c, fmt.Errorf("read mountinfo: %w", err)
	}
	defer f.Close()
	if c.Dirs, err = cgroupDirs(f, c.Path); err != nil {
		return c, err
	}
	if len(c.Dirs) == 0 {
		return c, fmt.Errorf("find cgroup mounts: /proc/self/mountinfo lists no cgroup or cgroup2 file system")
	}
	for _, d := range c.Dirs {
		if _, err := os.Stat(d); err == nil {
			c.Existing = append(c.Existing, d)
		}
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cgroup")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // the process is gone
		}
		if inCgroup(string(b), c.Path) {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
			if !zombie(pid) {
				c.PIDs = append(c.PIDs, pid)
			}
		}
	}
	return c, nil
}

// zombie reports whether pid has exited and only waits to be reaped: it holds nothing but its pid.
func zombie(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true // gone
	}
	// The state follows the command name, which is in parentheses and may itself hold ") ".
	i := strings.LastIndexByte(string(b), ')')
	return i < 0 || strings.HasPrefix(string(b[i:]), ") Z")
}

// PeakMemoryKnown reports whether the runtime can report a container's peak memory on this host, and says
// why: cgroup v1 keeps memory.max_usage_in_bytes; cgroup v2 (runc uses it when /sys/fs/cgroup itself is the
// v2 mount) keeps memory.peak only from Linux 5.19.
func PeakMemoryKnown() (bool, string) {
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false, fmt.Sprintf("cannot read mountinfo: %v", err)
	}
	if !unifiedHost(string(mi)) {
		return true, "cgroup v1 memory controller: memory.max_usage_in_bytes"
	}
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return false, fmt.Sprintf("cgroup v2, and uname failed: %v", err)
	}
	release := unix.ByteSliceToString(u.Release[:])
	if kernelAtLeast(release, 5, 19) {
		return true, "cgroup v2 on Linux " + release + ": memory.peak"
	}
	return false, "cgroup v2 on Linux " + release + ", before 5.19: no memory.peak"
}

// unifiedHost reports whether mountinfo mounts cgroup v2 at /sys/fs/cgroup itself: the host is cgroup v2
// only, and runc manages containers with its v2 manager.
func unifiedHost(mountinfo string) bool {
	for _, l := range strings.Split(mountinfo, "\n") {
		fields := strings.Fields(l)
		for i, f := range fields {
			if f == "-" && i >= 6 && i+1 < len(fields) {
				if fields[4] == "/sys/fs/cgroup" && fields[i+1] == "cgroup2" {
					return true
				}
				break
			}
		}
	}
	return false
}

// kernelAtLeast reports whether a kernel release string ("6.18.0-1-amd64") is major.minor or later.
func kernelAtLeast(release string, major, minor int) bool {
	var ma, mi int
	if _, err := fmt.Sscanf(release, "%d.%d", &ma, &mi); err != nil {
		return false
	}
	return ma > major || ma == major && mi >= minor
}

// cgroupDirs returns, for a cgroup path such as /ns/id, the directory it has below every cgroup (v1) and
// cgroup2 (v2) mount listed in mountinfo (the format of /proc/self/mountinfo). runc puts an absolute
// cgroupsPath directly below each mount point, whatever the mount's root.
func cgroupDirs(mountinfo io.Reader, cgPath string) ([]string, error) {
	var dirs []string
	seen := map[string]bool{}
	sc := bufio.NewScanner(mountinfo)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// id parent major:minor root mountpoint options [optional...] - fstype source superoptions
		fields := strings.Fields(sc.Text())
		sep := -1
		for i, f := range fields {
			if f == "-" && i >= 6 {
				sep = i
				break
			}
		}
		if sep < 0 || sep+1 >= len(fields) {
			continue
		}
		if fs := fields[sep+1]; fs != "cgroup" && fs != "cgroup2" {
			continue
		}
		d := path.Join(unescapeMountinfo(fields[4]), cgPath)
		if !seen[d] {
			seen[d] = true
			dirs = append(dirs, d)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	return dirs, nil
}

// unescapeMountinfo undoes the octal escapes mountinfo uses for space, tab, newline and backslash.
func unescapeMountinfo(s string) string {
	return strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`).Replace(s)
}

// inCgroup reports whether the content of a /proc/PID/cgroup file ("hierarchy-id:controllers:path" lines;
// "0::path" for cgroup v2) puts the process in cgPath or below it in any hierarchy.
func inCgroup(procCgroup, cgPath string) bool {
	for _, l := range strings.Split(procCgroup, "\n") {
		parts := strings.SplitN(l, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if p := parts[2]; p == cgPath || strings.HasPrefix(p, cgPath+"/") {
			return true
		}
	}
	return false
}
