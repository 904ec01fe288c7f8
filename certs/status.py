"""Looking at certificates: SANs, expiry, and whether the serving chain verifies against the bundle.

Used by `certs show`, by `/readyz` and by the tests. Chain verification uses
`cryptography.x509.verification` (RFC 5280 path validation with the Web PKI profile: the leaf must carry a
SAN and EKU serverAuth, the CA must be a CA with keyCertSign), so a pass here is what Go's crypto/x509 in the
API server will accept too.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from cryptography import x509
from cryptography.x509.oid import NameOID
from cryptography.x509.verification import PolicyBuilder, Store, VerificationError

from certs.errors import CertError
from certs.keys import describe_key
from certs.store import CA_BUNDLE, TLS_CERT, read_bundle, read_cert


@dataclass(frozen=True)
class BundleEntry:
    subject: str
    not_after: datetime
    expired: bool


@dataclass(frozen=True)
class CertStatus:
    """The serving certificate of a directory, as `certs show` and `/readyz` report it."""

    subject: str
    issuer: str
    dns_names: tuple[str, ...]
    ip_addresses: tuple[str, ...]
    not_before: datetime
    not_after: datetime
    key: str
    chain_ok: bool
    chain_error: str | None
    bundle: tuple[BundleEntry, ...]

    @property
    def sans(self) -> tuple[str, ...]:
        return self.dns_names + self.ip_addresses

    def remaining(self, now: datetime | None = None) -> float:
        """Seconds until the serving certificate expires (negative once expired)."""
        return (self.not_after - (now or datetime.now(UTC))).total_seconds()

    def ready(self, now: datetime | None = None) -> bool:
        current = now or datetime.now(UTC)
        return self.chain_ok and self.not_before <= current < self.not_after


def common_name(cert: x509.Certificate) -> str:
    attrs = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if attrs:
        value = attrs[0].value
        return value if isinstance(value, str) else value.decode("utf-8", "replace")
    return cert.subject.rfc4514_string()


def dns_names(cert: x509.Certificate) -> list[str]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return list(san.get_values_for_type(x509.DNSName))


def ip_addresses(cert: x509.Certificate) -> list[str]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return [str(ip) for ip in san.get_values_for_type(x509.IPAddress)]


def san_names(cert: x509.Certificate) -> list[str]:
    """Every SAN of `cert` as text: DNS names first, then IP addresses, in certificate order."""
    return dns_names(cert) + ip_addresses(cert)


def is_expired(cert: x509.Certificate, now: datetime | None = None) -> bool:
    return cert.not_valid_after_utc <= (now or datetime.now(UTC))


def verify_chain(
    leaf: x509.Certificate,
    trusted: list[x509.Certificate],
    *,
    hostname: str | None = None,
    now: datetime | None = None,
) -> None:
    """Raise `CertError` unless `leaf` chains to one of `trusted` as a TLS server certificate.

    `hostname` (a DNS name or IP address) defaults to the leaf's first SAN, so the chain alone is checked.
    """
    if not trusted:
        raise CertError("no trusted CA certificates")
    target = hostname
    if target is None:
        names = san_names(leaf)
        if not names:
            raise CertError("the serving certificate has no subject alternative name")
        target = names[0]
    subject: x509.DNSName | x509.IPAddress
    try:
        subject = x509.IPAddress(ipaddress.ip_address(target))
    except ValueError:
        subject = x509.DNSName(target)
    builder = PolicyBuilder().store(Store(trusted)).time(now or datetime.now(UTC))
    try:
        verifier = builder.build_server_verifier(subject)
    except ValueError:
        raise CertError(f"invalid host name {target!r}") from None
    try:
        verifier.verify(leaf, [])
    except VerificationError as exc:
        raise CertError(f"chain does not verify: {_one_line(exc)}") from None


def chain_ok(
    leaf: x509.Certificate,
    trusted: list[x509.Certificate],
    *,
    hostname: str | None = None,
    now: datetime | None = None,
) -> bool:
    try:
        verify_chain(leaf, trusted, hostname=hostname, now=now)
    except CertError:
        return False
    return True


def serving_not_after(directory: Path | str) -> datetime:
    """When the serving certificate in `directory` expires (UTC)."""
    return read_cert(Path(directory) / TLS_CERT).not_valid_after_utc


def cert_status(directory: Path | str, *, now: datetime | None = None) -> CertStatus:
    """Inspect `tls.crt` against `ca-bundle.crt` in `directory`; `CertError` if either is unreadable."""
    base = Path(directory)
    leaf = read_cert(base / TLS_CERT)
    bundle = read_bundle(base / CA_BUNDLE)
    current = now or datetime.now(UTC)
    error: str | None = None
    try:
        verify_chain(leaf, bundle, now=current)
    except CertError as exc:
        error = str(exc)
    return CertStatus(
        subject=leaf.subject.rfc4514_string(),
        issuer=leaf.issuer.rfc4514_string(),
        dns_names=tuple(dns_names(leaf)),
        ip_addresses=tuple(ip_addresses(leaf)),
        not_before=leaf.not_valid_before_utc,
        not_after=leaf.not_valid_after_utc,
        key=describe_key(leaf),
        chain_ok=error is None,
        chain_error=error,
        bundle=tuple(
            BundleEntry(
                subject=ca.subject.rfc4514_string(),
                not_after=ca.not_valid_after_utc,
                expired=is_expired(ca, current),
            )
            for ca in bundle
        ),
    )


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__
