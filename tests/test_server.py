"""Contract tests against a real `gpu-admission serve` process on loopback over real TLS (httpx verifies our CA)."""

from __future__ import annotations

import base64
import concurrent.futures
import json
import signal
import ssl
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import jsonpatch
import orjson
import pytest

from tests.serverproc import ServerProcess, review, written_records


def pod(name: str = "trainer-0", gpus: int = 8, **meta: Any) -> dict[str, Any]:
    labels = meta.pop(
        "labels", {"training.kubeflow.org/job-name": "llama", "training.kubeflow.org/replica-type": "worker"}
    )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml", "labels": labels, **meta},
        "spec": {
            "containers": [
                {
                    "name": "t",
                    "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                    "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                }
            ],
            "x-unknown-field": {"kept": True},
        },
    }


CPU_POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "web", "namespace": "ml"},
    "spec": {"containers": [{"name": "web", "image": "nginx"}]},
}


@pytest.fixture(scope="module")
def server() -> Any:
    srv = ServerProcess("--cert-reload-interval", "0.2")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Any:
    with server.client() as c:
        yield c


def post(client: httpx.Client, path: str, body: Any, timeout: str = "10s") -> httpx.Response:
    return client.post(
        f"{path}?timeout={timeout}", content=orjson.dumps(body), headers={"Content-Type": "application/json"}
    )


def check_envelope(r: httpx.Response, uid: str) -> dict[str, Any]:
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["apiVersion"] == "admission.k8s.io/v1" and body["kind"] == "AdmissionReview"
    assert body["response"]["uid"] == uid
    return dict(body["response"])


def test_non_gpu_pod_allowed_untouched(client: httpx.Client) -> None:
    for path in ("/admit", "/mutate", "/validate"):
        resp = check_envelope(post(client, path, review(CPU_POD, uid="cpu")), "cpu")
        assert resp["allowed"] is True
        assert "patch" not in resp and "patchType" not in resp and "status" not in resp


def test_mutate_returns_a_patch_that_applies(client: httpx.Client) -> None:
    obj = pod()
    resp = check_envelope(post(client, "/mutate", review(obj, uid="m1")), "m1")
    assert resp["allowed"] is True and resp["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(resp["patch"]))
    mutated = jsonpatch.apply_patch(obj, ops)
    assert mutated["spec"]["x-unknown-field"] == {"kept": True}
    terms = mutated["spec"]["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms[0]["topologyKey"] == "topology.kubernetes.io/rack"
    assert "training-rack" in resp["auditAnnotations"]["mutations"]
    # idempotent: the mutated object gets no patch
    again = check_envelope(post(client, "/mutate", review(mutated, uid="m2")), "m2")
    assert "patch" not in again
    # and it passes validation, with the queue warning
    val = check_envelope(post(client, "/validate", review(mutated, uid="v1")), "v1")
    assert val["allowed"] is True and "patch" not in val
    assert any(w.startswith("training-queue-priority:") for w in val["warnings"])


def test_validate_denies_with_one_line_403(client: httpx.Client) -> None:
    obj = pod(name="bad", labels={}, annotations={"gpu-admission.io/gpu-memry": "10Gi"})
    resp = check_envelope(post(client, "/validate", review(obj, uid="d1")), "d1")
    assert resp["allowed"] is False
    assert resp["status"]["code"] == 403
    msg = resp["status"]["message"]
    assert "gpu-admission-annotations" in msg and "gpu-admission.io/gpu-memory" in msg and "\n" not in msg
    assert "patch" not in resp
    assert resp["auditAnnotations"]["decision"] == "deny"
    assert all("/" not in k and len(k) <= 63 for k in resp["auditAnnotations"])


def test_admit_is_mutate_then_validate_in_one_review(client: httpx.Client) -> None:
    """/admit (the one call per Pod) answers what /mutate and then /validate on the mutated object answer."""
    obj = pod(name="one-call")
    admit = check_envelope(post(client, "/admit", review(obj, uid="a1")), "a1")
    mut = check_envelope(post(client, "/mutate", review(obj, uid="a2")), "a2")
    assert admit["allowed"] is True and admit["patchType"] == "JSONPatch"
    assert json.loads(base64.b64decode(admit["patch"])) == json.loads(base64.b64decode(mut["patch"]))
    mutated = jsonpatch.apply_patch(obj, json.loads(base64.b64decode(admit["patch"])))
    val = check_envelope(post(client, "/validate", review(mutated, uid="a3")), "a3")
    assert admit["warnings"] == val["warnings"]
    assert any(w.startswith("training-queue-priority:") for w in val["warnings"])
    assert admit["auditAnnotations"]["mutations"] == mut["auditAnnotations"]["mutations"]
    # a re-invocation on the mutated object: no patch, same verdict
    again = check_envelope(post(client, "/admit", review(mutated, uid="a4")), "a4")
    assert again["allowed"] is True and "patch" not in again and again["warnings"] == val["warnings"]


def test_admit_denies_without_a_patch(client: httpx.Client) -> None:
    # a typo key denies; the MIG ask would have been rewritten, but a denied object gets no patch
    obj = pod(name="bad", labels={}, annotations={"gpu-admission.io/gpu-memry": "10Gi"})
    resp = check_envelope(post(client, "/admit", review(obj, uid="ad1")), "ad1")
    assert resp["allowed"] is False and resp["status"]["code"] == 403
    assert "gpu-admission-annotations" in resp["status"]["message"]
    assert "patch" not in resp and "patchType" not in resp
    assert resp["auditAnnotations"]["decision"] == "deny"


def test_warnings_fit_the_api_server_limits(client: httpx.Client) -> None:
    obj = pod(labels={"batch.kubernetes.io/job-completion-index": "0", "batch.kubernetes.io/job-name": "x" * 60})
    resp = check_envelope(post(client, "/validate", review(obj, uid="w1")), "w1")
    assert resp["warnings"]
    for w in resp["warnings"]:
        assert len(w) <= 120 and "\n" not in w and all(ord(ch) >= 32 for ch in w)


def test_delete_and_unknown_kinds_are_allowed_untouched(client: httpx.Client) -> None:
    resp = check_envelope(post(client, "/mutate", review(pod(), uid="del", operation="DELETE")), "del")
    assert resp["allowed"] is True and "patch" not in resp
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s", "namespace": "ml"}}
    resp = check_envelope(post(client, "/mutate", review(secret, uid="sec")), "sec")
    assert resp["allowed"] is True and "patch" not in resp


def test_dry_run_is_recorded_as_dry_run(server: ServerProcess, client: httpx.Client) -> None:
    obj = pod(name="dry")
    check_envelope(post(client, "/mutate", review(obj, uid="dry-1", dry_run=True)), "dry-1")
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        records = written_records(server.audit)
        found = [r for r in records if r["uid"] == "dry-1"]
        if found:
            assert found[0]["dryRun"] is True and found[0]["webhook"] == "mutate"
            assert found[0]["user"] == "alice" and "ml-team" in found[0]["groups"]
            return
        time.sleep(0.05)
    pytest.fail("dry-run record never reached the audit log")


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        (b"{not json", 400, "not valid JSON"),
        (b"\xff\xfe\x00garbage", 400, "UTF-8"),
        (b"[]", 400, "JSON object"),
        (
            orjson.dumps({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview", "request": {}}),
            400,
            "expected apiVersion",
        ),
        (orjson.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}), 400, "no request"),
        (
            orjson.dumps(
                {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"operation": "CREATE"}}
            ),
            400,
            "uid",
        ),
        (
            orjson.dumps(
                {
                    "apiVersion": "admission.k8s.io/v1",
                    "kind": "AdmissionReview",
                    "request": {"uid": "x", "operation": "PATCH"},
                }
            ),
            400,
            "operation",
        ),
    ],
)
def test_malformed_input_is_a_clear_400(client: httpx.Client, body: bytes, status: int, fragment: str) -> None:
    for path in ("/admit", "/mutate", "/validate"):
        r = client.post(path, content=body, headers={"Content-Type": "application/json"})
        assert r.status_code == status, r.text
        assert fragment in r.json()["error"]
        assert "Traceback" not in r.text and "\n" not in r.json()["error"]


def test_huge_body_is_413(client: httpx.Client) -> None:
    big = b'{"pad": "' + b"x" * (9 * 2**20) + b'"}'
    r = client.post("/validate", content=big, headers={"Content-Type": "application/json"})
    assert r.status_code == 413 and "limit" in r.json()["error"]


def test_health_ready_metrics_version(client: httpx.Client) -> None:
    check_envelope(post(client, "/mutate", review(CPU_POD, uid="h1")), "h1")  # counted, whatever ran before
    assert client.get("/healthz").status_code == 200
    ready = client.get("/readyz")
    assert ready.status_code == 200
    details = ready.json()
    assert details["ready"] is True and details["certificates"]["loaded"] is True
    assert details["inventory"]["rackLabel"] == "topology.kubernetes.io/rack"
    levels = details["inventory"]["levels"]
    assert [lv["key"] for lv in levels] == ["topology.kubernetes.io/rack", "topology.kubernetes.io/zone"]
    assert levels[0]["largestDomainGpus"] == 16 and "slower across racks" in levels[0]["penalty"]
    assert details["policy"]["hash"].startswith("sha256:")
    text = client.get("/metrics").text
    assert 'gpu_admission_requests_total{webhook="mutate",verdict="allow"}' in text
    assert "gpu_admission_request_duration_seconds_bucket" in text
    assert "gpu_admission_cert_expiry_timestamp_seconds" in text
    assert 'gpu_admission_policy_info{hash="sha256:' in text
    types = dict(line.split()[2:4] for line in text.splitlines() if line.startswith("# TYPE"))
    assert all(kind == "counter" for name, kind in types.items() if name.endswith("_total")), types
    assert client.get("/version").json()["policyHash"] == details["policy"]["hash"]


def test_tls_below_1_2_is_refused(server: ServerProcess) -> None:
    ctx = ssl.create_default_context(cafile=server.ca)
    with pytest.warns(DeprecationWarning):  # Python itself deprecates these versions
        ctx.minimum_version = ssl.TLSVersion.TLSv1
        ctx.maximum_version = ssl.TLSVersion.TLSv1_1
    ctx.set_ciphers("ALL:@SECLEVEL=0")
    with pytest.raises((httpx.ConnectError, ssl.SSLError)), httpx.Client(verify=ctx) as c:
        c.get(server.url + "/healthz")


def test_cert_rotation_under_a_stream_of_requests(server: ServerProcess) -> None:
    """New handshakes get the rotated certificate; not one request fails meanwhile."""
    import subprocess
    import sys

    def serial() -> int:
        host, port = "127.0.0.1", server.port
        ctx = ssl.create_default_context(cafile=server.ca)
        import socket

        with socket.create_connection((host, port)) as sock, ctx.wrap_socket(sock, server_hostname=host) as tls:
            der = tls.getpeercert(binary_form=True)
        from cryptography import x509

        return int(x509.load_der_x509_certificate(der).serial_number)

    before = serial()
    stop = threading.Event()
    results: list[int] = []
    errors: list[str] = []

    def stream() -> None:
        while not stop.is_set():
            try:
                with server.client(timeout=10) as c:  # a new connection each time: new handshakes
                    r = post(c, "/mutate", review(pod(), uid="rot"))
                    results.append(r.status_code)
            except Exception as exc:
                errors.append(repr(exc))

    threads = [threading.Thread(target=stream) for _ in range(3)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    seen = {before}
    for _ in range(3):  # several rotations while handshakes keep coming
        subprocess.run(
            [sys.executable, "-m", "webhook", "certs", "rotate", "--dir", str(server.tls), "--force"],
            check=True,
            capture_output=True,
        )
        deadline = time.monotonic() + 10
        while serial() in seen and time.monotonic() < deadline:
            time.sleep(0.05)
        seen.add(serial())
    time.sleep(0.5)
    stop.set()
    for t in threads:
        t.join()
    assert len(seen) == 4, "the server did not pick up every rotated certificate"
    assert not errors, errors[:3]
    assert results and set(results) == {200}


@pytest.fixture
def policy_file(tmp_path: Path) -> Path:
    from policies.document import default_policy_text

    p = tmp_path / "policy.yaml"
    p.write_text(default_policy_text())
    return p


def _set_failure_mode(policy: Path, mode: str) -> None:
    policy.write_text(policy.read_text().replace("failureMode: closed", f"failureMode: {mode}"))


@pytest.mark.parametrize("mode", ["closed", "open"])
def test_deadline_is_honoured_with_a_slow_rule(policy_file: Path, mode: str) -> None:
    _set_failure_mode(policy_file, mode)
    srv = ServerProcess("--policy", str(policy_file), "--fault-injection", "slow-rule:3000")
    try:
        with srv.client() as c:
            t0 = time.monotonic()
            r = post(c, "/validate", review(pod(), uid="slow"), timeout="1s")
            took = time.monotonic() - t0
            resp = check_envelope(r, "slow")
            assert took < 1.0, f"answered after {took:.2f}s, past the API server's 1s timeout"
            if mode == "closed":
                assert resp["allowed"] is False and "failing closed" in resp["status"]["message"]
            else:
                assert resp["allowed"] is True and any("failing open" in w for w in resp["warnings"])
    finally:
        srv.stop()


@pytest.mark.parametrize("mode", ["closed", "open"])
def test_exception_in_a_rule_follows_the_failure_mode(policy_file: Path, mode: str) -> None:
    _set_failure_mode(policy_file, mode)
    srv = ServerProcess("--policy", str(policy_file), "--fault-injection", "raise-rule")
    try:
        with srv.client() as c:
            resp = check_envelope(post(c, "/validate", review(pod(labels={}, gpus=1), uid="boom")), "boom")
            if mode == "closed":
                assert resp["allowed"] is False and "fault-raise" in resp["status"]["message"]
            else:
                assert resp["allowed"] is True and any("fault-raise" in w for w in resp["warnings"])
        assert "rule failed" in srv.log_tail(50) and "boom" in srv.log_tail(50)
    finally:
        srv.stop()


def test_overload_answers_fast_and_never_hangs() -> None:
    """More simultaneous clients than --max-inflight: the excess is refused at once (503 from uvicorn's
    concurrency limit, or 429 from ours), everything is answered, and the server keeps serving."""
    srv = ServerProcess("--max-inflight", "4")
    # A timeout and abort(): one client that cannot connect (a loaded machine) must fail the test, never leave
    # the other 47 waiting on the barrier for good.
    start = threading.Barrier(48, timeout=60)

    def connected(c: Any) -> None:
        deadline = time.monotonic() + 30
        while True:
            try:
                c.get("/healthz")  # connect first, so all 48 requests land together
                return
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    start.abort()
                    raise
                time.sleep(0.2)

    def one(i: int) -> tuple[int, float]:
        with srv.client(timeout=10) as c:
            connected(c)
            start.wait()
            t0 = time.monotonic()
            r = post(c, "/validate", review(pod(name=f"o{i}", labels={}, gpus=1), uid=f"o{i}"))
            return r.status_code, time.monotonic() - t0

    try:
        with concurrent.futures.ThreadPoolExecutor(48) as pool:
            results = list(pool.map(one, range(48)))
        statuses = [s for s, _ in results]
        assert set(statuses) <= {200, 429, 503}, statuses
        assert 200 in statuses and ({429, 503} & set(statuses)), statuses
        assert max(t for _, t in results) < 5.0
        with srv.client() as c:
            assert post(c, "/validate", review(pod(labels={}, gpus=1), uid="after")).status_code == 200
    finally:
        srv.stop()


def test_policy_file_reload_changes_enforcement(policy_file: Path) -> None:
    srv = ServerProcess("--policy", str(policy_file))
    try:
        obj = pod(name="x", labels={}, annotations={"gpu-admission.io/unknown": "1"})
        with srv.client() as c:
            assert check_envelope(post(c, "/validate", review(obj, uid="p1")), "p1")["allowed"] is False
            policy_file.write_text(
                policy_file.read_text().replace("gpu-admission-annotations: enforce", "gpu-admission-annotations: warn")
            )
            t0 = time.monotonic()
            while time.monotonic() - t0 < 5:
                resp = check_envelope(post(c, "/validate", review(obj, uid="p2")), "p2")
                if resp["allowed"]:
                    break
                time.sleep(0.05)
            assert resp["allowed"] is True, "policy edit not applied within 5s"
            assert time.monotonic() - t0 < 2.0
            # an invalid edit keeps the last good policy and says so in /readyz
            policy_file.write_text("apiVersion: gpu-admission.io/v1alpha1\nkind: Policy\nrules: {nope: enforce}\n")
            time.sleep(1.5)
            details = c.get("/readyz").json()
            assert "rules.nope" in details["policy"]["error"]
            assert check_envelope(post(c, "/validate", review(obj, uid="p3")), "p3")["allowed"] is True
    finally:
        srv.stop()


def test_sigterm_drains_in_flight_requests(policy_file: Path) -> None:
    srv = ServerProcess("--policy", str(policy_file), "--fault-injection", "slow-rule:1000", "--shutdown-delay", "1")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        inflight = pool.submit(lambda: post(srv.client(), "/validate", review(pod(), uid="drain")))
        time.sleep(0.3)
        srv.proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        with srv.client() as c:
            assert c.get("/readyz").status_code == 503  # endpoints stop routing to us first
        r = inflight.result(timeout=10)
        assert r.status_code == 200 and r.json()["response"]["uid"] == "drain"
    assert srv.stop() == 0


def _records(directory: Path) -> list[dict[str, Any]]:
    import gzip

    out = []
    for f in sorted(directory.glob("audit.log*")):
        data = gzip.decompress(f.read_bytes()) if f.suffix == ".gz" else f.read_bytes()
        for line in data.decode().splitlines():
            out.append(json.loads(line))  # every line complete and parseable, or this raises
    return out


def _burst(srv: ServerProcess, prefix: str, n: int, stop: threading.Event | None = None) -> list[str]:
    """Send up to n validate reviews of GPU pods from 4 keep-alive clients; return the uids answered."""
    done: list[str] = []

    def worker(k: int) -> None:
        with srv.client(timeout=10) as c:
            for i in range(k, n, 4):
                if stop is not None and stop.is_set():
                    return
                uid = f"{prefix}-{i}"
                try:
                    r = post(c, "/validate", review(pod(name=f"p{i}", labels={}, gpus=1), uid=uid))
                except httpx.HTTPError:
                    return  # the server was killed under us
                if r.status_code == 200:
                    done.append(uid)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return done


def test_audit_rotation_under_load_loses_nothing() -> None:
    srv = ServerProcess("--audit-max-bytes", "64Ki", "--audit-backups", "1000", "--audit-compress")
    answered = _burst(srv, "rot", 800)
    assert srv.stop() == 0  # SIGTERM drains the audit queue
    records = _records(srv.audit.parent)
    uids = [r["uid"] for r in records]
    assert len(list(srv.audit.parent.glob("audit.log.*.gz"))) >= 2, "the log never rotated"
    assert sorted(uids) == sorted(answered), (len(uids), len(answered))


def test_audit_log_survives_kill_9_during_a_burst() -> None:
    srv = ServerProcess()
    acknowledged = _burst(srv, "ack", 300)
    time.sleep(0.5)  # the writer thread catches up: these records are written (acknowledged by the log)
    stop = threading.Event()
    result: list[list[str]] = []
    t = threading.Thread(target=lambda: result.append(_burst(srv, "late", 5000, stop)))
    t.start()
    time.sleep(0.7)
    srv.proc.kill()  # SIGKILL mid-burst
    srv.proc.wait()
    stop.set()
    t.join()
    records = _records(srv.audit.parent)  # raises on any half-written line
    uids = {r["uid"] for r in records}
    assert set(acknowledged) <= uids, f"{len(set(acknowledged) - uids)} acknowledged records lost"
    assert result and result[0], "the second burst never got going"
    assert uids <= set(acknowledged) | {f"late-{i}" for i in range(5000)}
    srv.stop()
