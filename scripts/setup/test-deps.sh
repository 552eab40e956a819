#!/usr/bin/env bash
# Debian packages the tests need beyond the runtimes: python3 runs the Python
# SDK's tests (sdk/python) against a real daemon. Idempotent.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
apt_install python3
log "test dependencies present (python3)"
