"""PEM bytes into an `ssl.SSLContext`: shared by the server (serving pair) and the Kubernetes client
(client certificate from kubeconfig data), so it lives in the lowest layer both import."""

from __future__ import annotations

import os
import shutil
import ssl
import tempfile


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
