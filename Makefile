# Amber — the two commands that matter are in README.md:
#   make demo   runs Amber (installs what it needs first)
#   make test   runs the tests (installs and starts what they need first)
SHELL := /bin/bash
export AMBER_CACHE ?= /var/cache/amber
export PATH := $(AMBER_CACHE)/bin:$(PATH)
export AMBER_TEST_PG ?= postgres://amber:amber@127.0.0.1:5432/amber_test?sslmode=disable
GO ?= go
# cgo for libcontainer's nsenter, the seccomp tag for the criu driver's filter.
export CGO_ENABLED := 1
GOTAGS := seccomp
BIN := bin/amber

-include mk/setup.mk

.PHONY: gen-envd build test test-unit test-extended test-fencing test-partition bench bench-restore bench-failover bench-session fuzz chaos demo vet clean console

# amber-agent is static (no cgo): it runs inside sandboxes whatever their
# template holds. It is looked up next to bin/amber.
build:
	$(GO) build -tags $(GOTAGS) -o $(BIN) ./cmd/amber
	CGO_ENABLED=0 $(GO) build -trimpath -o $(dir $(BIN))amber-agent ./cmd/amber-agent

vet:
	$(GO) vet -tags $(GOTAGS) ./...

# The Go code of E2B's envd protos (internal/edge/e2b/envdpb), committed:
# regenerate after editing a .proto (protoc from Debian's protobuf-compiler).
gen-envd:
	scripts/gen-envd.sh

# The web console's assets (console/dist, committed and embedded in the
# binary, so `make build` needs no npm): rebuilt from console/src with the
# locked npm toolchain (node_modules in console/, gitignored), then the hash
# of the sources is recorded (console.TestBuildIsFresh checks it).
console:
	cd console && { [ -d node_modules ] && cmp -s package-lock.json node_modules/.package-lock.json.src || { npm ci --no-audit --no-fund && cp package-lock.json node_modules/.package-lock.json.src; }; } && npx vite build
	$(GO) run ./console/internal/hashsrc console > console/dist/SOURCE_HASH

# The default test run: everything real (SQLite, PostgreSQL, MinIO, runsc, CRIU),
# plus a short fuzz of every parser. Long soak/chaos/bench runs have their own targets.
test: setup-test build vet
	AMBER_BIN=$(abspath $(BIN)) $(GO) test -tags $(GOTAGS) -count=1 -timeout 40m ./...
	$(MAKE) fuzz FUZZTIME=30000x

# Fuzz targets, each run for FUZZTIME. `make test` gives each an execution
# budget (30000x: seconds each here) rather than a duration: with a duration,
# go test can report "context deadline exceeded" as a failure when the time
# runs out while a worker is busy with a slow input (FuzzTarIn did, in CI),
# although nothing was found. Minimizing is off by default
# (FUZZMINIMIZE=0): Go minimizes every new interesting input, a kilobytes-long
# tar takes longer than a short FUZZTIME to minimize, and go test then fails
# with "context deadline exceeded" although nothing was found. A crasher is
# still written to testdata/fuzz, unminimized; set FUZZMINIMIZE=60s to shrink it.
FUZZTIME ?= 30s
FUZZMINIMIZE ?= 0
FUZZ = $(GO) test -run '^$$' -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMINIMIZE)
fuzz:
	$(FUZZ) -fuzz '^FuzzDecodeEnvelope$$' ./core/eventlog
	$(FUZZ) -fuzz '^FuzzResolvePath$$' ./drivers/internal/confinedfs
	$(FUZZ) -fuzz '^FuzzTarIn$$' ./drivers/internal/confinedfs
	$(FUZZ) -fuzz '^FuzzLayerArchive$$' ./drivers/internal/layer
	$(FUZZ) -fuzz '^FuzzDecodeManifest$$' ./internal/state/chunkstore
	$(FUZZ) -fuzz '^FuzzDecodeRequests$$' ./internal/edge/server
	$(FUZZ) -fuzz '^FuzzTarget$$' ./internal/edge/e2b/envd
	$(FUZZ) -fuzz '^FuzzGatewayDest$$' ./internal/egress/gateway
	$(FUZZ) -fuzz '^FuzzMatchDest$$' ./internal/egress/gateway
	$(FUZZ) -fuzz '^FuzzNormalizeURL$$' ./internal/egress/gateway
	$(FUZZ) -fuzz '^FuzzSubstituteSecrets$$' ./internal/egress/gateway
	$(FUZZ) -fuzz '^FuzzCheckDestPattern$$' ./internal/state/meta
	$(FUZZ) -fuzz '^FuzzDNSAnswer$$' ./internal/egress
	$(FUZZ) -fuzz '^FuzzParse$$' ./drivers/internal/procwait
	$(FUZZ) -fuzz '^FuzzReadFrame$$' ./lib/agentproto
	$(FUZZ) -fuzz '^FuzzDecodeList$$' ./drivers/internal/agent
	$(FUZZ) -fuzz '^FuzzParseDF$$' ./internal/engine
	$(FUZZ) -fuzz '^FuzzSessionDefinition$$' ./internal/session
	$(FUZZ) -fuzz '^FuzzAnthropicSSE$$' ./internal/session
	$(FUZZ) -fuzz '^FuzzOpenAISSE$$' ./internal/session

# The extended fidelity tests (browser sessions, live PostgreSQL sessions,
# core/sandbox/fidelitytest) against both drivers. They need templates built
# from Debian's chromium and postgresql packages (mk/setup.mk:
# setup-extended), so they are built only with the `extended` tag and are
# not part of `make test`. One package at a time (-p 1): two Chromiums at
# once on a small host would only measure each other.
EXTENDED_RUN ?= ^TestFidelity(Browser|BrowserZoneinfoWatch|Postgres)$$
test-extended: setup setup-extended
	$(GO) test -tags $(GOTAGS),extended -count=1 -p 1 -timeout 30m -run '$(EXTENDED_RUN)' -v ./drivers/gvisor ./drivers/criu

# The one-node fencing test alone (SIGSTOP a daemon, take its data dir
# over); `make test` runs it too.
test-fencing: setup-test build
	AMBER_BIN=$(abspath $(BIN)) $(GO) test -tags $(GOTAGS) -count=1 -timeout 20m -run '^TestE2EFencingPausedDaemon$$' -v ./cmd/amber

# The partition test alone (two nodes in network namespaces of their own,
# one cut off and healed; docs/reliability.md); `make test` runs it too.
test-partition: setup-test build
	AMBER_BIN=$(abspath $(BIN)) $(GO) test -tags $(GOTAGS) -count=1 -timeout 20m -run '^(TestNetnsForwarding|TestE2ENodesPartition)$$' -v ./cmd/amber

bench: setup-test build
	scripts/bench.sh

# Restore to running, every stack side by side on one workload (raw runsc,
# raw runc+CRIU eager and lazy, Amber gvisor and criu, hot and cold), warm
# and after drop_caches: docs/benchmarks.md, "Restore to running". Sizes in
# MiB; N rounds; STACKS a subset (comma-separated); the table goes to
# BENCH_OUT too. First, the sandbox's own speed on a SQLite setup
# (docs/benchmarks.md, "The sandbox's own speed"): stacks sqlite-native,
# sqlite-criu, sqlite-gvisor and sqlite-gvisor+VARIANT… (runsc options,
# cmd/amber/bench_sqlite_e2e_test.go), BENCH_SQLITE_N rounds.
BENCH_SIZES ?= 64,256,1024
BENCH_N ?= 5
BENCH_SQLITE_N ?= 3
BENCH_STACKS ?=
BENCH_OUT ?= bench-restore.md
bench-restore: setup-test setup-bench-deps build
	AMBER_BIN=$(abspath $(BIN)) AMBER_BENCH_RESTORE=1 AMBER_BENCH_SIZES=$(BENCH_SIZES) AMBER_BENCH_N=$(BENCH_N) AMBER_BENCH_SQLITE_N=$(BENCH_SQLITE_N) \
	  AMBER_BENCH_STACKS=$(BENCH_STACKS) AMBER_BENCH_OUT=$(abspath $(BENCH_OUT)) \
	  $(GO) test -tags $(GOTAGS) -count=1 -timeout 120m -run '^TestBenchRestore$$' -v ./cmd/amber

# Time from a node's death to its sandboxes running on another node
# (docs/deploy.md): FAILOVER_SANDBOXES sandboxes, default lease settings.
FAILOVER_SANDBOXES ?= 10
# The sandboxes' counter step in seconds (0.1: busy; 1: mostly idle, as an agent's).
FAILOVER_TICK ?= 0.1
bench-failover: setup-test build
	AMBER_BIN=$(abspath $(BIN)) AMBER_FAILOVER_SANDBOXES=$(FAILOVER_SANDBOXES) AMBER_FAILOVER_TICK=$(FAILOVER_TICK) \
	  $(GO) test -tags $(GOTAGS) -count=1 -timeout 30m -run '^TestE2EFailoverTime$$' -v ./cmd/amber

# Issue 21's headline: an agent session (a workspace built with >= 60 s of
# CPU, a dev server behind an exposed port, 20 tool calls) restored after a
# crash against redone from scratch, SESSION_N rounds on each driver of
# SESSION_DRIVERS, restoring from each tier of SESSION_TIERS (hot: the
# node's copy; cold: MinIO) (cmd/amber/bench_session_e2e_test.go).
SESSION_N ?= 3
SESSION_DRIVERS ?= gvisor,criu
SESSION_TIERS ?= hot,cold
SESSION_OUT ?= bench-session.md
bench-session: setup-test build
	AMBER_BIN=$(abspath $(BIN)) AMBER_BENCH_SESSION=1 AMBER_BENCH_SESSION_N=$(SESSION_N) AMBER_BENCH_SESSION_DRIVERS=$(SESSION_DRIVERS) \
	  AMBER_BENCH_SESSION_TIERS=$(SESSION_TIERS) AMBER_BENCH_OUT=$(abspath $(SESSION_OUT)) \
	  $(GO) test -tags $(GOTAGS) -count=1 -timeout 120m -run '^TestBenchSession$$' -v ./cmd/amber

# The long chaos run: N faults (PER_RUN per run of the reference workload)
# from seed SEED on CHAOS_DRIVER; the report in chaos-report.json, the data
# dirs of runs that differ kept (see docs/reliability.md). The default test
# run has a short one (TestE2EChaosShort).
N ?= 100
SEED ?= 1
PER_RUN ?= 10
CHAOS_DRIVER ?= gvisor
chaos: setup-test build
	$(BIN) chaos --driver $(CHAOS_DRIVER) --faults $(N) --faults-per-run $(PER_RUN) --seed $(SEED) --keep --report chaos-report.json

demo: setup build
	scripts/demo.sh

clean:
	rm -rf bin
