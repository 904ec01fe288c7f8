"""The certificate directory: file names, atomic writes with safe modes, and consistent loading.

Layout of a directory (the names a `kubernetes.io/tls` Secret and cert-manager use):

| file | what | mode |
|---|---|---|
| `ca.crt` | the current CA certificate (issues new serving certificates) | 0644 |
| `ca.key` | the current CA private key | 0600 |
| `tls.crt` | the serving certificate | 0644 |
| `tls.key` | the serving private key | 0600 |
| `ca-bundle.crt` | PEM concatenation of every CA a client should trust (the webhook `caBundle`) | 0644 |

Every file is written to a temporary file in the same directory, fsynced, then renamed over the old one
(`os.replace`), so a reader never sees a half-written file. A pair is written key first, certificate second:
a reader that notices the certificate changed and then loads both gets the new key with it. `load_pair()`
checks that the key matches the certificate and retries briefly if it caught the two mid-update.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from certs.authority import Issued
from certs.errors import CertError
from certs.keys import PrivateKey, key_from_pem, key_matches, key_to_pem

CA_CERT = "ca.crt"
CA_KEY = "ca.key"
TLS_CERT = "tls.crt"
TLS_KEY = "tls.key"
CA_BUNDLE = "ca-bundle.crt"
ALL_FILES: tuple[str, ...] = (CA_CERT, CA_KEY, TLS_CERT, TLS_KEY, CA_BUNDLE)

KEY_MODE = 0o600
CERT_MODE = 0o644
DIR_MODE = 0o700


@dataclass(frozen=True)
class LoadedPair:
    """A certificate and the private key that matches it, with the PEM bytes they were read from."""

    cert: x509.Certificate
    key: PrivateKey = field(repr=False)
    cert_pem: bytes = field(repr=False)
    key_pem: bytes = field(repr=False)

    def issued(self) -> Issued:
        return Issued(cert=self.cert, key=self.key)


def cert_to_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def bundle_to_pem(certs: list[x509.Certificate]) -> bytes:
    return b"".join(cert_to_pem(c) for c in certs)


def ensure_dir(directory: Path) -> Path:
    """Create `directory` (mode 0700) if it does not exist; error if it is something else."""
    if directory.exists() and not directory.is_dir():
        raise CertError(f"{directory}: not a directory")
    try:
        directory.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    except OSError as exc:
        raise CertError(f"{directory}: cannot create directory ({exc.strerror})") from None
    return directory


def write_atomic(path: Path, data: bytes, mode: int) -> None:
    """Replace `path` with `data` atomically; the file has exactly `mode` from its first byte on."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise CertError(f"{path.parent}: cannot write ({exc.strerror})") from None
    try:
        os.fchmod(fd, mode)  # mkstemp made it 0600; widen certificates only after nothing else can race
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise CertError(f"{path}: cannot write ({exc.strerror})") from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_pair(directory: Path, issued: Issued, *, cert_name: str, key_name: str) -> None:
    """Write key then certificate, each atomically (see the module docstring for why in this order)."""
    write_atomic(directory / key_name, key_to_pem(issued.key), KEY_MODE)
    write_atomic(directory / cert_name, cert_to_pem(issued.cert), CERT_MODE)


def write_bundle(directory: Path, certs: list[x509.Certificate]) -> None:
    write_atomic(directory / CA_BUNDLE, bundle_to_pem(certs), CERT_MODE)


def read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise CertError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise CertError(f"{path}: is a directory") from None
    except OSError as exc:
        raise CertError(f"{path}: cannot read ({exc.strerror})") from None


def parse_cert(data: bytes, *, source: str) -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(data)
    except ValueError:
        raise CertError(f"{source}: not a PEM certificate") from None


def parse_certs(data: bytes, *, source: str) -> list[x509.Certificate]:
    try:
        return x509.load_pem_x509_certificates(data)
    except ValueError:
        raise CertError(f"{source}: not a PEM certificate bundle") from None


def read_cert(path: Path) -> x509.Certificate:
    return parse_cert(read_bytes(path), source=str(path))


def read_bundle(path: Path) -> list[x509.Certificate]:
    return parse_certs(read_bytes(path), source=str(path))


def _load_pair_once(cert_path: Path, key_path: Path) -> LoadedPair:
    cert_pem = read_bytes(cert_path)
    key_pem = read_bytes(key_path)
    cert = parse_cert(cert_pem, source=str(cert_path))
    key = key_from_pem(key_pem, source=str(key_path))
    if not key_matches(key, cert):
        raise CertError(f"{key_path} does not match {cert_path}")
    return LoadedPair(cert=cert, key=key, cert_pem=cert_pem, key_pem=key_pem)


def load_pair(
    directory: Path | str,
    *,
    cert_name: str = TLS_CERT,
    key_name: str = TLS_KEY,
    attempts: int = 5,
    delay: float = 0.1,
) -> LoadedPair:
    """Load a certificate and its key, verified to match; retry while a writer is mid-update."""
    base = Path(directory)
    last: CertError | None = None
    for attempt in range(max(1, attempts)):
        if attempt:
            time.sleep(delay)
        try:
            return _load_pair_once(base / cert_name, base / key_name)
        except CertError as exc:
            last = exc
    assert last is not None
    raise last


def load_ca(directory: Path | str) -> LoadedPair:
    return load_pair(directory, cert_name=CA_CERT, key_name=CA_KEY)


def key_exposure(path: Path) -> str | None:
    """Why a private key file is readable by more than this process, or None.

    Others never may; a group only when it is one of ours: a Secret mounted with `defaultMode: 0440` and the
    pod's `fsGroup` (deploy/) is group-readable by design, a `chmod 644` key is not."""
    try:
        st = path.stat()
    except OSError:
        return None  # loading reports a missing key
    mode = st.st_mode & 0o777
    if mode & 0o007:
        return f"private key {path} is readable by others (mode {mode:04o}); chmod 600 it"
    if mode & 0o070 and st.st_gid not in {os.getgid(), *os.getgroups()}:
        return f"private key {path} is readable by group {st.st_gid}, not ours (mode {mode:04o}); chmod 600 it"
    return None
