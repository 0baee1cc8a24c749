# toolpool: `make run` starts the whole stack on 127.0.0.1:8080; `make test` runs every test.
SHELL := /bin/bash
GO ?= go
BIN := bin
GOFLAGS_BUILD := -trimpath -ldflags "-s -w"
PKGS := ./...
TEST_TIMEOUT ?= 40m

.PHONY: all deps build run test test-unit bench lint helm fmt clean

all: build

## deps: install containerd and runc from Debian when missing (needs root)
deps:
	@bash scripts/deps.sh

## build: static binaries in bin/ (the worker binary is also the in-container tool runner)
build:
	CGO_ENABLED=0 $(GO) build $(GOFLAGS_BUILD) -o $(BIN)/ ./cmd/dispatcher ./cmd/worker ./cmd/toolpool

## run: install what is missing, build, and run dispatcher (embedded NATS) and worker (private containerd)
run: deps build
	@bash scripts/run.sh

## test: every test, unit and integration, against real NATS and containerd, with the race detector
test: deps
	$(GO) vet $(PKGS)
	@bash scripts/check-fmt.sh
	@bash scripts/check-observability.sh
	@bash scripts/check-helm.sh
	$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) $(PKGS)

## test-unit: the tests that need neither root nor containerd
test-unit:
	$(GO) test -race -count=1 -short $(PKGS)

## bench: sandbox and end-to-end benchmarks (speed and memory targets are measured here)
bench: deps
	$(GO) test -run '^$$' -bench . -benchtime 100x -timeout 30m ./internal/sandbox/containerd/ ./test/e2e/

lint:
	$(GO) vet $(PKGS)
	@bash scripts/check-fmt.sh
	@bash scripts/check-observability.sh
	@bash scripts/check-helm.sh

## helm: lint, render and strictly validate the Helm chart; lint the Dockerfiles (helm is built once from the Go module proxy)
helm:
	@bash scripts/check-helm.sh

fmt:
	gofmt -w $$(git ls-files '*.go')

clean:
	rm -rf $(BIN) .data
