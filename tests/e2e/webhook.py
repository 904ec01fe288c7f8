"""Register a real `gpu-admission serve` process with the real kube-apiserver, from the deploy/ manifests.

The webhook configurations are rendered from `deploy/` (kustomize through kubectl) and only their
`clientConfig` is swapped for a URL on loopback with our CA: everything else — rules, namespaceSelector,
matchConditions, failurePolicy, timeouts — is exactly what operators install.
"""

from __future__ import annotations

import base64
import copy
import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from tests.e2e.cluster import ControlPlane
from tests.serverproc import ROOT, ServerProcess, free_port, make_certs, written_records

NAMESPACE = "gpu-admission"
POLICY_CONFIGMAP = "gpu-admission-policy"
REQUESTS = re.compile(r'^gpu_admission_requests_total\{webhook="(\w+)",verdict="(\w+)"\} (\S+)$', re.M)


def render(cp: ControlPlane, path: Path = ROOT / "deploy") -> list[dict[str, Any]]:
    out = cp.kubectl("kustomize", str(path)).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def local_configs(rendered: list[dict[str, Any]], base_url: str, ca_pem: bytes) -> list[dict[str, Any]]:
    """The webhook configurations of deploy/, pointed at a URL on loopback instead of the Service."""
    ca_b64 = base64.b64encode(ca_pem).decode()
    out = []
    for doc in rendered:
        if doc["kind"] not in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            continue
        doc = copy.deepcopy(doc)
        for wh in doc["webhooks"]:
            path = wh["clientConfig"]["service"].get("path", "/")
            wh["clientConfig"] = {"url": base_url + path, "caBundle": ca_b64}
        out.append(doc)
    return out


# A 16-GPU training job's pod: our webhook, when registered, adds a same-rack podAffinity to it.
PROBE_POD: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {
        "name": "probe",
        "namespace": "default",
        "labels": {"gpu-admission.io/job": "probe", "gpu-admission.io/workload": "training"},
        "annotations": {"gpu-admission.io/job-gpus": "16"},
    },
    "spec": {"containers": [{"name": "c", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]},
}


def probe_mutation(cp: ControlPlane) -> subprocess.CompletedProcess[str]:
    """A server-side dry-run create of PROBE_POD (mutated by our webhook iff it is in effect)."""
    return cp.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-", input=PROBE_POD, check=False)


class Webhook:
    """The server process plus its registration; `stop_server`/`start_server` keep the registration."""

    def __init__(self, cp: ControlPlane, *extra: str) -> None:
        self.cp = cp
        self.extra = extra
        self.rendered = render(cp)
        self.tls = make_certs(Path(cp.workdir) / f"webhook-tls-{time.monotonic_ns()}")
        self.port = free_port()
        self.server: ServerProcess | None = None
        self._bootstrap_namespace()
        self.start_server()
        self.configs = local_configs(
            self.rendered, f"https://127.0.0.1:{self.port}", (self.tls / "ca.crt").read_bytes()
        )
        cp.kubectl("apply", "-f", "-", input={"apiVersion": "v1", "kind": "List", "items": self.configs})
        self.wait_effective()

    def _bootstrap_namespace(self) -> None:
        wanted = [
            d
            for d in self.rendered
            if d["kind"] == "Namespace" or (d["kind"] == "ConfigMap" and d["metadata"]["name"] == POLICY_CONFIGMAP)
        ]
        self.cp.kubectl("apply", "-f", "-", input={"apiVersion": "v1", "kind": "List", "items": wanted})

    def start_server(self, *extra: str) -> None:
        self.server = ServerProcess(
            "--policy-configmap",
            f"{NAMESPACE}/{POLICY_CONFIGMAP}",
            "--cert-reload-interval",
            "1",
            *(extra or self.extra),
            tls_dir=self.tls,
            nodes=None,
            kubeconfig=str(self.cp.kubeconfig),
            port=self.port,
        )
        self.server.wait_ready(timeout=30, path="/readyz")

    def stop_server(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    def wait_effective(self, timeout: float = 30.0) -> None:
        """The API server picks configurations up asynchronously: dry-run a GPU pod until it is mutated."""
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            r = probe_mutation(self.cp)
            if r.returncode == 0 and "podAffinity" in r.stdout:
                return
            last = r.stderr or r.stdout[-300:]
            time.sleep(0.3)
        raise AssertionError(f"webhook never took effect: {last}")

    def audit_records(self) -> list[dict[str, Any]]:
        assert self.server is not None
        return written_records(self.server.audit)

    def wait_audit(self, match: Callable[[dict[str, Any]], bool], timeout: float = 10.0) -> list[dict[str, Any]]:
        """The audit records `match` accepts, once there is one: the server writes records from a queue after
        it answers (see webhook/audit.py), so a record can land a moment after kubectl returns."""
        deadline = time.monotonic() + timeout
        while True:
            found = [x for x in self.audit_records() if match(x)]
            if found or time.monotonic() > deadline:
                return found
            time.sleep(0.1)

    def close(self) -> None:
        for cfg in self.configs:
            kind = cfg["kind"].lower()
            self.cp.kubectl("delete", kind, cfg["metadata"]["name"], "--ignore-not-found", check=False)
        self.stop_server()


def served(webhook: Webhook) -> dict[tuple[str, str], float]:
    """The server's admission reviews of objects so far, by (webhook, verdict). Counted before each response is
    sent. Not the scheduler's binds (POST /bind): they come whenever a pod is scheduled, whatever it asks."""
    assert webhook.server is not None
    with webhook.server.client() as client:
        text = client.get("/metrics").raise_for_status().text
    return {(m[1], m[2]): float(m[3]) for m in REQUESTS.finditer(text) if m[1] != "bind"}


def calls_since(before: dict[tuple[str, str], float], webhook: Webhook) -> dict[tuple[str, str], float]:
    after = served(webhook)
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k, 0.0)}
