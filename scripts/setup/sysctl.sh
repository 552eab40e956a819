#!/usr/bin/env bash
# Raise fs.pipe-max-size to >= 4 MiB (idempotent; never lowers it).
#
# Why: CRIU lazy restore moves pages through pipes. Root here lacks
# CAP_SYS_RESOURCE, so the lazy page server cannot grow its pipes past
# pipe-max-size and dies with "splice: Bad file descriptor". Also written to
# /etc/sysctl.d so it survives a reboot.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

WANT=4194304
KNOB=/proc/sys/fs/pipe-max-size
CONF=/etc/sysctl.d/60-amber.conf

cur=$(cat "$KNOB") || die "cannot read $KNOB"
if [[ $cur -ge $WANT ]]; then
    log "fs.pipe-max-size=$cur (>= $WANT), nothing to do"
else
    need_root
    echo "$WANT" >"$KNOB" || die "cannot write $KNOB"
    log "fs.pipe-max-size: $cur -> $(cat "$KNOB")"
fi
if [[ -d /etc/sysctl.d ]] && ! grep -qs "^fs.pipe-max-size *= *$WANT\$" "$CONF" && [[ $(id -u) -eq 0 ]]; then
    echo "fs.pipe-max-size = $WANT" >"$CONF"
    log "wrote $CONF"
fi
echo "fs.pipe-max-size=$(cat "$KNOB")"
