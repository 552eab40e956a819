#!/usr/bin/env bash
# Install gVisor's runsc into $AMBER_CACHE/runsc-<pseudo-version>-p<patches>/bin/runsc
# and point $AMBER_CACHE/bin/runsc at it.
#
# gVisor publishes no tagged Go module versions for runsc; it is built from a
# pinned pseudo-version of the `master` branch (`@go` is refused by the module
# proxy here), with Amber's patches (scripts/setup/runsc-*.patch) applied to a
# copy of that module's source. The cache directory is keyed by the pin and by
# the patches' digest, so a new patch builds a new runsc. CGO_ENABLED=0 gives a
# static binary, which runsc needs (its sandbox process re-execs itself inside
# an empty filesystem).
#
# The binary's -ldflags build setting carries the pin and the digest: the
# gvisor driver's Check refuses any other build (drivers/gvisor/driver.go:
# PinnedVersion, PatchDigest).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

RUNSC_VERSION=v0.0.0-20260905035102-160fafc42237
PATCHES=("$SETUP_DIR"/runsc-*.patch)
PATCH_DIGEST=$(cat "${PATCHES[@]}" | sha256sum | cut -c1-12)
DIR="$CACHE/runsc-$RUNSC_VERSION-p$PATCH_DIGEST"
BIN="$DIR/bin/runsc"

command -v go >/dev/null || die "go not found on PATH"
apt_install patch

if [[ -x $BIN ]]; then
    log "found $BIN"
else
    log "building gvisor.dev/gvisor/runsc@$RUNSC_VERSION with ${#PATCHES[@]} patch(es) (a few minutes)"
    clean_stale_tmp "$DIR"
    tmp="$DIR.tmp.$$"
    rm -rf "$tmp"; mkdir -p "$tmp/bin"
    trap 'rm -rf "$tmp"' EXIT
    src=$(go mod download -json "gvisor.dev/gvisor@$RUNSC_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p') \
        || die "go mod download gvisor.dev/gvisor@$RUNSC_VERSION failed"
    [[ -d $src ]] || die "go mod download gave no source directory for gvisor.dev/gvisor@$RUNSC_VERSION"
    cp -R "$src" "$tmp/src"
    chmod -R u+w "$tmp/src"
    for p in "${PATCHES[@]}"; do
        patch -p1 -s -d "$tmp/src" < "$p" || die "$p does not apply to gvisor.dev/gvisor@$RUNSC_VERSION"
    done
    # The sentry's precompiled seccomp programs (runsc-precompiled-seccomp.patch):
    # without them every `runsc boot` compiles its filter, in the path of every
    # create and restore.
    (cd "$tmp/src" && CGO_ENABLED=0 go run -buildvcs=false ./runsc/boot/filter/amberseccompgen \
        > runsc/boot/filter/precompiled_amber.go 2> "$tmp/seccompgen.log") \
        || die "generating runsc's precompiled seccomp programs failed: $(tail -5 "$tmp/seccompgen.log")"
    log "$(grep -c . "$tmp/seccompgen.log") seccomp programs precompiled"
    # -X stamps the pin into `runsc --version` (what runsc compares with an
    # image's: unchanged, so images of the unpatched build restore) and the
    # patches' digest into the variable runsc-version-amber-patches.patch adds.
    (cd "$tmp/src" && CGO_ENABLED=0 go build -buildvcs=false \
        -ldflags "-X gvisor.dev/gvisor/runsc/version.version=$RUNSC_VERSION -X gvisor.dev/gvisor/runsc/version.amberPatches=$PATCH_DIGEST" \
        -o "$tmp/bin/runsc" ./runsc) \
        || die "building the patched runsc failed"
    rm -rf "$tmp/src"
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
