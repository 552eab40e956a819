#!/usr/bin/env bash
# Build CRIU 4.1.1 (+ Amber's SO_PASSCRED fix) into
# $AMBER_CACHE/criu-4.1.1-p1/sbin/criu and point $AMBER_CACHE/bin/criu at it.
#
# Why build it: Debian 12's criu 3.17 does not start on kernels >= 6.13 (vDSO
# layout). Never `apt-get install criu` here: runc would find that broken
# binary first on PATH.
#
# Why a private apt configuration: the source comes from Debian trixie, but the
# machine is bookworm. Adding trixie to the system's sources would let a later
# `apt-get upgrade` pull trixie packages; a private sources.list + state/cache
# dirs under a temp dir leaves /etc/apt and /var/lib/apt untouched.
#
# Why the patch: kernels >= 6.16 answer EOPNOTSUPP to
# getsockopt(SO_PASSCRED/SO_PASSSEC) on INET sockets and CRIU 4.1.1 treats that
# as fatal, so it cannot dump any process holding a TCP/UDP socket (upstream
# issue #2718). criu-4.1.1-passcred.patch treats EOPNOTSUPP as "option off".
# Bump CRIU_BUILD (p1 -> p2) whenever the patch or build flags change.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CRIU_VERSION=4.1.1
CRIU_BUILD=p1
ORIG=criu_${CRIU_VERSION}.orig.tar.xz
ORIG_SHA256=f80a66cb3726bb2116266d4759ce3bcbfab7abdb6b6d430bf20dd41911717afe
PATCH="$SETUP_DIR/criu-${CRIU_VERSION}-passcred.patch"

DIR="$CACHE/criu-$CRIU_VERSION-$CRIU_BUILD"
BIN="$DIR/sbin/criu"
TARBALL="$CACHE/downloads/$ORIG"

# Build dependencies from Debian 12 (no docs: asciidoc/xmlto are not needed
# because we only build the `criu` target). iproute2/nftables are run by criu
# itself when it dumps network namespaces and locks the network.
BUILD_DEPS=(build-essential pkg-config libprotobuf-dev libprotobuf-c-dev
    protobuf-c-compiler protobuf-compiler python3-protobuf libnl-3-dev
    libcap-dev libnet1-dev libbsd-dev libgnutls28-dev libnftables-dev uuid-dev
    iproute2 nftables xz-utils patch)

sha_ok() { [[ -f $1 ]] && echo "$ORIG_SHA256  $1" | sha256sum -c --status; }

# fetch_orig: put the verified orig tarball at $TARBALL.
fetch_orig() {
    if sha_ok "$TARBALL"; then log "found $TARBALL"; return 0; fi
    need_root
    local mirror work
    mirror=$(debian_mirror)
    work=$(mktemp -d /tmp/amber-criu-apt.XXXXXX)
    # shellcheck disable=SC2064
    trap "rm -rf '$work'; trap - RETURN" RETURN
    mkdir -p "$work/parts" "$work/state/lists/partial" "$work/cache/archives/partial" "$work/src"
    : >"$work/status"
    echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror trixie main" >"$work/sources.list"
    # apt drops privileges to _apt for downloads; let it write the target dir.
    id _apt >/dev/null 2>&1 && chown _apt "$work/src"
    local apt_priv=(
        -o "Dir::Etc::SourceList=$work/sources.list"
        -o "Dir::Etc::SourceParts=$work/parts"
        -o "Dir::State=$work/state"
        -o "Dir::State::status=$work/status"
        -o "Dir::Cache=$work/cache"
        -o "Acquire::Languages=none"
    )
    log "private apt: deb-src $mirror trixie main"
    apt-get "${apt_priv[@]}" -qq update >&2 || die "apt-get update (private trixie deb-src) failed"

    # Find the Debian revision of upstream $CRIU_VERSION and its pool directory.
    local stanza debver pooldir
    stanza=$(apt-cache "${apt_priv[@]}" showsrc criu \
        | awk -v v="$CRIU_VERSION" 'BEGIN{RS="";ORS="\n\n"} $0 ~ "\nVersion: " v "-" {print; exit}')
    [[ -n $stanza ]] || die "trixie has no criu $CRIU_VERSION-* source package"
    debver=$(awk '/^Version:/{print $2; exit}' <<<"$stanza")
    pooldir=$(awk '/^Directory:/{print $2; exit}' <<<"$stanza")
    log "trixie source package criu $debver ($pooldir)"

    # apt-get source fetches .dsc + orig + debian tarball; here the .dsc and
    # .debian.tar.xz are not served (404), so it fails but may still leave the
    # orig tarball, which is all we need.
    (cd "$work/src" && apt-get "${apt_priv[@]}" source --download-only "criu=$debver" >&2) \
        || log "apt-get source failed (expected here: .dsc/.debian.tar.xz not served); checking for the orig tarball"
    if ! sha_ok "$work/src/$ORIG"; then
        # Fallback: fetch just the orig tarball with apt's own downloader,
        # which checks the hash while downloading.
        log "fetching $mirror/$pooldir/$ORIG with apt-helper"
        rm -f "$work/src/$ORIG"
        /usr/lib/apt/apt-helper download-file "$mirror/$pooldir/$ORIG" "$work/src/$ORIG" "SHA256:$ORIG_SHA256" >&2 \
            || die "could not download $mirror/$pooldir/$ORIG"
    fi
    sha_ok "$work/src/$ORIG" || die "$ORIG: sha256 mismatch (want $ORIG_SHA256)"
    mkdir -p "$(dirname "$TARBALL")"
    cp "$work/src/$ORIG" "$TARBALL.tmp.$$" && mv -f "$TARBALL.tmp.$$" "$TARBALL"
    log "verified $TARBALL"
}

build() {
    need_root
    apt_install "${BUILD_DEPS[@]}"
    fetch_orig
    [[ -f $PATCH ]] || die "missing $PATCH"
    local tmp="$DIR.tmp.$$"
    rm -rf "$tmp"; mkdir -p "$tmp/src" "$tmp/sbin"
    # shellcheck disable=SC2064
    trap "rm -rf '$tmp'" EXIT
    tar -xf "$TARBALL" -C "$tmp/src" --strip-components=1
    (cd "$tmp/src" && patch -p1 --forward <"$PATCH" >&2) || die "patch $PATCH failed"
    log "building criu $CRIU_VERSION (make -j$(nproc) criu, ~1-2 min)"
    # Only the `criu` target: no docs (asciidoc/xmlto), no crit/lib/plugins.
    make -C "$tmp/src" -j"$(nproc)" criu >"$tmp/build.log" 2>&1 \
        || { tail -n 40 "$tmp/build.log" >&2; die "criu build failed (log above)"; }
    install -m 0755 "$tmp/src/criu/criu" "$tmp/sbin/criu"
    cp "$PATCH" "$tmp/"
    sha256sum "$PATCH" | awk '{print $1}' >"$tmp/patch.sha256"
    rm -rf "$tmp/src" "$tmp/build.log"
    rm -rf "$DIR"; mv -T "$tmp" "$DIR"
    trap - EXIT
}

if [[ -x $BIN ]]; then
    log "found $BIN"
    if [[ -f $DIR/patch.sha256 && $(sha256sum "$PATCH" | awk '{print $1}') != $(cat "$DIR/patch.sha256") ]]; then
        log "WARNING: $PATCH differs from the one $BIN was built with; bump CRIU_BUILD to rebuild"
    fi
else
    build
fi

"$BIN" --version >&2 || die "$BIN --version failed (missing shared libraries? try: ldd $BIN)"
ln_sf_atomic "$BIN" "$CACHE/bin/criu"

# Report what this kernel supports. `criu check` failing is fatal: the binary
# would not be able to dump anything. Feature checks are informational.
log "criu check:"
out=$("$BIN" check 2>&1) && rc=0 || rc=$?
sed 's/^/    /' <<<"$out" >&2
[[ $rc -eq 0 ]] || die "criu check failed (exit $rc)"
for f in uffd uffd-noncoop mem_dirty_track; do
    if fout=$("$BIN" check --feature "$f" 2>&1); then
        log "criu check --feature $f: yes"
    else
        log "criu check --feature $f: NO ($(tail -n1 <<<"$fout"))"
    fi
done
pipe_max=$(cat /proc/sys/fs/pipe-max-size)
[[ $pipe_max -ge 4194304 ]] || log "NOTE: fs.pipe-max-size=$pipe_max < 4194304; run scripts/setup/sysctl.sh for lazy restore"

echo "$BIN"
echo "$CACHE/bin/criu"
