#!/usr/bin/env bash
# Debian's Chromium for the web console's browser tests (cmd/amber
# console_e2e_test.go drives it with chromedp). Idempotent: apt_install only
# installs what is missing.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
apt_install chromium
log "browser test dependencies present ($(chromium --version 2>/dev/null || echo chromium))"
