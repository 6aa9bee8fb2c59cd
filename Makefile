# Tollgate. Two commands do the set-up: `make run` and `make test`.
GO        ?= go
BIN       := bin
PKGS      := ./...
TEST_TIMEOUT ?= 9m

.PHONY: run build test vet unit e2e fuzz bench soak clean

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

## fuzz: run each decoder fuzzer for FUZZTIME (default 20s)
FUZZTIME ?= 20s
fuzz:
	@for f in $$($(GO) test -list '^Fuzz' ./schemas | grep ^Fuzz); do \
		echo "== $$f"; $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) ./schemas || exit 1; \
	done

## soak: broker-restart soak tests that are too slow or (for now) too flaky for `make test`
soak:
	TOLLGATE_SOAK=1 $(GO) test -race -count=1 -timeout 10m -run 'AcrossARestart' -v ./pipeline/pipelinetest

## bench: Go micro-benchmarks with allocations
bench:
	$(GO) test -run '^$$' -bench . -benchmem $(PKGS)

clean:
	rm -rf $(BIN) .tollgate results
