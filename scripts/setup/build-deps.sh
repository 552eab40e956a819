#!/usr/bin/env bash
# Debian packages needed to build bin/amber itself: the criu driver uses runc's
# libcontainer, whose nsenter part is C (cgo), and its seccomp filter is
# compiled with libseccomp (build tag "seccomp"). Idempotent.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
apt_install gcc libc6-dev libseccomp-dev pkg-config
log "build dependencies present (gcc, libseccomp-dev, pkg-config)"
