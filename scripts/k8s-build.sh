#!/usr/bin/env bash
# Builds the Kubernetes control plane and node binaries that `make test-k8s` runs (scripts/test-k8s.sh) from
# the k8s.io/kubernetes module on the Go module proxy, once, into $K8S_CACHE/$K8S_VERSION/bin, and reuses them.
#
#   scripts/k8s-build.sh            build what is missing (kube-apiserver, kube-controller-manager,
#                                   kube-scheduler, kubelet, kube-proxy, and kubectl when none is on PATH),
#                                   one binary at a time, then CoreDNS ($COREDNS_VERSION), the cluster's DNS
#
# k8s.io/kubernetes cannot be required as an ordinary module: its go.mod replaces the k8s.io staging modules
# (k8s.io/api, k8s.io/client-go, ...) with directories that are not in the module's zip. The build therefore
# happens in a throwaway module under the cache that requires k8s.io/kubernetes and replaces each staging
# module with its published v0.MINOR.PATCH twin; the project's go.mod is never touched.
#
# K8S_VERSION: v1.33.x is the newest minor whose kubelet starts on a cgroup v1 host without opting in
# (1.35's kubelet refuses cgroup v1 unless failCgroupV1 is false).
# The build is CPU-heavy: GOMAXPROCS=1 and -p 1 unless K8S_BUILD_PROCS says otherwise (the CI machine has
# two cores shared with nothing; a developer machine is often shared).
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-v1.33.13}
K8S_CACHE=${K8S_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/toolpool/k8s}
PROCS=${K8S_BUILD_PROCS:-1}
GO=${GO:-go}
COREDNS_VERSION=${COREDNS_VERSION:-v1.14.7}
BINARIES=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy)
command -v kubectl >/dev/null || BINARIES+=(kubectl)

die() { printf 'k8s-build: %s\n' "$*" >&2; exit 1; }
[[ $K8S_VERSION =~ ^v1\.([0-9]+)\.([0-9]+)$ ]] || die "K8S_VERSION=$K8S_VERSION: want v1.MINOR.PATCH, e.g. v1.33.13"
minor=${BASH_REMATCH[1]} patch=${BASH_REMATCH[2]}
staging=v0.$minor.$patch

out=$K8S_CACHE/$K8S_VERSION/bin
src=$K8S_CACHE/$K8S_VERSION/module
mkdir -p "$out" "$src"

missing=()
for b in "${BINARIES[@]}"; do [ -x "$out/$b" ] || missing+=("$b"); done
coredns=$K8S_CACHE/coredns-$COREDNS_VERSION/coredns
# CoreDNS with only the plugins a cluster's DNS needs: its full build (every cloud DNS, tracing, ...) is
# several times longer. Its source is copied out of the module cache and core/plugin/zplugin.go, the
# generated list of plugins linked in, is cut to COREDNS_PLUGINS.
COREDNS_PLUGINS=${COREDNS_PLUGINS:-bind cache errors forward health kubernetes log loop ready reload}
build_coredns() {
  [ -x "$coredns" ] && return
  local start dir src
  start=$(date +%s)
  echo "k8s-build: building coredns $COREDNS_VERSION with plugins: $COREDNS_PLUGINS (GOMAXPROCS=$PROCS, -p $PROCS)" >&2
  dir=$(GOFLAGS=-mod=mod $GO mod download -json "github.com/coredns/coredns@$COREDNS_VERSION" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
  [ -d "$dir" ] || die "download github.com/coredns/coredns@$COREDNS_VERSION failed"
  src=$(dirname "$coredns")/src
  rm -rf "$src"
  mkdir -p "$src"
  cp -r "$dir/." "$src/"
  chmod -R u+w "$src"
  {
    echo "// cut by scripts/k8s-build.sh to COREDNS_PLUGINS"
    echo
    echo "package plugin"
    echo
    echo "import ("
    local p
    for p in $COREDNS_PLUGINS; do
      grep -q "\"github.com/coredns/coredns/plugin/$p\"" "$dir/core/plugin/zplugin.go" || die "COREDNS_PLUGINS: no plugin $p in coredns $COREDNS_VERSION"
      printf '\t_ "github.com/coredns/coredns/plugin/%s"\n' "$p"
    done
    echo ")"
  } >"$src/core/plugin/zplugin.go"
  (cd "$src" && CGO_ENABLED=0 GOMAXPROCS=$PROCS GOFLAGS=-mod=mod $GO build -p "$PROCS" -trimpath -ldflags "-s -w" \
    -o "$coredns.tmp" .) || die "build coredns failed"
  mv "$coredns.tmp" "$coredns"
  rm -rf "$src"
  echo "k8s-build: coredns built in $(( $(date +%s) - start ))s" >&2
}
if [ ${#missing[@]} -eq 0 ]; then
  build_coredns
  echo "k8s-build: $K8S_VERSION binaries cached in $out, coredns in $(dirname "$coredns")" >&2
  exit 0
fi

if [ ! -f "$src/go.sum" ] || ! grep -q "k8s.io/kubernetes $K8S_VERSION" "$src/go.mod" 2>/dev/null; then
  echo "k8s-build: preparing the throwaway module $src for k8s.io/kubernetes $K8S_VERSION" >&2
  mod=$(GOFLAGS=-mod=mod $GO mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/^\t"GoMod": "\(.*\)",$/\1/p')
  [ -f "$mod" ] || die "download k8s.io/kubernetes@$K8S_VERSION: no go.mod"
  {
    echo "module toolpool.invalid/k8sbuild"
    echo
    sed -n 's/^go \(.*\)/go \1/p' "$mod"
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    echo "replace ("
    # Every ./staging/src/k8s.io/NAME replacement becomes k8s.io/NAME at its published version.
    sed -n 's#^\t\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*#\t\1 => \1 '"$staging"'#p' "$mod"
    echo ")"
  } >"$src/go.mod"
  cat >"$src/tools.go" <<'GO'
//go:build tools

package k8sbuild

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
GO
  (cd "$src" && GOFLAGS=-mod=mod $GO mod tidy -e) || die "go mod tidy in $src failed"
fi

# The binaries report their real version (helm and kubectl check it); the commit is not known from a module.
ldflags="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
  ldflags+=" -X $p.buildDate=1970-01-01T00:00:00Z"
done
for b in "${missing[@]}"; do
  start=$(date +%s)
  echo "k8s-build: building $b $K8S_VERSION (GOMAXPROCS=$PROCS, -p $PROCS)" >&2
  (cd "$src" && CGO_ENABLED=0 GOMAXPROCS=$PROCS $GO build -p "$PROCS" -trimpath -tags tools -ldflags "$ldflags" \
    -o "$out/$b.tmp" "k8s.io/kubernetes/cmd/$b") || die "build $b failed"
  mv "$out/$b.tmp" "$out/$b"
  echo "k8s-build: $b built in $(( $(date +%s) - start ))s" >&2
done
build_coredns
echo "k8s-build: $K8S_VERSION binaries in $out, coredns in $(dirname "$coredns")" >&2
