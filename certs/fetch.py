"""Reading the material back from a `kubernetes.io/tls` Secret into a certificate directory (`certs fetch`).

The reverse of `certs secret`: `tls.crt`, `tls.key` and `ca.crt` must be in the Secret; `ca.key` and
`ca-bundle.crt` are taken when present (`certs secret --include-ca` stores them). Everything is decoded and
checked (certificates parse, each key matches its certificate) before anything is written, and the files
are written like `certs init` writes them: atomically, keys 0600, certificates 0644, the directory created
0700, the bundle first and every key before its certificate.

Messages name the Secret and the key, never the material.
"""

from __future__ import annotations

import base64
import binascii
from pathlib import Path

from certs.errors import CertError
from certs.keys import key_from_pem, key_matches
from certs.store import (
    ALL_FILES,
    CA_BUNDLE,
    CA_CERT,
    CA_KEY,
    CERT_MODE,
    KEY_MODE,
    TLS_CERT,
    TLS_KEY,
    ensure_dir,
    parse_cert,
    parse_certs,
    write_atomic,
)
from cluster.kubeclient import JSON, KubeClient, KubeError

SECRET_TYPE = "kubernetes.io/tls"
REQUIRED_KEYS: tuple[str, ...] = (TLS_CERT, TLS_KEY, CA_CERT)
OPTIONAL_KEYS: tuple[str, ...] = (CA_KEY, CA_BUNDLE)
# Bundle first, then each pair key before certificate: the order `certs init` and `certs rotate` use.
WRITE_ORDER: tuple[str, ...] = (CA_BUNDLE, CA_KEY, CA_CERT, TLS_KEY, TLS_CERT)


def secret_path(namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{namespace}/secrets/{name}"


def secret_material(secret: JSON, *, where: str) -> dict[str, bytes]:
    """The checked PEM files of a Secret object, by file name. Raises `CertError` naming what is wrong.

    `where` (e.g. "Secret ns/name") starts every message.
    """
    kind = secret.get("type")
    if kind != SECRET_TYPE:
        raise CertError(f"{where} has type {kind!r}, not {SECRET_TYPE}")
    data = secret.get("data")
    if data is None:  # the API server leaves out an empty map
        data = {}
    if not isinstance(data, dict):
        raise CertError(f"{where}: data is not a map")
    missing = [key for key in REQUIRED_KEYS if not data.get(key)]
    if missing:
        raise CertError(f"{where} lacks {', '.join(missing)}")
    files: dict[str, bytes] = {}
    for key in REQUIRED_KEYS + OPTIONAL_KEYS:
        value = data.get(key)
        if not value:
            continue
        if not isinstance(value, str):
            raise CertError(f"{where}: {key} is not a base64 string")
        try:
            files[key] = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise CertError(f"{where}: {key} is not valid base64") from None
    _check(files, where)
    return files


def _check(files: dict[str, bytes], where: str) -> None:
    leaf = parse_cert(files[TLS_CERT], source=f"{where}: {TLS_CERT}")
    if not key_matches(key_from_pem(files[TLS_KEY], source=f"{where}: {TLS_KEY}"), leaf):
        raise CertError(f"{where}: {TLS_KEY} does not match {TLS_CERT}")
    ca = parse_cert(files[CA_CERT], source=f"{where}: {CA_CERT}")
    if CA_KEY in files and not key_matches(key_from_pem(files[CA_KEY], source=f"{where}: {CA_KEY}"), ca):
        raise CertError(f"{where}: {CA_KEY} does not match {CA_CERT}")
    if CA_BUNDLE in files and not parse_certs(files[CA_BUNDLE], source=f"{where}: {CA_BUNDLE}"):
        raise CertError(f"{where}: {CA_BUNDLE} holds no certificate")


def fetch_secret_material(client: KubeClient, *, name: str, namespace: str) -> dict[str, bytes] | None:
    """GET the Secret and return its checked files; None when it does not exist. `KubeError` otherwise."""
    try:
        secret = client.get(secret_path(namespace, name))
    except KubeError as exc:
        if exc.not_found:
            return None
        raise
    return secret_material(secret, where=f"Secret {namespace}/{name}")


def check_target(directory: Path, *, replace: bool) -> None:
    """Refuse a directory that already holds material, unless `replace`; refuse a non-directory."""
    if directory.exists() and not directory.is_dir():
        raise CertError(f"{directory}: not a directory")
    if replace or not directory.is_dir():
        return
    present = [name for name in ALL_FILES if (directory / name).exists()]
    if present:
        raise CertError(f"{directory} already holds {', '.join(present)}: use --force to replace")


def write_material(
    directory: Path | str, files: dict[str, bytes], *, replace: bool = False
) -> tuple[list[Path], list[Path]]:
    """Write `files` into `directory`; with `replace`, also remove the known files that `files` lacks, so
    the directory holds exactly the Secret's material. Returns (written, removed)."""
    base = Path(directory)
    check_target(base, replace=replace)
    ensure_dir(base)
    written: list[Path] = []
    for name in WRITE_ORDER:
        if name in files:
            path = base / name
            write_atomic(path, files[name], KEY_MODE if name in (CA_KEY, TLS_KEY) else CERT_MODE)
            written.append(path)
    removed: list[Path] = []
    if replace:
        for name in ALL_FILES:
            path = base / name
            if name not in files and (path.exists() or path.is_symlink()):
                try:
                    path.unlink()
                except OSError as exc:
                    raise CertError(f"{path}: cannot remove ({exc.strerror})") from None
                removed.append(path)
    return written, removed
