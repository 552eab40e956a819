#!/usr/bin/env bash
# Regenerates the Go code of E2B's envd protos (internal/edge/e2b/envdpb):
# protoc (Debian protobuf-compiler) with protoc-gen-go and
# protoc-gen-connect-go at the versions go.mod pins, installed into a cache
# dir (never the repo). The generated code is committed; run this after
# editing a .proto (`make gen-envd`).
set -euo pipefail
cd "$(dirname "$0")/.."
tools="${AMBER_GEN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/amber-gen}/bin"
pbver=$(go list -m -f '{{.Version}}' google.golang.org/protobuf)
cver=$(go list -m -f '{{.Version}}' connectrpc.com/connect)
mkdir -p "$tools"
want="$pbver $cver"
if [ "$(cat "$tools/.versions" 2>/dev/null)" != "$want" ]; then
	GOBIN="$tools" go install "google.golang.org/protobuf/cmd/protoc-gen-go@$pbver"
	GOBIN="$tools" go install "connectrpc.com/connect/cmd/protoc-gen-connect-go@$cver"
	echo "$want" >"$tools/.versions"
fi
command -v protoc >/dev/null || { echo "gen-envd: protoc missing (apt-get install protobuf-compiler)" >&2; exit 1; }
dir=internal/edge/e2b/envdpb
PATH="$tools:$PATH" protoc -I "$dir" -I /usr/include \
	--go_out="$dir" --go_opt=paths=source_relative \
	--connect-go_out="$dir" --connect-go_opt=paths=source_relative \
	process/process.proto filesystem/filesystem.proto
