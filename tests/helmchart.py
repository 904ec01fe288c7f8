"""The Helm chart for tests: `helm` built from Go modules by scripts/helm/build.sh (cached), renders, and the
documented option sets (docs/deploy.md, "Helm") that every test renders, lints and dry-runs."""

from __future__ import annotations

import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "deploy" / "helm" / "gpu-admission"
BUILD = ROOT / "scripts" / "helm" / "build.sh"
POLICY_FILE = ROOT / "tests" / "fixtures" / "helm-policy.yaml"

# name -> `helm` value arguments: the defaults and every documented option (docs/deploy.md, "Helm").
OPTIONS: dict[str, list[str]] = {
    "defaults": [],
    "replicas": ["--set", "replicas=3"],
    "failure-policy": ["--set", "failurePolicy=Ignore"],
    "excluded-namespaces": ["--set", "excludedNamespaces={kube-system,kube-node-lease,kube-public,monitoring}"],
    "cert-manager": ["--set", "certificates.mode=cert-manager"],
    "resources": ["--set", "resources.requests.cpu=200m", "--set", "resources.limits.memory=512Mi"],
    "image": ["--set", "image.repository=registry.example.com/ml/gpu-admission", "--set", "image.tag=0.1.1"],
    "policy": ["--set-file", f"policy={POLICY_FILE}"],
    "audit-file": [
        "--set", "audit.stdout=false", "--set", "audit.file=/tmp/audit/decisions.jsonl",
        "--set", "audit.maxBytes=20Mi", "--set", "audit.backups=3", "--set", "audit.compress=true",
        "--set", "audit.queue=5000",
    ],
    "limits": [
        "--set", "limits.maxBody=16777216", "--set", "limits.maxConnections=900", "--set", "limits.idleTimeout=2.5",
        "--set", "limits.handshakeTimeout=4",
    ],
    "validate-pods": ["--set", "validatePods=true"],
    "native": ["--set", "native=true"],
    "scan": ["--set", "scan.interval=3600", "--set", "scan.qps=5", "--set", "scan.pageSize=500"],
    "no-ledger-election": ["--set", "ledgerLeaderElection=false"],
}  # fmt: skip


class HelmError(RuntimeError):
    pass


@cache
def helm_binary() -> str:
    """scripts/helm/build.sh: instant when cached, several minutes once."""
    proc = subprocess.run(["bash", str(BUILD)], capture_output=True, text=True, timeout=3600, check=False)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-20:])
        raise HelmError(f"building helm failed ({BUILD}, exit {proc.returncode}):\n{tail}")
    return proc.stdout.strip().splitlines()[-1]


def helm(*args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([helm_binary(), *args], capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise HelmError(f"helm {' '.join(args)} failed (exit {proc.returncode}): {proc.stderr.strip()}")
    return proc


def template(*values: str) -> list[dict[str, Any]]:
    """`helm template` of the chart with these value arguments, as objects."""
    out = helm("template", "gpu-admission", str(CHART), *values).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def object_key(obj: dict[str, Any]) -> tuple[str, str, str, str]:
    meta = obj["metadata"]
    return obj["apiVersion"], obj["kind"], meta.get("namespace", ""), meta["name"]


def by_key(objs: list[dict[str, Any]]) -> dict[tuple[str, str, str, str], dict[str, Any]]:
    return {object_key(o): o for o in objs}
