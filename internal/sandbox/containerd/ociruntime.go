package containerd

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/containerd/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/toolpool/toolpool/internal/sandbox"
)

// RuntimeBinaryAuto asks New to pick the OCI runtime: crun when it is installed, can run containers on
// this host and is at least MinCrunVersion, runc otherwise (resolveRuntimeBinary).
const RuntimeBinaryAuto = "auto"

// MinCrunVersion is the oldest crun this release recommends for production: 1.28 fixed CVE-2026-47766 (a
// /dev symlink in an image's root redirecting device setup out of it). Older releases also lack 1.14.1's
// chdir hardening and closing of leaked descriptors; the sandbox never lets crun change into the workspace
// and its init closes every descriptor but the standard three, but an image root meets crun's own code:
// New reports an older crun in Warnings.
const MinCrunVersion = "1.28"

// shimGroupAnnotation groups containers onto one runc shim (containerd's runc v2 shim reads it).
const shimGroupAnnotation = "io.containerd.runc.v2.group"

func isRuncShim(name string) bool { return strings.HasPrefix(name, "io.containerd.runc.") }

func isCrun(binary string) bool { return filepath.Base(binary) == "crun" }

// resolveRuntimeBinary turns the configured OCI runtime into the one the shim runs. "auto" is crun where
// crun holds: installed, able to run containers on this host (CrunRefusal) and at least MinCrunVersion;
// runc otherwise, with the reason when crun is installed (so that an operator sees what would make calls
// start faster). An explicit crun that cannot run containers here is an error: every call would fail.
func resolveRuntimeBinary(ctx context.Context, handler, binary string) (string, []string, error) {
	switch {
	case binary == RuntimeBinaryAuto && !isRuncShim(handler):
		return "", nil, nil
	case binary == RuntimeBinaryAuto:
		crun, err := exec.LookPath("crun")
		if err != nil {
			return "runc", nil, nil // not installed: runc, nothing to report
		}
		v := crunVersion(ctx, crun)
		why := v.refusal(hybridControllersFile)
		if w := v.warnings(crun); why == "" && len(w) > 0 {
			why = w[0]
		}
		if why != "" {
			return "runc", []string{"runtime_binary auto: using runc, not crun: " + why + " (set runtime_binary: runc to keep runc without this note)"}, nil
		}
		return "crun", nil, nil
	case isCrun(binary):
		if why := crunVersion(ctx, binary).refusal(hybridControllersFile); why != "" {
			return "", nil, fmt.Errorf("check runtime binary %s: %s", binary, why)
		}
	}
	return binary, nil, nil
}

// hybridControllersFile lists the controllers of the v2 hierarchy of a host that mixes cgroup v1 and v2.
const hybridControllersFile = "/sys/fs/cgroup/unified/cgroup.controllers"

// CrunRefusal says why the crun at binary cannot run containers on this host, "" when it can. crun before
// 1.9 refuses a hybrid cgroup layout (v1 controllers plus a v2 hierarchy at /sys/fs/cgroup/unified) whose
// v2 hierarchy holds a controller ("cgroups in hybrid mode not supported"): every container fails to
// start.
func CrunRefusal(ctx context.Context, binary string) string {
	return crunVersion(ctx, binary).refusal(hybridControllersFile)
}

// crunRelease is a crun's version as its --version reports it; known is false when it named none.
type crunRelease struct {
	major, minor int
	known        bool
}

// minCrun is MinCrunVersion, as numbers.
var minCrun = crunRelease{major: 1, minor: 28, known: true}

func (v crunRelease) atLeast(major, minor int) bool {
	return v.known && (v.major > major || v.major == major && v.minor >= minor)
}

// refusal says why this crun cannot run containers on a host whose cgroup v2 controllers (of a hybrid
// layout) are listed in controllersFile, "" when it can.
func (v crunRelease) refusal(controllersFile string) string {
	b, err := os.ReadFile(controllersFile)
	if err != nil {
		return ""
	}
	c := strings.TrimSpace(string(b))
	if c == "" || v.atLeast(1, 9) {
		return ""
	}
	return fmt.Sprintf("this host mixes cgroup v1 and v2 and its v2 hierarchy holds the %s controller, which crun before 1.9 refuses; boot the host with cgroup v1 or v2 alone, install crun 1.9 or later, or use runc", c)
}

// warnings says what an operator should fix about this crun, at binary.
func (v crunRelease) warnings(binary string) []string {
	switch {
	case !v.known:
		return []string{fmt.Sprintf("cannot tell the version of crun at %s: production needs crun %s or later", binary, MinCrunVersion)}
	case !v.atLeast(minCrun.major, minCrun.minor):
		return []string{fmt.Sprintf("crun %d.%d is older than %s: it lacks the fix for CVE-2026-47766 (an image's /dev symlink) and 1.14.1's chdir hardening; the sandbox never lets crun change into the workspace and closes leaked descriptors itself, but use images you trust, or a newer crun, in production", v.major, v.minor, MinCrunVersion)}
	}
	return nil
}

var crunVersionRE = regexp.MustCompile(`(?m)^crun version (\d+)\.(\d+)(?:\.(\d+))?`)

// crunVersion runs binary --version.
func crunVersion(ctx context.Context, binary string) crunRelease {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, binary, "--version").Output()
	m := crunVersionRE.FindStringSubmatch(string(out))
	if err != nil || m == nil {
		return crunRelease{}
	}
	major, _ := strconv.Atoi(m[1])
	minor, _ := strconv.Atoi(m[2])
	return crunRelease{major: major, minor: minor, known: true}
}

// crunWarnings checks the crun at binary and returns what an operator should fix.
func crunWarnings(ctx context.Context, binary string) []string {
	return crunVersion(ctx, binary).warnings(binary)
}

// specOpts are hardenedSpec's options for a container of backend be, with what only the runtime's plumbing
// reads in front: the shim group of a RuncRuntime container (ShimGroups).
func (r *Runtime) specOpts(be backend, argv []string, cwd string, spec sandbox.Spec, lim sandbox.Limits, rootPath string, mounts []specs.Mount) []oci.SpecOpts {
	hardened := r.hardenedSpec(argv, cwd, spec, lim, rootPath, mounts)
	if r.cfg.ShimGroups <= 0 || !be.runc {
		return hardened
	}
	n := r.shimGroup.Add(1) % uint64(r.cfg.ShimGroups)
	group := fmt.Sprintf("toolpool-%s-%d-%d", r.cfg.WorkerID, r.started.UnixNano(), n)
	return append([]oci.SpecOpts{oci.WithAnnotations(map[string]string{shimGroupAnnotation: group})}, hardened...)
}
