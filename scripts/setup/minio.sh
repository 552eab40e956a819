#!/usr/bin/env bash
# Install the MinIO server (S3-compatible object store used by the
# distributed-store tests) into $AMBER_CACHE/minio-<version>/bin/minio and
# point $AMBER_CACHE/bin/minio at it. Takes ~150 s the first time.
#
# MinIO tags its releases RELEASE.<date>, which are not Go module versions, so
# the module proxy only serves pseudo-versions. MINIO_VERSION below is what
# `go list -m github.com/minio/minio@latest` resolved to on 2026-11-29.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

MINIO_VERSION=v0.0.0-20260212201848-7aac2a2c5b7c
DIR="$CACHE/minio-$MINIO_VERSION"
BIN="$DIR/bin/minio"

command -v go >/dev/null || die "go not found on PATH"

if [[ -x $BIN ]]; then
    log "found $BIN"
else
    log "building github.com/minio/minio@$MINIO_VERSION (~150 s)"
    clean_stale_tmp "$DIR"
    tmp="$DIR.tmp.$$"
    rm -rf "$tmp"; mkdir -p "$tmp/bin"
    trap 'rm -rf "$tmp"' EXIT
    CGO_ENABLED=0 GOBIN="$tmp/bin" go install "github.com/minio/minio@$MINIO_VERSION" \
        || die "go install github.com/minio/minio@$MINIO_VERSION failed"
    rm -rf "$DIR"; mv -T "$tmp" "$DIR"
    trap - EXIT
fi

ver=$("$BIN" --version 2>&1) || die "$BIN --version failed: $ver"
log "$(head -n1 <<<"$ver")"
ln_sf_atomic "$BIN" "$CACHE/bin/minio"
echo "$BIN"
echo "$CACHE/bin/minio"
