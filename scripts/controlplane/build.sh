#!/usr/bin/env bash
# Build a real Kubernetes control plane (etcd, kube-apiserver, kube-scheduler, kube-controller-manager)
# and the kubectl of the same release from Go modules, for the end-to-end tests in tests/e2e/.
#
# Usage: scripts/controlplane/build.sh            # build once, then reuse the cache
#        scripts/controlplane/build.sh --force    # rebuild even when cached
#        scripts/controlplane/build.sh --print    # print the bin dir if cached, exit 1 otherwise
#
# The binaries are cached outside the repository, keyed by both versions:
#   ${GPU_ADMISSION_CACHE:-$HOME/.cache/gpu-admission}/controlplane/<k8s>-etcd-<etcd>/bin/
# The last line on stdout is always that bin dir; progress goes to stderr.
#
# Why a wrapper module: k8s.io/kubernetes requires its staging modules (k8s.io/api, k8s.io/client-go, …)
# at the placeholder v0.0.0 with `replace => ./staging/...`, so `go install …@version` is refused. A
# throwaway module that requires k8s.io/kubernetes and replaces every staging module with its published
# v0.X.Y twin builds the command packages. The list of staging modules is read from k8s.io/kubernetes' own
# go.mod (as served by the module proxy), never hard-coded.
set -euo pipefail

# Pinned versions. Kubernetes: v1.37.2, the newest release the Go proxy serves (DRA GA with extended
# resources through DeviceClasses, the Workload / PodGroup API in scheduling.k8s.io/v1beta1). etcd: v3.7.3,
# the newest patch of the minor 1.37 is built against (its go.mod requires go.etcd.io/etcd/* v3.7.0;
# kubeadm's DefaultEtcdVersion is 3.7.0-0). The oldest supported release, v1.33.13 with etcd v3.5.35, is
# built with K8S_VERSION=v1.33.13 ETCD_VERSION=v3.5.35 (make test runs a smoke e2e on it; see
# docs/controlplane.md).
K8S_VERSION="${K8S_VERSION:-v1.37.2}"
ETCD_VERSION="${ETCD_VERSION:-v3.7.3}"

CACHE_ROOT="${GPU_ADMISSION_CACHE:-$HOME/.cache/gpu-admission}"
KEY_DIR="$CACHE_ROOT/controlplane/${K8S_VERSION}-etcd-${ETCD_VERSION}"
BIN_DIR="$KEY_DIR/bin"
STAMP="$BIN_DIR/.complete"
SERVER_BINARIES=(etcd kube-apiserver kube-scheduler kube-controller-manager)
# kubectl of the same release: the preinstalled clients stop at 1.33, and kubectl supports one minor of skew.
# Caches made before kubectl was built here hold only the server binaries: kubectl is then added alone.
BINARIES=("${SERVER_BINARIES[@]}" kubectl)

LOG_NAME=build.sh
PRODUCT="$BIN_DIR"
source "$(dirname "$0")/../lib/cache.sh"

all_built() {
    [[ -f "$STAMP" ]] || return 1
    local b
    for b in "$@"; do [[ -x "$BIN_DIR/$b" ]] || return 1; done
}
cached() { all_built "${BINARIES[@]}"; }

cache_args 12 "$@"

[[ $K8S_VERSION =~ ^v1\.([0-9]+)\.([0-9]+)$ ]] \
    || die "K8S_VERSION must look like v1.33.13, got '$K8S_VERSION'"
K8S_MINOR="${BASH_REMATCH[1]}"
STAGING_VERSION="v0.${BASH_REMATCH[1]}.${BASH_REMATCH[2]}"
[[ $ETCD_VERSION =~ ^v3\.[0-9]+\.[0-9]+$ ]] || die "ETCD_VERSION must look like v3.5.35, got '$ETCD_VERSION'"

command -v go >/dev/null 2>&1 || die "the 'go' command is not on PATH; install Go >= 1.24 to build the control plane"
# One build at a time per version key (parallel test sessions share the cache).
cache_lock "$KEY_DIR"

WORK="$(mktemp -d "${TMPDIR:-/tmp}/gpu-admission-cpbuild.XXXXXX")"
STAGE="$KEY_DIR/bin.partial.$$"
cleanup() { rm -rf "$WORK" "$STAGE"; }
trap cleanup EXIT

start=$(date +%s)
log "go: $(go version)"
log "building Kubernetes $K8S_VERSION (staging $STAGING_VERSION) and etcd $ETCD_VERSION into $BIN_DIR"

# ---- Kubernetes -------------------------------------------------------------------------------------------
K8S_MOD_DIR="$WORK/k8s"
mkdir -p "$K8S_MOD_DIR"
cd "$K8S_MOD_DIR"
cat >go.mod <<EOF
module gpu-admission.local/controlplane/kubernetes

go 1.24.0
EOF

log "reading the staging module list from k8s.io/kubernetes@$K8S_VERSION's go.mod"
if ! dl_json="$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" 2>&1)"; then
    printf '%s\n' "$dl_json" >&2
    die "cannot download k8s.io/kubernetes@$K8S_VERSION from the module proxy (GOPROXY=$(go env GOPROXY))"
fi
gomod_file="$(printf '%s\n' "$dl_json" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')"
[[ -n $gomod_file && -f $gomod_file ]] || die "go mod download did not name k8s.io/kubernetes' go.mod: $dl_json"

mapfile -t staging < <(sed -n 's#^[[:space:]]*\(k8s\.io/[A-Za-z0-9._-]*\)[[:space:]]*=>[[:space:]]*\./staging/src/.*#\1#p' "$gomod_file" | sort -u)
((${#staging[@]} > 0)) || die "found no '=> ./staging/src/...' replace lines in $gomod_file"
log "${#staging[@]} staging modules: ${staging[*]}"

{
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    echo "replace ("
    for m in "${staging[@]}"; do echo "	$m => $m $STAGING_VERSION"; done
    echo ")"
} >>go.mod

build_date="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
pkg=k8s.io/component-base/version
k8s_ldflags="-s -w"
k8s_ldflags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$K8S_MINOR"
k8s_ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$build_date"
# client-go carries its own copy of the version variables (used in its User-Agent).
k8s_ldflags+=" -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION"
k8s_ldflags+=" -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=$K8S_MINOR"

mkdir -p "$STAGE"
check_kubectl() {
    local got
    got="$("$1" version --client -o json 2>&1 | sed -n 's/^[[:space:]]*"gitVersion": "\(.*\)",\{0,1\}$/\1/p' | head -1)"
    [[ $got == "$K8S_VERSION" ]] || die "$1 version --client says '$got', expected $K8S_VERSION"
}
if [[ $FORCE == 0 ]] && all_built "${SERVER_BINARIES[@]}"; then
    log "the server binaries are cached; compiling kubectl $K8S_VERSION alone"
    CGO_ENABLED=0 go build -mod=mod -trimpath -ldflags "$k8s_ldflags" -o "$STAGE/" k8s.io/kubernetes/cmd/kubectl \
        || die "go build of kubectl $K8S_VERSION failed"
    check_kubectl "$STAGE/kubectl"
    mv "$STAGE/kubectl" "$BIN_DIR/kubectl"
    echo "kubectl_seconds=$(( $(date +%s) - start ))" >>"$STAMP"
    log "kubectl added in $(( $(date +%s) - start ))s"
    echo "$BIN_DIR"
    exit 0
fi
log "compiling kube-apiserver, kube-scheduler, kube-controller-manager, kubectl (several minutes on a cold cache)"
CGO_ENABLED=0 go build -mod=mod -trimpath -ldflags "$k8s_ldflags" -o "$STAGE/" \
    k8s.io/kubernetes/cmd/kube-apiserver \
    k8s.io/kubernetes/cmd/kube-scheduler \
    k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kubectl \
    || die "go build of the Kubernetes $K8S_VERSION components failed"

# ---- etcd -------------------------------------------------------------------------------------------------
# go.etcd.io/etcd/server/v3 is the etcd main package. Its go.mod replaces its sibling modules with relative
# paths (ignored for a dependency); the versions it requires are the published twins, so a wrapper that only
# requires the server module resolves them correctly.
ETCD_MOD_DIR="$WORK/etcd"
mkdir -p "$ETCD_MOD_DIR"
cd "$ETCD_MOD_DIR"
cat >go.mod <<EOF
module gpu-admission.local/controlplane/etcd

go 1.24.0

require go.etcd.io/etcd/server/v3 $ETCD_VERSION
EOF
log "compiling etcd $ETCD_VERSION"
CGO_ENABLED=0 go build -mod=mod -trimpath -ldflags "-s -w" -o "$STAGE/etcd" go.etcd.io/etcd/server/v3 \
    || die "go build of etcd $ETCD_VERSION failed"

# ---- verify and install -----------------------------------------------------------------------------------
for b in "${BINARIES[@]}"; do [[ -x "$STAGE/$b" ]] || die "expected binary $b was not produced"; done
got="$("$STAGE/kube-apiserver" --version 2>&1 || true)"
[[ $got == "Kubernetes $K8S_VERSION" ]] || die "kube-apiserver --version says '$got', expected 'Kubernetes $K8S_VERSION'"
got="$("$STAGE/etcd" --version 2>&1 | head -1 || true)"
[[ $got == "etcd Version: ${ETCD_VERSION#v}" ]] || die "etcd --version says '$got', expected etcd ${ETCD_VERSION#v}"
check_kubectl "$STAGE/kubectl"

elapsed=$(( $(date +%s) - start ))
cat >"$STAGE/.complete" <<EOF
kubernetes=$K8S_VERSION
etcd=$ETCD_VERSION
go=$(go env GOVERSION)
built=$build_date
build_seconds=$elapsed
EOF
rm -rf "$BIN_DIR"
mv "$STAGE" "$BIN_DIR"
log "done in ${elapsed}s"
echo "$BIN_DIR"
