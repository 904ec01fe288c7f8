"""A server-side `ssl.SSLContext` from a certificate directory: TLS 1.2 or newer, a verified key pair."""

from __future__ import annotations

import os
import shutil
import ssl
import tempfile
from pathlib import Path

from certs.errors import CertError
from certs.store import TLS_CERT, TLS_KEY, LoadedPair, load_pair

MIN_TLS_VERSION = ssl.TLSVersion.TLSv1_2


def load_pem_chain(context: ssl.SSLContext, cert_pem: bytes, key_pem: bytes) -> None:
    """Load a certificate chain and key given as PEM bytes into `context` (raises ssl.SSLError).

    `ssl` only reads certificates and keys from files, so the bytes go to a private (0700) temporary
    directory that is removed right after loading. Shared by the server (serving pair) and the Kubernetes
    client (client certificate from kubeconfig data).
    """
    scratch = tempfile.mkdtemp(prefix="gpu-admission-tls-")
    try:
        cert_path = os.path.join(scratch, "tls.crt")
        key_path = os.path.join(scratch, "tls.key")
        for path, data in ((cert_path, cert_pem), (key_path, key_pem)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
        context.load_cert_chain(cert_path, key_path)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def load_into_context(context: ssl.SSLContext, pair: LoadedPair) -> None:
    """Load an already verified pair into `context`: the context gets exactly the pair that was verified,
    whatever a concurrent rotation does to the certificate directory meanwhile."""
    try:
        load_pem_chain(context, pair.cert_pem, pair.key_pem)
    except ssl.SSLError as exc:
        raise CertError(f"cannot load the serving certificate: {exc.reason or exc}") from None


def server_ssl_context(
    directory: Path | str,
    *,
    cert_name: str = TLS_CERT,
    key_name: str = TLS_KEY,
    min_version: ssl.TLSVersion = MIN_TLS_VERSION,
) -> ssl.SSLContext:
    """A TLS server context serving `tls.crt`/`tls.key` of `directory`, refusing anything below TLS 1.2."""
    if min_version < MIN_TLS_VERSION:
        raise CertError("the minimum TLS version may not be below TLS 1.2")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = min_version
    context.options |= ssl.OP_NO_COMPRESSION
    load_into_context(context, load_pair(directory, cert_name=cert_name, key_name=key_name))
    return context
