#!/usr/bin/env bash
# Installs gVisor's runsc and containerd-shim-runsc-v1, built from source through the Go module proxy, when
# the pinned version is not installed yet. Idempotent: a second run costs nothing.
#
#   scripts/gvisor.sh            build (about 7 CPU-minutes from a cold Go cache; docs/performance.md) and
#                                install, unless already there. make test runs this first, so that CI
#                                always tests gVisor
#   scripts/gvisor.sh --check    exit 0 when the pinned version is installed, 1 otherwise; build nothing
#
# The binaries go to $PREFIX/lib/toolpool/gvisor-$GVISOR_VERSION/ and are linked from $PREFIX/bin, where
# the worker and containerd find them on PATH (containerd resolves the runtime handler io.containerd.runsc.v1
# to the binary containerd-shim-runsc-v1 on its PATH).
#
# They MUST be static (CGO_ENABLED=0). A plain `go install gvisor.dev/gvisor/runsc@...` on a machine with a C
# compiler links runsc against glibc, with /lib64/ld-linux-x86-64.so.2 as its ELF interpreter. runsc boot and
# runsc gofer pivot into an empty chroot (a tmpfs holding only /proc and /etc/localtime) and then re-execute
# /proc/self/exe to unmount /proc (runsc/cmd/sandboxsetup/process.go, ExecProcUmounter); the kernel cannot
# find the interpreter inside that chroot, and execve fails with ENOENT:
#   error executing umounter: fork/exec /proc/self/exe: no such file or directory
# gVisor's own release builds are static for this reason.
set -euo pipefail

# gVisor's "go" branch, as the Go module proxy serves it (gVisor tags releases only on its Bazel branch).
# Pinned so that every build is the same; bump it deliberately and run the gVisor tier (make test-gvisor).
GVISOR_VERSION=${GVISOR_VERSION:-v0.0.0-20260905035102-160fafc42237}
PREFIX=${TOOLPOOL_GVISOR_PREFIX:-/usr/local}
dir="$PREFIX/lib/toolpool/gvisor-$GVISOR_VERSION"
bindir="$PREFIX/bin"

installed() {
  [ -x "$dir/runsc" ] && [ -x "$dir/containerd-shim-runsc-v1" ] &&
    [ "$(readlink "$bindir/runsc" 2>/dev/null)" = "$dir/runsc" ] &&
    [ "$(readlink "$bindir/containerd-shim-runsc-v1" 2>/dev/null)" = "$dir/containerd-shim-runsc-v1" ]
}

if [ "${1:-}" = "--check" ]; then
  installed
  exit
fi
if installed; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "installing gVisor into $PREFIX needs root (TOOLPOOL_GVISOR=0 make test leaves gVisor out of make test)" >&2
  exit 1
fi
command -v go >/dev/null || { echo "installing gVisor needs the go command (Go 1.26)" >&2; exit 1; }

echo "building gVisor $GVISOR_VERSION (runsc and its containerd shim) from the Go module proxy; this takes a few minutes..." >&2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Outside any module (the repository's go.mod must not apply), static, reproducible paths.
(
  cd "$work"
  CGO_ENABLED=0 GOFLAGS= GOBIN="$work/bin" go install -trimpath \
    -ldflags "-s -w -X gvisor.dev/gvisor/runsc/version.version=$GVISOR_VERSION" \
    "gvisor.dev/gvisor/runsc@$GVISOR_VERSION" "gvisor.dev/gvisor/shim@$GVISOR_VERSION"
)
for b in runsc shim; do
  if ! go version -m "$work/bin/$b" | grep -q 'CGO_ENABLED=0'; then
    echo "gVisor's $b was built with cgo: it could not re-execute itself inside its chroot" >&2
    exit 1
  fi
done

mkdir -p "$dir.tmp" "$bindir"
install -m 0755 "$work/bin/runsc" "$dir.tmp/runsc"
install -m 0755 "$work/bin/shim" "$dir.tmp/containerd-shim-runsc-v1"
rm -rf "$dir"
mv "$dir.tmp" "$dir"

# A smoke test of the sandbox itself before anything points at it: boots the Sentry on the systrap platform
# (no /dev/kvm needed) with no network, on the host's root, and runs /bin/true.
smoke=$(mktemp -d)
if ! "$dir/runsc" --root="$smoke/state" --platform=systrap --network=none --debug-log="$smoke/logs/" do /bin/true; then
  echo "gVisor $GVISOR_VERSION was built but cannot start a sandbox on this machine; runsc's logs are in $smoke/logs" >&2
  exit 1
fi
rm -rf "$smoke"

ln -sfn "$dir/runsc" "$bindir/runsc"
ln -sfn "$dir/containerd-shim-runsc-v1" "$bindir/containerd-shim-runsc-v1"
echo "installed gVisor $GVISOR_VERSION: $("$bindir/runsc" --version | head -1) in $dir, linked from $bindir" >&2
