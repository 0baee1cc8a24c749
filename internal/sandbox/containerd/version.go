package containerd

import (
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// MinRuncVersion is the oldest runc this release supports in production, per release line: 1.2.8, 1.3.3,
// and from 1.4.0-rc.3 on (runcSupported says it in words). Older releases lack the fixes for CVE-2024-45310
// (fixed in 1.1.14) and for the 2025 mount races CVE-2025-31133, CVE-2025-52565 and CVE-2025-52881 (fixed
// in 1.2.8, 1.3.3 and 1.4.0-rc.3); a pre-release of a fixed version (1.2.8-rc.1) predates it. The sandbox never lets runc mount into, or change into, a directory another container can
// write (see callMounts and cwdTrampoline), which closes the paths those CVEs use, but an unpatched runc is
// still a runc with known escapes: New reports it in Warnings.
const MinRuncVersion = "1.2.8"

// runcFixed lists, per release line, the first release with every fix MinRuncVersion stands for; lines
// after the last one are fixed from their first release.
var runcFixed = []struct{ major, minor, patch int }{{1, 2, 8}, {1, 3, 3}}

// runcSupported is MinRuncVersion in words, for the warnings.
const runcSupported = "1.2.8 or later, 1.3.3 or later on the 1.3 line, 1.4.0-rc.3 or later on the 1.4 line"

var runcVersionRE = regexp.MustCompile(`(?m)^runc version v?(\d+)\.(\d+)\.(\d+)(\S*)`)

// runcVersion runs "bin --version" and returns its first line's version string ("1.1.5+ds1").
func runcVersion(ctx context.Context, bin string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("run %s --version: %w", bin, err)
	}
	m := runcVersionRE.FindStringSubmatch(string(out))
	if m == nil {
		return "", fmt.Errorf("run %s --version: no version in %q", bin, strings.TrimSpace(string(out)))
	}
	return m[1] + "." + m[2] + "." + m[3] + m[4], nil
}

// runcTooOld reports whether runc version v (as runcVersion returns it) predates the fixes MinRuncVersion
// stands for. A distribution's backports ("1.1.5+ds1-1+deb12u1") do not count: the version is what it says.
func runcTooOld(v string) (bool, error) {
	m := runcVersionRE.FindStringSubmatch("runc version " + v)
	if m == nil {
		return false, fmt.Errorf("parse runc version %q", v)
	}
	major, _ := strconv.Atoi(m[1])
	minor, _ := strconv.Atoi(m[2])
	patch, _ := strconv.Atoi(m[3])
	pre := strings.TrimPrefix(strings.SplitN(m[4], "+", 2)[0], "-") // "rc.3" of 1.4.0-rc.3+dev
	switch {
	case major != 1:
		return major < 1, nil
	case minor < runcFixed[0].minor:
		return true, nil
	}
	for _, f := range runcFixed {
		if minor == f.minor {
			return patch < f.patch || patch == f.patch && pre != "", nil
		}
	}
	if minor == 4 && patch == 0 && strings.HasPrefix(pre, "rc.") {
		rc, _ := strconv.Atoi(strings.TrimPrefix(pre, "rc."))
		return rc < 3, nil
	}
	return false, nil
}

// runtimeWarnings checks the OCI runtime behind the containerd runtime handler name and returns what an
// operator should fix. Only the runc shims are checked; gVisor and Kata bring their own boundary.
func runtimeWarnings(ctx context.Context, name, binary string) []string {
	if !strings.HasPrefix(name, "io.containerd.runc.") {
		return nil
	}
	if binary == "" {
		binary = "runc"
	}
	if isCrun(binary) {
		return crunWarnings(ctx, binary)
	}
	v, err := runcVersion(ctx, binary)
	if err != nil {
		return []string{fmt.Sprintf("cannot tell which runc the %s shim runs (%v): production needs runc %s", name, err, runcSupported)}
	}
	old, err := runcTooOld(v)
	if err != nil {
		return []string{fmt.Sprintf("cannot parse runc version %q: production needs runc %s", v, runcSupported)}
	}
	if old {
		return []string{fmt.Sprintf("runc %s is too old (production needs %s): it lacks the fixes for CVE-2024-45310, CVE-2025-31133, CVE-2025-52565 and CVE-2025-52881; the sandbox avoids the mount patterns they exploit, but run a supported runc, or the gVisor runtime, in production", v, runcSupported)}
	}
	return nil
}
