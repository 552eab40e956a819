#!/usr/bin/env bash
# cold-rounds.sh DRIVER ROUNDS: scripts/cut-rounds.sh with every restore cold — a MinIO of the
# cache on loopback as the blob store and `--hot-tier off` — so the daemon's log gives a cold
# restore's phases (fetch=, then the driver's own). CUT_MIB as for cut-rounds.sh.
#
#   CUT_MIB=256 scripts/cold-rounds.sh gvisor 3
set -euo pipefail
drv=${1:?driver}; rounds=${2:-3}
export AMBER_CACHE=${AMBER_CACHE:-/var/cache/amber}
minio=$(ls -d "$AMBER_CACHE"/minio-*/bin | head -1)/minio
port=${COLD_MINIO_PORT:-9107}
data=$(mktemp -d /tmp/amber-cold-minio.XXXXXX)
export AMBER_S3_ACCESS_KEY=amberbench AMBER_S3_SECRET_KEY=amberbench-secret
MINIO_ROOT_USER=$AMBER_S3_ACCESS_KEY MINIO_ROOT_PASSWORD=$AMBER_S3_SECRET_KEY \
    "$minio" server --quiet --address "127.0.0.1:$port" --console-address "127.0.0.1:$((port + 1))" "$data" >"$data.log" 2>&1 &
mpid=$!
trap 'kill "$mpid" 2>/dev/null || true; wait "$mpid" 2>/dev/null || true; rm -rf "$data" "$data.log"' EXIT
for _ in $(seq 40); do curl -sf "http://127.0.0.1:$port/minio/health/live" >/dev/null && break; sleep 0.25; done
UP_ARGS="--hot-tier off --egress=false --blobs s3://127.0.0.1:$port/cold/bench?secure=false&create=true" \
    "$(dirname "$0")/cut-rounds.sh" "$drv" "$rounds"
