# syntax=docker/dockerfile:1
# toolpool worker: the static worker binary with containerd and runc from Debian.
#
# The worker runs as root: it starts containerd (or talks to the node's) and runc containers. Beside it,
# toolpool-runner (the built-in tools) and toolpool-init (the warm pool's init) are mounted read-only into
# the calls' containers. The calls' containers see this
# image's /usr, /bin, /lib and a few /etc entries read-only as their root filesystem, so the programs an
# agent may run (git, python3, ...) are the ones installed here: add yours with EXTRA_PACKAGES.
#
#   docker build -f deploy/docker/worker.Dockerfile -t ghcr.io/toolpool/worker:0.1.0 \
#     --build-arg VERSION=0.1.0 --build-arg REVISION=$(git rev-parse HEAD) .
ARG GO_IMAGE=golang:1.26-bookworm
ARG BASE_IMAGE=debian:bookworm-slim

FROM --platform=$BUILDPLATFORM ${GO_IMAGE} AS build
ARG TARGETOS
ARG TARGETARCH
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY cmd/ cmd/
COPY internal/ internal/
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=${TARGETOS:-linux} GOARCH=${TARGETARCH} \
    go build -trimpath -buildvcs=false -ldflags "-s -w" -o /out/ ./cmd/worker ./cmd/toolpool-runner ./cmd/toolpool-init

FROM ${BASE_IMAGE}
# The tools the calls' containers can run. bash, coreutils, grep, sed and findutils come with the base.
ARG EXTRA_PACKAGES="git python3 jq diffutils patch procps less file xz-utils unzip"
RUN set -eux; \
    apt-get update; \
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      containerd runc tini ca-certificates ${EXTRA_PACKAGES}; \
    rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*; \
    # Debian's containerd package ships a systemd unit and a config for the node's daemon: the worker
    # writes its own config for its private containerd and needs neither.
    rm -f /etc/containerd/config.toml
# The worker finds toolpool-runner and toolpool-init beside itself and mounts them into the calls' containers.
COPY --from=build /out/worker /out/toolpool-runner /out/toolpool-init /usr/local/bin/
COPY deploy/docker/worker-entrypoint.sh /usr/local/bin/toolpool-worker-entrypoint
ARG BASE_IMAGE
ARG VERSION=dev
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.title="toolpool worker" \
      org.opencontainers.image.description="toolpool's worker: runs every AI agent tool call in a fresh containerd container" \
      org.opencontainers.image.source="https://github.com/toolpool/toolpool" \
      org.opencontainers.image.url="https://github.com/toolpool/toolpool" \
      org.opencontainers.image.documentation="https://github.com/toolpool/toolpool/blob/main/docs/deploy.md" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.vendor="toolpool" \
      org.opencontainers.image.licenses="NOASSERTION" \
      org.opencontainers.image.base.name="${BASE_IMAGE}"
# Root is required (see above); the calls themselves run as uid 65532 with every capability dropped.
USER 0:0
EXPOSE 9091
# tini reaps containerd's shims, which the kernel re-parents to PID 1, and passes SIGTERM to the worker,
# which then drains: no new calls, running ones finish within the pod's grace period.
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/toolpool-worker-entrypoint"]
CMD ["--listen=0.0.0.0:9091"]
