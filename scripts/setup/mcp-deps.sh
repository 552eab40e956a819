#!/usr/bin/env bash
# The official MCP clients that cmd/amber's TestE2EMCPClients drives against
# a daemon in `make test`: the TypeScript SDK (@modelcontextprotocol/sdk)
# and the MCP Inspector (@modelcontextprotocol/inspector, its --cli mode),
# at the versions pinned by cmd/amber/testdata/mcpclients/package-lock.json.
#
# Output: $AMBER_CACHE/npm/mcp-<key>/node_modules, <key> being the first 16
#         hex digits of the sha256 of that lockfile: a new lockfile gets a
#         new directory, the same one is found again. The source tree is not
#         touched; the test links this directory into a copy of the
#         package. The Inspector declares Node.js >= 22 but its CLI runs on
#         the Node.js 20 the TypeScript SDK's setup (tssdk-deps.sh) installs.
# `npm ci` runs next to the final place and is renamed into it (atomic
# publish); install scripts are off (none of these packages needs one).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

PKG="$(cd "$SETUP_DIR/../../cmd/amber/testdata/mcpclients" && pwd)"
[[ -f $PKG/package-lock.json ]] || die "$PKG/package-lock.json is missing"

node_major() { node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0; }
if ! command -v npm >/dev/null || [[ $(node_major) -lt 20 ]]; then
    apt_install nodejs npm
fi
[[ $(node_major) -ge 20 ]] || die "the MCP clients need Node.js 20 or later; $(command -v node || echo node) is $(node --version 2>/dev/null || echo missing)"

KEY=$(sha256sum "$PKG/package-lock.json" | cut -c1-16)
DIR="$CACHE/npm/mcp-$KEY"

if [[ -f $DIR/node_modules/@modelcontextprotocol/sdk/package.json && -f $DIR/node_modules/@modelcontextprotocol/inspector/package.json ]]; then
    log "found $DIR/node_modules"
    exit 0
fi
mkdir -p "$CACHE/npm"
rm -rf --one-file-system "$DIR" # a leftover without a complete node_modules
clean_stale_tmp "$CACHE/npm/.mcp-$KEY"
tmp="$CACHE/npm/.mcp-$KEY.tmp.$$"
mkdir "$tmp"
# shellcheck disable=SC2064
trap "rm -rf --one-file-system '$tmp'" EXIT
cp "$PKG/package.json" "$PKG/package-lock.json" "$tmp/"
log "npm ci (MCP clients, lockfile $KEY)"
if ! (cd "$tmp" && npm ci --ignore-scripts --no-audit --no-fund --cache "$CACHE/npm/.npm-cache" >"$tmp/npm.log" 2>&1); then
    tail -n 30 "$tmp/npm.log" >&2
    die "npm ci failed"
fi
chmod -R a+rX "$tmp"
mv -T "$tmp" "$DIR"
trap - EXIT
log "installed $DIR/node_modules"
