"""`gpu-admission certs` against the real kube-apiserver: the Secret round trip (`secret --include-ca`, then
`fetch`), `inject` into a real ValidatingWebhookConfiguration, and deploy/base/certs.sh run as the certs
ServiceAccount with exactly the RBAC of deploy/base/certs-rbac.yaml.

The webhook configurations made here point at a URL nobody serves, match only a resource that does not
exist and fail open, so they can never get in the way of another test; each is deleted at the end.
"""

from __future__ import annotations

import base64
import copy
import os
import stat
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from certs.status import chain_ok, dns_names
from certs.store import parse_cert, parse_certs
from tests.e2e.cluster import ControlPlane

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
ALL_FILES = ("ca.crt", "ca.key", "tls.crt", "tls.key", "ca-bundle.crt")
SECRET = "gpu-admission-tls"


def certs(*args: str, env: dict[str, str] | None = None, rc: int | None = 0) -> subprocess.CompletedProcess[str]:
    """`gpu-admission certs ...` as a real process."""
    environ = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-m", "webhook", "certs", *args],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert "PRIVATE KEY" not in proc.stdout + proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    if rc is not None:
        assert proc.returncode == rc, (proc.stdout, proc.stderr)
    return proc


def one_line_error(proc: subprocess.CompletedProcess[str], rc: int) -> str:
    assert proc.returncode == rc, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu-admission: error: "), proc.stderr
    return lines[0]


def validating_config(name: str) -> dict[str, Any]:
    """Two webhooks, a URL clientConfig without caBundle, rules for a resource that does not exist."""
    hook = {
        "clientConfig": {"url": "https://127.0.0.1:9/validate"},
        "rules": [{
            "apiGroups": ["certs-e2e.gpu-admission.io"], "apiVersions": ["v1"], "operations": ["CREATE"],
            "resources": ["nothings"], "scope": "*",
        }],
        "namespaceSelector": {"matchLabels": {"certs-e2e.gpu-admission.io/never": name}},
        "failurePolicy": "Ignore",
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
        "timeoutSeconds": 1,
    }  # fmt: skip
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [{"name": f"{x}.certs-e2e.gpu-admission.io", **copy.deepcopy(hook)} for x in ("a", "b")],
    }


@pytest.fixture
def webhook_name(control_plane: ControlPlane) -> Iterator[str]:
    name = f"certs-e2e-{uuid.uuid4().hex[:8]}"
    control_plane.kubectl("create", "-f", "-", input=validating_config(name))
    try:
        yield name
    finally:
        control_plane.kubectl("delete", "validatingwebhookconfiguration", name, "--ignore-not-found", check=False)


def get_vwc(cp: ControlPlane, name: str) -> dict[str, Any]:
    vwc: dict[str, Any] = cp.get_json("validatingwebhookconfiguration", name)
    return vwc


def secret_files(cp: ControlPlane, namespace: str, name: str = SECRET) -> tuple[str, dict[str, bytes]]:
    secret = cp.get_json("secret", name, "-n", namespace)
    assert secret["type"] == "kubernetes.io/tls"
    return secret["metadata"]["resourceVersion"], {k: base64.b64decode(v) for k, v in secret["data"].items()}


def test_secret_fetch_round_trip_and_inject(
    control_plane: ControlPlane, namespace: str, webhook_name: str, tmp_path: Path
) -> None:
    cp = control_plane
    kc = ("--kubeconfig", str(cp.kubeconfig))
    made, fetched = tmp_path / "made", tmp_path / "fetched"
    certs("init", "--service", "gpu-admission", "--namespace", namespace, "--out", str(made))

    # secret --include-ca: all five files, stored by the real API server as a kubernetes.io/tls Secret.
    proc = certs("secret", "--dir", str(made), "--name", SECRET, "--namespace", namespace, "--include-ca", *kc)
    assert "created" in proc.stdout
    version, stored = secret_files(cp, namespace)
    assert stored == {n: (made / n).read_bytes() for n in ALL_FILES}
    proc = certs("secret", "--dir", str(made), "--name", SECRET, "--namespace", namespace, "--include-ca", *kc)
    assert "unchanged" in proc.stdout
    assert secret_files(cp, namespace)[0] == version

    # fetch: the same bytes back, with the store's modes.
    proc = certs("fetch", "--name", SECRET, "--namespace", namespace, "--out", str(fetched), *kc)
    assert proc.stdout.startswith("wrote ")
    assert sorted(p.name for p in fetched.iterdir()) == sorted(ALL_FILES)
    assert stat.S_IMODE(os.stat(fetched).st_mode) == 0o700
    for n in ALL_FILES:
        assert (fetched / n).read_bytes() == (made / n).read_bytes()
        assert stat.S_IMODE(os.stat(fetched / n).st_mode) == (0o600 if n.endswith(".key") else 0o644)

    # A missing Secret: a one-line note with --missing-ok, a one-line error without.
    nowhere = tmp_path / "nowhere"
    proc = certs("fetch", "--name", "absent", "--namespace", namespace, "--out", str(nowhere), "--missing-ok", *kc)
    assert proc.stdout == f"Secret {namespace}/absent not found: nothing fetched\n"
    proc = certs("fetch", "--name", "absent", "--namespace", namespace, "--out", str(nowhere), *kc, rc=None)
    assert "not found" in one_line_error(proc, 1)
    assert not nowhere.exists()

    # inject into the real configuration: caBundle set on both webhooks, nothing else touched.
    before = get_vwc(cp, webhook_name)
    bundle = fetched / "ca-bundle.crt"
    proc = certs("inject", "--ca-bundle", str(bundle), "--webhook-name", webhook_name, *kc)
    assert f"ValidatingWebhookConfiguration {webhook_name}: caBundle set for" in proc.stdout
    after = get_vwc(cp, webhook_name)
    value = base64.b64encode(bundle.read_bytes()).decode()
    assert [h["clientConfig"].get("caBundle") for h in after["webhooks"]] == [value, value]
    expected = copy.deepcopy(before["webhooks"])
    for hook in expected:
        hook["clientConfig"]["caBundle"] = value
    assert after["webhooks"] == expected
    assert after["metadata"]["generation"] == before["metadata"]["generation"] + 1

    # A second inject is a no-op: no write at all, so the object's resourceVersion stays.
    proc = certs("inject", "--ca-bundle", str(bundle), "--webhook-name", webhook_name, *kc)
    assert proc.stdout == f"ValidatingWebhookConfiguration {webhook_name}: caBundle already current\n"
    assert get_vwc(cp, webhook_name)["metadata"]["resourceVersion"] == after["metadata"]["resourceVersion"]

    # A CA rollover travels the same way: rotate, inject (old + new CA), secret, and fetch sees it.
    proc = certs("rotate", "--dir", str(fetched), "--force-ca")
    assert "rolled the CA over" in proc.stdout
    certs("inject", "--ca-bundle", str(bundle), "--webhook-name", webhook_name, *kc)
    rolled = get_vwc(cp, webhook_name)["webhooks"][0]["clientConfig"]["caBundle"]
    assert len(parse_certs(base64.b64decode(rolled), source="caBundle")) == 2
    proc = certs("secret", "--dir", str(fetched), "--name", SECRET, "--namespace", namespace, "--include-ca", *kc)
    assert "updated" in proc.stdout
    again = tmp_path / "again"
    certs("fetch", "--name", SECRET, "--namespace", namespace, "--out", str(again), *kc)
    assert {n: (again / n).read_bytes() for n in ALL_FILES} == {n: (fetched / n).read_bytes() for n in ALL_FILES}


# -- certs.sh as the certs ServiceAccount --------------------------------------------------------------------


def certs_rbac(namespace: str, webhook_name: str, suffix: str) -> list[dict[str, Any]]:
    """deploy/base/certs-rbac.yaml moved into `namespace`, its webhook resourceName set to `webhook_name`, and
    its cluster-scoped names made unique. Verbs, resources and the Secret's resourceName stay as shipped."""
    docs = [d for d in yaml.safe_load_all((ROOT / "deploy/base/certs-rbac.yaml").read_text()) if d]
    for doc in docs:
        meta = doc["metadata"]
        if "namespace" in meta:
            meta["namespace"] = namespace
        if doc["kind"] in ("ClusterRole", "ClusterRoleBinding"):
            meta["name"] = f"{meta['name']}-{suffix}"
        if doc["kind"] == "ClusterRoleBinding":
            doc["roleRef"]["name"] = f"{doc['roleRef']['name']}-{suffix}"
        for subject in doc.get("subjects", []):
            subject["namespace"] = namespace
        for rule in doc.get("rules", []):
            if rule.get("resourceNames") == ["gpu-admission"]:
                rule["resourceNames"] = [webhook_name]
    return docs


def test_certs_script_as_the_certs_service_account(
    control_plane: ControlPlane, namespace: str, webhook_name: str, tmp_path: Path
) -> None:
    cp = control_plane
    suffix = uuid.uuid4().hex[:8]
    rbac = certs_rbac(namespace, webhook_name, suffix)
    cp.kubectl("create", "-f", "-", input={"apiVersion": "v1", "kind": "List", "items": rbac})
    try:
        _run_certs_script_as_service_account(cp, namespace, webhook_name, tmp_path)
    finally:
        for doc in rbac:
            if doc["kind"] in ("ClusterRole", "ClusterRoleBinding"):
                cp.kubectl("delete", doc["kind"].lower(), doc["metadata"]["name"], "--ignore-not-found", check=False)


def _run_certs_script_as_service_account(cp: ControlPlane, namespace: str, webhook_name: str, tmp_path: Path) -> None:
    token = cp.kubectl("create", "token", "gpu-admission-certs", "-n", namespace, "--duration=10m").stdout.strip()
    admin = yaml.safe_load(Path(cp.kubeconfig).read_text())
    kubeconfig = tmp_path / "certs-kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "certs",
        "clusters": admin["clusters"],
        "contexts": [{"name": "certs", "context": {"cluster": admin["clusters"][0]["name"], "user": "certs"}}],
        "users": [{"name": "certs", "user": {"token": token}}],
    }))  # fmt: skip
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "gpu-admission").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m webhook "$@"\n')
    (bin_dir / "gpu-admission").chmod(0o755)
    env = {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
        "PYTHONPATH": str(ROOT),
        "HOME": str(tmp_path),
        "KUBECONFIG": str(kubeconfig),
        "GPU_ADMISSION_NAMESPACE": namespace,
        "GPU_ADMISSION_WEBHOOK": webhook_name,
        "GPU_ADMISSION_CERTS_DIR": str(tmp_path / "material"),
    }

    def script(mode: str) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(["sh", str(ROOT / "deploy/base/certs.sh"), mode], env=env, capture_output=True,
                              text=True, timeout=120, check=False)  # fmt: skip
        assert "PRIVATE KEY" not in proc.stdout + proc.stderr and "Traceback" not in proc.stderr, proc.stderr
        return proc

    proc = script("rotate")  # the CronJob never makes a CA
    assert proc.returncode == 1 and "nothing to rotate" in proc.stderr
    assert cp.kubectl("get", "secret", SECRET, "-n", namespace, check=False).returncode != 0

    proc = script("bootstrap")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    version, files = secret_files(cp, namespace)
    assert sorted(files) == sorted(ALL_FILES)
    ca, leaf = parse_cert(files["ca.crt"], source="ca.crt"), parse_cert(files["tls.crt"], source="tls.crt")
    assert chain_ok(leaf, [ca])
    assert f"gpu-admission.{namespace}.svc" in dns_names(leaf)
    vwc = get_vwc(cp, webhook_name)
    value = base64.b64encode(files["ca-bundle.crt"]).decode()
    assert [h["clientConfig"].get("caBundle") for h in vwc["webhooks"]] == [value, value]

    # The Job again and the CronJob: nothing due, nothing written (the server's resourceVersions prove it).
    for mode in ("bootstrap", "rotate"):
        proc = script(mode)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "nothing to do" in proc.stdout and "already current" in proc.stdout
    assert secret_files(cp, namespace)[0] == version
    assert get_vwc(cp, webhook_name)["metadata"]["resourceVersion"] == vwc["metadata"]["resourceVersion"]

    # The ServiceAccount reads that one Secret only: any other is forbidden, even when it exists.
    cp.kubectl("create", "secret", "generic", "other", "-n", namespace, "--from-literal=k=v")
    proc = certs("fetch", "--name", "other", "--namespace", namespace, "--out", str(tmp_path / "o"), "--missing-ok",
                 env={"KUBECONFIG": str(kubeconfig)}, rc=None)  # fmt: skip
    assert "forbidden" in one_line_error(proc, 1)
    assert not (tmp_path / "o").exists()
