"""Publishing certificates to the cluster: the CA bundle into our webhook configurations, the pair into a
`kubernetes.io/tls` Secret.

The manifests and patches are built by pure functions (`ca_bundle_patch`, `tls_secret`); the functions that
talk to the API server take a `cluster.kubeclient.KubeClient`. Key material only ever goes into the Secret
body sent to the API server (or to stdout on an explicit `--print`), never into a message.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from certs.errors import CertError
from certs.store import (
    CA_BUNDLE,
    CA_CERT,
    CA_KEY,
    TLS_CERT,
    TLS_KEY,
    load_ca,
    load_pair,
    parse_certs,
    read_bytes,
    read_cert,
)
from cluster.kubeclient import JSON, KubeClient, KubeError

ADMISSION_API = "/apis/admissionregistration.k8s.io/v1"
WEBHOOK_KINDS: tuple[tuple[str, str], ...] = (
    ("MutatingWebhookConfiguration", f"{ADMISSION_API}/mutatingwebhookconfigurations"),
    ("ValidatingWebhookConfiguration", f"{ADMISSION_API}/validatingwebhookconfigurations"),
)
LABELS = {"app.kubernetes.io/name": "gpu-admission", "app.kubernetes.io/managed-by": "gpu-admission"}


def ca_bundle_b64(bundle_pem: bytes, *, source: str = "CA bundle") -> str:
    """The `caBundle` value: base64 of the PEM bundle, after checking it holds certificates."""
    certs = parse_certs(bundle_pem, source=source)
    if not certs:
        raise CertError(f"{source}: holds no certificate")
    return base64.b64encode(bundle_pem).decode("ascii")


def ca_bundle_patch(configuration: JSON, bundle_b64: str) -> list[JSON]:
    """RFC 6902 operations setting `webhooks[*].clientConfig.caBundle` and nothing else.

    One `test` of the entry's name guards each change against the list being reordered meanwhile; entries
    that already carry this bundle are left out, so an empty list means there is nothing to do.
    """
    ops: list[JSON] = []
    webhooks = configuration.get("webhooks") or []
    if not isinstance(webhooks, list):
        return ops
    for index, hook in enumerate(webhooks):
        if not isinstance(hook, dict):
            continue
        client_config = hook.get("clientConfig")
        if isinstance(client_config, dict) and client_config.get("caBundle") == bundle_b64:
            continue
        if "name" in hook:
            ops.append({"op": "test", "path": f"/webhooks/{index}/name", "value": hook["name"]})
        if isinstance(client_config, dict):
            ops.append({"op": "add", "path": f"/webhooks/{index}/clientConfig/caBundle", "value": bundle_b64})
        else:
            ops.append({"op": "add", "path": f"/webhooks/{index}/clientConfig", "value": {"caBundle": bundle_b64}})
    return ops


@dataclass
class InjectResult:
    kind: str
    name: str
    patched: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)


def inject_ca_bundle(client: KubeClient, names: Sequence[str], bundle_pem: bytes) -> list[InjectResult]:
    """Set the caBundle of every webhook in our Mutating/ValidatingWebhookConfigurations named `names`.

    A name may match a mutating and a validating configuration; both are patched. Every name must match at
    least one, checked before anything is patched.
    """
    value = ca_bundle_b64(bundle_pem)
    found: list[tuple[str, str, JSON]] = []
    missing: list[str] = []
    for name in dict.fromkeys(names):
        hits = 0
        for kind, base in WEBHOOK_KINDS:
            try:
                found.append((kind, f"{base}/{name}", client.get(f"{base}/{name}")))
                hits += 1
            except KubeError as exc:
                if not exc.not_found:
                    raise
        if not hits:
            missing.append(name)
    if missing:
        raise CertError(f"no MutatingWebhookConfiguration or ValidatingWebhookConfiguration named {', '.join(missing)}")
    results: list[InjectResult] = []
    for kind, path, configuration in found:
        result = InjectResult(kind=kind, name=str((configuration.get("metadata") or {}).get("name", "")))
        ops = ca_bundle_patch(configuration, value)
        changed = {op["path"].split("/")[2] for op in ops}
        for index, hook in enumerate(configuration.get("webhooks") or []):
            hook_name = str(hook.get("name", index)) if isinstance(hook, dict) else str(index)
            (result.patched if str(index) in changed else result.unchanged).append(hook_name)
        if ops:
            client.patch(path, ops, "json")
        results.append(result)
    return results


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def tls_secret(directory: Path | str, *, name: str, namespace: str, include_ca: bool = False) -> JSON:
    """A `kubernetes.io/tls` Secret with tls.crt, tls.key (a verified pair) and ca.crt from `directory`.

    With `include_ca`, also ca.key (verified to match ca.crt) and ca-bundle.crt (which must hold ca.crt),
    so that a later `certs fetch` + `certs rotate` elsewhere can continue from it.
    """
    base = Path(directory)
    pair = load_pair(base, cert_name=TLS_CERT, key_name=TLS_KEY)
    data = {TLS_CERT: _b64(pair.cert_pem), TLS_KEY: _b64(pair.key_pem)}
    if include_ca:
        ca = load_ca(base)
        bundle_pem = read_bytes(base / CA_BUNDLE)
        bundle = parse_certs(bundle_pem, source=str(base / CA_BUNDLE))
        if ca.cert not in bundle:
            raise CertError(f"{base / CA_BUNDLE} does not hold {base / CA_CERT}: run `certs rotate` first")
        data.update({CA_CERT: _b64(ca.cert_pem), CA_KEY: _b64(ca.key_pem), CA_BUNDLE: _b64(bundle_pem)})
    else:
        ca_pem = read_bytes(base / CA_CERT)
        read_cert(base / CA_CERT)  # must parse
        data[CA_CERT] = _b64(ca_pem)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(LABELS)},
        "type": "kubernetes.io/tls",
        "data": data,
    }


def secret_yaml(secret: JSON) -> str:
    return yaml.safe_dump(secret, sort_keys=False, default_flow_style=False)


def apply_secret(client: KubeClient, secret: JSON) -> str:
    """Create the Secret, or merge-patch its data and labels; `created`, `updated` or `unchanged`."""
    metadata = secret["metadata"]
    collection = f"/api/v1/namespaces/{metadata['namespace']}/secrets"
    path = f"{collection}/{metadata['name']}"
    try:
        existing = client.get(path)
    except KubeError as exc:
        if not exc.not_found:
            raise
        client.create(collection, secret)
        return "created"
    if existing.get("type") != secret["type"]:
        raise CertError(
            f"Secret {metadata['namespace']}/{metadata['name']} exists with type {existing.get('type')!r}, "
            f"not {secret['type']}: delete it first"
        )
    current: dict[str, Any] = existing.get("data") or {}
    labels: dict[str, Any] = (existing.get("metadata") or {}).get("labels") or {}
    if all(current.get(k) == v for k, v in secret["data"].items()) and all(
        labels.get(k) == v for k, v in metadata["labels"].items()
    ):
        return "unchanged"
    client.patch(path, {"metadata": {"labels": metadata["labels"]}, "data": secret["data"]}, "merge")
    return "updated"


def read_bundle_bytes(path: Path | str) -> bytes:
    """The bytes of a CA bundle file (default name `ca-bundle.crt`), checked to parse."""
    target = Path(path)
    if target.is_dir():
        target = target / CA_BUNDLE
    data = read_bytes(target)
    ca_bundle_b64(data, source=str(target))
    return data
