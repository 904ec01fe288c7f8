"""Certificates: profile, files, rotation, and real TLS handshakes with the generated pair."""

from __future__ import annotations

import ipaddress
import os
import socket
import ssl
import stat
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.serialization import Encoding
from cryptography.x509.oid import ExtendedKeyUsageOID
from cryptography.x509.verification import PolicyBuilder, Store, VerificationError

from certs.authority import (
    BACKDATE,
    make_ca,
    make_serving_cert,
    service_dns_names,
)
from certs.errors import CertError
from certs.keys import key_matches
from certs.rotation import init_dir, rotate
from certs.status import cert_status, chain_ok, san_names, serving_not_after, verify_chain
from certs.store import CA_BUNDLE, CA_CERT, CA_KEY, TLS_CERT, TLS_KEY, load_pair, read_bundle, read_cert
from certs.tlsconfig import server_ssl_context
from tests.threads import Worker

SVC, NS = "gpu-admission", "gpu-system"
ALL_NAMES = (CA_CERT, CA_KEY, TLS_CERT, TLS_KEY, CA_BUNDLE)
EXPECTED_DNS = [
    "gpu-admission",
    "gpu-admission.gpu-system",
    "gpu-admission.gpu-system.svc",
    "gpu-admission.gpu-system.svc.cluster.local",
]


@pytest.fixture(scope="module")
def ecdsa_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("certs") / "ecdsa"
    init_dir(out, service=SVC, namespace=NS, ips=["127.0.0.1"], extra_dns=["webhook.example.com"])
    return out


def _ext(cert: x509.Certificate, kind: type[x509.ExtensionType]) -> x509.Extension[x509.ExtensionType]:
    return cert.extensions.get_extension_for_class(kind)


# -- profile --------------------------------------------------------------------------------------------


def test_service_dns_names_order() -> None:
    assert service_dns_names(SVC, NS) == EXPECTED_DNS
    assert service_dns_names("a", "b", "corp.internal")[-1] == "a.b.svc.corp.internal"


def test_serving_cert_sans_exactly(ecdsa_dir: Path) -> None:
    leaf = read_cert(ecdsa_dir / TLS_CERT)
    san = _ext(leaf, x509.SubjectAlternativeName).value
    assert isinstance(san, x509.SubjectAlternativeName)
    assert san.get_values_for_type(x509.DNSName) == [*EXPECTED_DNS, "webhook.example.com"]
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    assert san_names(leaf) == [*EXPECTED_DNS, "webhook.example.com", "127.0.0.1"]


def test_serving_cert_extensions(ecdsa_dir: Path) -> None:
    leaf = read_cert(ecdsa_dir / TLS_CERT)
    ca = read_cert(ecdsa_dir / CA_CERT)
    eku = _ext(leaf, x509.ExtendedKeyUsage).value
    assert isinstance(eku, x509.ExtendedKeyUsage)
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]
    bc = _ext(leaf, x509.BasicConstraints)
    assert isinstance(bc.value, x509.BasicConstraints)
    assert bc.critical and bc.value.ca is False
    ku = _ext(leaf, x509.KeyUsage)
    assert isinstance(ku.value, x509.KeyUsage)
    assert ku.critical and ku.value.digital_signature
    assert not ku.value.key_encipherment and not ku.value.key_cert_sign  # ECDSA: no keyEncipherment
    ski = _ext(leaf, x509.SubjectKeyIdentifier).value
    assert isinstance(ski, x509.SubjectKeyIdentifier)
    assert ski.digest == x509.SubjectKeyIdentifier.from_public_key(leaf.public_key()).digest
    aki = _ext(leaf, x509.AuthorityKeyIdentifier).value
    ca_ski = _ext(ca, x509.SubjectKeyIdentifier).value
    assert isinstance(aki, x509.AuthorityKeyIdentifier) and isinstance(ca_ski, x509.SubjectKeyIdentifier)
    assert aki.key_identifier == ca_ski.digest
    assert leaf.issuer == ca.subject


def test_ca_extensions(ecdsa_dir: Path) -> None:
    ca = read_cert(ecdsa_dir / CA_CERT)
    assert ca.issuer == ca.subject
    bc = _ext(ca, x509.BasicConstraints)
    assert isinstance(bc.value, x509.BasicConstraints)
    assert bc.critical and bc.value.ca is True and bc.value.path_length == 0
    ku = _ext(ca, x509.KeyUsage).value
    assert isinstance(ku, x509.KeyUsage)
    assert ku.key_cert_sign and ku.crl_sign
    ca.verify_directly_issued_by(ca)  # self-signed


def test_chain_verifies_with_policy_builder(ecdsa_dir: Path) -> None:
    leaf = read_cert(ecdsa_dir / TLS_CERT)
    bundle = read_bundle(ecdsa_dir / CA_BUNDLE)
    for name in EXPECTED_DNS:
        verifier = PolicyBuilder().store(Store(bundle)).build_server_verifier(x509.DNSName(name))
        chain = verifier.verify(leaf, [])
        assert chain[-1] == bundle[0]
    ip_verifier = (
        PolicyBuilder().store(Store(bundle)).build_server_verifier(x509.IPAddress(ipaddress.ip_address("127.0.0.1")))
    )
    ip_verifier.verify(leaf, [])
    wrong = PolicyBuilder().store(Store(bundle)).build_server_verifier(x509.DNSName("other.gpu-system.svc"))
    with pytest.raises(VerificationError):
        wrong.verify(leaf, [])
    other_ca = make_ca()
    with pytest.raises(VerificationError):
        PolicyBuilder().store(Store([other_ca.cert])).build_server_verifier(x509.DNSName(EXPECTED_DNS[2])).verify(
            leaf, []
        )


def test_validity_windows(ecdsa_dir: Path) -> None:
    leaf = read_cert(ecdsa_dir / TLS_CERT)
    ca = read_cert(ecdsa_dir / CA_CERT)
    now = datetime.now(UTC)
    assert leaf.not_valid_before_utc <= now - BACKDATE + timedelta(seconds=60)
    leaf_life = leaf.not_valid_after_utc - leaf.not_valid_before_utc
    ca_life = ca.not_valid_after_utc - ca.not_valid_before_utc
    assert leaf_life == timedelta(days=365) + BACKDATE
    assert ca_life == timedelta(days=3650) + BACKDATE
    assert serving_not_after(ecdsa_dir) == leaf.not_valid_after_utc


def test_leaf_never_outlives_its_ca() -> None:
    now = datetime(2030, 1, 1, tzinfo=UTC)
    ca = make_ca(validity=timedelta(days=10), now=now)
    leaf = make_serving_cert(ca, service="s", namespace="n", validity=timedelta(days=365), now=now)
    assert leaf.cert.not_valid_after_utc == ca.cert.not_valid_after_utc


def test_key_types(tmp_path: Path) -> None:
    ecdsa = init_dir(tmp_path / "e", service="s", namespace="n")
    public = ecdsa.serving.public_key()
    assert isinstance(public, ec.EllipticCurvePublicKey) and public.curve.name == "secp256r1"
    for bits in (2048, 3072):
        result = init_dir(tmp_path / f"r{bits}", service="s", namespace="n", key_type="rsa", rsa_bits=bits)
        for cert in (result.ca, result.serving):
            rsa_public = cert.public_key()
            assert isinstance(rsa_public, rsa.RSAPublicKey) and rsa_public.key_size == bits
        ku = _ext(result.serving, x509.KeyUsage).value
        assert isinstance(ku, x509.KeyUsage)
        assert ku.digital_signature and ku.key_encipherment
        verify_chain(result.serving, [result.ca], hostname="s.n.svc")
    with pytest.raises(CertError, match="2048 or 3072"):
        make_ca(key_type="rsa", rsa_bits=1024)
    with pytest.raises(CertError, match="unknown key type"):
        make_ca(key_type="dsa")


def test_bad_names_rejected() -> None:
    ca = make_ca()
    for service, namespace in (("Upper", "ns"), ("svc", "bad_ns"), ("1svc", "ns"), ("x" * 64, "ns")):
        with pytest.raises(CertError):
            make_serving_cert(ca, service=service, namespace=namespace)
    with pytest.raises(CertError, match="invalid DNS name"):
        make_serving_cert(ca, service="s", namespace="n", extra_dns=["bad name"])
    with pytest.raises(CertError, match="invalid IP"):
        make_serving_cert(ca, service="s", namespace="n", ips=["10.0.0.300"])


# -- files ----------------------------------------------------------------------------------------------


def test_file_layout_and_modes(ecdsa_dir: Path) -> None:
    assert sorted(p.name for p in ecdsa_dir.iterdir()) == sorted([CA_CERT, CA_KEY, TLS_CERT, TLS_KEY, CA_BUNDLE])
    for name in (CA_KEY, TLS_KEY):
        assert stat.S_IMODE(os.stat(ecdsa_dir / name).st_mode) == 0o600
    for name in (CA_CERT, TLS_CERT, CA_BUNDLE):
        assert stat.S_IMODE(os.stat(ecdsa_dir / name).st_mode) == 0o644
    assert stat.S_IMODE(os.stat(ecdsa_dir).st_mode) == 0o700
    assert (ecdsa_dir / CA_BUNDLE).read_bytes() == (ecdsa_dir / CA_CERT).read_bytes()
    pair = load_pair(ecdsa_dir)
    assert key_matches(pair.key, pair.cert)
    assert b"PRIVATE KEY" not in repr(pair).encode()


def test_init_refuses_to_overwrite(ecdsa_dir: Path) -> None:
    with pytest.raises(CertError, match="already holds"):
        init_dir(ecdsa_dir, service=SVC, namespace=NS)


def test_secret_material_round_trip(ecdsa_dir: Path, tmp_path: Path) -> None:
    """`certs secret --include-ca` then `certs fetch`, without the API server: same bytes, modes, order."""
    from certs.fetch import WRITE_ORDER, secret_material, write_material
    from certs.publish import tls_secret

    full = tls_secret(ecdsa_dir, name="t", namespace="n", include_ca=True)
    assert list(full["data"]) == [TLS_CERT, TLS_KEY, CA_CERT, CA_KEY, CA_BUNDLE]
    files = secret_material(full, where="Secret n/t")
    assert files == {name: (ecdsa_dir / name).read_bytes() for name in ALL_NAMES}
    out = tmp_path / "a" / "b"
    written, removed = write_material(out, files)
    assert [p.name for p in written] == list(WRITE_ORDER) == [CA_BUNDLE, CA_KEY, CA_CERT, TLS_KEY, TLS_CERT]
    assert removed == []
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o700
    for name in ALL_NAMES:
        assert stat.S_IMODE(os.stat(out / name).st_mode) == (0o600 if name.endswith(".key") else 0o644)
    assert load_pair(out).cert == load_pair(ecdsa_dir).cert
    # Without --include-ca: the three files a kubernetes.io/tls Secret usually has, and no CA key.
    plain = tls_secret(ecdsa_dir, name="t", namespace="n")
    assert list(plain["data"]) == [TLS_CERT, TLS_KEY, CA_CERT]
    files = secret_material(plain, where="Secret n/t")
    with pytest.raises(CertError, match="already holds"):
        write_material(out, files)
    written, removed = write_material(out, files, replace=True)
    assert sorted(p.name for p in removed) == sorted([CA_KEY, CA_BUNDLE])
    assert sorted(p.name for p in out.iterdir()) == sorted([TLS_CERT, TLS_KEY, CA_CERT])


def test_secret_material_rejects_unusable_secrets(ecdsa_dir: Path, tmp_path: Path) -> None:
    from certs.fetch import secret_material
    from certs.publish import tls_secret

    init_dir(tmp_path / "other", service="s", namespace="n")
    foreign = tls_secret(tmp_path / "other", name="t", namespace="n", include_ca=True)["data"]
    changes: list[tuple[dict[str, Any], str]] = [
        ({"type": "Opaque"}, "has type 'Opaque'"),
        ({"data": {}}, "lacks tls.crt, tls.key, ca.crt"),
        ({"data": []}, "data is not a map"),
        ({"data": {TLS_KEY: foreign[TLS_KEY]}}, "tls.key does not match tls.crt"),
        ({"data": {CA_KEY: foreign[CA_KEY]}}, "ca.key does not match ca.crt"),
        ({"data": {TLS_CERT: 5}}, "tls.crt is not a base64 string"),
        ({"data": {CA_BUNDLE: "!!"}}, "ca-bundle.crt is not valid base64"),
    ]
    for change, needle in changes:
        secret = tls_secret(ecdsa_dir, name="t", namespace="n", include_ca=True)
        for key, value in change.items():
            if isinstance(value, dict) and value:
                secret[key].update(value)
            else:
                secret[key] = value
        with pytest.raises(CertError, match=needle) as info:
            secret_material(secret, where="Secret n/t")
        assert str(info.value).startswith("Secret n/t") and "PRIVATE" not in str(info.value)


def test_tls_secret_include_ca_needs_a_matching_ca(ecdsa_dir: Path, tmp_path: Path) -> None:
    from certs.publish import tls_secret

    init_dir(tmp_path / "other", service="s", namespace="n")
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for name in ALL_NAMES:
        (mixed / name).write_bytes((ecdsa_dir / name).read_bytes())
    (mixed / CA_BUNDLE).write_bytes((tmp_path / "other" / CA_BUNDLE).read_bytes())
    with pytest.raises(CertError, match="does not hold"):
        tls_secret(mixed, name="t", namespace="n", include_ca=True)
    tls_secret(mixed, name="t", namespace="n")  # the bundle is not read without include_ca
    (mixed / CA_KEY).write_bytes((tmp_path / "other" / CA_KEY).read_bytes())
    with pytest.raises(CertError, match="does not match"):
        tls_secret(mixed, name="t", namespace="n", include_ca=True)


def test_load_pair_detects_mismatch_and_retries(tmp_path: Path) -> None:
    init_dir(tmp_path / "a", service="s", namespace="n")
    init_dir(tmp_path / "b", service="s", namespace="n")
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    (mixed / TLS_CERT).write_bytes((tmp_path / "a" / TLS_CERT).read_bytes())
    (mixed / TLS_KEY).write_bytes((tmp_path / "b" / TLS_KEY).read_bytes())
    with pytest.raises(CertError, match="does not match"):
        load_pair(mixed, attempts=2, delay=0.01)

    # A writer finishing the pair while the reader retries: the reader gets the matching pair.
    def finish() -> None:
        (mixed / TLS_KEY).write_bytes((tmp_path / "a" / TLS_KEY).read_bytes())

    timer = threading.Timer(0.05, finish)
    timer.start()
    try:
        pair = load_pair(mixed, attempts=50, delay=0.02)
    finally:
        timer.join()
    assert pair.cert == read_cert(tmp_path / "a" / TLS_CERT)


def test_concurrent_rotation_never_yields_a_mismatched_pair(tmp_path: Path) -> None:
    directory = tmp_path / "live"
    init_dir(directory, service="s", namespace="n")
    stop = threading.Event()
    seen: list[str] = []
    gave_up = 0

    def reader() -> None:
        nonlocal gave_up
        while not stop.is_set():
            try:
                pair = load_pair(directory)  # the product's retry budget
            except CertError as exc:
                # Caught mid-update for longer than the budget (a writer descheduled between its two renames,
                # on a busy machine): refused, which is the contract. Returning a mismatch is the failure.
                assert "does not match" in str(exc)
                gave_up += 1
                continue
            assert key_matches(pair.key, pair.cert), "load_pair returned a key that does not match its cert"
            seen.append(pair.cert.serial_number.to_bytes(20, "big").hex())

    thread = Worker(reader)
    thread.start()
    try:
        for _ in range(15):
            rotate(directory, force=True)
    finally:
        stop.set()
        thread.join()  # re-raises the reader's failure
    assert seen, f"no load succeeded ({gave_up} gave up)"


# -- rotation -------------------------------------------------------------------------------------------


def test_rotate_is_a_noop_far_from_expiry(tmp_path: Path) -> None:
    directory = tmp_path / "d"
    init_dir(directory, service=SVC, namespace=NS)
    names = (CA_CERT, CA_KEY, TLS_CERT, TLS_KEY, CA_BUNDLE)
    before = {name: (directory / name).read_bytes() for name in names}
    result = rotate(directory)
    assert not result.changed and not result.leaf_renewed and not result.ca_rotated
    assert result.actions[0].startswith("nothing to do")
    after = {name: (directory / name).read_bytes() for name in before}
    assert before == after


def test_rotate_renews_leaf_within_window(tmp_path: Path) -> None:
    directory = tmp_path / "d"
    init_dir(directory, service=SVC, namespace=NS, ips=["127.0.0.1"])
    old_leaf = read_cert(directory / TLS_CERT)
    old_ca = (directory / CA_CERT).read_bytes()
    later = old_leaf.not_valid_after_utc - timedelta(days=10)
    result = rotate(directory, timedelta(days=30), now=later)
    assert result.leaf_renewed and not result.ca_rotated
    new_leaf = read_cert(directory / TLS_CERT)
    assert new_leaf.serial_number != old_leaf.serial_number
    assert san_names(new_leaf) == san_names(old_leaf)
    assert new_leaf.public_key() != old_leaf.public_key()
    assert new_leaf.not_valid_after_utc - new_leaf.not_valid_before_utc == timedelta(days=365) + BACKDATE
    assert (directory / CA_CERT).read_bytes() == old_ca
    verify_chain(new_leaf, read_bundle(directory / CA_BUNDLE), hostname=EXPECTED_DNS[2], now=later)
    assert stat.S_IMODE(os.stat(directory / TLS_KEY).st_mode) == 0o600
    # Just outside the window: nothing to do.
    assert not rotate(directory, timedelta(days=30), now=later + timedelta(days=1)).changed


def test_rotate_force(tmp_path: Path) -> None:
    directory = tmp_path / "d"
    init_dir(directory, service=SVC, namespace=NS)
    old = read_cert(directory / TLS_CERT)
    result = rotate(directory, force=True)
    assert result.leaf_renewed and not result.ca_rotated and not result.bundle_changed
    assert read_cert(directory / TLS_CERT).serial_number != old.serial_number


def test_ca_rollover_keeps_old_and_new_ca_then_drops_the_expired_one(tmp_path: Path) -> None:
    directory = tmp_path / "d"
    start = datetime.now(UTC).replace(microsecond=0)
    init_dir(directory, service=SVC, namespace=NS, ca_validity=timedelta(days=200), now=start)
    old_ca = read_cert(directory / CA_CERT)
    old_leaf = read_cert(directory / TLS_CERT)
    assert old_leaf.not_valid_after_utc == old_ca.not_valid_after_utc  # clamped to the CA

    # 60 days before the CA expires (inside the 90-day CA window): roll over.
    when = old_ca.not_valid_after_utc - timedelta(days=60)
    result = rotate(directory, now=when)
    assert result.ca_rotated and result.leaf_renewed and result.bundle_changed
    new_ca = read_cert(directory / CA_CERT)
    assert new_ca != old_ca and new_ca.subject != old_ca.subject
    bundle = read_bundle(directory / CA_BUNDLE)
    assert bundle == [new_ca, old_ca]
    new_leaf = read_cert(directory / TLS_CERT)
    assert new_leaf.issuer == new_ca.subject
    new_leaf.verify_directly_issued_by(new_ca)
    assert stat.S_IMODE(os.stat(directory / CA_KEY).st_mode) == 0o600
    # The new leaf verifies against the bundle; the old leaf still does too during the rollover.
    for leaf in (new_leaf, old_leaf):
        verify_chain(leaf, bundle, hostname="gpu-admission.gpu-system.svc", now=when)
    # The new leaf is not verified by the old CA alone: the bundle must carry the new one.
    assert not chain_ok(new_leaf, [old_ca], now=when)
    assert key_matches(load_pair(directory, cert_name=CA_CERT, key_name=CA_KEY).key, new_ca)

    # Inside the CA window again? No: the new CA is fresh, so rotation is a no-op.
    assert not rotate(directory, now=when + timedelta(days=1)).changed

    # After the old CA expired, it is dropped from the bundle (the leaf is left alone).
    after = old_ca.not_valid_after_utc + timedelta(days=1)
    dropped = rotate(directory, now=after)
    assert dropped.dropped_cas and not dropped.leaf_renewed and not dropped.ca_rotated
    assert read_bundle(directory / CA_BUNDLE) == [new_ca]
    verify_chain(read_cert(directory / TLS_CERT), [new_ca], now=after)


def test_rotate_reissues_a_leaf_that_does_not_chain(tmp_path: Path) -> None:
    directory, other = tmp_path / "d", tmp_path / "o"
    init_dir(directory, service=SVC, namespace=NS)
    init_dir(other, service=SVC, namespace=NS)
    for name in (TLS_KEY, TLS_CERT):
        (directory / name).write_bytes((other / name).read_bytes())
    result = rotate(directory)
    assert result.leaf_renewed
    verify_chain(read_cert(directory / TLS_CERT), read_bundle(directory / CA_BUNDLE))


def test_rotate_missing_dir_is_one_line_error(tmp_path: Path) -> None:
    with pytest.raises(CertError) as info:
        rotate(tmp_path / "nope")
    assert "\n" not in str(info.value) and "no such file" in str(info.value)


def test_cert_status(ecdsa_dir: Path, tmp_path: Path) -> None:
    status = cert_status(ecdsa_dir)
    assert status.chain_ok and status.chain_error is None and status.ready()
    assert list(status.dns_names) == [*EXPECTED_DNS, "webhook.example.com"]
    assert status.ip_addresses == ("127.0.0.1",)
    assert status.key == "ECDSA P-256"
    assert len(status.bundle) == 1 and not status.bundle[0].expired
    assert 364 * 86400 < status.remaining() <= 365 * 86400
    # A bundle that does not hold the issuer: chain not ok.
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / TLS_CERT).write_bytes((ecdsa_dir / TLS_CERT).read_bytes())
    other = make_ca()
    (broken / CA_BUNDLE).write_bytes(other.cert.public_bytes(Encoding.PEM))
    bad = cert_status(broken)
    assert not bad.chain_ok and bad.chain_error and not bad.ready()


# -- real TLS handshakes --------------------------------------------------------------------------------


def _handshake(
    server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext, hostname: str
) -> tuple[str | None, BaseException | None, BaseException | None]:
    """Run one TLS connection on 127.0.0.1; (negotiated version, client error, server error)."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(10)
    port = listener.getsockname()[1]
    errors: dict[str, BaseException] = {}

    def serve() -> None:
        try:
            conn, _ = listener.accept()
            conn.settimeout(10)
            with server_ctx.wrap_socket(conn, server_side=True) as tls:
                tls.sendall(b"hello")
        except (OSError, ssl.SSLError) as exc:
            errors["server"] = exc

    thread = threading.Thread(target=serve)
    thread.start()
    version: str | None = None
    try:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
            client_ctx.wrap_socket(raw, server_hostname=hostname) as tls,
        ):
            assert tls.recv(5) == b"hello"
            version = tls.version()
    except (OSError, ssl.SSLError) as exc:
        errors["client"] = exc
    finally:
        thread.join(10)
        listener.close()
    return version, errors.get("client"), errors.get("server")


def _client_trusting_bundle(directory: Path) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies and checks host names
    ctx.load_verify_locations(cafile=str(directory / CA_BUNDLE))  # and trusts nothing else
    return ctx


@pytest.mark.parametrize("key_type", ["ecdsa", "rsa"])
def test_tls_handshake_with_generated_pair(tmp_path: Path, key_type: str) -> None:
    directory = tmp_path / key_type
    init_dir(directory, service=SVC, namespace=NS, key_type=key_type, ips=["127.0.0.1"])
    server = server_ssl_context(directory)
    version, client_error, server_error = _handshake(
        server, _client_trusting_bundle(directory), "gpu-admission.gpu-system.svc"
    )
    assert client_error is None and server_error is None
    assert version in ("TLSv1.2", "TLSv1.3")
    version, client_error, _ = _handshake(server, _client_trusting_bundle(directory), "127.0.0.1")
    assert client_error is None


def test_tls_handshake_fails_for_wrong_hostname(ecdsa_dir: Path) -> None:
    _, client_error, _ = _handshake(
        server_ssl_context(ecdsa_dir), _client_trusting_bundle(ecdsa_dir), "gpu-admission.other.svc"
    )
    assert isinstance(client_error, ssl.SSLCertVerificationError)
    assert "Hostname mismatch" in str(client_error) or "hostname" in str(client_error).lower()


def test_tls_handshake_fails_for_untrusted_ca(ecdsa_dir: Path, tmp_path: Path) -> None:
    init_dir(tmp_path / "other", service=SVC, namespace=NS)
    _, client_error, _ = _handshake(
        server_ssl_context(ecdsa_dir), _client_trusting_bundle(tmp_path / "other"), EXPECTED_DNS[2]
    )
    assert isinstance(client_error, ssl.SSLCertVerificationError)


def test_tls_handshake_during_ca_rollover(tmp_path: Path) -> None:
    directory = tmp_path / "d"
    init_dir(directory, service=SVC, namespace=NS)
    rotate(directory, force_ca=True)
    assert len(read_bundle(directory / CA_BUNDLE)) == 2
    _, client_error, server_error = _handshake(
        server_ssl_context(directory), _client_trusting_bundle(directory), EXPECTED_DNS[3]
    )
    assert client_error is None and server_error is None


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_tls11_client_refused_by_tls12_server(ecdsa_dir: Path) -> None:
    server = server_ssl_context(ecdsa_dir)
    assert server.minimum_version == ssl.TLSVersion.TLSv1_2
    old_client = _client_trusting_bundle(ecdsa_dir)
    old_client.minimum_version = ssl.TLSVersion.TLSv1
    old_client.maximum_version = ssl.TLSVersion.TLSv1_1
    old_client.set_ciphers("DEFAULT:@SECLEVEL=0")  # so the client really offers TLS 1.1
    version, client_error, server_error = _handshake(server, old_client, EXPECTED_DNS[2])
    assert version is None
    assert isinstance(client_error, ssl.SSLError)
    assert server_error is not None  # the server, not the client, refused the protocol version
    assert "UNSUPPORTED_PROTOCOL" in str(server_error) or "version" in str(server_error).lower()


def test_server_context_refuses_below_tls12(ecdsa_dir: Path) -> None:
    with pytest.raises(CertError):
        server_ssl_context(ecdsa_dir, min_version=ssl.TLSVersion.TLSv1_1)
