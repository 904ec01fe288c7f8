"""What `kubectl apply -k deploy/` leaves running in kind: the server pods, their TLS, the injected caBundle and
the audit log on stdout. Only a real cluster (kubelet, container runtime, the certs Job) can show these; the
local control plane of tests/e2e runs the server as a local process instead."""

from __future__ import annotations

import base64
import json
import os
import uuid
from typing import Any

import pytest

from tests.kind.kube import DEFAULT_IMAGE, ENV_IMAGE, Kind, probe_pod, wait_until

pytestmark = pytest.mark.kind

NAMESPACE = "gpu-admission"
DEPLOYMENT = "gpu-admission"
SECRET = "gpu-admission-tls"
SELECTOR = "app.kubernetes.io/name=gpu-admission,app.kubernetes.io/component=webhook"
REVISION = "deployment.kubernetes.io/revision"
NONROOT = "65532"  # the uid/gid of the Dockerfile's USER and the Deployment's securityContext


def server_pods(kind: Kind) -> list[dict[str, Any]]:
    """The pods of the Deployment's current ReplicaSet, once the rollout is complete."""
    r = kind.kubectl("-n", NAMESPACE, "rollout", "status", f"deployment/{DEPLOYMENT}", "--timeout=180s", check=False)
    assert r.returncode == 0, f"the Deployment did not roll out: {r.stderr or r.stdout}"
    deployment = kind.get_json("deployment", DEPLOYMENT, "-n", NAMESPACE)
    revision = deployment["metadata"]["annotations"][REVISION]
    (current,) = [
        rs
        for rs in kind.get_json("replicasets", "-n", NAMESPACE, "-l", SELECTOR)["items"]
        if rs["metadata"].get("annotations", {}).get(REVISION) == revision
    ]
    pod_hash = current["metadata"]["labels"]["pod-template-hash"]
    pods = kind.get_json("pods", "-n", NAMESPACE, "-l", f"{SELECTOR},pod-template-hash={pod_hash}")["items"]
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def test_webhook_pods_are_ready_and_run_as_non_root(kind: Kind) -> None:
    deployment = kind.get_json("deployment", DEPLOYMENT, "-n", NAMESPACE)
    pods = server_pods(kind)
    assert len(pods) == deployment["spec"]["replicas"] == 2, [p["metadata"]["name"] for p in pods]
    image = os.environ.get(ENV_IMAGE, DEFAULT_IMAGE)
    for pod in pods:
        name = pod["metadata"]["name"]
        conditions = {c["type"]: c["status"] for c in pod["status"].get("conditions", [])}
        assert conditions.get("Ready") == "True", (name, pod["status"])
        (server,) = [c for c in pod["spec"]["containers"] if c["name"] == "server"]
        assert server["image"] == image, (name, server["image"])
        assert server.get("imagePullPolicy") == "IfNotPresent", name
        assert pod["spec"]["securityContext"]["runAsNonRoot"] is True, name
        assert server["securityContext"]["readOnlyRootFilesystem"] is True, name
        for status in pod["status"]["containerStatuses"]:
            assert status["ready"] is True, (name, status)
        # what the kernel says, not only what the spec asks
        uid = kind.kubectl("exec", "-n", NAMESPACE, name, "-c", "server", "--", "id", "-u").stdout.strip()
        gid = kind.kubectl("exec", "-n", NAMESPACE, name, "-c", "server", "--", "id", "-g").stdout.strip()
        assert (uid, gid) == (NONROOT, NONROOT), name


def test_tls_secret_exists_and_ca_bundle_is_injected_into_both_configurations(kind: Kind) -> None:
    secret = kind.get_json("secret", SECRET, "-n", NAMESPACE)
    assert secret["type"] == "kubernetes.io/tls"
    data = {k: base64.b64decode(v) for k, v in secret["data"].items()}
    assert {"tls.crt", "tls.key", "ca.crt"} <= set(data), sorted(data)
    ca = data["ca.crt"].strip()
    assert ca.startswith(b"-----BEGIN CERTIFICATE-----")
    for kind_name in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
        config = kind.get_json(kind_name, "gpu-admission")
        webhooks = config["webhooks"]
        assert webhooks, kind_name
        for wh in webhooks:
            bundle_b64 = wh["clientConfig"].get("caBundle", "")
            assert bundle_b64, f"{kind_name} {wh['name']}: no caBundle"
            bundle = base64.b64decode(bundle_b64)
            assert ca in bundle, f"{kind_name} {wh['name']}: caBundle does not hold the Secret's ca.crt"
            if "ca-bundle.crt" in data:
                assert bundle.strip() == data["ca-bundle.crt"].strip(), f"{kind_name} {wh['name']}"


def audit_records(kind: Kind) -> list[dict[str, Any]]:
    """The audit records every server pod wrote to stdout (`--audit-stdout`; `kubectl logs` shows them)."""
    out = []
    for pod in server_pods(kind):
        logs = kind.kubectl("logs", "-n", NAMESPACE, pod["metadata"]["name"], "-c", "server").stdout
        for line in logs.splitlines():
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict) and rec.get("verdict") in ("allow", "deny", "warn") and "webhook" in rec:
                out.append(rec)
    return out


def test_dry_run_decisions_reach_the_audit_log_and_system_namespaces_never_do(cluster: Kind) -> None:
    name = f"audit-probe-{uuid.uuid4().hex[:8]}"
    r = cluster.kubectl("create", "--dry-run=server", "-f", "-", input=probe_pod("ml-research", name), check=False)
    assert r.returncode != 0, r.stdout
    for ns in ("kube-system", NAMESPACE):
        r = cluster.kubectl("create", "--dry-run=server", "-f", "-", input=probe_pod(ns, name), check=False)
        assert r.returncode == 0, f"{ns}: {r.stderr}"

    def recorded() -> list[dict[str, Any]]:
        recs = [x for x in audit_records(cluster) if x.get("name") == name]
        return recs if any(x.get("namespace") == "ml-research" and x.get("verdict") == "deny" for x in recs) else []

    recs = wait_until(recorded, timeout=30, what=f"the audit record of {name}", interval=1)
    assert all(x["dryRun"] is True for x in recs), recs
    assert {x.get("namespace") for x in recs} == {"ml-research"}, recs
