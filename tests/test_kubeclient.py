"""The Kubernetes REST client and the list+watch cache.

Configuration parsing is tested on files written here. Requests, watch streaming and the reflector run
against `KubeTestServer`: a real HTTPS server on 127.0.0.1 (certificates from `certs`) that answers from
canned, scripted responses. End-to-end against a real kube-apiserver lives in tests/e2e.
"""

from __future__ import annotations

import base64
import gc
import json
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from certs.authority import Issued, make_ca
from certs.keys import generate_key, key_to_pem, signature_hash
from certs.rotation import init_dir
from certs.tlsconfig import server_ssl_context
from cluster.kubeclient import (
    KubeClient,
    KubeConfig,
    KubeConfigError,
    KubeError,
    WatchHandle,
    decode_watch_event,
    iter_json_lines,
    load_config,
    load_incluster,
    load_kubeconfig,
    query_params,
)
from cluster.reflector import Change, Reflector, object_key

# -- a tiny HTTPS API server with canned answers -----------------------------------------------------------


@dataclass
class Recorded:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: Any
    peer_cn: str | None = None


@dataclass
class Reply:
    status: int = 200
    body: Any = None


@dataclass
class Stream:
    """A chunked response: each item is bytes to send, or a float to sleep; then hold open if asked."""

    chunks: list[bytes | float]
    hold_open: bool = False


Route = Callable[[Recorded], "Reply | Stream | None"]


def status_body(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "code": code,
        "reason": reason,
        "message": message,
    }


class KubeTestServer:
    """HTTPS on 127.0.0.1:<free port>. `routes` are tried in order; the first non-None answer is sent."""

    def __init__(self, tls_dir: Path, *, client_ca: x509.Certificate | None = None) -> None:
        self.routes: list[Route] = []
        self.requests: list[Recorded] = []
        self.closing = threading.Event()
        self._lock = threading.Lock()
        context = server_ssl_context(tls_dir)
        if client_ca is not None:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(cadata=client_ca.public_bytes(Encoding.PEM).decode())
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _handle(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                cn = None
                if isinstance(self.connection, ssl.SSLSocket):
                    der = self.connection.getpeercert(binary_form=True)
                    if der:
                        names = x509.load_der_x509_certificate(der).subject.get_attributes_for_oid(NameOID.COMMON_NAME)
                        cn = str(names[0].value) if names else None
                record = Recorded(
                    self.command,
                    url.path,
                    dict(urllib.parse.parse_qsl(url.query)),
                    {k.lower(): v for k, v in self.headers.items()},
                    body,
                    cn,
                )
                with server._lock:
                    server.requests.append(record)
                answer: Reply | Stream | None = None
                for route in list(server.routes):
                    answer = route(record)
                    if answer is not None:
                        break
                if answer is None:
                    answer = Reply(404, status_body(404, "NotFound", f"{url.path} not found"))
                if isinstance(answer, Reply):
                    data = json.dumps(answer.body if answer.body is not None else {}).encode()
                    self.send_response(answer.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                try:
                    for chunk in answer.chunks:
                        if isinstance(chunk, float):
                            time.sleep(chunk)
                            continue
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                        self.wfile.flush()
                    if answer.hold_open:
                        limit = float(record.query.get("timeoutSeconds", "30"))
                        server.closing.wait(limit)
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
                    pass
                self.close_connection = True

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._httpd.socket = context.wrap_socket(self._httpd.socket, server_side=True)
        self.port = self._httpd.server_address[1]
        self.url = f"https://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def __enter__(self) -> KubeTestServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.closing.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)

    def route(self, fn: Route) -> Route:
        self.routes.append(fn)
        return fn

    def requests_to(self, path: str, method: str = "GET") -> list[Recorded]:
        with self._lock:
            return [r for r in self.requests if r.path == path and r.method == method]


@pytest.fixture(scope="module")
def tls_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("apiserver-tls") / "pki"
    init_dir(out, service="kubernetes", namespace="default", ips=["127.0.0.1"], extra_dns=["localhost"])
    return out


@pytest.fixture
def api(tls_dir: Path) -> Iterator[KubeTestServer]:
    with KubeTestServer(tls_dir) as server:
        yield server


def client_for(server: KubeTestServer, tls_dir: Path, **extra: Any) -> KubeClient:
    config = KubeConfig(server=server.url, ca_pem=(tls_dir / "ca-bundle.crt").read_bytes(), token="t0k3n", **extra)
    return KubeClient(config, timeout=10)


def event_line(kind: str, obj: dict[str, Any]) -> bytes:
    return json.dumps({"type": kind, "object": obj}).encode() + b"\n"


def node(name: str, rv: str, **labels: str) -> dict[str, Any]:
    return {"kind": "Node", "metadata": {"name": name, "resourceVersion": rv, "labels": labels}}


# -- kubeconfig ----------------------------------------------------------------------------------------------


def _kubeconfig(path: Path, user: dict[str, Any], cluster: dict[str, Any] | None = None, **top: Any) -> Path:
    doc: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "dev",
        "contexts": [{"name": "dev", "context": {"cluster": "c1", "user": "u1", "namespace": "ml"}}],
        "clusters": [{"name": "c1", "cluster": cluster or {"server": "https://127.0.0.1:6443"}}],
        "users": [{"name": "u1", "user": user}],
    }
    doc.update(top)
    path.write_text(yaml.safe_dump(doc))
    return path


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_kubeconfig_token_and_ca_data(tmp_path: Path, tls_dir: Path) -> None:
    ca = (tls_dir / "ca.crt").read_bytes()
    path = _kubeconfig(
        tmp_path / "kc",
        {"token": "abc"},
        {"server": "https://127.0.0.1:6443/", "certificate-authority-data": _b64(ca)},
    )
    config = load_kubeconfig(path)
    assert config.server == "https://127.0.0.1:6443"
    assert config.token == "abc" and config.ca_pem == ca and config.namespace == "ml"
    assert "abc" not in repr(config) and "BEGIN" not in repr(config)
    assert "context dev" in config.source


def test_kubeconfig_client_cert_data(tmp_path: Path, tls_dir: Path) -> None:
    cert = (tls_dir / "tls.crt").read_bytes()
    key = (tls_dir / "tls.key").read_bytes()
    path = _kubeconfig(tmp_path / "kc", {"client-certificate-data": _b64(cert), "client-key-data": _b64(key)})
    config = load_kubeconfig(path)
    assert config.client_cert_pem == cert and config.client_key_pem == key and config.token is None
    assert "PRIVATE" not in repr(config)


def test_kubeconfig_relative_files_and_token_file(tmp_path: Path, tls_dir: Path) -> None:
    (tmp_path / "pki").mkdir()
    (tmp_path / "pki" / "ca.crt").write_bytes((tls_dir / "ca.crt").read_bytes())
    (tmp_path / "token").write_text("from-file\n")
    path = _kubeconfig(
        tmp_path / "kc",
        {"tokenFile": "token"},
        {"server": "https://h:1", "certificate-authority": "pki/ca.crt"},
    )
    config = load_kubeconfig(path)
    assert config.ca_pem == (tls_dir / "ca.crt").read_bytes()
    assert config.token == "from-file" and config.token_file == tmp_path / "token"


def test_kubeconfig_merge_like_kubectl(tmp_path: Path) -> None:
    first = _kubeconfig(tmp_path / "a", {"token": "first"})
    second = tmp_path / "b"
    second.write_text(
        yaml.safe_dump(
            {
                "current-context": "other",
                "contexts": [{"name": "other", "context": {"cluster": "c2", "user": "u1"}}],
                "clusters": [{"name": "c2", "cluster": {"server": "https://second:443"}}],
                "users": [{"name": "u1", "user": {"token": "second"}}],
            }
        )
    )
    config = load_kubeconfig([first, second])
    assert config.token == "first" and config.server == "https://127.0.0.1:6443"
    other = load_kubeconfig([first, second], context="other")
    assert other.server == "https://second:443" and other.token == "first"
    assert load_config(environ={"KUBECONFIG": f"{tmp_path / 'missing'}:{first}"}).token == "first"


@pytest.mark.parametrize(
    ("user", "cluster", "top", "message"),
    [
        ({"exec": {"command": "aws"}}, None, {}, "exec apiVersion None is not supported"),
        ({"auth-provider": {"name": "gcp"}}, None, {}, "legacy auth-provider 'gcp'"),
        ({"token": "x"}, None, {"current-context": "nope"}, "context 'nope' not found"),
        ({"token": "x"}, {"server": "ftp://x"}, {}, "no https:// server"),
        ({"token": "x"}, {"server": "https://x", "certificate-authority-data": "!!!"}, {}, "not valid base64"),
        ({"token": "x"}, {"server": "https://x", "certificate-authority": "/nonexistent/ca"}, {}, "no such file"),
        (
            {"token": "x"},
            {"server": "https://x", "certificate-authority-data": _b64(b"junk")},
            {},
            "not PEM",
        ),
        (
            {"token": "x"},
            {
                "server": "https://x",
                "insecure-skip-tls-verify": True,
                "certificate-authority-data": _b64(b"-----BEGIN CERTIFICATE-----\n"),
            },
            {},
            "insecure-skip-tls-verify",
        ),
        ({"client-certificate-data": _b64(b"-----BEGIN CERTIFICATE-----")}, None, {}, "both"),
    ],
)
def test_kubeconfig_errors_are_one_line(
    tmp_path: Path, user: dict[str, Any], cluster: dict[str, Any] | None, top: dict[str, Any], message: str
) -> None:
    path = _kubeconfig(tmp_path / "kc", user, cluster, **top)
    with pytest.raises(KubeConfigError) as info:
        load_kubeconfig(path)
    assert message in str(info.value)
    assert "\n" not in str(info.value) and str(path) in str(info.value)


def test_kubeconfig_missing_or_broken_file(tmp_path: Path) -> None:
    with pytest.raises(KubeConfigError, match=r"kubeconfig .*/nope: no such file$"):
        load_kubeconfig(tmp_path / "nope")
    bad = tmp_path / "bad"
    bad.write_text("clusters: [\n  - {name: x\n")
    with pytest.raises(KubeConfigError, match="not valid YAML at line"):
        load_kubeconfig(bad)
    (tmp_path / "list").write_text("- 1\n")
    with pytest.raises(KubeConfigError, match="mapping"):
        load_kubeconfig(tmp_path / "list")
    (tmp_path / "empty").write_text("")
    with pytest.raises(KubeConfigError, match="no current-context"):
        load_kubeconfig(tmp_path / "empty")


def test_incluster_config(tmp_path: Path, tls_dir: Path) -> None:
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("sa-token")
    (sa / "ca.crt").write_bytes((tls_dir / "ca.crt").read_bytes())
    (sa / "namespace").write_text("gpu-system")
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    config = load_incluster(sa, env)
    assert config.server == "https://10.96.0.1:443"
    assert config.token == "sa-token" and config.token_file == sa / "token"
    assert config.namespace == "gpu-system"
    v6 = load_incluster(sa, {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"})
    assert v6.server == "https://[fd00::1]:443"
    with pytest.raises(KubeConfigError, match="not in a cluster"):
        load_incluster(sa, {})
    with pytest.raises(KubeConfigError, match="no such file"):
        load_incluster(tmp_path / "none", env)


def test_query_params() -> None:
    assert query_params(
        {"label_selector": "a=b", "continue_": "tok", "limit": 5, "watch": True, "x": None, "dry_run": False}
    ) == {"labelSelector": "a=b", "continue": "tok", "limit": "5", "watch": "true", "dryRun": "false"}


# -- watch line decoding --------------------------------------------------------------------------------------


def test_iter_json_lines_any_chunking() -> None:
    payload = event_line("ADDED", node("a", "1")) + b"\n\r\n" + event_line("DELETED", node("b", "2"))
    expected = [json.loads(line) for line in payload.splitlines() if line.strip()]
    for size in (1, 2, 7, 64, len(payload)):
        chunks = [payload[i : i + size] for i in range(0, len(payload), size)]
        lines = list(iter_json_lines(chunks))
        assert [json.loads(line) for line in lines] == expected
    # A last line without a newline is still delivered.
    assert list(iter_json_lines([b'{"a":1}\n{"b"', b":2}"])) == [b'{"a":1}', b'{"b":2}']
    with pytest.raises(KubeError, match="exceeds"):
        list(iter_json_lines([b"x" * 100], max_line=10))


def test_decode_watch_event() -> None:
    assert decode_watch_event(b'{"type":"ADDED","object":{"metadata":{"name":"a"}}}')["type"] == "ADDED"
    for bad in (b"not json", b"[1]", b'{"type":"ADDED"}', b'{"object":{}}'):
        with pytest.raises(KubeError) as info:
            decode_watch_event(bad)
        assert info.value.reason == "InvalidWatchEvent"


# -- requests against the local HTTPS server ---------------------------------------------------------------


def test_get_create_update_patch_delete(api: KubeTestServer, tls_dir: Path) -> None:
    @api.route
    def objects(r: Recorded) -> Reply | None:
        if r.path.startswith("/api/v1/namespaces/ml/configmaps"):
            return Reply(201 if r.method == "POST" else 200, {"kind": "ConfigMap", "echo": r.body})
        return None

    with client_for(api, tls_dir) as client:
        assert client.get("/api/v1/namespaces/ml/configmaps/p")["kind"] == "ConfigMap"
        client.create("/api/v1/namespaces/ml/configmaps", {"metadata": {"name": "q"}})
        client.update("/api/v1/namespaces/ml/configmaps/q", {"metadata": {"name": "q", "resourceVersion": "3"}})
        for short, mime in (
            ("json", "application/json-patch+json"),
            ("merge", "application/merge-patch+json"),
            ("strategic", "application/strategic-merge-patch+json"),
        ):
            client.patch("/api/v1/namespaces/ml/configmaps/q", [{"op": "add", "path": "/x", "value": 1}], short)
            assert api.requests[-1].headers["content-type"] == mime
        client.delete("/api/v1/namespaces/ml/configmaps/q", dry_run="All")
        with pytest.raises(ValueError, match="unknown patch type"):
            client.patch("/api/v1/namespaces/ml/configmaps/q", {}, "yaml-ish")
        with pytest.raises(ValueError):
            client.get("https://elsewhere.example/api")
    methods = [r.method for r in api.requests]
    assert methods == ["GET", "POST", "PUT", "PATCH", "PATCH", "PATCH", "DELETE"]
    assert all(r.headers["authorization"] == "Bearer t0k3n" for r in api.requests)
    assert api.requests[1].body == {"metadata": {"name": "q"}}
    assert api.requests[-1].query == {"dryRun": "All"}


def test_kube_error_carries_status_message(api: KubeTestServer, tls_dir: Path) -> None:
    @api.route
    def forbidden(r: Recorded) -> Reply | None:
        if r.path == "/api/v1/secrets":
            msg = 'secrets is forbidden: User "x" cannot list resource "secrets"'
            return Reply(403, status_body(403, "Forbidden", msg))
        if r.path == "/plain":
            return Reply(502, "bad gateway")
        return None

    with client_for(api, tls_dir) as client:
        with pytest.raises(KubeError) as info:
            client.list("/api/v1/secrets")
        assert (info.value.status, info.value.reason) == (403, "Forbidden")
        assert 'cannot list resource "secrets"' in info.value.message
        assert str(info.value).endswith("(HTTP 403 Forbidden)")
        with pytest.raises(KubeError) as missing:
            client.get("/api/v1/namespaces/ml/pods/nope")
        assert missing.value.not_found and missing.value.status == 404
        with pytest.raises(KubeError) as plain:
            client.get("/plain")
        assert plain.value.status == 502


def test_untrusted_server_and_unreachable_are_kube_errors(api: KubeTestServer, tmp_path: Path) -> None:
    other = make_ca()
    config = KubeConfig(server=api.url, ca_pem=other.cert.public_bytes(Encoding.PEM))
    with KubeClient(config, timeout=5) as client, pytest.raises(KubeError) as info:
        client.get("/version")
    assert info.value.status == 0 and "CERTIFICATE_VERIFY_FAILED" in info.value.message
    closed = KubeConfig(server="https://127.0.0.1:1", insecure_skip_tls_verify=True)
    with KubeClient(closed, timeout=5) as client, pytest.raises(KubeError) as refused:
        client.get("/version")
    assert refused.value.status == 0 and refused.value.reason == "ConnectionFailed"


def test_list_all_asks_for_the_next_page_while_it_cuts_this_one_down(api: KubeTestServer, tls_dir: Path) -> None:
    """The API server serves page n+1 while the client transforms page n (one request in flight at most)."""

    @api.route
    def pages(r: Recorded) -> Reply | None:
        if r.path != "/api/v1/nodes":
            return None
        n = int(r.query.get("continue") or 0)
        meta = {"resourceVersion": "5", **({"continue": str(n + 1)} if n < 3 else {})}
        return Reply(200, {"kind": "NodeList", "items": [{"page": n}], "metadata": meta})

    seen_when_cut: list[int] = []

    def transform(item: dict[str, Any]) -> dict[str, Any]:
        want = item["page"] + 2  # this page's request and the next one's
        deadline = time.monotonic() + 5
        while len(api.requests_to("/api/v1/nodes")) < min(want, 4) and time.monotonic() < deadline:
            time.sleep(0.005)
        seen_when_cut.append(len(api.requests_to("/api/v1/nodes")))
        return item

    with client_for(api, tls_dir) as client:
        listed = client.list_all("/api/v1/nodes", page_size=1, transform=transform)
    assert [i["page"] for i in listed["items"]] == [0, 1, 2, 3]
    assert seen_when_cut == [2, 3, 4, 4]  # never more than one page ahead
    assert listed["metadata"] == {"resourceVersion": "5"}


def test_a_read_response_keeps_no_copy_of_its_body(api: KubeTestServer, tls_dir: Path) -> None:
    """Responses sit in reference cycles; with the collector paused (a first list) a body kept on them would
    stay until the end of the list: 700 MB of pages at 50,000 Nodes."""
    big = {"kind": "List", "items": [{"pad": "x" * 1000} for _ in range(100)], "metadata": {}}
    api.route(lambda r: Reply(200, big) if r.path == "/api/v1/things" else None)
    with client_for(api, tls_dir) as client:
        gc.collect()
        gc.disable()
        try:
            for _ in range(3):
                assert len(client.list("/api/v1/things")["items"]) == 100
            alive = [o for o in gc.get_objects() if isinstance(o, httpx.Response)]
        finally:
            gc.enable()
    assert alive  # the cycles are there (else this test would prove nothing)
    for response in alive:
        with pytest.raises(httpx.ResponseNotRead):
            response.content  # noqa: B018


def test_list_all_follows_continue_and_recovers_from_expired_token(api: KubeTestServer, tls_dir: Path) -> None:
    expired = {"once": True}

    @api.route
    def pods(r: Recorded) -> Reply | None:
        if r.path != "/api/v1/pods":
            return None
        token = r.query.get("continue")
        if "limit" not in r.query:  # the fallback full list
            return Reply(
                200, {"kind": "PodList", "items": [{"n": 1}, {"n": 2}, {"n": 3}], "metadata": {"resourceVersion": "99"}}
            )
        if token is None:
            return Reply(
                200, {"kind": "PodList", "items": [{"n": 1}], "metadata": {"resourceVersion": "7", "continue": "c1"}}
            )
        if token == "c1":
            return Reply(
                200, {"kind": "PodList", "items": [{"n": 2}], "metadata": {"resourceVersion": "7", "continue": "c2"}}
            )
        if expired["once"]:
            expired["once"] = False
            return Reply(410, status_body(410, "Expired", "continue token expired"))
        return Reply(200, {"kind": "PodList", "items": [{"n": 3}], "metadata": {"resourceVersion": "7"}})

    with client_for(api, tls_dir) as client:
        recovered = client.list_all("/api/v1/pods", page_size=1)
        assert [i["n"] for i in recovered["items"]] == [1, 2, 3]
        assert recovered["metadata"]["resourceVersion"] == "99"
        paged = client.list_all("/api/v1/pods", page_size=1, label_selector="gpu=true")
        assert [i["n"] for i in paged["items"]] == [1, 2, 3]
        assert paged["metadata"] == {"resourceVersion": "7"} and paged["kind"] == "PodList"
    assert api.requests[-1].query == {"limit": "1", "continue": "c2", "labelSelector": "gpu=true"}


def issue_client_cert(ca: Issued, common_name: str) -> Issued:
    """A client-auth certificate signed by `ca` (for servers that require client certificates)."""
    key = generate_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(datetime.now(UTC) - timedelta(minutes=5))
        .not_valid_after(datetime.now(UTC) + timedelta(days=1))
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca.key, signature_hash(ca.key))
    )
    return Issued(cert=cert, key=key)


def test_client_certificate_from_kubeconfig_data(tls_dir: Path, tmp_path: Path) -> None:
    client_ca = make_ca()
    client_pair = issue_client_cert(client_ca, "gpu-admission-tester")
    with KubeTestServer(tls_dir, client_ca=client_ca.cert) as server:
        server.route(lambda r: Reply(200, {"kind": "Status", "who": r.peer_cn}))
        path = _kubeconfig(
            tmp_path / "kc",
            {
                "client-certificate-data": _b64(client_pair.cert.public_bytes(Encoding.PEM)),
                "client-key-data": _b64(key_to_pem(client_pair.key)),
            },
            {"server": server.url, "certificate-authority-data": _b64((tls_dir / "ca.crt").read_bytes())},
        )
        before = set(Path("/tmp").glob("gpu-admission-kube-*"))
        with KubeClient.from_config(path, timeout=10) as client:
            assert client.get("/api")["who"] == "gpu-admission-tester"
        assert set(Path("/tmp").glob("gpu-admission-kube-*")) == before  # temp key files removed
        # Without the client certificate the server refuses the handshake.
        with KubeClient(KubeConfig(server=server.url, ca_pem=(tls_dir / "ca.crt").read_bytes()), timeout=5) as c:
            with pytest.raises(KubeError) as info:
                c.get("/api")
            assert info.value.status == 0


def test_token_file_is_reread_and_401_retried(api: KubeTestServer, tls_dir: Path, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("first")
    accepted = {"token": "first"}

    @api.route
    def auth(r: Recorded) -> Reply:
        if r.headers.get("authorization") != f"Bearer {accepted['token']}":
            return Reply(401, status_body(401, "Unauthorized", "Unauthorized"))
        return Reply(200, {"kind": "APIVersions"})

    config = KubeConfig(server=api.url, ca_pem=(tls_dir / "ca.crt").read_bytes(), token="first", token_file=token_file)
    with KubeClient(config, timeout=10, token_refresh=3600) as client:
        client.get("/api")
        token_file.write_text("second\n")
        accepted["token"] = "second"
        client.get("/api")  # 401 with the cached token, then re-read and retried
        assert [r.headers["authorization"] for r in api.requests] == [
            "Bearer first",
            "Bearer first",
            "Bearer second",
        ]
    with KubeClient(config, timeout=10, token_refresh=0) as client:
        token_file.write_text("third")
        accepted["token"] = "third"
        client.get("/api")
        assert api.requests[-1].headers["authorization"] == "Bearer third"


def test_watch_streams_events_and_raises_on_error_event(api: KubeTestServer, tls_dir: Path) -> None:
    first = event_line("ADDED", node("a", "11"))
    second = event_line("MODIFIED", node("a", "12"))
    gone = event_line("ERROR", status_body(410, "Expired", "too old resource version: 10 (12)"))

    @api.route
    def watch(r: Recorded) -> Stream | None:
        if r.path != "/api/v1/nodes" or r.query.get("watch") != "true":
            return None
        # Lines split across chunks, with pauses: the client must reassemble them.
        return Stream([first[:10], 0.02, first[10:] + second[:5], 0.02, second[5:], gone])

    with client_for(api, tls_dir) as client:
        events: list[dict[str, Any]] = []
        with pytest.raises(KubeError) as info:
            for event in client.watch("/api/v1/nodes", resource_version="10", timeout_seconds=5):
                events.append(event)
    assert [(e["type"], e["object"]["metadata"]["resourceVersion"]) for e in events] == [
        ("ADDED", "11"),
        ("MODIFIED", "12"),
    ]
    assert info.value.gone and info.value.reason == "Expired" and "too old" in info.value.message
    assert api.requests[0].query == {
        "watch": "true",
        "resourceVersion": "10",
        "timeoutSeconds": "5",
        "allowWatchBookmarks": "true",
    }


def test_watch_http_error(api: KubeTestServer, tls_dir: Path) -> None:
    api.route(lambda r: Reply(410, status_body(410, "Gone", "resource version too old")))
    with client_for(api, tls_dir) as client, pytest.raises(KubeError) as info:
        list(client.watch("/api/v1/nodes", resource_version="1", timeout_seconds=1))
    assert info.value.gone


def test_watch_handle_aborts_an_idle_stream(api: KubeTestServer, tls_dir: Path) -> None:
    api.route(lambda r: Stream([event_line("ADDED", node("a", "1"))], hold_open=True))
    handle = WatchHandle()
    got: list[dict[str, Any]] = []
    with client_for(api, tls_dir) as client:
        timer = threading.Timer(0.3, handle.abort)
        started = time.monotonic()
        timer.start()
        for event in client.watch("/api/v1/nodes", timeout_seconds=30, handle=handle):
            got.append(event)
        timer.join()
        assert time.monotonic() - started < 5  # not the 30 s server timeout
        assert [e["type"] for e in got] == ["ADDED"]
        assert list(client.watch("/api/v1/nodes", handle=handle)) == []  # already aborted: no request
    assert len(api.requests) == 1


# -- the reflector -----------------------------------------------------------------------------------------


@dataclass
class NodeScript:
    """List/watch answers for /api/v1/nodes in phases, recording the watch resourceVersions."""

    full_lists: int = 0
    watches: list[str] = field(default_factory=list)
    fail_first_list: bool = True

    def __call__(self, r: Recorded) -> Reply | Stream | None:
        if r.path != "/api/v1/nodes":
            return None
        if r.query.get("watch") != "true":
            return self.list(r)
        rv = r.query.get("resourceVersion", "")
        self.watches.append(rv)
        if rv == "10":
            return Stream(
                [
                    event_line("ADDED", node("n3", "11")),
                    0.01,
                    event_line("MODIFIED", node("n1", "12", gpu="a100")),
                    event_line("ERROR", status_body(410, "Expired", "too old resource version")),
                ]
            )
        if rv == "20":
            return Stream(
                [
                    event_line("DELETED", node("n3", "21")),
                    event_line("BOOKMARK", {"kind": "Node", "metadata": {"resourceVersion": "22"}}),
                ]
            )
        return Stream([], hold_open=True)

    def list(self, r: Recorded) -> Reply:
        if self.fail_first_list:
            self.fail_first_list = False
            return Reply(500, status_body(500, "InternalError", "etcd is having a moment"))
        if r.query.get("continue") == "p2":
            return Reply(200, {"kind": "NodeList", "items": [node("n2", "6")], "metadata": {"resourceVersion": "10"}})
        self.full_lists += 1
        if self.full_lists == 1:
            return Reply(
                200,
                {
                    "kind": "NodeList",
                    "items": [node("n1", "5")],
                    "metadata": {"resourceVersion": "10", "continue": "p2"},
                },
            )
        items = [node("n1", "12", gpu="a100"), node("n3", "11"), node("n4", "15")]
        return Reply(200, {"kind": "NodeList", "items": items, "metadata": {"resourceVersion": "20"}})


def _wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.01)
    raise AssertionError("condition not reached in time")


def test_reflector_list_watch_410_relist(api: KubeTestServer, tls_dir: Path) -> None:
    script = NodeScript()
    api.route(script)
    changes: list[Change] = []
    with client_for(api, tls_dir) as client:
        reflector = Reflector(
            client,
            "/api/v1/nodes",
            on_change=changes.append,
            page_size=1,
            watch_timeout=5,
            backoff_initial=0.05,
            seed=1,
        )
        assert not reflector.synced and reflector.snapshot() == {}
        started = time.monotonic()
        reflector.start()
        assert time.monotonic() - started < 0.5  # start() never waits for the API
        assert reflector.wait_synced(10)
        _wait_for(lambda: reflector.resource_version == "22" and len(script.watches) >= 3)
        snapshot = reflector.snapshot()
        assert sorted(snapshot) == ["n1", "n4"]
        assert snapshot["n1"]["metadata"]["labels"] == {"gpu": "a100"}
        assert script.watches[:3] == ["10", "20", "22"]
        assert reflector.lists == 2 and reflector.errors == 1
        assert reflector.last_error is None
        stopping = time.monotonic()
        assert reflector.stop(10)  # aborts the idle watch at once
        assert time.monotonic() - stopping < 2
        assert not reflector.running
    assert [(c.type, c.key) for c in changes] == [
        ("ADDED", "n1"),
        ("ADDED", "n2"),
        ("SYNCED", ""),
        ("ADDED", "n3"),
        ("MODIFIED", "n1"),
        ("ADDED", "n4"),  # from the relist after 410: the differences only
        ("DELETED", "n2"),
        ("SYNCED", ""),
        ("DELETED", "n3"),
    ]
    modified = changes[4]
    assert modified.old is not None and modified.new is not None
    assert modified.old["metadata"]["resourceVersion"] == "5"
    assert modified.new["metadata"]["resourceVersion"] == "12"


def test_reflector_survives_a_failing_callback_and_namespaced_keys(api: KubeTestServer, tls_dir: Path) -> None:
    cm = {"kind": "ConfigMap", "metadata": {"name": "policy", "namespace": "gpu-system", "resourceVersion": "3"}}

    @api.route
    def configmaps(r: Recorded) -> Reply | Stream | None:
        if r.path != "/api/v1/namespaces/gpu-system/configmaps":
            return None
        if r.query.get("watch") == "true":
            if r.query.get("resourceVersion") == "3":
                updated = json.loads(json.dumps(cm))
                updated["metadata"]["resourceVersion"] = "4"
                return Stream([event_line("MODIFIED", updated)], hold_open=True)
            return Stream([], hold_open=True)
        assert r.query.get("fieldSelector") == "metadata.name=policy"
        return Reply(200, {"kind": "ConfigMapList", "items": [cm], "metadata": {"resourceVersion": "3"}})

    seen: list[str] = []

    def explode(change: Change) -> None:
        seen.append(change.type)
        raise RuntimeError("callback bug")

    with client_for(api, tls_dir) as client:
        reflector = Reflector(
            client,
            "/api/v1/namespaces/gpu-system/configmaps",
            field_selector="metadata.name=policy",
            on_change=explode,
            watch_timeout=5,
        ).start()
        _wait_for(lambda: reflector.resource_version == "4")
        assert reflector.get("gpu-system/policy") is not None
        assert seen == ["ADDED", "SYNCED", "MODIFIED"] and reflector.running
        reflector.stop(0)
    assert object_key(cm) == "gpu-system/policy"


def test_reflector_backs_off_while_the_server_is_down(tls_dir: Path) -> None:
    config = KubeConfig(server="https://127.0.0.1:1", insecure_skip_tls_verify=True)
    with KubeClient(config, timeout=2) as client:
        reflector = Reflector(client, "/api/v1/nodes", backoff_initial=0.05, backoff_max=0.2, seed=3).start()
        _wait_for(lambda: reflector.errors >= 3)
        assert not reflector.synced and reflector.snapshot() == {}
        assert reflector.last_error is not None and "ConnectionFailed" in reflector.last_error
        assert reflector.stop(5)


def test_reflector_reports_sync_of_an_empty_list(api: KubeTestServer, tls_dir: Path) -> None:
    @api.route
    def empty(r: Recorded) -> Reply | Stream:
        if r.query.get("watch") == "true":
            return Stream([], hold_open=True)
        return Reply(200, {"kind": "ConfigMapList", "items": [], "metadata": {"resourceVersion": "1"}})

    changes: list[Change] = []
    with client_for(api, tls_dir) as client:
        reflector = Reflector(client, "/api/v1/namespaces/x/configmaps", on_change=changes.append).start()
        _wait_for(lambda: bool(changes))
        assert reflector.synced and reflector.snapshot() == {} and len(reflector) == 0
        assert changes == [Change("SYNCED", "", None, None)]
        assert reflector.stop(5)
