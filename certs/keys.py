"""Private keys: generation, PEM encoding and matching a key to a certificate.

Key types: ECDSA P-256 (the default: small, fast handshakes, accepted by every supported Kubernetes) and
RSA 2048 or 3072 for environments that still require RSA.
"""

from __future__ import annotations

import enum
from typing import TypeAlias

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from certs.errors import CertError

PrivateKey: TypeAlias = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey

RSA_SIZES: tuple[int, ...] = (2048, 3072)


class KeyType(enum.StrEnum):
    ECDSA = "ecdsa"
    RSA = "rsa"


def generate_key(key_type: KeyType | str = KeyType.ECDSA, *, rsa_bits: int = 2048) -> PrivateKey:
    """A fresh private key: ECDSA on P-256, or RSA of `rsa_bits` (2048 or 3072)."""
    try:
        kind = KeyType(key_type)
    except ValueError:
        raise CertError(f"unknown key type {key_type!r}: use ecdsa or rsa") from None
    if kind is KeyType.ECDSA:
        return ec.generate_private_key(ec.SECP256R1())
    if rsa_bits not in RSA_SIZES:
        raise CertError(f"RSA key size {rsa_bits} is not supported: use 2048 or 3072")
    return rsa.generate_private_key(public_exponent=65537, key_size=rsa_bits)


def key_type_of(key: PrivateKey | x509.Certificate) -> KeyType:
    public = key.public_key()
    if isinstance(public, ec.EllipticCurvePublicKey):
        return KeyType.ECDSA
    if isinstance(public, rsa.RSAPublicKey):
        return KeyType.RSA
    raise CertError(f"unsupported key algorithm {type(public).__name__}")


def describe_key(key: PrivateKey | x509.Certificate) -> str:
    """`ECDSA P-256` or `RSA 2048`: for humans, never the key itself."""
    public = key.public_key()
    if isinstance(public, ec.EllipticCurvePublicKey):
        curve = {"secp256r1": "P-256", "secp384r1": "P-384"}.get(public.curve.name, public.curve.name)
        return f"ECDSA {curve}"
    if isinstance(public, rsa.RSAPublicKey):
        return f"RSA {public.key_size}"
    return type(public).__name__


def signature_hash(key: PrivateKey) -> hashes.SHA256:
    """SHA-256 for both key types (ecdsa-with-SHA256, sha256WithRSAEncryption)."""
    del key
    return hashes.SHA256()


def key_to_pem(key: PrivateKey) -> bytes:
    """Unencrypted PKCS#8 PEM (`BEGIN PRIVATE KEY`), the form Kubernetes TLS Secrets and Python `ssl` read."""
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def key_from_pem(data: bytes, *, source: str = "key") -> PrivateKey:
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise CertError(f"{source}: not a readable unencrypted PEM private key ({_first_line(exc)})") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        raise CertError(f"{source}: unsupported key algorithm {type(key).__name__}")
    return key


def public_key_der(key: PrivateKey | x509.Certificate) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def key_matches(key: PrivateKey, cert: x509.Certificate) -> bool:
    """True when `key` is the private half of `cert`'s public key."""
    return public_key_der(key) == public_key_der(cert)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
