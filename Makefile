# Tollgate. Two commands do the set-up: `make run` and `make test`.
GO        ?= go
BIN       := bin
PKGS      := ./...
TEST_TIMEOUT ?= 9m

.PHONY: run build build-all test test-go test-long test-deps screenshots test-helm test-clients lint vet check unit e2e fuzz bench bench-cluster bench-layout bench-footprint bench-profile microbench soak soak-retention clean chaos cluster cluster-test

## run: start the all-in-one dev process (embedded nats-server with JetStream in ./.tollgate, all four stages)
run: build
	$(BIN)/tollgate dev

## build: the one binary tollgate (the operator CLI, and every component as a subcommand: tollgate ingest,
## executor, approver, redriver, planner, gateway, slack, discord), tollgate-bench and a nats-server (for the
## multi-process setup) into ./bin (tollgate version names the commit: the go command's VCS stamp, else REVISION
## linked in here)
REVISION ?= $(shell git describe --always --dirty --exclude '*' 2>/dev/null)
LDFLAGS  := -X main.buildRevision=$(REVISION)
build:
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN)/ ./cmd/tollgate ./cmd/tollgate-bench
	$(GO) build -o $(BIN)/nats-server github.com/nats-io/nats-server/v2

## build-all: also each component's own binary (bin/ingest, bin/gateway, ...: the same code as tollgate's subcommands;
## tollgate and tollgate-bench are make build's, not written again while tests may be running them)
COMPONENTS := ingest executor approver redriver planner gateway slack discord
build-all: build
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN)/ $(addprefix ./cmd/,$(COMPONENTS))

## test: two phases side by side (make -j$(TEST_JOBS) -k): test-go (every Go test of the module under -race and
## -short: unit, integration on an embedded server, end-to-end with real processes) and test-clients. Each phase's
## output is printed as one block when it ends (-Otarget), its commands first, so a failure reads as that phase's,
## and make names the phase that failed; both run to their end, and make test fails if either did. The binaries are
## built once (make build-all) and the tests that run them (e2e, chaos, bench, deploy, Slack, Discord, cmd, docs)
## take them from TOLLGATE_TEST_BIN; without it each builds its own.
## What make test leaves out is make check (each its own target too; .ci/run runs make test, then make check):
## test-long (the long tests), test-helm (the Helm chart's module) and lint (go vet, staticcheck). Measured 2026-12-04 on 2 cores from an
## empty build cache (a fresh CI machine): build-all 206 s of wall time (389 CPU-s), the vet phase 289 s
## (557 CPU-s: go vet and staticcheck compile and analyse every dependency, the Helm chart's Kubernetes ones too),
## test-helm 251 s (486 CPU-s: Helm and Kubernetes compiled under -race for a render test); with them make test
## took about 11 minutes on a fresh machine and 9 to 11 after a change to a package most others import.
TEST_JOBS ?= 4
test:
	@$(MAKE) --no-print-directory -k -j$(TEST_JOBS) -Otarget test-go test-clients

## check: what make test leaves out: the long tests, the Helm chart's test and lint, one after another, each to
## its end (-k); .ci/run runs it after make test
CHECK_TARGETS := test-long test-helm lint
check:
	@$(MAKE) --no-print-directory -k $(CHECK_TARGETS)

## test-go: only the Go tests of the module under -race and -short, TEST_P test binaries at a time; GOTESTFLAGS
## adds flags (-v, -json, -run). -short leaves out the long tests: the short chaos runs, the benchmark's smoke
## runs, the three-node clusters and the chat transports' processes (make test-long runs them; .ci/run runs
## both). TEST_P is 4, twice go's default on 2 cores, because the tests wait far more than they compute.
## Measured 2026-12-04 with -short (go test -exec /usr/bin/time): go test alone 302 s of wall time, 468 CPU-s, of
## which the 57 race test binaries ran 324 CPU-s (web 49, gateway 32, pipelinetest 31, redriver 17, planner 15,
## executor 14, then 51 packages under 14) and linking them about 144; without -short 346 s and 544 CPU-s.
## make test (this and test-clients) with nothing changed since its last run: 316 s, 491 CPU-s; right after a
## change to the approver (it and every test package importing internal/pipelinetest compiled and linked
## again): 465 s, 798 CPU-s; from an empty build cache, build-all 206 s then test-go 469 s (793 CPU-s). Waits
## are deadlines scaled by TOLLGATE_TEST_TIMEOUT_SCALE (2 in .ci/run), so a loaded machine lengthens a failing
## wait, never a passing test. Measured 2026-12-05 (go test -json, build cache warm): 329 s in package order,
## where transport/gateway and transport/web (about 100 s each) start last, and 333 s with the 12 slowest packages
## listed first: the run is bound by the 2 cores, so only less CPU shortens it, not another order.
TEST_P ?= 4
GOTESTFLAGS ?=
test-go: test-deps build-all
	TOLLGATE_TEST_BIN=$(CURDIR)/$(BIN) $(GO) test -race -short -count=1 -p $(TEST_P) -timeout $(TEST_TIMEOUT) $(GOTESTFLAGS) $(PKGS)

## test-long: the packages whose tests skip under -short (LONG_PKGS), whole and without -short: the short chaos
## runs, the benchmark's smoke runs, the three-node clusters, the chat transports' processes. Measured: 79 s of wall
## time, 127 CPU-s (their quick tests run again here). TestEveryLongTestIsInTestLong keeps LONG_PKGS whole: a test
## that calls testing.Short() outside them fails make test.
LONG_PKGS := ./internal/chaos ./internal/bench ./deploy/nats ./pipeline/store ./jetstream/topology ./transport/discord ./transport/slack
test-long: test-deps build-all
	TOLLGATE_TEST_BIN=$(CURDIR)/$(BIN) $(GO) test -race -count=1 -p $(TEST_P) -timeout $(TEST_TIMEOUT) $(GOTESTFLAGS) $(LONG_PKGS)

## test-helm: the Helm chart's render test (deploy/helm: a module of its own, so that Helm's and
## Kubernetes' dependencies stay out of go.mod)
test-helm: build
	cd deploy/helm && TOLLGATE_TEST_BIN=$(CURDIR)/$(BIN) $(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) ./...

## test-deps: the npm packages that tests run as real third-party programs (the Node tool service example, the MCP
## filesystem server), installed once from their lock files; without npm those tests skip, and fail under CI=true
NPM_DIRS := examples/toolservice-node tools/mcptool/testdata/npm transport/gateway/testdata/npm transport/web/testdata/npm clients/typescript examples/agent-openai
test-deps:
	@for d in $(NPM_DIRS); do \
		[ -d $$d/node_modules ] && continue; \
		if command -v npm >/dev/null 2>&1; then npm ci --prefix $$d --no-audit --no-fund || exit 1; \
		else echo "npm not found: the tests that run $$d skip (and fail under CI=true)"; fi; \
	done

## screenshots: regenerate docs/img's inbox screenshots (inbox.png, inbox-card.png, preview.png, turn.png) with the
## browser tests
screenshots:
	TOLLGATE_SCREENSHOTS=$(CURDIR)/docs/img $(GO) test -count=1 -run 'TestTriageInARealBrowser|TestInboxInARealBrowser|TestPreviewInARealBrowser' ./transport/web/

## test-clients: the Python and TypeScript clients' tests (clients/) and the two agent examples (examples/agent-python,
## examples/agent-openai), each against a real `tollgate dev` (bin/tollgate); without python3 or node they skip, and
## fail under CI=true
test-clients: test-deps build
	@export TOLLGATE_BIN=$(CURDIR)/$(BIN)/tollgate; \
	if command -v python3 >/dev/null 2>&1; then \
		(cd clients/python && python3 -m unittest discover -s tests -t .) || exit 1; \
		(cd examples/agent-python && python3 -m unittest discover -s . -p 'test_*.py') || exit 1; \
	elif [ "$$CI" = true ]; then echo "python3 not found: the Python client's tests must run in CI" >&2; exit 1; \
	else echo "python3 not found: the Python client's tests skip (and fail under CI=true)"; fi; \
	if command -v node >/dev/null 2>&1; then \
		(cd clients/typescript && node --test test/*.test.js) || exit 1; \
		(cd examples/agent-openai && node --test test/*.test.js) || exit 1; \
	elif [ "$$CI" = true ]; then echo "node not found: the TypeScript client's tests must run in CI" >&2; exit 1; \
	else echo "node not found: the TypeScript client's tests skip (and fail under CI=true)"; fi

## lint: go vet, then staticcheck (pinned by the tool directive in go.mod: `go tool` builds it once and caches it),
## over the module and the Helm chart's module; vet is its old name
lint vet:
	$(GO) vet $(PKGS)
	cd deploy/helm && $(GO) vet ./... && $(GO) tool staticcheck ./...
	$(GO) tool staticcheck $(PKGS)

## e2e: only the end-to-end test (runs the real binaries, built once by make build)
e2e: build
	TOLLGATE_TEST_BIN=$(CURDIR)/$(BIN) $(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) -run . ./e2e/...

## chaos: the long chaos run (internal/chaos): replicated stage processes against a real nats-server,
## SIGKILLs of workers and broker restarts under load, then the safety checks. Parameters:
## CHAOS_TURNS, CHAOS_KILLS, CHAOS_RESTARTS, CHAOS_REPLICAS, CHAOS_SEED (replay); CHAOS_WRITE_KILLS (10: the stage
## that made a turn's k-th durable write SIGKILLed right after it, every k of both paths); CHAOS_CLUSTER=3 runs it on a
## three-node cluster (broker restarts then kill the TOLLGATE_TURNS leader node), CHAOS_STREAM_REPLICAS
## (default: the node count); CHAOS_PLANNER=1 sends CHAOS_PLANNER_PERCENT (30) of the turns as text through
## replicated planner processes against a scripted model (killed like the workers); logs in results/chaos/
CHAOS_TURNS    ?= 5000
CHAOS_KILLS    ?= 50
CHAOS_RESTARTS ?= 2
CHAOS_WRITE_KILLS ?= 10
CHAOS_REPLICAS ?= 2
CHAOS_CLUSTER  ?=
CHAOS_STREAM_REPLICAS ?=
CHAOS_LEADER_PAUSES ?=
CHAOS_PARTITIONS ?=
CHAOS_SEED     ?=
CHAOS_TIMEOUT  ?= 90m
CHAOS_PLANNER  ?=
CHAOS_PLANNER_PERCENT ?=
chaos: build
	TOLLGATE_CHAOS_LONG=1 TOLLGATE_CHAOS_BIN=$(CURDIR)/$(BIN) TOLLGATE_CHAOS_DIR=$(CURDIR)/results/chaos \
	TOLLGATE_CHAOS_TURNS=$(CHAOS_TURNS) TOLLGATE_CHAOS_KILLS=$(CHAOS_KILLS) TOLLGATE_CHAOS_RESTARTS=$(CHAOS_RESTARTS) \
	TOLLGATE_CHAOS_REPLICAS=$(CHAOS_REPLICAS) TOLLGATE_CHAOS_SEED=$(CHAOS_SEED) \
	TOLLGATE_CHAOS_WRITE_KILLS=$(CHAOS_WRITE_KILLS) \
	TOLLGATE_CHAOS_PLANNER=$(CHAOS_PLANNER) TOLLGATE_CHAOS_PLANNER_PERCENT=$(CHAOS_PLANNER_PERCENT) \
	TOLLGATE_CHAOS_CLUSTER=$(CHAOS_CLUSTER) TOLLGATE_CHAOS_STREAM_REPLICAS=$(CHAOS_STREAM_REPLICAS) \
	TOLLGATE_CHAOS_LEADER_PAUSES=$(CHAOS_LEADER_PAUSES) TOLLGATE_CHAOS_PARTITIONS=$(CHAOS_PARTITIONS) \
	$(GO) test -count=1 -timeout $(CHAOS_TIMEOUT) -run '^TestChaosLong$$' -v ./internal/chaos

## cluster-test: the pipeline on a three-node JetStream cluster on loopback (R3 streams and buckets, one
## two processes per stage given all three URLs), the node leading TOLLGATE_TURNS SIGKILLed under load and
## restarted later, then the chaos checks (internal/chaos TestChaosCluster: 400 turns; about a minute, or
## four when a call whose result could not be recorded in the election waits out its 2-minute claim lease).
## Every violation fails the run; CLUSTER_ALLOW=session-order would tolerate session-order ones (counted
## and printed). CHAOS_SEED replays a run.
CLUSTER_ALLOW ?=
cluster-test: build
	TOLLGATE_CHAOS_CLUSTER_TEST=1 TOLLGATE_CHAOS_BIN=$(CURDIR)/$(BIN) TOLLGATE_CHAOS_DIR=$(CURDIR)/results/chaos \
	TOLLGATE_CHAOS_ALLOW=$(CLUSTER_ALLOW) TOLLGATE_CHAOS_SEED=$(CHAOS_SEED) \
	$(GO) test -count=1 -timeout 20m -run '^TestChaosCluster$$' -v ./internal/chaos

## cluster: a local three-node nats-server cluster in the foreground (deploy/nats/cluster-{1,2,3}.conf:
## clients on 127.0.0.1:4222-4224, stores in ./.tollgate/cluster); Ctrl-C stops it. Run the stages with
## TOLLGATE_NATS_URL=nats://127.0.0.1:4222,nats://127.0.0.1:4223,nats://127.0.0.1:4224 TOLLGATE_REPLICAS=3
CLUSTER_CONFS ?= deploy/nats/cluster-1.conf deploy/nats/cluster-2.conf deploy/nats/cluster-3.conf
cluster: build
	@mkdir -p .tollgate/cluster
	@pids=""; for c in $(CLUSTER_CONFS); do $(BIN)/nats-server -c $$c & pids="$$pids $$!"; done; \
	trap 'kill $$pids 2>/dev/null; wait' INT TERM; \
	echo "three nodes started ($(CLUSTER_CONFS)); Ctrl-C stops them"; \
	wait

## fuzz: run each decoder fuzzer for FUZZTIME (default 20s)
FUZZTIME ?= 20s
fuzz:
	@for f in $$($(GO) test -list '^Fuzz' ./schemas | grep ^Fuzz); do \
		echo "== $$f"; $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) ./schemas || exit 1; \
	done

## soak: the broker-restart soak test, repeated (SOAK_COUNT, default 5)
SOAK_COUNT ?= 5
soak:
	$(GO) test -race -count=$(SOAK_COUNT) -timeout 30m -run 'AcrossARestart' -v ./internal/pipelinetest

## soak-retention: the retention soak (internal/soak): SOAK_TURNS turns (200,000; every 5th also needing an
## approval, which a decider gives) through a pipeline whose ended records are kept SOAK_RETENTION (20s), with
## the buckets' and streams' bytes sampled every 2s; fails on a safety violation or bytes that do not level
## off. The curve and the checks are written as CSV and JSON to results/soak/
SOAK_TURNS     ?= 200000
SOAK_RETENTION ?= 20s
soak-retention:
	TOLLGATE_SOAK_TURNS=$(SOAK_TURNS) TOLLGATE_SOAK_RETENTION=$(SOAK_RETENTION) TOLLGATE_SOAK_OUT=$(CURDIR)/results/soak \
		$(GO) test -count=1 -timeout 3h -run '^TestRetentionSoak$$' -v ./internal/soak

## bench: the benchmark report (internal/bench, about 10 minutes on 2 cores): raw JetStream references
## (async publish, pull consume + ack, the raw turn: the same JetStream operations as a Tollgate turn),
## Tollgate fast-path and approval-path turns/s all-in-one and as separate stage processes, efficiency,
## latencies, footprint with BENCH_PENDING approvals pending and recovery, the throughput again with
## sync_interval: always, the approval path with its approved call behind a NATS tool service next to the
## built-in one, the approval turn submitted and decided over the HTTP gateway next to NATS, a planner turn
## (scripted model: one echo call, then the answer) next to the fast and approval turns, the web inbox's first
## page (p50/p95, HTML size) with BENCH_PENDING approvals pending (BENCH_PHASES=inbox alone), GET /v1/approvals
## paged through by 16 clients at once from a `tollgate gateway` process with BENCH_PENDING pending (page p50/p99,
## the gateway's RSS; BENCH_PHASES=approvals alone). Printed, and
## written as JSON and markdown to results/bench/. Parameters:
## BENCH_RUNS, BENCH_DURATION, BENCH_WARMUP, BENCH_CONCURRENCY, BENCH_CONSUME_MSGS, BENCH_LOW_RATE,
## BENCH_LAT_DURATION, BENCH_PENDING, BENCH_PHASES (throughput,procs,latency,footprint,sync,toolservice,gateway,planner,inbox,
## approvals),
## BENCH_LOG_LEVEL, BENCH_TOOL_DIR (the tools' sandboxes: /dev/shm by default, "store" for beside the store)
BENCH_PENDING ?= 10000
BENCH_OUT     ?= $(CURDIR)/results/bench
export BENCH_RUNS BENCH_DURATION BENCH_WARMUP BENCH_CONCURRENCY BENCH_CONSUME_MSGS BENCH_LOW_RATE \
	BENCH_LAT_DURATION BENCH_PHASES BENCH_LOG_LEVEL BENCH_TOOL_DIR
bench: build
	BENCH_BIN=$(CURDIR)/$(BIN) BENCH_OUT=$(BENCH_OUT) BENCH_PENDING=$(BENCH_PENDING) $(BIN)/tollgate-bench

## bench-cluster: the single-node throughput figures (default and sync_interval: always) next to the same on a
## three-node cluster on loopback with R3 streams and buckets (both sync settings), interleaved round by round
bench-cluster: build
	BENCH_BIN=$(CURDIR)/$(BIN) BENCH_OUT=$(BENCH_OUT) BENCH_PHASES=throughput,sync,cluster $(BIN)/tollgate-bench

## bench-layout: the raw turn (the stages' JetStream operations, no Tollgate code) in storage layouts, both sync
## settings: today's and the two one-write-per-fact designs, (a) records are the log and (b) the turn's events are the
## log, at 1 and 4 partitions; BENCH_LAYOUTS also offers state, and
## BENCH_LAYOUT_PARTITIONS other partition counts (internal/bench/layout.go, docs/bench.md)
bench-layout: build
	BENCH_BIN=$(CURDIR)/$(BIN) BENCH_OUT=$(BENCH_OUT) BENCH_PHASES=layout $(BIN)/tollgate-bench

## bench-footprint: only the footprint phase, with FOOTPRINT_PENDING (100,000) approvals pending
FOOTPRINT_PENDING ?= 100000
bench-footprint: build
	BENCH_BIN=$(CURDIR)/$(BIN) BENCH_OUT=$(BENCH_OUT) BENCH_PHASES=footprint BENCH_PENDING=$(FOOTPRINT_PENDING) $(BIN)/tollgate-bench

## bench-profile: CPU and allocation profiles of the all-in-one fast and approval paths and the approval path over the HTTP gateway (one run each)
## into results/profile, and their top functions
PROFILE_DIR ?= $(CURDIR)/results/profile
bench-profile: build
	BENCH_BIN=$(CURDIR)/$(BIN) BENCH_OUT=$(PROFILE_DIR) BENCH_PHASES=profile BENCH_PROFILE=$(PROFILE_DIR) $(BIN)/tollgate-bench > /dev/null
	@for p in fast approval gateway; do \
		echo "== $$p path: CPU"; $(GO) tool pprof -top -nodecount=35 $(BIN)/tollgate-bench $(PROFILE_DIR)/cpu-$$p.pprof 2>/dev/null | sed -n '1,45p'; \
		echo "== $$p path: allocations (objects) in the window"; $(GO) tool pprof -top -nodecount=25 -sample_index=alloc_objects \
			-diff_base $(PROFILE_DIR)/allocs-$$p-base.pprof $(BIN)/tollgate-bench $(PROFILE_DIR)/allocs-$$p.pprof 2>/dev/null | sed -n '1,35p'; \
	done

## microbench: Go micro-benchmarks with allocations
microbench:
	$(GO) test -run '^$$' -bench . -benchmem $(PKGS)

clean:
	rm -rf $(BIN) .tollgate results
