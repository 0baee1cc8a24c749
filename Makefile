# toolpool: `make run` starts the whole stack on 127.0.0.1:8080; `make test` runs every test.
SHELL := /bin/bash
GO ?= go
BIN := bin
GOFLAGS_BUILD := -trimpath -ldflags "-s -w"
PKGS := ./...
TEST_TIMEOUT ?= 40m
# TOOLPOOL_GVISOR=1 makes `make run` install gVisor (once) and run every call under it.
TOOLPOOL_GVISOR ?=
export TOOLPOOL_GVISOR
# TEST_GVISOR is TOOLPOOL_GVISOR for make test: the tests that need gVisor installed (the runtime choice
# on real containers) run when it is installed, and skip, saying so, when it is not (TOOLPOOL_GVISOR=0).
# make test never builds gVisor: from a cold cache that alone can take longer than the rest of make test
# (docs/security.md). make test-gvisor installs it and runs everything that needs it.
TEST_GVISOR = $(or $(TOOLPOOL_GVISOR),$(if $(shell bash scripts/gvisor.sh --check && echo y),1,0))
# The gVisor tier: the escape suite, the sandbox's runtime and leak tests and the tools end to end, under
# gVisor (docs/security.md says what it leaves to the runc tier, and why).
GVISOR_TESTS := ^(TestEscape|TestRun|TestTimeoutKillsEverything|TestNoLeaks|TestLeakCheckSeesALiveCall|TestToolsInContainers|TestEndToEnd|TestEgress)$$
# The tests of the runtime choice that need gVisor installed, under the default runtime (runc).
GVISOR_SELECTION_TESTS := ^(TestRuntimeSelection|TestGVisorMissing|TestTenantRuntime)$$

# CONTAINER_PKGS are the packages whose tests start containers. make test runs them after the others, one
# package at a time (-p 1): go test otherwise runs as many packages at once as there are CPUs, and the escape
# suite's fork bomb, 2 GiB output flood and memory hog would share the cores with the end-to-end suite's
# timing checks; the cluster test's three NATS servers, two dispatchers and three workers with theirs;
# test/oracle, the policy oracle's corpus run in containers under strace; and test/mcp, which also installs
# the MCP TypeScript clients with npm (Node.js 20).
CONTAINER_PKGS := ./internal/sandbox/containerd/... ./test/e2e/... ./test/cluster/... ./test/oracle/... ./test/mcp/...
# FUZZTIME is how long make test (and make fuzz) runs each fuzz target.
FUZZTIME ?= 20s

.PHONY: all deps gvisor build run test test-gvisor test-unit test-escape fuzz bench lint helm fmt clean

all: build

## deps: install containerd and runc from Debian when missing (needs root)
deps:
	@bash scripts/deps.sh

## build: static binaries in bin/ (the worker binary is also the in-container tool runner)
build:
	CGO_ENABLED=0 $(GO) build $(GOFLAGS_BUILD) -o $(BIN)/ ./cmd/dispatcher ./cmd/worker ./cmd/toolpool

## gvisor: build gVisor's runsc and its shim from the Go module proxy into /usr/local, unless installed (a few minutes)
gvisor:
	@bash scripts/gvisor.sh

## run: install what is missing, build, and run dispatcher (embedded NATS) and worker (private containerd)
run: deps build
	@if [ "$(TOOLPOOL_GVISOR)" = 1 ]; then bash scripts/gvisor.sh; fi
	@bash scripts/run.sh

## test: every test, unit and integration, against real NATS and containerd, with the race detector; then
## every fuzz target for FUZZTIME. gVisor's tier is make test-gvisor.
test: deps lint
	TOOLPOOL_GVISOR=$(TEST_GVISOR) $(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) $$($(GO) list $(PKGS) | grep -vxF -f <($(GO) list $(CONTAINER_PKGS)))
	TOOLPOOL_GVISOR=$(TEST_GVISOR) $(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) -p 1 $(CONTAINER_PKGS)
	@FUZZTIME=$(FUZZTIME) bash scripts/fuzz.sh

## test-gvisor: install gVisor (once), then the runtime-choice tests that need it and the gVisor tier
## (GVISOR_TESTS with TOOLPOOL_TEST_RUNTIME=gvisor)
test-gvisor: deps gvisor
	TOOLPOOL_GVISOR=1 $(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) -p 1 -run '$(GVISOR_SELECTION_TESTS)' $(CONTAINER_PKGS)
	TOOLPOOL_GVISOR=1 TOOLPOOL_TEST_RUNTIME=gvisor $(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) -p 1 -run '$(GVISOR_TESTS)' $(CONTAINER_PKGS)

## test-unit: the tests that need neither root nor containerd (-short skips the others, CI=true or not)
test-unit:
	$(GO) test -race -count=1 -short $(PKGS)

## test-escape: the escape suite again, against the warm pool's containers and under crun (make test runs it
## cold under runc)
test-escape: deps
	TOOLPOOL_TEST_POOL=1 $(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) -run '^TestEscape$$' ./internal/sandbox/containerd/
	TOOLPOOL_TEST_RUNTIME_BINARY=crun $(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) -run '^TestEscape$$' ./internal/sandbox/containerd/

## fuzz: every fuzz target for FUZZTIME (default 20s) each; a failing input lands in testdata/fuzz/ to commit
fuzz:
	@FUZZTIME=$(FUZZTIME) bash scripts/fuzz.sh

## bench: sandbox and end-to-end benchmarks (speed and memory targets are measured here), then `toolpool
## bench` at concurrency 16 for CLUSTER_BENCH (30s) against the three-server cluster with three workers
CLUSTER_BENCH ?= 30s
bench: deps
	$(GO) test -run '^$$' -bench . -benchtime 100x -timeout 30m ./internal/sandbox/containerd/ ./test/e2e/
	TOOLPOOL_CLUSTER_BENCH=$(CLUSTER_BENCH) $(GO) test -count=1 -v -run '^TestClusterBench$$' -timeout 30m ./test/cluster/

## lint: go vet, gofmt, the metrics and alert rules, the Helm chart (make test runs it first)
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
