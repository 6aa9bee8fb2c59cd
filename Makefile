# Tollgate. Two commands do the set-up: `make run` and `make test`.
GO        ?= go
BIN       := bin
PKGS      := ./...
TEST_TIMEOUT ?= 9m

.PHONY: run build test vet unit e2e fuzz bench soak clean chaos

## run: start the all-in-one dev process (embedded nats-server with JetStream in ./.tollgate, all four stages)
run: build
	$(BIN)/tollgate dev

## build: the five binaries and a nats-server (for the multi-process setup) into ./bin
build:
	$(GO) build -o $(BIN)/ ./cmd/...
	$(GO) build -o $(BIN)/nats-server github.com/nats-io/nats-server/v2

## test: go vet, then every test (unit, integration on an embedded server, end-to-end with real processes) under -race
test: vet
	$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) $(PKGS)

vet:
	$(GO) vet $(PKGS)

## e2e: only the end-to-end test (builds and runs the real binaries)
e2e:
	$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) -run . ./e2e/...

## chaos: the long chaos run (internal/chaos): replicated stage processes against a real nats-server,
## SIGKILLs of workers and broker restarts under load, then the safety checks. Parameters:
## CHAOS_TURNS, CHAOS_KILLS, CHAOS_RESTARTS, CHAOS_REPLICAS, CHAOS_SEED (replay); logs in results/chaos/
CHAOS_TURNS    ?= 5000
CHAOS_KILLS    ?= 50
CHAOS_RESTARTS ?= 2
CHAOS_REPLICAS ?= 2
CHAOS_SEED     ?=
CHAOS_TIMEOUT  ?= 90m
chaos: build
	TOLLGATE_CHAOS_LONG=1 TOLLGATE_CHAOS_BIN=$(CURDIR)/$(BIN) TOLLGATE_CHAOS_DIR=$(CURDIR)/results/chaos \
	TOLLGATE_CHAOS_TURNS=$(CHAOS_TURNS) TOLLGATE_CHAOS_KILLS=$(CHAOS_KILLS) TOLLGATE_CHAOS_RESTARTS=$(CHAOS_RESTARTS) \
	TOLLGATE_CHAOS_REPLICAS=$(CHAOS_REPLICAS) TOLLGATE_CHAOS_SEED=$(CHAOS_SEED) \
	$(GO) test -count=1 -timeout $(CHAOS_TIMEOUT) -run '^TestChaosLong$$' -v ./internal/chaos

## fuzz: run each decoder fuzzer for FUZZTIME (default 20s)
FUZZTIME ?= 20s
fuzz:
	@for f in $$($(GO) test -list '^Fuzz' ./schemas | grep ^Fuzz); do \
		echo "== $$f"; $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) ./schemas || exit 1; \
	done

## soak: the broker-restart soak test, repeated (SOAK_COUNT, default 5)
SOAK_COUNT ?= 5
soak:
	$(GO) test -race -count=$(SOAK_COUNT) -timeout 30m -run 'AcrossARestart' -v ./pipeline/pipelinetest

## bench: Go micro-benchmarks with allocations
bench:
	$(GO) test -run '^$$' -bench . -benchmem $(PKGS)

clean:
	rm -rf $(BIN) .tollgate results
