#!/usr/bin/env bash
# The demo `make demo` runs (after `make setup build`): `amber demo` — an
# agent session in a python sandbox that writes files, starts a web server and
# a counter, and orders from a local shop through the egress gateway, while
# the demo SIGKILLs its sandbox and then the daemon mid-order. It prints a
# report and exits 0 only if memory, files, processes, the conversation and
# the shop's ledger (each order exactly once) all came through. Everything
# runs on this machine (the shop listens on 127.0.0.1); nothing is left
# behind.
#
#   AMBER=bin/amber   the binary to run
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
AMBER=${AMBER:-bin/amber}
[[ -x $AMBER ]] || { echo "demo: $AMBER not found; run \`make build\` first" >&2; exit 1; }
exec "$AMBER" demo "$@"
