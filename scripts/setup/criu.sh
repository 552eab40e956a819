#!/usr/bin/env bash
# Build CRIU 4.1.1 (+ Amber's seven patches) into
# $AMBER_CACHE/criu-4.1.1-p5/sbin/criu and point $AMBER_CACHE/bin/criu at it.
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
# Why the patches (applied with patch -p1, in this order):
#  - criu-4.1.1-passcred.patch: kernels >= 6.16 answer EOPNOTSUPP to
#    getsockopt(SO_PASSCRED/SO_PASSSEC) on INET sockets and CRIU 4.1.1 treats
#    it as fatal, so it cannot dump any process holding a TCP/UDP socket
#    (upstream issue #2718). The patch treats EOPNOTSUPP as "option off".
#  - criu-4.1.1-hw-breakpoints.patch: under the PVM hypervisor of these
#    machines x86 hardware breakpoints set through ptrace never fire, so every
#    dump hangs while CRIU waits for the task to leave the parasite. The patch
#    probes for working breakpoints and otherwise uses CRIU's syscall-tracing
#    fallback (what CRIU_FAULT=130 forces).
#  - criu-4.1.1-uffd-dev.patch: a lazy restore has each restored task call
#    userfaultfd(2) inside the sandbox's user namespace, which the kernel
#    refuses (EPERM) while vm.unprivileged_userfaultfd=0. criu, still root,
#    opens the root-only /dev/userfaultfd (Linux >= 6.1) before forking the
#    tree and the tasks create their userfaultfd with USERFAULTFD_IOC_NEW on
#    it; the sysctl stays 0. Adds `criu check --feature uffd-dev`.
#  - criu-4.1.1-tmpfs-plain-tar.patch: CRIU gzips the content of every tmpfs
#    it dumps (the sandbox's /dev and /dev/shm), inside the frozen window: a
#    full 64 MiB /dev/shm froze a sandbox for 2.3–2.6 s on this machine. The
#    patch writes a plain tar; a restore reads the archive's first two bytes
#    and gunzips the images of earlier builds.
#  - criu-4.1.1-network-lock-rpc.patch: `network-lock` in the configuration
#    file libcontainer hands CRIU (the only way to choose the lock method
#    through runc's RPC options) crashed CRIU: argv[optind] is NULL in RPC
#    mode. The criu driver sets `network-lock nftables` there.
#  - criu-4.1.1-kdat-cache.patch: CRIU keeps its kernel-feature cache
#    (/run/criu.kdat) only on a tmpfs, and /run is ext4 here, so every dump
#    and restore probed the kernel again (28 ms of each cut's frozen window);
#    a failed save also leaked criu.kdat.tmp, which blocked every later save.
#    The cache now records the boot id and is refused after a reboot.
#  - criu-4.1.1-empty-netns-dump.patch: with --empty-ns net (the criu
#    driver makes the sandbox's network namespace itself at a restore) CRIU
#    still mounted the namespace's sysfs and dumped its conntrack tables,
#    ~18 ms of the frozen window; it now dumps nothing of the namespace.
# The install dir records a hash of the patches: editing a patch rebuilds.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CRIU_VERSION=4.1.1
CRIU_BUILD=p5
ORIG=criu_${CRIU_VERSION}.orig.tar.xz
ORIG_SHA256=f80a66cb3726bb2116266d4759ce3bcbfab7abdb6b6d430bf20dd41911717afe
PATCHES=("$SETUP_DIR/criu-$CRIU_VERSION-passcred.patch" "$SETUP_DIR/criu-$CRIU_VERSION-hw-breakpoints.patch"
    "$SETUP_DIR/criu-$CRIU_VERSION-uffd-dev.patch" "$SETUP_DIR/criu-$CRIU_VERSION-tmpfs-plain-tar.patch"
    "$SETUP_DIR/criu-$CRIU_VERSION-network-lock-rpc.patch" "$SETUP_DIR/criu-$CRIU_VERSION-kdat-cache.patch"
    "$SETUP_DIR/criu-$CRIU_VERSION-empty-netns-dump.patch")

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

for p in "${PATCHES[@]}"; do [[ -f $p ]] || die "missing $p"; done
PATCHES_SHA=$(cat "${PATCHES[@]}" | sha256sum | cut -c1-64)

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
    # apt drops privileges to _apt for downloads; let it reach its dirs.
    chmod 755 "$work"
    if id _apt >/dev/null 2>&1; then chown _apt "$work/src"; fi
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
    clean_stale_tmp "$DIR"
    local tmp="$DIR.tmp.$$"
    rm -rf "$tmp"; mkdir -p "$tmp/src" "$tmp/sbin"
    # shellcheck disable=SC2064
    trap "rm -rf '$tmp'" EXIT
    tar -xf "$TARBALL" -C "$tmp/src" --strip-components=1
    local p
    for p in "${PATCHES[@]}"; do
        (cd "$tmp/src" && patch -p1 --forward --quiet <"$p" >&2) || die "patch $p failed"
        cp "$p" "$tmp/"
    done
    log "building criu $CRIU_VERSION (make -j$(nproc) criu; 2-4 min, longer on a busy machine)"
    # Only the `criu` target: no docs (asciidoc/xmlto), no crit/lib/plugins.
    make -C "$tmp/src" -j"$(nproc)" criu >"$tmp/build.log" 2>&1 \
        || { tail -n 40 "$tmp/build.log" >&2; die "criu build failed (log above)"; }
    install -m 0755 "$tmp/src/criu/criu" "$tmp/sbin/criu"
    echo "$PATCHES_SHA" >"$tmp/patches.sha256"
    rm -rf "$tmp/src" "$tmp/build.log"
    rm -rf "$DIR"; mv -T "$tmp" "$DIR"
    trap - EXIT
}

if [[ -x $BIN && $(cat "$DIR/patches.sha256" 2>/dev/null) == "$PATCHES_SHA" ]]; then
    log "found $BIN"
else
    [[ -x $BIN ]] && log "$BIN was built with other patches; rebuilding"
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
for f in uffd uffd-noncoop uffd-dev mem_dirty_track; do
    if fout=$("$BIN" check --feature "$f" 2>&1); then
        log "criu check --feature $f: yes"
    else
        log "criu check --feature $f: NO ($(tail -n1 <<<"$fout"))"
    fi
done

# Smoke test: dump a process holding TCP and UDP sockets (exercises both
# patches), restore it, check it runs. Cheap (~1 s), and it is the only way to
# notice a criu that passes `check` but hangs or fails on a real dump.
smoke_test() {
    local work pid="" rc=0
    work=$(mktemp -d /tmp/amber-criu-smoke.XXXXXX)
    # setsid -f: the test process is not our child (no job-control noise when
    # criu kills it); it reports its PID through the "ready" file.
    setsid -f /usr/bin/python3 -c '
import os, socket, sys, time
t = socket.socket(); t.bind(("127.0.0.1", 0)); t.listen()
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
with open(sys.argv[1] + ".tmp", "w") as f: f.write(str(os.getpid()))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
while True: time.sleep(1)' "$work/ready" </dev/null >/dev/null 2>&1
    for _ in $(seq 1 200); do [[ -s $work/ready ]] && break; sleep 0.05; done
    pid=$(cat "$work/ready" 2>/dev/null) || { log "smoke test: test process did not start"; return 1; }
    mkdir "$work/img"
    if ! timeout -s KILL 60 "$BIN" dump -t "$pid" -D "$work/img" -o dump.log -v4; then
        rc=1; log "smoke test: criu dump failed or hung; log: $work/img/dump.log"
    fi
    kill -9 "$pid" 2>/dev/null || true
    # init reaps it; restore needs the PID free again.
    for _ in $(seq 1 100); do [[ -d /proc/$pid ]] || break; sleep 0.05; done
    if [[ $rc -eq 0 ]]; then
        if timeout -s KILL 60 "$BIN" restore -d -D "$work/img" -o restore.log -v4 && kill -0 "$pid" 2>/dev/null; then
            kill -9 "$pid" 2>/dev/null || true
        else
            rc=1; log "smoke test: criu restore failed; log: $work/img/restore.log"
        fi
    fi
    [[ $rc -eq 0 ]] && rm -rf "$work"
    return $rc
}
# Once per boot is enough (the stamp is keyed by the kernel's boot id).
stamp="$DIR/smoke-ok.$(cat /proc/sys/kernel/random/boot_id 2>/dev/null || echo none)"
if [[ -e $stamp ]]; then
    log "smoke test: passed earlier this boot ($stamp)"
elif smoke_test; then
    rm -f "$DIR"/smoke-ok.*
    touch "$stamp" 2>/dev/null || true
    log "smoke test: dump + restore of a process with TCP/UDP sockets OK"
else
    die "criu smoke test failed (see log path above)"
fi

# CRIU's default network lock (the only one libcontainer can ask for: it has
# no option for it) runs iptables-restore in the sandbox's network namespace.
apt_install iptables

pipe_max=$(cat /proc/sys/fs/pipe-max-size)
[[ $pipe_max -ge 4194304 ]] || log "NOTE: fs.pipe-max-size=$pipe_max < 4194304; run scripts/setup/sysctl.sh for lazy restore"

echo "$BIN"
echo "$CACHE/bin/criu"
