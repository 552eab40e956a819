# shellcheck shell=bash
# Shared helpers for scripts/setup/*.sh. Sourced, never executed.
#
# Everything Amber needs from outside the source tree lives under one cache
# root, in directories keyed by the pinned version, so a second run only has to
# notice that the directory is already there.

AMBER_CACHE="${AMBER_CACHE:-/var/cache/amber}"
CACHE="$AMBER_CACHE"
SETUP_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

log() { printf '[%s] %s\n' "$(basename "$0" .sh)" "$*" >&2; }
die() { printf '[%s] ERROR: %s\n' "$(basename "$0" .sh)" "$*" >&2; exit 1; }

need_root() { [[ $(id -u) -eq 0 ]] || die "must run as root"; }

# ln_sf_atomic TARGET LINK: point LINK at TARGET without a window where LINK
# is missing (rename(2) over the old link).
ln_sf_atomic() {
    local target=$1 link=$2
    mkdir -p "$(dirname "$link")"
    ln -sfn "$target" "$link.tmp.$$"
    mv -Tf "$link.tmp.$$" "$link"
}

# apt_install PKG...: install only what is missing. Runs `apt-get update`
# first (only when something is missing). Several setup scripts may run at
# once (make -j); apt's own locks make a second apt-get fail rather than wait,
# so apt runs are serialized on a lock file.
APT_LOCK=/var/lock/amber-setup-apt.lock
apt_install() {
    local missing=() p
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    [[ ${#missing[@]} -eq 0 ]] && return 0
    need_root
    (
        flock -w 1800 9 || die "timed out waiting for $APT_LOCK"
        local still=() aptlog
        for p in "${missing[@]}"; do
            dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || still+=("$p")
        done
        [[ ${#still[@]} -eq 0 ]] && exit 0
        log "apt-get update"
        apt-get update -qq -o DPkg::Lock::Timeout=600 >&2 || die "apt-get update failed"
        log "apt-get install ${still[*]}"
        aptlog=$(mktemp /tmp/amber-apt.XXXXXX.log)
        if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
            -o DPkg::Lock::Timeout=600 "${still[@]}" >"$aptlog" 2>&1; then
            tail -n 30 "$aptlog" >&2
            die "apt-get install ${still[*]} failed (full log: $aptlog)"
        fi
        rm -f "$aptlog"
    ) 9>"$APT_LOCK"
}

# umount_under DIR: undo any mount left below DIR (deepest first), so removing
# a failed build can never reach into the host's /proc or /dev.
umount_under() {
    local m
    awk -v d="$1/" 'index($2, d) == 1 {print $2}' /proc/self/mounts | sort -r | while read -r m; do
        umount -l "$m" || true
    done
}

# clean_stale_tmp PREFIX: builds happen in PREFIX.tmp.<pid> and are renamed
# to PREFIX when complete; remove such dirs left by runs that were killed.
clean_stale_tmp() {
    local d pid
    for d in "$1".tmp.*; do
        [[ -d $d ]] || continue
        pid=${d##*.tmp.}
        [[ $pid =~ ^[0-9]+$ ]] || continue
        kill -0 "$pid" 2>/dev/null && continue
        log "removing stale $d"
        umount_under "$d"
        rm -rf --one-file-system "$d"
    done
}

# debian_mirror: the Debian mirror the system's apt sources use (first deb
# URI that ends in /debian), so every download goes to the same reachable host.
debian_mirror() {
    local uri
    uri=$( { grep -hsE '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{for (i=2;i<=NF;i++) print $i}';
             grep -hsE '^deb(-src)?[[:space:]]' /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
               | sed -E 's/\[[^]]*\]//' | awk '{print $2}'; } \
           | grep -E '/debian/?$' | head -n1)
    echo "${uri:-http://deb.debian.org/debian}" | sed 's:/*$::'
}
