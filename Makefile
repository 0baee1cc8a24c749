# toolpool: `make run` starts the whole stack on 127.0.0.1:8080; `make test` runs every test.
SHELL := /bin/bash
GO ?= go
BIN := bin
GOFLAGS_BUILD := -trimpath -ldflags "-s -w"
PKGS := ./...
TEST_TIMEOUT ?= 40m
# TOOLPOOL_GVISOR=1 makes `make run` install gVisor (once) and run every call under it.
# make test builds gVisor when it is missing (scripts/gvisor.sh) and runs the gVisor tier: under CI=true a
# failing build or a missing runsc fails make test. TOOLPOOL_GVISOR=0 make test is a developer's opt-out: no
# build and no gVisor tier, said loudly at the start and the end (the tests that need runsc then run only
# where it is installed, and skip, saying so, elsewhere); CI=true refuses it.
TOOLPOOL_GVISOR ?=
export TOOLPOOL_GVISOR
# GVISOR_PKGS hold every test of the gVisor tier.
GVISOR_PKGS := ./internal/sandbox/containerd/ ./test/e2e/
# The gVisor tier: the escape suite, the sandbox's runtime and leak tests, and the tools and the whole path end
# to end, under gVisor (TOOLPOOL_TEST_RUNTIME=gvisor; docs/security.md says what it leaves to the runc tier, and
# why). make test runs all of it, the escape suite through scripts/escape-results.sh (runc and gVisor side by
# side): nothing is cut for time. Its time on 2 cores is in docs/performance.md (make test).
GVISOR_TESTS := ^(TestEscape|TestRun|TestTimeoutKillsEverything|TestNoLeaks|TestLeakCheckSeesALiveCall|TestToolsInContainers|TestEndToEnd|TestEgress)$$
# The tests of the runtime choice that need gVisor installed, under the default runtime (runc). make test runs
# them in its pass over CONTAINER_PKGS.
GVISOR_SELECTION_TESTS := ^(TestRuntimeSelection|TestGVisorMissing|TestTenantRuntime)$$
# ESCAPE_IMAGE_SKIP are the escape suite's cases that make test leaves out when it runs the suite on an
# OCI image (TOOLPOOL_TEST_IMAGE=1, under runc and gVisor): the resource limits (cgroup and rlimits, the same
# whatever the root) and the output flood, which take most of the suite's time. make test-escape runs every
# case on an image. docs/images.md has both times.
ESCAPE_IMAGE_SKIP := ^TestEscape$$/^(output_flood|fork_bomb|cpu_quota|memory_hog|pids_limit|open_files_limit|fill_the_workspace_with_one_file|fill_the_workspace_with_many_files)$$
# GVISOR_OFF is non-empty under TOOLPOOL_GVISOR=0.
GVISOR_OFF := $(filter 0,$(TOOLPOOL_GVISOR))
GVISOR_SKIPPED := make test: TOOLPOOL_GVISOR=0: gVisor is NOT built and NOT tested: the escape suite runs under runc only, the rest of the gVisor tier (GVISOR_TESTS: the leak tests, the tools and the whole path end to end) does not run, and the tests that need runsc (TestRuntimeSelection, TestTenantRuntime) run only where it is installed, skipping elsewhere

# CONTAINER_PKGS are the packages whose tests start containers. make test runs them after the others, one
# package at a time (-p 1): go test otherwise runs as many packages at once as there are CPUs, and the escape
# suite's fork bomb, 2 GiB output flood and memory hog would share the cores with the end-to-end suite's
# timing checks; the cluster test's three NATS servers, two dispatchers and three workers with theirs;
# test/oracle, the policy oracle's corpus run in containers under strace; test/mcp, which also installs
# the MCP TypeScript clients with npm (Node.js 20); test/clients, the OpenAPI contract checked against
# real answers of every operation and the Python and TypeScript clients; and test/console, the web
# console in headless Chromium.
CONTAINER_PKGS := ./internal/sandbox/containerd/... ./test/e2e/... ./test/cluster/... ./test/oracle/... ./test/mcp/... ./test/clients/... ./test/console/...
# FUZZTIME is how long make test (and make fuzz) runs each fuzz target.
FUZZTIME ?= 20s

.PHONY: all deps deps-test gvisor gvisor-for-test build images run soak test test-k8s test-gvisor test-unit test-escape fuzz mutants bench lint helm fmt clean

all: build

## deps: install what make run needs from Debian when missing: containerd, runc, crun, git, curl (needs root)
deps:
	@bash scripts/deps.sh

## deps-test: and what the tests need (promtool, Node.js, strace, pytest, chromium, versitygw; scripts/deps.sh)
deps-test:
	@bash scripts/deps.sh test

## build: static binaries in bin/ (the worker mounts toolpool-runner and toolpool-init, found beside it, into the calls' containers)
build:
	CGO_ENABLED=0 $(GO) build $(GOFLAGS_BUILD) -o $(BIN)/ ./cmd/dispatcher ./cmd/worker ./cmd/toolpool-runner ./cmd/toolpool-init ./cmd/toolpool

## images: the dispatcher, worker and nats images as reproducible OCI archives in bin/images, without a Docker
## engine or a public base image (scripts/images.sh; root and apt-get; IMAGES_CHECK=1 builds twice and compares)
images:
	@bash scripts/images.sh $(if $(IMAGES_CHECK),--check)

## gvisor: build gVisor's runsc and its shim from the Go module proxy into /usr/local, unless installed (a few minutes)
gvisor:
	@bash scripts/gvisor.sh

## run: install what is missing, build, and run dispatcher (embedded NATS) and worker (private containerd)
run: deps build
	@if [ "$(TOOLPOOL_GVISOR)" = 1 ]; then bash scripts/gvisor.sh; fi
	@bash scripts/run.sh

## test: every test, unit and integration, against real NATS and containerd, with the race detector; gVisor
## is built first when missing, the escape suite runs under runc and gVisor side by side, and the rest of the
## gVisor tier (GVISOR_TESTS) under gVisor; then every fuzz target for FUZZTIME. TOOLPOOL_GVISOR=0 leaves
## gVisor out, loudly (refused under CI=true)
test: deps-test lint gvisor-for-test
	$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) $$($(GO) list $(PKGS) | grep -vxF -f <($(GO) list $(CONTAINER_PKGS)))
	$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) -p 1 $(if $(GVISOR_OFF),,-skip '^TestEscape$$') $(CONTAINER_PKGS)
ifeq ($(GVISOR_OFF),)
	GOTESTFLAGS='-race -timeout $(TEST_TIMEOUT)' bash scripts/escape-results.sh
	TOOLPOOL_TEST_IMAGE=1 ESCAPE_SKIP='$(ESCAPE_IMAGE_SKIP)' GOTESTFLAGS='-race -timeout $(TEST_TIMEOUT)' bash scripts/escape-results.sh
	TOOLPOOL_TEST_RUNTIME=gvisor $(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) -p 1 -run '$(GVISOR_TESTS)' -skip '^TestEscape$$' $(GVISOR_PKGS)
endif
ifneq ($(GVISOR_OFF),)
	TOOLPOOL_TEST_IMAGE=1 $(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) -run '^TestEscape$$' -skip '$(ESCAPE_IMAGE_SKIP)' ./internal/sandbox/containerd/
endif
	@FUZZTIME=$(FUZZTIME) bash scripts/fuzz.sh
ifneq ($(GVISOR_OFF),)
	@echo "$(GVISOR_SKIPPED)" >&2
endif

# gvisor-for-test: make test's first step for gVisor: build it when missing (a failure fails make test), or,
# under TOOLPOOL_GVISOR=0, say what make test leaves out; CI=true refuses that opt-out.
gvisor-for-test:
ifeq ($(GVISOR_OFF),)
	@bash scripts/gvisor.sh
else
	@if [ "$$CI" = true ]; then echo "make test: TOOLPOOL_GVISOR=0 under CI=true: CI must build gVisor and run its tier" >&2; exit 1; fi
	@echo "$(GVISOR_SKIPPED)" >&2
endif

## test-k8s: the Helm chart on a one-node Kubernetes this starts (kube-apiserver, controller manager, scheduler,
## kubelet, kube-proxy built once from k8s.io/kubernetes; etcd, CNI from Debian; CoreDNS): helm install, calls
## through the Service, a worker killed mid-call, helm upgrade under load, helm uninstall (scripts/test-k8s.sh;
## root). Not in make test: docs/deploy.md has its time
test-k8s:
	@bash scripts/test-k8s.sh

## test-gvisor: install gVisor (once), then only what make test runs with it: the runtime-choice tests that
## need it and the whole gVisor tier (GVISOR_TESTS with TOOLPOOL_TEST_RUNTIME=gvisor)
test-gvisor: deps-test gvisor
	$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) -p 1 -run '$(GVISOR_SELECTION_TESTS)' $(GVISOR_PKGS)
	TOOLPOOL_TEST_RUNTIME=gvisor $(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) -p 1 -run '$(GVISOR_TESTS)' $(GVISOR_PKGS)

## test-unit: the tests that need neither root nor containerd (-short skips the others, CI=true or not)
test-unit:
	$(GO) test -race -count=1 -short $(PKGS)

## test-escape: the escape suite again, against the warm pool's containers, under crun, and whole on an OCI
## image under runc and gVisor (make test runs it cold under runc and gVisor, and a subset of it on an image)
test-escape: deps-test gvisor
	TOOLPOOL_TEST_IMAGE=1 GOTESTFLAGS='-race -timeout $(TEST_TIMEOUT)' bash scripts/escape-results.sh
	TOOLPOOL_TEST_POOL=1 $(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) -run '^TestEscape$$' ./internal/sandbox/containerd/
	@# The crun tier skips, saying why, where crun cannot run; go test would print only "ok" for that.
	@log=$$(mktemp); echo "escape suite under crun:"; \
	if TOOLPOOL_TEST_RUNTIME_BINARY=crun $(GO) test -v -race -count=1 -timeout $(TEST_TIMEOUT) -run '^TestEscape$$' ./internal/sandbox/containerd/ > $$log 2>&1; then \
	  if grep -B1 '^--- SKIP: TestEscape ' $$log; then echo "the escape suite did NOT run under crun (why: above)"; \
	  else grep -E '^(--- PASS: TestEscape |ok )' $$log; fi; \
	else cat $$log; rm -f $$log; exit 1; fi; rm -f $$log

## fuzz: every fuzz target for FUZZTIME (default 20s) each; a failing input lands in testdata/fuzz/ to commit
fuzz:
	@FUZZTIME=$(FUZZTIME) bash scripts/fuzz.sh

## soak: the chaos soak on the three-server cluster for SOAK (default 5m): steady load while NATS servers
## (the calls stream's, records bucket's and output store's leaders among them), workers and a dispatcher
## are killed at random and a server is frozen; fails on any broken guarantee and writes its table to
## SOAK_REPORT (docs/reliability.md). SOAK_SEED replays a run's fault schedule
SOAK ?= 5m
SOAK_REPORT ?= soak-report.md
soak: deps-test
	TOOLPOOL_SOAK=$(SOAK) TOOLPOOL_SOAK_SEED=$(SOAK_SEED) TOOLPOOL_SOAK_REPORT=$(abspath $(SOAK_REPORT)) $(GO) test -count=1 -v -run '^TestSoak$$' -timeout 60m ./test/cluster/

## mutants: mutation testing (gremlins, built once from the Go module proxy) of policy, deniedpath, the
## in-container tools, the queue's lease and records, the worker's fencing, workspace archives and quotas
## and the dispatcher's admission, one package at a time; the kill rate per package against
## scripts/mutants-baseline.txt (docs/reliability.md). Not in make test: it runs a package's tests once per
## mutant. MUTANTS=name... picks targets, MUTANTS_TIMEOUT (30m) bounds each
MUTANTS ?=
mutants:
	@bash scripts/mutants.sh $(MUTANTS)

## bench: sandbox, live-output, workspace-checkpoint and end-to-end benchmarks (speed and memory targets are measured here; the
## live flood prints 200 MB), restore throughput of 100 MiB (JetStream, S3), then on the three-server cluster: the failover of a
## 100 MB workspace (kill -9 of its home, lease 2s) and `toolpool bench` at concurrency 16 for CLUSTER_BENCH (30s) with three workers
CLUSTER_BENCH ?= 30s
bench: deps-test
	$(GO) test -run '^$$' -bench . -benchtime 100x -timeout 30m ./internal/sandbox/containerd/ ./internal/queue/jetstream/ ./test/e2e/
	$(GO) test -run '^$$' -bench 'SaveOneFileChange|SnapshotForkRestore' -benchtime 100x -timeout 30m ./internal/checkpoint/
	$(GO) test -run '^$$' -bench 'Workspace100k' -benchtime 1x -timeout 60m ./internal/checkpoint/
	$(GO) test -run '^$$' -bench 'RestoreThroughput|Collect' -benchtime 3x -timeout 30m ./internal/checkpoint/
	TOOLPOOL_FAILOVER_BENCH=1 $(GO) test -count=1 -v -run '^TestFailoverBench$$' -timeout 30m ./test/cluster/
	TOOLPOOL_CLUSTER_BENCH=$(CLUSTER_BENCH) $(GO) test -count=1 -v -run '^TestClusterBench$$' -timeout 30m ./test/cluster/

## lint: go vet, gofmt, the metrics and alert rules, the Helm chart (make test runs it first)
lint:
	$(GO) vet $(PKGS)
	@bash scripts/check-fmt.sh
	@bash scripts/check-commits.sh
	@bash scripts/check-observability.sh
	@bash scripts/check-helm.sh

## helm: lint, render and strictly validate the Helm chart; lint the Dockerfiles (helm is built once from the Go module proxy)
helm:
	@bash scripts/check-helm.sh

fmt:
	gofmt -w $$(git ls-files '*.go')

clean:
	rm -rf $(BIN) .data
