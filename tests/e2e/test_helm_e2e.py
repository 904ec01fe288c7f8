"""The Helm chart on the real kube-apiserver: a server-side dry run of the render of the defaults and of every
documented option, then `helm install`, `helm upgrade` and `helm uninstall` of the release.

The release's webhooks point at a Service whose pods never run here (no kubelet), so while it is installed
GPU objects outside the excluded namespaces would be refused; nothing else runs meanwhile, and uninstall
removes them. The namespace is torn down completely at the end, so later modules start without it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.cluster import ControlPlane, wait_until
from tests.e2e.conftest import _teardown_namespace
from tests.e2e.crds import crd
from tests.helmchart import CHART, OPTIONS, helm, template

pytestmark = pytest.mark.e2e

RELEASE = "gpu-admission"
RELEASE_NAMESPACE = "default"  # the chart makes its own namespace (with Pod Security labels); see docs/deploy.md
NAMESPACE = "gpu-admission"
CERT_MANAGER_CRDS = (
    ("cert-manager.io", "v1", "Certificate", "certificates"),
    ("cert-manager.io", "v1", "Issuer", "issuers"),
)


def kubectl_list(objs: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "List", "items": objs}


def adopt(cp: ControlPlane, objs: list[dict[str, Any]]) -> None:
    """The documented move from `kubectl apply -k deploy/` to Helm (docs/deploy.md): mark the objects that
    already exist as the release's. Other e2e modules leave the namespace and the policy ConfigMap behind."""
    for obj in objs:
        meta = obj["metadata"]
        where = ["-n", meta["namespace"]] if meta.get("namespace") else []
        ref = f"{obj['kind']}/{meta['name']}"
        if cp.kubectl("get", ref, *where, "-o", "name", check=False).returncode != 0:
            continue
        cp.kubectl("label", ref, *where, "--overwrite", "app.kubernetes.io/managed-by=Helm")
        cp.kubectl(
            "annotate", ref, *where, "--overwrite",
            f"meta.helm.sh/release-name={RELEASE}", f"meta.helm.sh/release-namespace={RELEASE_NAMESPACE}",
        )  # fmt: skip


@pytest.fixture(scope="module")
def cluster(control_plane: ControlPlane) -> Iterator[ControlPlane]:
    cp = control_plane
    cp.kubectl("apply", "-f", "-", input=kubectl_list([crd(*k) for k in CERT_MANAGER_CRDS]))
    cp.kubectl("wait", "--for=condition=Established", "crd/certificates.cert-manager.io", "crd/issuers.cert-manager.io")
    default = template()
    adopt(cp, default)
    # Namespaced objects can only be dry-run into a namespace that exists: create it as the release's own.
    (namespace,) = [o for o in default if o["kind"] == "Namespace"]
    cp.kubectl("apply", "-f", "-", input=namespace)
    adopt(cp, [namespace])
    try:
        yield cp
    finally:
        helm("uninstall", RELEASE, "-n", RELEASE_NAMESPACE, "--kubeconfig", str(cp.kubeconfig), check=False)
        _teardown_namespace(cp, NAMESPACE)
        wait_until(
            lambda: cp.kubectl("get", "namespace", NAMESPACE, check=False).returncode != 0 or None,
            timeout=60, what=f"namespace {NAMESPACE} to be deleted",
        )  # fmt: skip


@pytest.mark.parametrize("option", list(OPTIONS))
def test_the_api_server_accepts_every_render(cluster: ControlPlane, option: str) -> None:
    objs = template(*OPTIONS[option])
    proc = cluster.kubectl(
        # --force-conflicts: other modules leave the policy ConfigMap behind, patched by kubectl; the question
        # here is whether the API server accepts the objects, not who owns which field.
        "apply", "--server-side", "--force-conflicts", "--dry-run=server", "--field-manager=helm-e2e", "-f", "-",
        input=kubectl_list(objs), check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.strip().splitlines()) == len(objs)


def _release(cp: ControlPlane) -> dict[str, Any]:
    out = helm("list", "-n", RELEASE_NAMESPACE, "-o", "json", "--kubeconfig", str(cp.kubeconfig)).stdout
    (release,) = [r for r in json.loads(out) if r["name"] == RELEASE]
    return release


BIND_WEBHOOK = "bindings.validate.gpu-admission.io"


def _failure_policies(cp: ControlPlane) -> set[str]:
    """The failure policies of every webhook the chart registers but the bind check, which is Ignore whatever
    the value says (a webhook outage must never stop binding cluster-wide: docs/policy.md)."""
    hooks = [
        h
        for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration")
        for h in cp.get_json(kind, "gpu-admission")["webhooks"]
    ]
    binds = [h for h in hooks if h["name"] == BIND_WEBHOOK]
    assert [h["failurePolicy"] for h in binds] == ["Ignore"], binds
    return {h["failurePolicy"] for h in hooks if h["name"] != BIND_WEBHOOK}


def test_install_upgrade_uninstall(cluster: ControlPlane) -> None:
    cp = cluster
    kc = ("--kubeconfig", str(cp.kubeconfig))
    helm("install", RELEASE, str(CHART), "-n", RELEASE_NAMESPACE, *kc)
    release = _release(cp)
    assert (release["status"], release["revision"]) == ("deployed", "1")
    installed = template()
    for obj in installed:  # every object of the render exists, as rendered
        meta = obj["metadata"]
        where = ["-n", meta["namespace"]] if meta.get("namespace") else []
        live = cp.get_json(obj["kind"], meta["name"], *where)
        assert live["metadata"]["annotations"]["meta.helm.sh/release-name"] == RELEASE
    assert cp.get_json("deployment", "gpu-admission", "-n", NAMESPACE)["spec"]["replicas"] == 2
    assert _failure_policies(cp) == {"Fail"}

    helm("upgrade", RELEASE, str(CHART), "-n", RELEASE_NAMESPACE, *kc, *OPTIONS["replicas"], *OPTIONS["failure-policy"])
    release = _release(cp)
    assert (release["status"], release["revision"]) == ("deployed", "2")
    assert cp.get_json("deployment", "gpu-admission", "-n", NAMESPACE)["spec"]["replicas"] == 3
    assert _failure_policies(cp) == {"Ignore"}

    helm("uninstall", RELEASE, "-n", RELEASE_NAMESPACE, *kc)
    for kind, name in (
        ("mutatingwebhookconfiguration", "gpu-admission"),
        ("validatingwebhookconfiguration", "gpu-admission"),
        ("clusterrole", "gpu-admission"),
        ("clusterrolebinding", "gpu-admission-certs"),
    ):
        assert cp.kubectl("get", kind, name, check=False).returncode != 0, f"{kind}/{name} left behind"
    assert "gpu-admission" not in helm("list", "-n", RELEASE_NAMESPACE, "-q", *kc).stdout.split()
