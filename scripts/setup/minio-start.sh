#!/usr/bin/env bash
# Usage: minio-start.sh DIR PORT
# Start a MinIO server on 127.0.0.1:PORT storing its data in DIR, with access
# key "amberminio" and secret "amberminio-secret"; wait until it answers
# /minio/health/live and print its PID (last line). The server keeps running
# after this script exits; stop it with `kill PID`.
# If a server started by this script already serves PORT, its PID is printed.
# Log and pid file: $AMBER_CACHE/run/minio-PORT.{log,pid}.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

[[ $# -eq 2 ]] || die "usage: $0 DIR PORT"
DATA=$1
PORT=$2
[[ $PORT =~ ^[0-9]+$ && $PORT -gt 0 && $PORT -lt 65536 ]] || die "bad port: $PORT"
ACCESS_KEY=amberminio
SECRET_KEY=amberminio-secret
URL="http://127.0.0.1:$PORT/minio/health/live"
RUN="$CACHE/run"
PIDFILE="$RUN/minio-$PORT.pid"
LOGFILE="$RUN/minio-$PORT.log"

live() { curl -fsS -o /dev/null --max-time 1 "$URL" 2>/dev/null; }

# Already running (started by us on this port)?
if [[ -s $PIDFILE ]]; then
    pid=$(cat "$PIDFILE")
    if kill -0 "$pid" 2>/dev/null && [[ $(readlink "/proc/$pid/exe" 2>/dev/null) == */minio ]] && live; then
        log "MinIO already running on 127.0.0.1:$PORT (pid $pid)"
        echo "$pid"
        exit 0
    fi
    rm -f "$PIDFILE"
fi
if live || ss -Hltn "sport = :$PORT" 2>/dev/null | grep -q .; then
    die "port $PORT is already in use by another process"
fi

MINIO="$CACHE/bin/minio"
if [[ ! -x $MINIO ]]; then
    log "$MINIO missing; running minio.sh first"
    "$SETUP_DIR/minio.sh" >/dev/null
fi

mkdir -p "$DATA" "$RUN"
# MINIO_BROWSER=off: no web console (it would grab a second, random port).
# MINIO_CI_CD=1: allow a data dir on the root disk. setsid detaches the server
# from our session so it outlives this script.
MINIO_ROOT_USER=$ACCESS_KEY MINIO_ROOT_PASSWORD=$SECRET_KEY \
MINIO_BROWSER=off MINIO_CI_CD=1 MINIO_UPDATE=off \
    setsid "$MINIO" server --quiet --address "127.0.0.1:$PORT" "$DATA" \
    </dev/null >"$LOGFILE" 2>&1 &
pid=$!
echo "$pid" >"$PIDFILE"

for _ in $(seq 1 300); do
    live && break
    kill -0 "$pid" 2>/dev/null || { tail -n 20 "$LOGFILE" >&2; rm -f "$PIDFILE"; die "MinIO exited during startup (log: $LOGFILE)"; }
    sleep 0.1
done
if ! live; then
    kill "$pid" 2>/dev/null || true
    rm -f "$PIDFILE"
    tail -n 20 "$LOGFILE" >&2
    die "MinIO did not become ready on $URL within 30 s (log: $LOGFILE)"
fi
log "MinIO ready on http://127.0.0.1:$PORT (data $DATA, access key $ACCESS_KEY)"
echo "$pid"
