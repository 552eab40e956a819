#!/usr/bin/env bash
# Build a Debian 12 (bookworm) sandbox template with extra Debian packages:
# a debootstrap minbase root filesystem, then `apt-get install` of PACKAGES
# from bookworm, bookworm-updates and bookworm-security inside it (so a
# package with security releases, like chromium, is the version Debian ships
# today, not the one frozen at the point release).
#
#   deb-template.sh NAME REV PACKAGES CHECK [TEMPLATE_JSON]
#
#   NAME           template name (the catalog's name, before the first "-")
#   REV            bump when the caller's post-processing or CHECK changes
#   PACKAGES       comma-separated Debian package names
#   CHECK          shell command run in the new rootfs (chroot) that must
#                  succeed before the template is published (a smoke test)
#   TEMPLATE_JSON  optional template.json (env, cwd, user, limits)
#
# Output: $AMBER_CACHE/templates/NAME-bookworm-<key>/rootfs
#         $AMBER_CACHE/templates/NAME-bookworm-<key>/packages.txt
# <key> is a hash of the inputs that decide the content (suite, variant,
# packages, REV, template.json). The exact package versions that went in are
# in packages.txt (`dpkg-query -W`): security updates change them, the key
# does not, so a rebuild is only done when an input changes. Built next to its
# final place and renamed into it (atomic publish).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

[[ $# -ge 4 ]] || die "usage: $0 NAME REV PACKAGES CHECK [TEMPLATE_JSON]"
NAME=$1 REV=$2 PACKAGES=$3 CHECK=$4 TJSON=${5:-}
SUITE=bookworm
VARIANT=minbase
BASE_INCLUDE=ca-certificates

KEY=$(printf 'suite=%s\nvariant=%s\nbase=%s\npackages=%s\nrev=%s\njson=%s\n' \
    "$SUITE" "$VARIANT" "$BASE_INCLUDE" "$PACKAGES" "$REV" "$TJSON" | sha256sum | cut -c1-12)
DIR="$CACHE/templates/$NAME-$SUITE-$KEY"
ROOTFS="$DIR/rootfs"

if [[ -f $DIR/.complete && -s $DIR/packages.txt ]]; then
    log "found $ROOTFS"
    echo "$ROOTFS"
    echo "$DIR/packages.txt"
    exit 0
fi

need_root
apt_install debootstrap
MIRROR=$(debian_mirror)
mkdir -p "$CACHE/templates"
rm -rf --one-file-system "$DIR" # a leftover without a usable rootfs
clean_stale_tmp "$CACHE/templates/.$NAME-$SUITE-$KEY"
tmp="$CACHE/templates/.$NAME-$SUITE-$KEY.tmp.$$"
mkdir "$tmp"
chmod 0755 "$tmp"
# shellcheck disable=SC2064
trap "umount_under '$tmp'; rm -rf --one-file-system '$tmp'" EXIT
r="$tmp/rootfs"

log "debootstrap --variant=$VARIANT $SUITE from $MIRROR"
if ! debootstrap --variant="$VARIANT" --include="$BASE_INCLUDE" "$SUITE" "$r" "$MIRROR" >"$tmp/build.log" 2>&1; then
    tail -n 30 "$tmp/build.log" >&2
    [[ -f $r/debootstrap/debootstrap.log ]] && tail -n 30 "$r/debootstrap/debootstrap.log" >&2
    die "debootstrap failed"
fi
umount_under "$tmp"

cat >"$r/etc/apt/sources.list" <<EOF
deb $MIRROR $SUITE main
deb $MIRROR $SUITE-updates main
deb ${MIRROR%/debian}/debian-security $SUITE-security main
EOF
# Packages' maintainer scripts must not start services in the build chroot.
printf '#!/bin/sh\nexit 101\n' >"$r/usr/sbin/policy-rc.d"
chmod 0755 "$r/usr/sbin/policy-rc.d"
# postgresql-common: no cluster in the template; a sandbox makes its own.
mkdir -p "$r/etc/postgresql-common/createcluster.d"
echo 'create_main_cluster = false' >"$r/etc/postgresql-common/createcluster.d/amber.conf"
cp /etc/resolv.conf "$r/etc/resolv.conf"
mount -t proc proc "$r/proc"

log "apt-get install ${PACKAGES//,/ } (a few minutes)"
pkgs=${PACKAGES//,/ }
# shellcheck disable=SC2086
if ! chroot "$r" /usr/bin/env DEBIAN_FRONTEND=noninteractive sh -ec "
        apt-get update -q
        apt-get dist-upgrade -y -q
        apt-get install -y -q --no-install-recommends -o Dpkg::Options::=--force-confold $pkgs
    " >>"$tmp/build.log" 2>&1; then
    tail -n 40 "$tmp/build.log" >&2
    die "apt-get install in the new rootfs failed"
fi

chroot "$r" dpkg-query -W >"$tmp/packages.txt" || die "dpkg-query in the new rootfs failed"
if ! chroot "$r" /bin/sh -ec "$CHECK" >&2; then
    die "smoke test in the new rootfs failed: $CHECK"
fi
umount_under "$tmp"

# Host-specific files; the runtime provides its own.
: >"$r/etc/resolv.conf"
echo amber >"$r/etc/hostname"
rm -f "$r/usr/sbin/policy-rc.d"
mkdir -p "$r/home/user"
# Keep the template small (see python-template.sh).
chroot "$r" apt-get clean
rm -rf "$r"/var/lib/apt/lists/* "$r"/var/cache/apt/*.bin "$r"/var/cache/debconf/*-old \
    "$r"/var/log/*.log "$r"/var/log/apt/* "$r"/debootstrap
find "$r/usr/share/doc" -mindepth 1 ! -name copyright ! -type d -delete 2>/dev/null || true
find "$r/usr/share/doc" -mindepth 1 -type d -empty -delete 2>/dev/null || true
rm -rf "$r"/usr/share/man/* "$r"/usr/share/info/*
cat >"$r/etc/dpkg/dpkg.cfg.d/01-amber-nodoc" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
EOF
[[ -n $TJSON ]] && printf '%s\n' "$TJSON" >"$tmp/template.json"
printf 'suite=%s\nvariant=%s\nbase=%s\npackages=%s\nrev=%s\nmirror=%s\nbuilt=%s\n' \
    "$SUITE" "$VARIANT" "$BASE_INCLUDE" "$PACKAGES" "$REV" "$MIRROR" "$(date -u +%FT%TZ)" >"$tmp/inputs.txt"
rm -f "$tmp/build.log"
touch "$tmp/.complete"

if ! mv -T "$tmp" "$DIR" 2>/dev/null; then
    [[ -f $DIR/.complete ]] || die "cannot rename $tmp to $DIR"
    log "another run already published $DIR"
else
    trap - EXIT
    log "built $ROOTFS ($(du -sh "$ROOTFS" | cut -f1), $(wc -l <"$DIR/packages.txt") packages)"
fi
echo "$ROOTFS"
echo "$DIR/packages.txt"
