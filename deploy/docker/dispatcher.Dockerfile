# syntax=docker/dockerfile:1
# toolpool dispatcher: a static binary on distroless, running as uid 65532.
#
#   docker build -f deploy/docker/dispatcher.Dockerfile -t ghcr.io/toolpool/dispatcher:0.1.0 \
#     --build-arg VERSION=0.1.0 --build-arg REVISION=$(git rev-parse HEAD) .
ARG GO_IMAGE=golang:1.26-bookworm
ARG BASE_IMAGE=gcr.io/distroless/static-debian12:nonroot

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
    go build -trimpath -buildvcs=false -ldflags "-s -w" -o /out/dispatcher ./cmd/dispatcher

FROM ${BASE_IMAGE}
ARG BASE_IMAGE
ARG VERSION=dev
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.title="toolpool dispatcher" \
      org.opencontainers.image.description="toolpool's HTTP API: authenticates, checks and queues AI agents' tool calls" \
      org.opencontainers.image.source="https://github.com/toolpool/toolpool" \
      org.opencontainers.image.url="https://github.com/toolpool/toolpool" \
      org.opencontainers.image.documentation="https://github.com/toolpool/toolpool/blob/main/docs/deploy.md" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.vendor="toolpool" \
      org.opencontainers.image.licenses="NOASSERTION" \
      org.opencontainers.image.base.name="${BASE_IMAGE}"
COPY --from=build /out/dispatcher /usr/local/bin/dispatcher
# distroless "nonroot": uid and gid 65532, no shell, no package manager.
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/dispatcher"]
CMD ["--listen=0.0.0.0:8080", "--data-dir=/tmp/toolpool"]
