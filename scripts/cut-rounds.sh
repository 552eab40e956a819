#!/usr/bin/env bash
# cut-rounds.sh DRIVER ROUNDS: a daemon of bin/amber on a fresh data dir (no warm pool), one
# minimal sandbox running a shell loop, then ROUNDS × {amber checkpoint; sandbox kill; sandbox
# recover}. Prints each call's time and the driver's own log lines of each cut and restore
# (frozen, total, running), then destroys the sandbox and stops the daemon.
#
#   SRC=/path/to/other/checkout AMBER_CACHE=... scripts/cut-rounds.sh gvisor 4
#
# SRC is the checkout whose bin/amber runs (default: this one), for an A/B of two builds.
# CUT_MIB=256 runs the restore benchmark's ticker holding 256 MiB instead of the shell loop
# (CUT_MEMORY: its sandbox's memory limit, default CUT_MIB + 512 MiB, e.g. 4Gi).
# UP_ARGS="--hot-tier off --blobs s3://..." adds flags to `amber up` (e.g. every restore cold).
set -euo pipefail
drv=${1:?driver}; rounds=${2:-4}
cd "${SRC:-$(dirname "$0")/..}"
export AMBER_CACHE=${AMBER_CACHE:-/var/cache/amber}
export PATH=$AMBER_CACHE/bin:$PATH AMBER_ADDR=127.0.0.1:${CUT_PORT:-7790}
dir=$(mktemp -d /tmp/amber-cut-rounds.XXXXXX)
bin/amber up --data-dir "$dir/d" --addr "$AMBER_ADDR" --driver "$drv" --pool 0 --log-level debug ${UP_ARGS:-} >"$dir/up.log" 2>&1 &
pid=$!
sbx=""
cleanup() {
    [[ -n $sbx ]] && bin/amber sandbox rm "$sbx" >/dev/null 2>&1 || true
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -9 "$pid" 2>/dev/null || true
    # The daemon keeps runsc's null network namespace mounted for its next start.
    mount | awk -v d="$dir" 'index($3, d) == 1 {print $3}' | sort -r | xargs -r -n1 umount -l
    rm -rf "$dir"
}
trap cleanup EXIT
for _ in $(seq 60); do [[ -f $dir/d/admin.key ]] && curl -sf "http://$AMBER_ADDR/healthz" >/dev/null && break; sleep 0.5; done
export AMBER_TOKEN=$(cat "$dir/d/admin.key")
if [[ -n ${CUT_MIB:-} ]]; then
    # The restore benchmark's ticker holding CUT_MIB MiB of a pattern.
    CGO_ENABLED=0 go build -trimpath -o "$dir/ticker" ./cmd/amber/testdata/ticker
    sbx=$(bin/amber sandbox create --template minimal --memory "${CUT_MEMORY:-$((CUT_MIB + 512))Mi}" | tail -1)
    bin/amber files put "$sbx" "$dir/ticker" /root/ticker >/dev/null
    bin/amber exec "$sbx" -- chmod +x /root/ticker
    bin/amber exec -d "$sbx" -- /root/ticker "$CUT_MIB" 12345 >/dev/null
else
    sbx=$(bin/amber sandbox create --template minimal | tail -1)
    bin/amber exec -d "$sbx" -- sh -c 'while true; do sleep 0.01; done' >/dev/null
fi
sleep 3
ms() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }
for _ in $(seq "$rounds"); do
    t=$(date +%s%N); bin/amber checkpoint "$sbx" >/dev/null; echo "checkpoint call $(ms "$t") ms"
    bin/amber sandbox kill "$sbx" >/dev/null
    t=$(date +%s%N); bin/amber sandbox recover "$sbx" >/dev/null; echo "recover call $(ms "$t") ms"
done
grep -E "(sandbox restored|sandbox checkpointed|checkpoint: steps).*(driver=$drv|fetch=)" "$dir/up.log" | sed 's/^time=[^ ]* //' || true
echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
