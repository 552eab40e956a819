#!/usr/bin/env bash
# Build the "chromium" sandbox template (extended tests, fidelity item 5):
# Debian bookworm with Debian's chromium package (headless-capable; no X
# server is needed with --headless), a font so pages render text, and
# python3 for a standard-library DevTools client inside the sandbox.
# Output and cache key: see deb-template.sh.
set -euo pipefail
REV=1 # bump when the smoke test or template.json below changes
exec "$(dirname "${BASH_SOURCE[0]}")/deb-template.sh" chromium "$REV" \
    chromium,fonts-liberation,python3,procps \
    'chromium --version && python3 --version' \
    '{"env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "LANG=C.UTF-8", "TERM=xterm", "PYTHONUNBUFFERED=1"],
  "cwd": "/root", "user": "0:0",
  "limits": {"memory_bytes": 2147483648, "pids": 4096}}'
