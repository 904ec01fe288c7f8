"""A server-side `ssl.SSLContext` from a certificate directory: TLS 1.2 or newer, a verified key pair."""

from __future__ import annotations

import ssl
from pathlib import Path

from certs.errors import CertError
from certs.store import TLS_CERT, TLS_KEY, LoadedPair, load_pair
from cluster.pem import load_pem_chain

MIN_TLS_VERSION = ssl.TLSVersion.TLSv1_2


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
