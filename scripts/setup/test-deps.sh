#!/usr/bin/env bash
# Debian packages the tests need beyond the runtimes: python3 runs the Python
# SDK's tests (sdk/python) against a real daemon, in a venv whose package
# is built with Debian's setuptools (no package index is reachable). Idempotent.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
apt_install python3 python3-venv python3-setuptools
log "test dependencies present (python3, python3-venv, python3-setuptools)"
