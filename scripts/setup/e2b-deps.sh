#!/usr/bin/env bash
# e2b-deps.sh — the official E2B SDK, npm e2b@2.51.0 (pinned by
# tests/e2b/package-lock.json), for cmd/amber's TestE2EE2B (the ordinary E2B
# programs in tests/e2b) and internal/edge/e2b/envd's TestEnvdOfficialSDK:
# installed with `npm ci` into $AMBER_CACHE/npm/e2b-<key>/node_modules
# (npm-deps.sh: <key> is the lockfile's hash; idempotent).
set -euo pipefail
exec "$(dirname "${BASH_SOURCE[0]}")/npm-deps.sh" e2b tests/e2b e2b/package.json e2b/dist/index.mjs
