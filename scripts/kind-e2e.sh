#!/usr/bin/env bash
# `make kind-e2e`: gpu-admission as operators install it, in a kind cluster, checked end to end.
#
#   1. checks for a running Docker engine, kind, kubectl and Python with the test packages
#   2. creates the kind cluster gpu-admission-e2e (or reuses it if it exists)
#   3. builds the image from the Dockerfile (gpu-admission:e2e) and loads it into the cluster
#   4. applies deploy/ through a kustomize overlay generated in a temp dir (image gpu-admission:e2e,
#      imagePullPolicy IfNotPresent), waits for the certs Job and the Deployment rollout
#   5. creates the fake GPU nodes of examples/cluster/nodes.yaml and keeps them Ready with a background
#      Lease heartbeat (there is no kubelet behind them; see tests/kind/nodes.py)
#   6. runs `python -m pytest tests/kind` with GPU_ADMISSION_KIND_KUBECONFIG set
#   7. deletes the cluster, unless KEEP=1
#
# Usage:  make kind-e2e                  KEEP=1 make kind-e2e
#         bash scripts/kind-e2e.sh [PYTEST ARGS...]     e.g. bash scripts/kind-e2e.sh -k denied -x
# Environment: KEEP=1 (keep the cluster), KIND_NODE_IMAGE (kindest/node image; Kubernetes 1.30 or newer),
#              PYTHON (default python3), GPU_ADMISSION_CACHE (where the kubeconfig goes; default
#              ~/.cache/gpu-admission). The kubeconfig is written to
#              $GPU_ADMISSION_CACHE/kind/gpu-admission-e2e.kubeconfig; your own kubeconfig is not touched.
# See docs/kind.md.
set -euo pipefail

CLUSTER="gpu-admission-e2e"
IMAGE="gpu-admission:e2e"
KEEP="${KEEP:-0}"
PYTHON="${PYTHON:-python3}"
MIN_MINOR=30 # webhook matchConditions are GA from Kubernetes 1.30

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
CACHE="${GPU_ADMISSION_CACHE:-$HOME/.cache/gpu-admission}/kind"
KUBECONFIG_FILE="$CACHE/$CLUSTER.kubeconfig"

die() {
  printf 'kind-e2e: %s\n' "$*" >&2
  exit 1
}
step() { printf '\n== %s ==\n' "$*"; }
kc() { kubectl --kubeconfig "$KUBECONFIG_FILE" "$@"; }

# --- 1. prerequisites (one line each when missing) -----------------------------------------------------
command -v docker >/dev/null 2>&1 || die "docker not found: install Docker (Docker Engine or Docker Desktop)"
if ! docker_err="$(docker info 2>&1 >/dev/null)"; then
  die "no Docker engine answers 'docker info': ${docker_err%%$'\n'*}"
fi
command -v kind >/dev/null 2>&1 || die "kind not found: install kind v0.23 or newer (e.g. go install sigs.k8s.io/kind@latest)"
command -v kubectl >/dev/null 2>&1 || die "kubectl not found: install kubectl 1.30 or newer"
command -v "$PYTHON" >/dev/null 2>&1 || die "$PYTHON not found: Python 3.11 or newer is needed (set PYTHON=...)"
if ! "$PYTHON" -c 'import pytest, yaml' >/dev/null 2>&1; then
  step "installing the test packages (as make setup does)"
  "$PYTHON" -m pip install -q -e '.[test]' || die "cannot install the test packages: run 'make setup' first"
fi

WORK="$(mktemp -d)"
HAVE_CLUSTER=0
HEARTBEAT_PID=""

cleanup() {
  local rc=$?
  if [[ -n "$HEARTBEAT_PID" ]]; then
    kill "$HEARTBEAT_PID" 2>/dev/null || true
    wait "$HEARTBEAT_PID" 2>/dev/null || true
  fi
  if [[ $rc -ne 0 && $HAVE_CLUSTER -eq 1 ]]; then
    step "failed (exit $rc): state of the gpu-admission namespace"
    kc -n gpu-admission get jobs,pods,secrets -o wide 2>&1 || true
    kc -n gpu-admission logs job/gpu-admission-certs --tail=30 2>&1 || true
    kc -n gpu-admission logs deployment/gpu-admission -c server --tail=30 2>&1 || true
  fi
  rm -rf "$WORK"
  if [[ $HAVE_CLUSTER -eq 1 ]]; then
    if [[ "$KEEP" == "1" ]]; then
      step "cluster kept (KEEP=1)"
      echo "export KUBECONFIG=$KUBECONFIG_FILE"
      echo "tests again:  GPU_ADMISSION_KIND_KUBECONFIG=$KUBECONFIG_FILE $PYTHON -m pytest tests/kind -q"
      echo "delete it:    kind delete cluster --name $CLUSTER"
    else
      step "deleting the cluster (KEEP=1 keeps it)"
      kind delete cluster --name "$CLUSTER" --kubeconfig "$KUBECONFIG_FILE" || true
    fi
  fi
  exit "$rc"
}
trap cleanup EXIT

# --- 2. the cluster ------------------------------------------------------------------------------------
mkdir -p "$CACHE"
REUSED=0
if kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
  step "reusing kind cluster $CLUSTER"
  REUSED=1
else
  step "creating kind cluster $CLUSTER"
  create_args=(create cluster --name "$CLUSTER" --kubeconfig "$KUBECONFIG_FILE" --wait 180s)
  if [[ -n "${KIND_NODE_IMAGE:-}" ]]; then
    create_args+=(--image "$KIND_NODE_IMAGE")
  fi
  HAVE_CLUSTER=1
  kind "${create_args[@]}"
fi
HAVE_CLUSTER=1
kind get kubeconfig --name "$CLUSTER" >"$KUBECONFIG_FILE"
chmod 600 "$KUBECONFIG_FILE"
version_json="$(kc version -o json)"
minor="$("$PYTHON" -c 'import json, sys; print(json.load(sys.stdin)["serverVersion"]["minor"].rstrip("+"))' <<<"$version_json")"
if ((minor < MIN_MINOR)); then
  die "the cluster runs Kubernetes 1.$minor; gpu-admission needs 1.$MIN_MINOR+ (set KIND_NODE_IMAGE or upgrade kind)"
fi
kc get nodes -o wide

# --- 3. the image --------------------------------------------------------------------------------------
step "building $IMAGE from the Dockerfile"
docker build -t "$IMAGE" .
kind load docker-image "$IMAGE" --name "$CLUSTER"

# --- 4. deploy/ with the image overridden --------------------------------------------------------------
step "applying deploy/ (image $IMAGE)"
mkdir -p "$WORK/overlay"
# kustomize refuses an absolute path in `resources:`, so the overlay names deploy/ relative to itself. Both
# paths are resolved first: on macOS the temp dir lies behind a symlink (/var -> /private/var).
realpath_py='import os, sys; print(os.path.realpath(sys.argv[1]))'
OVERLAY="$("$PYTHON" -c "$realpath_py" "$WORK/overlay")"
DEPLOY_DIR="$("$PYTHON" -c "$realpath_py" "$ROOT/deploy")"
DEPLOY_REL="$("$PYTHON" -c 'import os, sys; print(os.path.relpath(sys.argv[1], sys.argv[2]))' "$DEPLOY_DIR" "$OVERLAY")"
cat >"$OVERLAY/kustomization.yaml" <<EOF
# Generated by scripts/kind-e2e.sh: deploy/ as operators apply it, with the locally built image.
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - "$DEPLOY_REL"
images:
  - name: gpu-admission
    newName: ${IMAGE%%:*}
    newTag: ${IMAGE##*:}
patches:
  - target: {group: apps, version: v1, kind: Deployment, name: gpu-admission}
    patch: |-
      apiVersion: apps/v1
      kind: Deployment
      metadata: {name: gpu-admission, namespace: gpu-admission}
      spec:
        template:
          spec:
            containers:
              - {name: server, imagePullPolicy: IfNotPresent}
  - target: {group: batch, version: v1, kind: Job, name: gpu-admission-certs}
    patch: |-
      apiVersion: batch/v1
      kind: Job
      metadata: {name: gpu-admission-certs, namespace: gpu-admission}
      spec:
        template:
          spec:
            containers:
              - {name: certs, imagePullPolicy: IfNotPresent}
  - target: {group: batch, version: v1, kind: CronJob, name: gpu-admission-certs-rotate}
    patch: |-
      apiVersion: batch/v1
      kind: CronJob
      metadata: {name: gpu-admission-certs-rotate, namespace: gpu-admission}
      spec:
        jobTemplate:
          spec:
            template:
              spec:
                containers:
                  - {name: certs, imagePullPolicy: IfNotPresent}
EOF
if [[ $REUSED -eq 1 ]]; then
  # The fake nodes of an earlier run go until the webhook has rolled out again, so that its pods never land
  # on a node without a kubelet. A Job's pod template is immutable: the old certs Job goes too.
  "$PYTHON" -m tests.kind.nodes delete --kubeconfig "$KUBECONFIG_FILE"
  kc -n gpu-admission delete job gpu-admission-certs --ignore-not-found
fi
kc apply -k "$OVERLAY"
if [[ $REUSED -eq 1 ]]; then
  # Same tag, maybe a new image: restart so that the pods run what was just loaded.
  kc -n gpu-admission rollout restart deployment/gpu-admission
fi
kc -n gpu-admission wait --for=condition=complete job/gpu-admission-certs --timeout=300s
kc -n gpu-admission rollout status deployment/gpu-admission --timeout=300s

# --- 5. fake GPU nodes (after the rollout, so the webhook's own pods never land on them) ----------------
step "creating the fake GPU nodes of examples/cluster/nodes.yaml"
"$PYTHON" -m tests.kind.nodes create --kubeconfig "$KUBECONFIG_FILE"
"$PYTHON" -m tests.kind.nodes heartbeat --kubeconfig "$KUBECONFIG_FILE" --until-pid $$ &
HEARTBEAT_PID=$!
kc get nodes -L topology.kubernetes.io/rack -L nvidia.com/gpu.product

# --- 6. the tests --------------------------------------------------------------------------------------
step "python -m pytest tests/kind"
GPU_ADMISSION_KIND_KUBECONFIG="$KUBECONFIG_FILE" GPU_ADMISSION_KIND_IMAGE="$IMAGE" \
  "$PYTHON" -m pytest tests/kind -q "$@"
