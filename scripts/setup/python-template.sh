#!/usr/bin/env bash
# Build the "python" sandbox template: a Debian 12 (bookworm) minbase root
# filesystem with python3, sqlite3, curl and CA certificates, made by debootstrap.
#
# Output: $AMBER_CACHE/templates/python-bookworm-<key>/rootfs
#         $AMBER_CACHE/templates/python-bookworm-<key>/packages.txt
# <key> is a hash of the inputs that decide the content (suite, variant,
# package list, post-processing revision): it changes, and the template is
# rebuilt, only when one of them changes. The package versions that went in are
# recorded in packages.txt (`dpkg-query -W`), since the hash cannot say.
# Built next to its final place and renamed into it (atomic publish).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

SUITE=bookworm
VARIANT=minbase
INCLUDE=python3,python3-minimal,ca-certificates,sqlite3,curl
TEMPLATE_REV=1 # bump when the post-processing below changes

KEY=$(printf 'suite=%s\nvariant=%s\ninclude=%s\nrev=%s\n' "$SUITE" "$VARIANT" "$INCLUDE" "$TEMPLATE_REV" \
    | sha256sum | cut -c1-12)
DIR="$CACHE/templates/python-$SUITE-$KEY"
ROOTFS="$DIR/rootfs"

if [[ -x $ROOTFS/usr/bin/python3 && -s $DIR/packages.txt ]]; then
    log "found $ROOTFS"
else
    need_root
    apt_install debootstrap
    MIRROR=$(debian_mirror)
    mkdir -p "$CACHE/templates"
    rm -rf --one-file-system "$DIR" # a leftover without a usable rootfs
    clean_stale_tmp "$CACHE/templates/.python-$SUITE-$KEY"
    tmp="$CACHE/templates/.python-$SUITE-$KEY.tmp.$$"
    mkdir "$tmp"
    chmod 0755 "$tmp"
    # shellcheck disable=SC2064
    trap "umount_under '$tmp'; rm -rf --one-file-system '$tmp'" EXIT
    r="$tmp/rootfs"

    log "debootstrap --variant=$VARIANT --include=$INCLUDE $SUITE from $MIRROR (a few minutes)"
    if ! debootstrap --variant="$VARIANT" --include="$INCLUDE" "$SUITE" "$r" "$MIRROR" >"$tmp/debootstrap.log" 2>&1; then
        tail -n 30 "$tmp/debootstrap.log" >&2
        [[ -f $r/debootstrap/debootstrap.log ]] && tail -n 30 "$r/debootstrap/debootstrap.log" >&2
        die "debootstrap failed"
    fi
    umount_under "$tmp"

    # Same mirror as the host for apt inside the sandbox, plus updates/security.
    cat >"$r/etc/apt/sources.list" <<EOF
deb $MIRROR $SUITE main
deb $MIRROR $SUITE-updates main
deb ${MIRROR%/debian}/debian-security $SUITE-security main
EOF
    # Host-specific files debootstrap copied in; the runtime provides its own.
    : >"$r/etc/resolv.conf"
    echo amber >"$r/etc/hostname"
    mkdir -p "$r/home/user"

    chroot "$r" dpkg-query -W >"$tmp/packages.txt" || die "dpkg-query in the new rootfs failed"
    chroot "$r" python3 -c 'import sqlite3, ssl; print("python", __import__("sys").version.split()[0], "sqlite", sqlite3.sqlite_version)' >&2 \
        || die "python3 smoke test in the new rootfs failed"

    # Keep the template small: apt's downloaded packages and indexes, logs,
    # and documentation (licences kept). Installs inside the sandbox run
    # `apt-get update` first anyway; the dpkg.cfg.d snippet stops later
    # installs from bringing docs back.
    chroot "$r" apt-get clean
    rm -rf "$r"/var/lib/apt/lists/* "$r"/var/cache/apt/*.bin "$r"/var/cache/debconf/*-old \
        "$r"/var/log/*.log "$r"/var/log/apt/* "$r"/debootstrap
    find "$r/usr/share/doc" -mindepth 1 ! -name copyright ! -type d -delete 2>/dev/null || true
    find "$r/usr/share/doc" -mindepth 1 -type d -empty -delete 2>/dev/null || true
    rm -rf "$r"/usr/share/man/* "$r"/usr/share/info/* "$r"/usr/share/locale/*
    cat >"$r/etc/dpkg/dpkg.cfg.d/01-amber-nodoc" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
EOF
    printf 'suite=%s\nvariant=%s\ninclude=%s\nrev=%s\nmirror=%s\nbuilt=%s\n' \
        "$SUITE" "$VARIANT" "$INCLUDE" "$TEMPLATE_REV" "$MIRROR" "$(date -u +%FT%TZ)" >"$tmp/inputs.txt"
    rm -f "$tmp/debootstrap.log"

    if ! mv -T "$tmp" "$DIR" 2>/dev/null; then
        [[ -x $ROOTFS/usr/bin/python3 ]] || die "cannot rename $tmp to $DIR"
        log "another run already published $DIR"
    else
        trap - EXIT
        log "built $ROOTFS ($(du -sh "$ROOTFS" | cut -f1), $(wc -l <"$DIR/packages.txt") packages)"
    fi
fi

echo "$ROOTFS"
echo "$DIR/packages.txt"
