"""Issuing certificates: a self-signed CA and serving certificates for the webhook's Service.

Profile (what `cryptography.x509.verification`, Go's crypto/x509 in the API server and OpenSSL all accept):

- CA: subject `CN=gpu-admission-ca@<unix seconds>` (unique per CA, so old and new CAs are told apart in a
  bundle during rollover), BasicConstraints CA:true pathlen:0 (critical), KeyUsage keyCertSign + cRLSign +
  digitalSignature (critical), SubjectKeyIdentifier, AuthorityKeyIdentifier (its own key).
- Serving certificate: subject `CN=<svc>.<ns>.svc`, SubjectAlternativeName with the Service's DNS names
  (`svc`, `svc.ns`, `svc.ns.svc`, `svc.ns.svc.<cluster-domain>`) plus extra DNS names and IP addresses,
  ExtendedKeyUsage serverAuth, KeyUsage digitalSignature (+ keyEncipherment for RSA) (critical),
  BasicConstraints CA:false (critical), SubjectKeyIdentifier, AuthorityKeyIdentifier = the CA's key id.
- Signatures use SHA-256. `notBefore` is back-dated by `BACKDATE` to tolerate clock skew between the
  machine that issues and the API server that verifies. A leaf never outlives its CA: its `notAfter` is
  clamped to the CA's.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from certs.errors import CertError
from certs.keys import KeyType, PrivateKey, generate_key, key_matches, key_type_of, signature_hash

DEFAULT_CA_VALIDITY = timedelta(days=3650)
DEFAULT_LEAF_VALIDITY = timedelta(days=365)
DEFAULT_CLUSTER_DOMAIN = "cluster.local"
BACKDATE = timedelta(minutes=5)
CA_NAME_PREFIX = "gpu-admission-ca"
ORGANIZATION = "gpu-admission"

IPAddr = ipaddress.IPv4Address | ipaddress.IPv6Address

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_SERVICE_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")


@dataclass(frozen=True)
class Issued:
    """A certificate and its private key. `repr` never shows the key."""

    cert: x509.Certificate
    key: PrivateKey = field(repr=False)


def _now(now: datetime | None) -> datetime:
    if now is None:
        return datetime.now(UTC).replace(microsecond=0)
    if now.tzinfo is None:
        raise CertError("time must be timezone-aware")
    return now.astimezone(UTC).replace(microsecond=0)


def validate_service_name(name: str) -> str:
    """A Service name is an RFC 1035 label: lower-case letters, digits and '-', starting with a letter."""
    if not _SERVICE_NAME.match(name):
        raise CertError(
            f"invalid Service name {name!r}: use at most 63 lower-case letters, digits and '-', starting with a letter"
        )
    return name


def validate_namespace(name: str) -> str:
    if not _DNS_LABEL.match(name):
        raise CertError(
            f"invalid namespace {name!r}: use at most 63 lower-case letters, digits and '-', "
            "starting and ending with a letter or digit"
        )
    return name


def validate_dns_name(name: str) -> str:
    """A DNS name for a SAN: dot-separated labels, a leading `*.` wildcard allowed; returned lower-cased."""
    lowered = name.strip().lower().rstrip(".")
    labels = lowered.split(".")
    if labels and labels[0] == "*" and len(labels) > 1:
        labels = labels[1:]
    if not lowered or len(lowered) > 253 or not all(_DNS_LABEL.match(label) for label in labels):
        raise CertError(f"invalid DNS name {name!r}")
    return lowered


def parse_ip(text: str) -> IPAddr:
    try:
        return ipaddress.ip_address(text.strip())
    except ValueError:
        raise CertError(f"invalid IP address {text!r}") from None


def service_dns_names(service: str, namespace: str, cluster_domain: str = DEFAULT_CLUSTER_DOMAIN) -> list[str]:
    """The names the API server may use for `service` in `namespace`, in the order they go into the SAN."""
    validate_service_name(service)
    validate_namespace(namespace)
    domain = validate_dns_name(cluster_domain)
    return [
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.{domain}",
    ]


def _dedupe(items: Iterable[str]) -> list[str]:
    seen: dict[str, None] = {}
    for item in items:
        seen.setdefault(item, None)
    return list(seen)


def make_ca(
    *,
    key_type: KeyType | str = KeyType.ECDSA,
    rsa_bits: int = 2048,
    validity: timedelta = DEFAULT_CA_VALIDITY,
    common_name: str | None = None,
    now: datetime | None = None,
) -> Issued:
    """A new self-signed CA valid for `validity` (default 10 years) with a fresh key."""
    if validity <= timedelta(0):
        raise CertError("CA validity must be positive")
    start = _now(now)
    key = generate_key(key_type, rsa_bits=rsa_bits)
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, ORGANIZATION),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name or f"{CA_NAME_PREFIX}@{int(start.timestamp())}"),
        ]
    )
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start - BACKDATE)
        .not_valid_after(start + validity)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(ski, critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False)
        .sign(key, signature_hash(key))
    )
    return Issued(cert=cert, key=key)


def make_serving_cert(
    ca: Issued,
    *,
    service: str,
    namespace: str,
    extra_dns: Sequence[str] = (),
    ips: Sequence[str | IPAddr] = (),
    cluster_domain: str = DEFAULT_CLUSTER_DOMAIN,
    key_type: KeyType | str | None = None,
    rsa_bits: int | None = None,
    validity: timedelta = DEFAULT_LEAF_VALIDITY,
    now: datetime | None = None,
) -> Issued:
    """A serving certificate for the Service `service.namespace`, signed by `ca`, with a fresh key.

    `key_type` (and `rsa_bits`) default to the CA's key type (and size).
    The leaf's `notAfter` is clamped to the CA's.
    """
    dns = _dedupe([*service_dns_names(service, namespace, cluster_domain), *map(validate_dns_name, extra_dns)])
    addresses = _dedupe([str(ip if not isinstance(ip, str) else parse_ip(ip)) for ip in ips])
    return issue_serving_cert(
        ca,
        common_name=f"{service}.{namespace}.svc",
        dns_names=dns,
        ips=[ipaddress.ip_address(a) for a in addresses],
        key_type=key_type,
        rsa_bits=rsa_bits,
        validity=validity,
        now=now,
    )


def issue_serving_cert(
    ca: Issued,
    *,
    common_name: str,
    dns_names: Sequence[str],
    ips: Sequence[IPAddr] = (),
    key_type: KeyType | str | None = None,
    rsa_bits: int | None = None,
    validity: timedelta = DEFAULT_LEAF_VALIDITY,
    now: datetime | None = None,
) -> Issued:
    """A serving certificate with exactly these SANs (DNS names first, then IPs), signed by `ca`."""
    if validity <= timedelta(0):
        raise CertError("certificate validity must be positive")
    if not dns_names and not ips:
        raise CertError("a serving certificate needs at least one DNS name or IP address")
    if not key_matches(ca.key, ca.cert):
        raise CertError("the CA key does not match the CA certificate")
    start = _now(now)
    ca_not_after = ca.cert.not_valid_after_utc
    if ca_not_after <= start:
        raise CertError(f"the CA expired at {ca_not_after.isoformat()}")
    not_after = min(start + validity, ca_not_after)
    kind = KeyType(key_type) if key_type is not None else key_type_of(ca.key)
    if rsa_bits is None:
        ca_public = ca.key.public_key()
        rsa_bits = ca_public.key_size if isinstance(ca_public, rsa.RSAPublicKey) else 2048
    key = generate_key(kind, rsa_bits=rsa_bits)
    sans: list[x509.GeneralName] = [x509.DNSName(name) for name in dns_names]
    sans += [x509.IPAddress(ip) for ip in ips]
    ca_ski = ca.cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    cert = (
        x509.CertificateBuilder()
        .subject_name(
            x509.Name(
                [
                    x509.NameAttribute(NameOID.ORGANIZATION_NAME, ORGANIZATION),
                    x509.NameAttribute(NameOID.COMMON_NAME, common_name[:64]),
                ]
            )
        )
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(max(start - BACKDATE, ca.cert.not_valid_before_utc))
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=kind is KeyType.RSA,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
        .sign(ca.key, signature_hash(ca.key))
    )
    return Issued(cert=cert, key=key)
