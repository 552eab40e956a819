#!/usr/bin/env bash
# Build the "minimal" sandbox template: a root filesystem holding only a
# static busybox (from Debian's busybox-static), its applet symlinks and the
# few files and directories a process expects to find.
#
# Output: $AMBER_CACHE/templates/minimal-<busybox version>/rootfs
# The directory is built next to its final place and renamed into it, so a
# reader never sees a half-built template, and an existing one is reused.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

apt_install busybox-static
BUSYBOX=/bin/busybox
[[ -x $BUSYBOX ]] || die "$BUSYBOX missing after installing busybox-static"
# Debian version without the epoch, e.g. 1.35.0-4+deb12u1+b1.
BB_VERSION=$(dpkg-query -W -f='${Version}' busybox-static | sed 's/^[0-9]*://')
DIR="$CACHE/templates/minimal-$BB_VERSION"
ROOTFS="$DIR/rootfs"

if [[ -x $ROOTFS/bin/busybox ]]; then
    log "found $ROOTFS"
else
    need_root
    file -L "$BUSYBOX" | grep -q 'statically linked' || die "$BUSYBOX is not statically linked"
    mkdir -p "$CACHE/templates"
    rm -rf "$DIR" # a leftover without a usable rootfs
    clean_stale_tmp "$CACHE/templates/.minimal-$BB_VERSION"
    tmp="$CACHE/templates/.minimal-$BB_VERSION.tmp.$$"
    mkdir "$tmp"
    # shellcheck disable=SC2064
    trap "rm -rf '$tmp'" EXIT
    chmod 0755 "$tmp"
    r="$tmp/rootfs"
    mkdir -p "$r"/{bin,sbin,usr/bin,usr/sbin,etc,proc,sys,dev,root,home/user,tmp,var/tmp}
    chmod 1777 "$r/tmp" "$r/var/tmp"
    chmod 0700 "$r/root"
    install -m 0755 "$BUSYBOX" "$r/bin/busybox"

    # One symlink per applet, at the path busybox itself uses (bin/sh,
    # usr/bin/env, sbin/ip, ...), so shebangs like /usr/bin/env work.
    # `busybox --install -s` run inside the new root does it in one process.
    chroot "$r" /bin/busybox --install -s || die "busybox --install -s failed"
    rm -f "$r/linuxrc"
    n=$(find "$r" -type l -lname /bin/busybox | wc -l)
    want=$("$BUSYBOX" --list | grep -vcx 'busybox\|linuxrc')
    [[ $n -ge $want && $n -gt 100 ]] || die "only $n of $want busybox applets linked"

    cat >"$r/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
EOF
    cat >"$r/etc/group" <<'EOF'
root:x:0:
nobody:x:65534:
EOF
    cat >"$r/etc/hosts" <<'EOF'
127.0.0.1	localhost
::1	localhost ip6-localhost ip6-loopback
EOF
    : >"$r/etc/resolv.conf"
    echo "$BB_VERSION" >"$tmp/busybox-version"

    # Smoke test: the template's shell runs and sees its applets.
    if [[ $(id -u) -eq 0 ]]; then
        out=$(chroot "$r" /bin/sh -c 'ls /bin/sh >/dev/null && echo ok') || die "chroot smoke test failed"
        [[ $out == ok ]] || die "chroot smoke test printed: $out"
    fi

    # Publish atomically. If another run won the race, keep its copy.
    if ! mv -T "$tmp" "$DIR" 2>/dev/null; then
        [[ -x $ROOTFS/bin/busybox ]] || die "cannot rename $tmp to $DIR"
        log "another run already published $DIR"
    else
        trap - EXIT
        log "built $ROOTFS ($n applets)"
    fi
fi

echo "$ROOTFS"
