#!/usr/bin/env bash
# Install gVisor's runsc into $AMBER_CACHE/runsc-<pseudo-version>/bin/runsc and
# point $AMBER_CACHE/bin/runsc at it.
#
# gVisor publishes no tagged Go module versions for runsc; it must be built
# from a pinned pseudo-version of the `master` branch (`@go` is refused by the
# module proxy here). CGO_ENABLED=0 gives a static binary, which runsc needs
# (its sandbox process re-execs itself inside an empty filesystem).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

RUNSC_VERSION=v0.0.0-20260905035102-160fafc42237
DIR="$CACHE/runsc-$RUNSC_VERSION"
BIN="$DIR/bin/runsc"

command -v go >/dev/null || die "go not found on PATH"

if [[ -x $BIN ]]; then
    log "found $BIN"
else
    log "building gvisor.dev/gvisor/runsc@$RUNSC_VERSION (a few minutes)"
    clean_stale_tmp "$DIR"
    tmp="$DIR.tmp.$$"
    rm -rf "$tmp"; mkdir -p "$tmp/bin"
    trap 'rm -rf "$tmp"' EXIT
    # -X only stamps the pin into `runsc --version` (go install leaves it at
    # VERSION_MISSING); the code built is the same.
    CGO_ENABLED=0 GOBIN="$tmp/bin" \
        go install -ldflags "-X gvisor.dev/gvisor/runsc/version.version=$RUNSC_VERSION" \
        "gvisor.dev/gvisor/runsc@$RUNSC_VERSION" \
        || die "go install gvisor.dev/gvisor/runsc@$RUNSC_VERSION failed"
    rm -rf "$DIR"; mv -T "$tmp" "$DIR"
    trap - EXIT
fi

# Verify: it runs, and it is statically linked.
ver=$("$BIN" --version 2>&1) || die "$BIN --version failed: $ver"
file -L "$BIN" | grep -q 'statically linked' \
    || die "$BIN is not statically linked (was it built with CGO_ENABLED=0?): $(file -L "$BIN")"
if command -v ldd >/dev/null && ldd "$BIN" 2>&1 | grep -q '=>'; then
    die "$BIN links shared libraries: $(ldd "$BIN" 2>&1 | tr '\n' ' ')"
fi
log "$(head -n1 <<<"$ver") (static)"

ln_sf_atomic "$BIN" "$CACHE/bin/runsc"
echo "$BIN"
echo "$CACHE/bin/runsc"
