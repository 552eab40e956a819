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

# apt_install PKG...: install only what is missing, running `apt-get update`
# at most once per script run (and only if something is missing).
_APT_UPDATED=0
apt_install() {
    local missing=() p
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    [[ ${#missing[@]} -eq 0 ]] && return 0
    need_root
    if [[ $_APT_UPDATED -eq 0 ]]; then
        log "apt-get update"
        apt-get update -qq || die "apt-get update failed"
        _APT_UPDATED=1
    fi
    log "apt-get install ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2 \
        || die "apt-get install ${missing[*]} failed"
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
