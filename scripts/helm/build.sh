#!/usr/bin/env bash
# Build `helm` from Go modules, for the chart tests (tests/test_helm.py, tests/e2e/test_helm_e2e.py).
#
# Usage: scripts/helm/build.sh            # build once, then reuse the cache
#        scripts/helm/build.sh --force    # rebuild even when cached
#        scripts/helm/build.sh --print    # print the binary's path if cached, exit 1 otherwise
#
# The binary is cached outside the repository, keyed by the version:
#   ${GPU_ADMISSION_CACHE:-$HOME/.cache/gpu-admission}/helm/<version>/helm
# The last line on stdout is always that path; progress goes to stderr.
#
# Helm 3 (not 4): the version most platform teams run today; the chart (apiVersion v2) installs with both.
set -euo pipefail

HELM_VERSION="${HELM_VERSION:-v3.22.0}"
CACHE_ROOT="${GPU_ADMISSION_CACHE:-$HOME/.cache/gpu-admission}"
KEY_DIR="$CACHE_ROOT/helm/$HELM_VERSION"
BIN="$KEY_DIR/helm"
STAMP="$KEY_DIR/.complete"

cached() { [[ -f "$STAMP" && -x "$BIN" ]]; }
PRODUCT="$BIN"
LOG_NAME=helm/build.sh
source "$(dirname "$0")/../lib/cache.sh"
cache_args 10 "$@"

[[ $HELM_VERSION =~ ^v3\.[0-9]+\.[0-9]+$ ]] || die "HELM_VERSION must look like v3.22.0, got '$HELM_VERSION'"
command -v go >/dev/null 2>&1 || die "the 'go' command is not on PATH; install Go to build helm"
cache_lock "$KEY_DIR"

STAGE="$KEY_DIR/stage.$$"
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE"
start=$(date +%s)
log "go: $(go version); building helm $HELM_VERSION into $BIN"
# Stamped the way helm's own Makefile does: its version, and the Kubernetes version `helm template` and
# `helm lint` assume (client-go's v0.X -> 1.X), read from helm's go.mod as served by the module proxy.
dl_json="$(go mod download -json "helm.sh/helm/v3@$HELM_VERSION" 2>&1)" \
    || die "cannot download helm.sh/helm/v3@$HELM_VERSION from the module proxy: $dl_json"
gomod_file="$(printf '%s\n' "$dl_json" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')"
client_go="$(sed -n 's#^[[:space:]]*k8s\.io/client-go[[:space:]]\{1,\}v0\.\([0-9]\{1,\}\)\..*#\1#p' "$gomod_file" | head -1)"
[[ -n $client_go ]] || die "found no k8s.io/client-go requirement in $gomod_file"
ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
ldflags+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
    ldflags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$client_go"
done
GOBIN="$STAGE" CGO_ENABLED=0 go install -trimpath -ldflags "$ldflags" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" \
    || die "go install helm.sh/helm/v3/cmd/helm@$HELM_VERSION failed"
got="$("$STAGE/helm" version --template '{{.Version}}' 2>&1 || true)"
[[ $got == "$HELM_VERSION" ]] || die "helm version says '$got', expected '$HELM_VERSION'"
mv -f "$STAGE/helm" "$BIN"
elapsed=$(( $(date +%s) - start ))
printf 'helm=%s\nkubernetes=1.%s\ngo=%s\nbuild_seconds=%s\n' "$HELM_VERSION" "$client_go" "$(go env GOVERSION)" "$elapsed" >"$STAMP"
log "done in ${elapsed}s"
echo "$BIN"
