#!/usr/bin/env bash
# Install kubeconform (the Kubernetes manifest validator the deploy/ tests
# run) into $AMBER_CACHE/kubeconform-<version>/bin and point
# $AMBER_CACHE/bin/kubeconform at it, and fetch the Kubernetes API's OpenAPI
# document (k8s.io/kubernetes's api/openapi-spec/swagger.json, through the Go
# module proxy) that the tests turn into kubeconform's JSON schemas: this
# machine reaches no schema registry. Idempotent.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

KUBECONFORM_VERSION=v0.7.0
K8S_VERSION=v1.34.0 # keep in step with deploy/validate_test.go
DIR="$CACHE/kubeconform-$KUBECONFORM_VERSION"
BIN="$DIR/bin/kubeconform"

command -v go >/dev/null || die "go not found on PATH"

if [[ -x $BIN ]]; then
    log "found $BIN"
else
    log "building github.com/yannh/kubeconform@$KUBECONFORM_VERSION"
    clean_stale_tmp "$DIR"
    tmp="$DIR.tmp.$$"
    rm -rf "$tmp"; mkdir -p "$tmp/bin"
    trap 'rm -rf "$tmp"' EXIT
    CGO_ENABLED=0 GOBIN="$tmp/bin" go install "github.com/yannh/kubeconform/cmd/kubeconform@$KUBECONFORM_VERSION" \
        || die "go install kubeconform@$KUBECONFORM_VERSION failed"
    rm -rf "$DIR"; mv -T "$tmp" "$DIR"
    trap - EXIT
fi
ln_sf_atomic "$BIN" "$CACHE/bin/kubeconform"

# The module cache keeps it; a second run only checks.
spec=$(cd "$SETUP_DIR" && GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
[[ -f $spec/api/openapi-spec/swagger.json ]] || die "k8s.io/kubernetes@$K8S_VERSION has no api/openapi-spec/swagger.json (in '$spec')"
log "kubeconform $KUBECONFORM_VERSION; Kubernetes $K8S_VERSION API schema at $spec/api/openapi-spec/swagger.json"
