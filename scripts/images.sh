#!/usr/bin/env bash
# Builds the dispatcher, worker and nats images as OCI archives, without a Docker engine and without a
# public base image (make images):
#
#   dispatcher  the static dispatcher alone, /etc/passwd and /tmp: uid 65532, like distroless "nonroot"
#   worker      layer 1: a Debian 12 userland unpacked from Debian's own .debs (apt-get download, no
#                        maintainer scripts run): containerd, runc, tini, CA certificates, the shell and
#                        utilities the calls' containers see, and WORKER_EXTRA_PACKAGES;
#               layer 2: the static worker, toolpool-runner, toolpool-init and the entry point
#   nats        the static nats-server of the release go.mod pins, for the chart's built-in JetStream
#
#   scripts/images.sh                 build all three into $IMAGES_OUT (bin/images)
#   scripts/images.sh --check         build twice from the same inputs and fail unless the digests match
#   WORKER_GVISOR=1 scripts/images.sh  the worker image also carries gVisor's runsc (/usr/local/bin/runsc,
#                                     static, built from the Go module proxy at the version scripts/gvisor.sh
#                                     pins): its worker then offers the gvisor runtime
#
# Output, per image: NAME.oci.tar (load it with `ctr -n k8s.io images import NAME.oci.tar`, or push it with
# `crane push NAME.oci.tar REF` / `skopeo copy oci-archive:NAME.oci.tar docker://REF`), NAME.digest, and for
# the worker worker.debs.txt, the exact Debian packages and versions it holds. Images are named
# $IMAGE_REGISTRY/NAME:$IMAGE_TAG (toolpool.local/NAME:dev). Every time in them is SOURCE_DATE_EPOCH (0),
# so the same sources, Go toolchain and .debs give the same digests; a Debian point release changes the
# .debs, and so the worker's digest (worker.debs.txt says which).
# The binaries are built with CGO_ENABLED=0 -trimpath -buildvcs=false: static, reproducible. Needs root
# (the .debs' files keep their owners) and apt-get (Debian or a derivative).
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=${IMAGES_OUT:-bin/images}
REGISTRY=${IMAGE_REGISTRY:-toolpool.local}
TAG=${IMAGE_TAG:-dev}
EPOCH=${SOURCE_DATE_EPOCH:-0}
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/toolpool/images
GO=${GO:-go}
# The tools the calls' containers can run besides the base set below (the Dockerfile's EXTRA_PACKAGES).
WORKER_EXTRA_PACKAGES=${WORKER_EXTRA_PACKAGES:-git python3 jq diffutils patch procps less file xz-utils unzip}
# What the worker needs, and what a Debian image has without asking (Essential: yes packages apt does not
# pull in as dependencies).
WORKER_BASE_PACKAGES="base-files bash coreutils dash debianutils diffutils findutils grep gzip hostname libc-bin
  mawk sed tar util-linux containerd runc tini ca-certificates"
WORKER_GVISOR=${WORKER_GVISOR:-0}
VERSION=$(git describe --tags --always 2>/dev/null || echo dev)
REVISION=$(git rev-parse HEAD 2>/dev/null || echo unknown)

die() { printf 'images: %s\n' "$*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "run as root: the worker's Debian files must keep their owners (root, and a few others)"
command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null || die "needs apt-get and dpkg-deb (Debian 12 or a derivative)"
[[ $EPOCH =~ ^[0-9]+$ ]] || die "SOURCE_DATE_EPOCH=$EPOCH: want seconds since 1970"
[[ $WORKER_GVISOR =~ ^[01]$ ]] || die "WORKER_GVISOR=$WORKER_GVISOR: want 1 (runsc in the worker image) or 0"

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$OUT"

echo "images: building the tool and the static binaries" >&2
$GO -C deploy/images build -o "$WORK/images" .
build() { CGO_ENABLED=0 $GO build -trimpath -buildvcs=false -ldflags "-s -w" "$@"; }
build -o "$WORK/bin/" ./cmd/dispatcher ./cmd/worker ./cmd/toolpool-runner ./cmd/toolpool-init
# nats-server at the version go.mod requires: the release toolpool is tested against.
build -o "$WORK/bin/nats-server" github.com/nats-io/nats-server/v2
NATS_VERSION=$($GO list -m -f '{{.Version}}' github.com/nats-io/nats-server/v2)
if [ "$WORKER_GVISOR" = 1 ]; then
  # The version scripts/gvisor.sh pins (one source), built as it builds it: static, or runsc cannot re-execute
  # itself inside its chroot (scripts/gvisor.sh says why).
  GVISOR_VERSION=$(sed -n 's/^GVISOR_VERSION=\${GVISOR_VERSION:-\(.*\)}$/\1/p' scripts/gvisor.sh)
  [ -n "$GVISOR_VERSION" ] || die "WORKER_GVISOR=1: no GVISOR_VERSION pin found in scripts/gvisor.sh"
  echo "images: building gVisor's runsc $GVISOR_VERSION for the worker (a few minutes the first time)" >&2
  (cd "$WORK" && CGO_ENABLED=0 GOFLAGS= GOBIN="$WORK/gvisor" $GO install -trimpath \
    -ldflags "-s -w -X gvisor.dev/gvisor/runsc/version.version=$GVISOR_VERSION" "gvisor.dev/gvisor/runsc@$GVISOR_VERSION") ||
    die "WORKER_GVISOR=1: building runsc $GVISOR_VERSION failed"
fi

# labels TITLE DESCRIPTION: sets the array lbl to the -label flags of an image.
labels() {
  lbl=()
  local kv
  for kv in "org.opencontainers.image.title=$1" "org.opencontainers.image.description=$2" \
    "org.opencontainers.image.source=https://github.com/toolpool/toolpool" \
    "org.opencontainers.image.documentation=https://github.com/toolpool/toolpool/blob/main/docs/deploy.md" \
    "org.opencontainers.image.version=$VERSION" "org.opencontainers.image.revision=$REVISION" \
    "org.opencontainers.image.vendor=toolpool" "org.opencontainers.image.licenses=NOASSERTION"; do
    lbl+=(-label "$kv")
  done
}

# passwd ROOT: root and nonroot (65532), as distroless has them.
passwd() {
  mkdir -p "$1/etc" "$1/tmp"
  chmod 1777 "$1/tmp"
  printf 'root:x:0:0:root:/root:/bin/sh\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$1/etc/passwd"
  printf 'root:x:0:\nnonroot:x:65532:\n' >"$1/etc/group"
}

# --- worker layer 1: Debian's packages ------------------------------------------------------------------
debian_rootfs() { # debian_rootfs DIR LIST
  local dir=$1 list=$2 debs=$CACHE/debs
  mkdir -p "$debs" "$dir"
  : >"$WORK/empty-status"
  # What apt would install on an empty system: the packages asked for and their dependencies, no
  # recommends, each at the version apt's lists name now.
  simulate() {
    # shellcheck disable=SC2086
    apt-get -s install --no-install-recommends -o Dir::State::status="$WORK/empty-status" \
      $WORKER_BASE_PACKAGES $WORKER_EXTRA_PACKAGES >"$WORK/sim.txt" 2>&1
  }
  if ! simulate; then
    # A fresh machine has no package lists yet.
    apt-get update -qq >&2 || die "apt-get update failed"
    simulate || { cat "$WORK/sim.txt" >&2; die "apt cannot resolve the worker's packages: check WORKER_EXTRA_PACKAGES"; }
  fi
  sed -n 's/^Inst \([^ ]*\) (\([^ ]*\) .*/\1=\2/p' "$WORK/sim.txt" | LC_ALL=C sort >"$list"
  [ -s "$list" ] || die "apt resolved no package for the worker"
  echo "images: worker: $(wc -l <"$list") Debian packages (fetched once into $debs)" >&2
  local need=()
  while IFS== read -r pkg ver; do
    compgen -G "$debs/${pkg}_$(sed 's/:/%3a/' <<<"$ver")_*.deb" >/dev/null || need+=("$pkg=$ver")
  done <"$list"
  if [ ${#need[@]} -gt 0 ]; then
    (cd "$debs" && apt-get download -q -o APT::Sandbox::User=root "${need[@]}" >&2) || die "apt-get download failed for ${need[*]}"
  fi
  while IFS== read -r pkg ver; do
    local deb
    deb=$(compgen -G "$debs/${pkg}_$(sed 's/:/%3a/' <<<"$ver")_*.deb" | head -1)
    dpkg-deb -x "$deb" "$dir"
  done <"$list"
  # Merged /usr, as debootstrap makes Debian 12: /bin, /sbin and /lib* are links into /usr.
  local d
  for d in bin sbin lib lib32 lib64 libx32; do
    [ -e "$dir/$d" ] || [ -e "$dir/usr/$d" ] || continue
    if [ -d "$dir/$d" ] && [ ! -L "$dir/$d" ]; then
      mkdir -p "$dir/usr/$d"
      cp -a "$dir/$d/." "$dir/usr/$d/"
      rm -rf "${dir:?}/$d"
    fi
    ln -s "usr/$d" "$dir/$d"
  done
  # What maintainer scripts would have made and the calls need: sh, awk, the CA bundle.
  [ -e "$dir/usr/bin/sh" ] || ln -s dash "$dir/usr/bin/sh"
  [ -e "$dir/usr/bin/awk" ] || ln -s mawk "$dir/usr/bin/awk"
  mkdir -p "$dir/etc/ssl/certs"
  find "$dir/usr/share/ca-certificates" -name '*.crt' -print0 | LC_ALL=C sort -z | xargs -0 cat >"$dir/etc/ssl/certs/ca-certificates.crt"
  # Documentation is not needed at run time; the copyright files stay.
  find "$dir/usr/share/doc" -type f ! -name copyright -delete
  find "$dir/usr/share/doc" -type l -delete
  rm -rf "$dir/usr/share/man" "$dir/usr/share/info" "$dir/usr/share/lintian" "$dir/usr/share/locale"
  # Debian's containerd ships a config and a unit for the node's daemon: the worker writes its own.
  rm -f "$dir/etc/containerd/config.toml"
  passwd "$dir"
  mkdir -p "$dir/run" "$dir/var/lib" "$dir/proc" "$dir/sys" "$dir/dev" "$dir/root" "$dir/home/nonroot"
}

# --- the images ------------------------------------------------------------------------------------------
# image NAME FLAGS...: builds $out/NAME.oci.tar and NAME.digest, says its size.
image() {
  local name=$1 digest
  shift
  digest=$("$WORK/images" -name "$REGISTRY/$name:$TAG" -o "$out/$name.oci.tar" -epoch "$EPOCH" "$@") \
    || die "$name: the image was not built"
  echo "$digest" >"$out/$name.digest"
  printf 'images: %-10s %s  %s MiB  %s\n' "$name" "$digest" "$(( ($(stat -c %s "$out/$name.oci.tar") + 524287) / 1048576 ))" "$out/$name.oci.tar" >&2
}

build_all() { # build_all OUTDIR
  out=$1
  mkdir -p "$out"
  local r=$WORK/roots
  rm -rf "$r"
  mkdir -p "$r/dispatcher/usr/local/bin" "$r/worker-bin/usr/local/bin" "$r/nats/usr/local/bin"

  install -m 0755 "$WORK/bin/dispatcher" "$r/dispatcher/usr/local/bin/"
  passwd "$r/dispatcher"
  labels "toolpool dispatcher" "toolpool's HTTP API: authenticates, checks and queues AI agents' tool calls"
  image dispatcher -layer "$r/dispatcher" -user 65532:65532 -expose 8080/tcp -env PATH=/usr/local/bin:/usr/bin:/bin \
    -entrypoint /usr/local/bin/dispatcher -cmd --listen=0.0.0.0:8080 -cmd --data-dir=/tmp/toolpool "${lbl[@]}"

  debian_rootfs "$r/worker-debian" "$out/worker.debs.txt"
  install -m 0755 "$WORK/bin/worker" "$WORK/bin/toolpool-runner" "$WORK/bin/toolpool-init" "$r/worker-bin/usr/local/bin/"
  install -m 0755 deploy/docker/worker-entrypoint.sh "$r/worker-bin/usr/local/bin/toolpool-worker-entrypoint"
  if [ "$WORKER_GVISOR" = 1 ]; then install -m 0755 "$WORK/gvisor/runsc" "$r/worker-bin/usr/local/bin/"; fi
  labels "toolpool worker" "toolpool's worker: runs every AI agent tool call in a fresh containerd container"
  # Root is required (docs/deploy.md, why the worker is privileged); the calls run as 65532, no capabilities.
  # tini reaps containerd's shims and passes SIGTERM on, so the worker drains.
  image worker -layer "$r/worker-debian" -layer "$r/worker-bin" -user 0:0 -expose 9091/tcp \
    -env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    -entrypoint /usr/bin/tini -entrypoint -- -entrypoint /usr/local/bin/toolpool-worker-entrypoint \
    -cmd --listen=0.0.0.0:9091 "${lbl[@]}"

  install -m 0755 "$WORK/bin/nats-server" "$r/nats/usr/local/bin/"
  passwd "$r/nats"
  labels "nats-server $NATS_VERSION" "nats-server built from github.com/nats-io/nats-server/v2 $NATS_VERSION for toolpool's built-in JetStream"
  image nats -layer "$r/nats" -user 1000:1000 -expose 4222/tcp -expose 6222/tcp -expose 8222/tcp \
    -env PATH=/usr/local/bin:/usr/bin:/bin -entrypoint /usr/local/bin/nats-server "${lbl[@]}"
}

if [ "${1:-}" = --check ]; then
  build_all "$WORK/first"
  build_all "$OUT"
  for n in dispatcher worker nats; do
    cmp -s "$WORK/first/$n.digest" "$OUT/$n.digest" || die "$n: two builds from the same inputs differ: $(cat "$WORK/first/$n.digest") and $(cat "$OUT/$n.digest")"
    cmp -s "$WORK/first/$n.oci.tar" "$OUT/$n.oci.tar" || die "$n: two builds give the same digest but different archives"
  done
  echo "images: reproducible: two builds gave the same digests and the same archives" >&2
elif [ $# -gt 0 ]; then
  die "unknown argument $1: scripts/images.sh [--check]"
else
  build_all "$OUT"
fi
