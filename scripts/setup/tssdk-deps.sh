#!/usr/bin/env bash
# The TypeScript SDK's development dependencies (sdk/typescript: typescript,
# openapi-typescript, @types/node; the SDK itself has none at run time), for
# its tests in `make test` (cmd/amber's TestE2ETypeScriptSDK).
#
# Output: $AMBER_CACHE/npm/tssdk-<key>/node_modules, <key> being the first 16
#         hex digits of the sha256 of sdk/typescript/package-lock.json: a new
#         lockfile gets a new directory, the same one is found again. The
#         source tree is not touched; the test links this directory into a
#         copy of the package.
# `npm ci` runs next to the final place and is renamed into it (atomic
# publish); install scripts are off (none of these packages needs one).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

PKG="$(cd "$SETUP_DIR/../../sdk/typescript" && pwd)"
[[ -f $PKG/package-lock.json ]] || die "$PKG/package-lock.json is missing"

node_major() { node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0; }
if ! command -v npm >/dev/null || [[ $(node_major) -lt 20 ]]; then
    apt_install nodejs npm
fi
[[ $(node_major) -ge 20 ]] || die "the TypeScript SDK needs Node.js 20 or later; $(command -v node || echo node) is $(node --version 2>/dev/null || echo missing)"

KEY=$(sha256sum "$PKG/package-lock.json" | cut -c1-16)
DIR="$CACHE/npm/tssdk-$KEY"

if [[ -f $DIR/node_modules/typescript/bin/tsc && -f $DIR/node_modules/openapi-typescript/bin/cli.js ]]; then
    log "found $DIR/node_modules"
    exit 0
fi
mkdir -p "$CACHE/npm"
rm -rf --one-file-system "$DIR" # a leftover without a complete node_modules
clean_stale_tmp "$CACHE/npm/.tssdk-$KEY"
tmp="$CACHE/npm/.tssdk-$KEY.tmp.$$"
mkdir "$tmp"
# shellcheck disable=SC2064
trap "rm -rf --one-file-system '$tmp'" EXIT
cp "$PKG/package.json" "$PKG/package-lock.json" "$tmp/"
log "npm ci (sdk/typescript, lockfile $KEY)"
if ! (cd "$tmp" && npm ci --ignore-scripts --no-audit --no-fund --cache "$CACHE/npm/.npm-cache" >"$tmp/npm.log" 2>&1); then
    tail -n 30 "$tmp/npm.log" >&2
    die "npm ci failed"
fi
chmod -R a+rX "$tmp"
mv -T "$tmp" "$DIR"
trap - EXIT
log "installed $DIR/node_modules"
