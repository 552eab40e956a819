#!/usr/bin/env bash
# Runs every benchmark report in docs/benchmarks.md, one after the other (never
# in parallel: the machine has 2 cores), and keeps the output under
# ${AMBER_BENCH_OUT:-/tmp/amber-bench-<time>}. `make bench` calls it after
# `make setup-test build`. Select a subset with BENCH="sqlite postgres ...".
set -euo pipefail
cd "$(dirname "$0")/.."
out=${AMBER_BENCH_OUT:-/tmp/amber-bench-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$out"
export AMBER_BENCH=1 CGO_ENABLED=1
all="sqlite postgres gvisor criu engine engine-criu engine-ckpt engine-ckpt-criu server exec exec-criu chunkstore egress"
for b in ${BENCH:-$all}; do
    echo "== $b (load: $(cut -d' ' -f1-3 /proc/loadavg))"
    case $b in
    sqlite)      cmd=(go test -count=1 -run TestBenchReport -v ./stores/sqlite) ;;
    postgres)    cmd=(go test -count=1 -run TestBenchReport -v ./stores/postgres) ;;
    gvisor)      cmd=(go test -count=1 -run 'TestBench|TestPerf' -v ./drivers/gvisor) ;;
    criu)        cmd=(go test -tags seccomp -count=1 -run TestPerf -v ./drivers/criu) ;;
    engine)      cmd=(go test -tags seccomp -count=1 -run TestBenchClaimVsCold -v ./internal/engine) ;;
    engine-criu) cmd=(env AMBER_TEST_DRIVER=criu go test -tags seccomp -count=1 -run TestBenchClaimVsCold -v ./internal/engine) ;;
    engine-ckpt) cmd=(go test -tags seccomp -count=1 -run TestBenchCheckpoint -v -timeout 90m ./internal/engine) ;;
    engine-ckpt-criu) cmd=(env AMBER_TEST_DRIVER=criu go test -tags seccomp -count=1 -run TestBenchCheckpoint -v -timeout 90m ./internal/engine) ;;
    server)      cmd=(go test -tags seccomp -count=1 -run TestBenchAPIClaim -v ./internal/edge/server) ;;
    exec)        cmd=(go test -tags seccomp -count=1 -run TestBenchExecREST -v ./internal/edge/server) ;;
    exec-criu)   cmd=(env AMBER_TEST_DRIVER=criu go test -tags seccomp -count=1 -run TestBenchExecREST -v ./internal/edge/server) ;;
    chunkstore)  cmd=(go test -count=1 -run TestBenchReport -v -timeout 30m ./internal/state/chunkstore) ;;
    egress)      cmd=(go test -count=5 -run '^$' -bench BenchmarkEgress -benchtime 1000x ./internal/egress) ;;
    *) echo "unknown benchmark $b (have: $all)" >&2; exit 2 ;;
    esac
    echo "\$ AMBER_BENCH=1 ${cmd[*]}" | tee "$out/$b.txt"
    "${cmd[@]}" 2>&1 | grep -v ' INFO ' | tee -a "$out/$b.txt"
done
echo "results in $out"
