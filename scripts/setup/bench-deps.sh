#!/usr/bin/env bash
# Debian packages the benchmarks need beyond the tests': runc, the raw
# runtime `make bench-restore` times beside Amber's criu driver (with the
# cache's CRIU). Idempotent.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
apt_install runc
log "benchmark dependencies present (runc $(runc --version | head -1 | awk '{print $3}'))"
