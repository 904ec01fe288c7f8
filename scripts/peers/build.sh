#!/usr/bin/env bash
# Build the peers of the `peers` benchmark part (tests/bench/peers.py; tests/bench/peerinstall.py installs them)
# from their Go modules: Gatekeeper's manager and Kyverno's admission controller. Never run by CI's default
# path (the part and its tests name a peer that is not built, with the reason); on this 2-core machine under
# load, at nice 19: Gatekeeper 16 min, Kyverno 40 min.
#
# Usage: scripts/peers/build.sh            # build once, then reuse the cache
#        scripts/peers/build.sh --force    # rebuild even when cached
#        scripts/peers/build.sh --print    # print the cache dir if both are built, exit 1 otherwise
#
# Cached outside the repository, keyed by version:
#   ${GPU_ADMISSION_CACHE:-$HOME/.cache/gpu-admission}/peers/gatekeeper-<v>/gatekeeper
#   ${GPU_ADMISSION_CACHE:-$HOME/.cache/gpu-admission}/peers/kyverno-<v>/kyverno
# The module sources (CRDs, install manifests) stay in the Go module cache, where the part reads them.
#
# Why a wrapper module for Kyverno: its go.mod has a replace directive (k8s.io/pod-security-admission => its
# fork), so `go install …@version` is refused. A throwaway module requires kyverno and repeats its replace
# directives, read from kyverno's own go.mod (as served by the module proxy), never hard-coded.
set -euo pipefail

GATEKEEPER_VERSION="${GATEKEEPER_VERSION:-v3.23.1}"
KYVERNO_VERSION="${KYVERNO_VERSION:-v1.19.1}"

CACHE_ROOT="${GPU_ADMISSION_CACHE:-$HOME/.cache/gpu-admission}"
DIR="$CACHE_ROOT/peers"
GATEKEEPER="$DIR/gatekeeper-$GATEKEEPER_VERSION/gatekeeper"
KYVERNO="$DIR/kyverno-$KYVERNO_VERSION/kyverno"

LOG_NAME=peers/build.sh
PRODUCT="$DIR"
source "$(dirname "$0")/../lib/cache.sh"

cached() { [[ -x "$GATEKEEPER" && -x "$KYVERNO" ]]; }

cache_args 18 "$@"
command -v go >/dev/null 2>&1 || die "'go' is not on PATH (Go ${GO_MIN:-1.26} or newer is needed)"
cache_lock "$DIR"

if [[ $FORCE == 1 || ! -x "$GATEKEEPER" ]]; then
    log "building gatekeeper $GATEKEEPER_VERSION (go install, CGO off)"
    GOBIN="$(dirname "$GATEKEEPER")" GOFLAGS=-mod=mod CGO_ENABLED=0 \
        go install "github.com/open-policy-agent/gatekeeper/v3@$GATEKEEPER_VERSION" >&2
fi

if [[ $FORCE == 1 || ! -x "$KYVERNO" ]]; then
    log "building kyverno $KYVERNO_VERSION (wrapper module, CGO off)"
    wrap="$DIR/kyverno-wrap-$KYVERNO_VERSION"
    rm -rf "$wrap" && mkdir -p "$wrap"
    gomod="$(go mod download -json "github.com/kyverno/kyverno@$KYVERNO_VERSION" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$/\1/p')"
    [[ -f "$gomod" ]] || die "could not download kyverno's go.mod for $KYVERNO_VERSION"
    goversion="$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$gomod")"
    {
        printf 'module peers/kyverno\n\ngo %s\n\nrequire github.com/kyverno/kyverno %s\n\n' "$goversion" "$KYVERNO_VERSION"
        grep -E '^replace [^(]' "$gomod" || true
        # a replace block ( replace ( ... ) ) is repeated as is
        sed -n '/^replace (/,/^)/p' "$gomod"
    } >"$wrap/go.mod"
    printf '//go:build tools\n\npackage tools\n\nimport _ "github.com/kyverno/kyverno/cmd/kyverno"\n' >"$wrap/tools.go"
    (cd "$wrap" && go mod tidy >&2 && GOBIN="$(dirname "$KYVERNO")" CGO_ENABLED=0 go install github.com/kyverno/kyverno/cmd/kyverno >&2)
fi

cached || die "a peer binary is missing after the build: $GATEKEEPER, $KYVERNO"
echo "$PRODUCT"
