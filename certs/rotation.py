"""Creating a certificate directory and rotating what is in it.

`init_dir` writes a new CA, its bundle and a serving certificate. `rotate` renews the serving certificate
when it is inside its renewal window (or on `force`), rolls the CA over when the CA is inside its own window
(the new CA signs the new serving certificate; the old CA stays in `ca-bundle.crt` until it expires, so a
bundle injected during the rollover trusts the serving certificate of either generation), and drops expired
CAs from the bundle.

Order of writes in a rotation: bundle (old + new CAs) first, then the CA pair, then the serving pair (key
before certificate). After a rotation that changed the bundle, inject it (`certs inject`) before the server
switches to the new serving certificate: the API server must trust the new CA first.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import rsa

from certs.authority import (
    DEFAULT_CA_VALIDITY,
    DEFAULT_CLUSTER_DOMAIN,
    DEFAULT_LEAF_VALIDITY,
    Issued,
    issue_serving_cert,
    make_ca,
    make_serving_cert,
)
from certs.errors import CertError
from certs.keys import KeyType, key_type_of, public_key_der
from certs.status import chain_ok, common_name, dns_names, ip_addresses
from certs.store import (
    ALL_FILES,
    CA_BUNDLE,
    CA_CERT,
    CA_KEY,
    TLS_CERT,
    TLS_KEY,
    ensure_dir,
    load_ca,
    read_bundle,
    read_cert,
    write_bundle,
    write_pair,
)

DEFAULT_RENEW_BEFORE = timedelta(days=30)
DEFAULT_CA_RENEW_BEFORE = timedelta(days=90)


@dataclass(frozen=True)
class InitResult:
    directory: Path
    ca: x509.Certificate
    serving: x509.Certificate
    files: tuple[Path, ...]


@dataclass
class RotationResult:
    """What `rotate` did. `actions` is human-readable, one line each, and never empty."""

    leaf_renewed: bool = False
    ca_rotated: bool = False
    dropped_cas: list[str] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)
    serving_not_after: datetime | None = None
    ca_not_after: datetime | None = None

    @property
    def changed(self) -> bool:
        return self.leaf_renewed or self.ca_rotated or bool(self.dropped_cas)

    @property
    def bundle_changed(self) -> bool:
        """True when `ca-bundle.crt` changed and should be injected again."""
        return self.ca_rotated or bool(self.dropped_cas)


def _now(now: datetime | None) -> datetime:
    return (now or datetime.now(UTC)).astimezone(UTC)


def init_dir(
    directory: Path | str,
    *,
    service: str,
    namespace: str,
    extra_dns: list[str] | tuple[str, ...] = (),
    ips: list[str] | tuple[str, ...] = (),
    cluster_domain: str = DEFAULT_CLUSTER_DOMAIN,
    key_type: KeyType | str = KeyType.ECDSA,
    rsa_bits: int = 2048,
    validity: timedelta = DEFAULT_LEAF_VALIDITY,
    ca_validity: timedelta = DEFAULT_CA_VALIDITY,
    overwrite: bool = False,
    now: datetime | None = None,
) -> InitResult:
    """Write a new CA, bundle and serving certificate into `directory` (created 0700 if missing).

    Refuses to replace existing files unless `overwrite`.
    """
    base = Path(directory)
    if not overwrite and base.is_dir():
        present = [name for name in ALL_FILES if (base / name).exists()]
        if present:
            raise CertError(f"{base} already holds {', '.join(present)}: use `certs rotate`, or --force")
    # Issue everything before writing anything, so bad input leaves no partial directory behind.
    ca = make_ca(key_type=key_type, rsa_bits=rsa_bits, validity=ca_validity, now=now)
    leaf = make_serving_cert(
        ca,
        service=service,
        namespace=namespace,
        extra_dns=extra_dns,
        ips=ips,
        cluster_domain=cluster_domain,
        validity=validity,
        now=now,
    )
    ensure_dir(base)
    write_bundle(base, [ca.cert])
    write_pair(base, ca, cert_name=CA_CERT, key_name=CA_KEY)
    write_pair(base, leaf, cert_name=TLS_CERT, key_name=TLS_KEY)
    return InitResult(
        directory=base,
        ca=ca.cert,
        serving=leaf.cert,
        files=tuple(base / name for name in (CA_CERT, CA_KEY, TLS_CERT, TLS_KEY, CA_BUNDLE)),
    )


def _renew_like(ca: Issued, old: x509.Certificate, validity: timedelta, now: datetime) -> Issued:
    """A new serving certificate with the same subject name, SANs and key type as `old`."""
    public = old.public_key()
    bits = public.key_size if isinstance(public, rsa.RSAPublicKey) else None
    return issue_serving_cert(
        ca,
        common_name=common_name(old),
        dns_names=dns_names(old),
        ips=[ipaddress.ip_address(ip) for ip in ip_addresses(old)],
        key_type=key_type_of(old),
        rsa_bits=bits,
        validity=validity,
        now=now,
    )


def _fmt(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _days(delta: timedelta) -> str:
    days = delta.total_seconds() / 86400
    return f"{days:.0f} days" if abs(days) >= 2 else f"{delta.total_seconds() / 3600:.1f} hours"


def rotate(
    directory: Path | str,
    renew_before: timedelta = DEFAULT_RENEW_BEFORE,
    *,
    ca_renew_before: timedelta = DEFAULT_CA_RENEW_BEFORE,
    force: bool = False,
    force_ca: bool = False,
    validity: timedelta | None = None,
    ca_validity: timedelta = DEFAULT_CA_VALIDITY,
    now: datetime | None = None,
) -> RotationResult:
    """Renew what is due in `directory` and say what was done.

    - The serving certificate is renewed (same SANs and key type, fresh key) when it expires within
      `renew_before`, when it no longer chains to the current CA, or when `force` is set.
    - The CA is rolled over when it expires within `max(ca_renew_before, renew_before)` or when `force_ca`
      is set: a new CA (same key type) is made, the bundle holds both, and a new serving certificate is
      issued by the new CA.
    - Expired CAs are dropped from `ca-bundle.crt`; the current CA is always in it.
    - `validity` of a renewed serving certificate defaults to the old one's lifetime in whole days (the
      default of one year if the old one was cut short by its CA's expiry).
    """
    base = Path(directory)
    current = _now(now)
    if renew_before < timedelta(0) or ca_renew_before < timedelta(0):
        raise CertError("renewal windows must not be negative")
    ca_pair = load_ca(base)
    ca = ca_pair.issued()
    bundle_path = base / CA_BUNDLE
    bundle = read_bundle(bundle_path) if bundle_path.exists() else [ca.cert]
    leaf = read_cert(base / TLS_CERT)
    result = RotationResult()

    if validity is None:
        # As long as the current certificate was meant to live (whole days, back-dating removed), unless its
        # life was cut short by its CA's expiry: then the default.
        lifetime = leaf.not_valid_after_utc - leaf.not_valid_before_utc
        clamped = leaf.not_valid_after_utc == ca.cert.not_valid_after_utc
        days = round(lifetime.total_seconds() / 86400)
        validity = DEFAULT_LEAF_VALIDITY if clamped or days < 1 else timedelta(days=days)
    leaf_validity = validity

    ca_window = max(ca_renew_before, renew_before)
    ca_left = ca.cert.not_valid_after_utc - current
    if force_ca or ca_left <= ca_window:
        if ca_left <= timedelta(0):
            reason = "expired"
        else:
            reason = "forced" if force_ca and ca_left > ca_window else f"expires in {_days(ca_left)}"
        old_name = common_name(ca.cert)
        public = ca.cert.public_key()
        ca = make_ca(
            key_type=key_type_of(ca.cert),
            rsa_bits=public.key_size if isinstance(public, rsa.RSAPublicKey) else 2048,
            validity=ca_validity,
            now=current,
        )
        result.ca_rotated = True
        result.actions.append(f"rolled the CA over: {old_name} ({reason}) -> {common_name(ca.cert)}")

    # The new bundle: the current CA first, then every other CA not yet expired, without duplicates.
    kept: list[x509.Certificate] = [ca.cert]
    seen = {public_key_der(ca.cert) + ca.cert.subject.public_bytes()}
    for cert in [ca_pair.cert, *bundle]:
        ident = public_key_der(cert) + cert.subject.public_bytes()
        if ident in seen:
            continue
        seen.add(ident)
        if cert.not_valid_after_utc <= current:
            result.dropped_cas.append(common_name(cert))
            result.actions.append(f"dropped expired CA {common_name(cert)} (expired {_fmt(cert.not_valid_after_utc)})")
            continue
        kept.append(cert)
    old_bundle_ids = [c.fingerprint(_sha256()) for c in bundle]
    bundle_differs = not bundle_path.exists() or [c.fingerprint(_sha256()) for c in kept] != old_bundle_ids

    leaf_left = leaf.not_valid_after_utc - current
    renew_reason: str | None = None
    if result.ca_rotated:
        renew_reason = "the CA rolled over"
    elif force:
        renew_reason = "forced"
    elif leaf_left <= renew_before:
        renew_reason = f"expires in {_days(leaf_left)}" if leaf_left > timedelta(0) else "expired"
    elif not chain_ok(leaf, [ca.cert], now=current):
        renew_reason = "it does not chain to the current CA"

    new_leaf: Issued | None = None
    if renew_reason is not None:
        new_leaf = _renew_like(ca, leaf, leaf_validity, current)

    # Writes: bundle first (trust before use), then CA pair, then serving pair (key before certificate).
    if bundle_differs:
        write_bundle(base, kept)
    if result.ca_rotated:
        write_pair(base, ca, cert_name=CA_CERT, key_name=CA_KEY)
    if new_leaf is not None:
        write_pair(base, new_leaf, cert_name=TLS_CERT, key_name=TLS_KEY)
        result.leaf_renewed = True
        result.actions.append(
            f"renewed the serving certificate ({renew_reason}); valid until {_fmt(new_leaf.cert.not_valid_after_utc)}"
        )
        leaf = new_leaf.cert
    if not result.actions:
        result.actions.append(
            f"nothing to do: serving certificate valid until {_fmt(leaf.not_valid_after_utc)} "
            f"({_days(leaf.not_valid_after_utc - current)} left), "
            f"CA until {_fmt(ca.cert.not_valid_after_utc)}"
        )
    result.serving_not_after = leaf.not_valid_after_utc
    result.ca_not_after = ca.cert.not_valid_after_utc
    return result


def _sha256() -> hashes.SHA256:
    return hashes.SHA256()
