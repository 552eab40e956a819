#!/usr/bin/env bash
# npm-deps.sh NAME PKGDIR FILE... — the npm packages a test runs, pinned by
# PKGDIR/package-lock.json (PKGDIR relative to the repository), installed
# with `npm ci` for `make test`:
#
#   mcp   cmd/amber/testdata/mcpclients: the official MCP clients, the
#         TypeScript SDK (@modelcontextprotocol/sdk) and the MCP Inspector
#         (@modelcontextprotocol/inspector, its --cli), which cmd/amber's
#         TestE2EMCPClients drives against a daemon
#   openapi-lint  api/lint: Redocly's CLI (@redocly/cli), which api's
#         TestOpenAPILint runs on api/openapi.json
#
# Output: $AMBER_CACHE/npm/NAME-<key>/node_modules, <key> being the first
#         16 hex digits of the sha256 of the lockfile: a new lockfile gets a
#         new directory, the same one is found again. Each FILE (relative
#         to node_modules) must be there for an install to count as done.
#         The source tree is not touched; the tests link this directory
#         into a copy of the package or run from it. The Inspector and
#         Redocly's CLI declare Node.js >= 22 but run on the Node.js 20 the
#         TypeScript SDK's setup (tssdk-deps.sh) installs.
# `npm ci` runs next to the final place and is renamed into it (atomic
# publish); install scripts are off (none of these packages needs one).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

[[ $# -ge 3 ]] || die "usage: npm-deps.sh NAME PKGDIR FILE..."
NAME=$1 PKG="$(cd "$SETUP_DIR/../../$2" && pwd)"
shift 2
[[ -f $PKG/package-lock.json ]] || die "$PKG/package-lock.json is missing"

node_major() { node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0; }
if ! command -v npm >/dev/null || [[ $(node_major) -lt 20 ]]; then
    apt_install nodejs npm
fi
[[ $(node_major) -ge 20 ]] || die "$NAME needs Node.js 20 or later; $(command -v node || echo node) is $(node --version 2>/dev/null || echo missing)"

KEY=$(sha256sum "$PKG/package-lock.json" | cut -c1-16)
DIR="$CACHE/npm/$NAME-$KEY"

complete() {
    for f in "$@"; do [[ -f $DIR/node_modules/$f ]] || return 1; done
}
if complete "$@"; then
    log "found $DIR/node_modules"
    exit 0
fi
mkdir -p "$CACHE/npm"
rm -rf --one-file-system "$DIR" # a leftover without a complete node_modules
clean_stale_tmp "$CACHE/npm/.$NAME-$KEY"
tmp="$CACHE/npm/.$NAME-$KEY.tmp.$$"
mkdir "$tmp"
# shellcheck disable=SC2064
trap "rm -rf --one-file-system '$tmp'" EXIT
cp "$PKG/package.json" "$PKG/package-lock.json" "$tmp/"
log "npm ci ($NAME, lockfile $KEY)"
if ! (cd "$tmp" && npm ci --ignore-scripts --no-audit --no-fund --cache "$CACHE/npm/.npm-cache" >"$tmp/npm.log" 2>&1); then
    tail -n 30 "$tmp/npm.log" >&2
    die "npm ci failed"
fi
DIR=$tmp complete "$@" || die "npm ci made no ${*} in $tmp/node_modules"
chmod -R a+rX "$tmp"
mv -T "$tmp" "$DIR"
trap - EXIT
log "installed $DIR/node_modules"
