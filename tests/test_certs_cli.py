"""`gpu-admission certs ...` run as a real process (`python -m webhook`).

`inject` and `secret` talk to `KubeTestServer` (a real HTTPS server on 127.0.0.1 with canned, stateful
answers) through a kubeconfig file, exactly as they would talk to an API server.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonpatch  # type: ignore[import-untyped]
import pytest
import yaml

from certs.store import CA_BUNDLE, TLS_CERT, TLS_KEY, read_bundle, read_cert
from tests.test_kubeclient import KubeTestServer, Recorded, Reply, status_body

ROOT = Path(__file__).resolve().parent.parent


def run(*args: str, check_rc: int | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("KUBECONFIG", None)
    proc = subprocess.run(
        [sys.executable, "-m", "webhook", "certs", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if check_rc is not None:
        assert proc.returncode == check_rc, (proc.stdout, proc.stderr)
    return proc


def assert_one_line_error(proc: subprocess.CompletedProcess[str], rc: int = 2) -> str:
    assert proc.returncode == rc, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "error:" in lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cli") / "pki"
    proc = run(
        "init",
        "--service",
        "gpu-admission",
        "--namespace",
        "gpu-system",
        "--out",
        str(out),
        "--ip",
        "127.0.0.1",
        "--dns",
        "webhook.example.com",
        check_rc=0,
    )
    assert "PRIVATE KEY" not in proc.stdout + proc.stderr
    return out


def test_init_writes_the_layout(made: Path) -> None:
    assert sorted(p.name for p in made.iterdir()) == sorted(["ca.crt", "ca.key", "tls.crt", "tls.key", CA_BUNDLE])
    assert stat.S_IMODE(os.stat(made / "tls.key").st_mode) == 0o600
    assert stat.S_IMODE(os.stat(made / "ca.key").st_mode) == 0o600
    leaf = read_cert(made / TLS_CERT)
    assert "gpu-admission.gpu-system.svc" in str(leaf.subject.rfc4514_string())


def test_init_options(tmp_path: Path) -> None:
    out = tmp_path / "rsa"
    proc = run(
        "init",
        "--service",
        "s",
        "--namespace",
        "n",
        "--out",
        str(out),
        "--key-type",
        "rsa",
        "--rsa-bits",
        "3072",
        "--days",
        "30",
        "--ca-days",
        "365",
        "--cluster-domain",
        "corp.local",
        check_rc=0,
    )
    assert "RSA 3072" in proc.stdout and "s.n.svc.corp.local" in proc.stdout
    leaf = read_cert(out / TLS_CERT)
    assert (leaf.not_valid_after_utc - leaf.not_valid_before_utc).days == 30


def test_show(made: Path) -> None:
    proc = run("show", "--dir", str(made), check_rc=0)
    assert "chain       ok" in proc.stdout
    assert "gpu-admission.gpu-system.svc.cluster.local" in proc.stdout and "127.0.0.1" in proc.stdout
    data = json.loads(run("show", "--dir", str(made), "--json", check_rc=0).stdout)
    assert data["chainOk"] and data["ready"]
    assert data["dnsNames"] == [
        "gpu-admission",
        "gpu-admission.gpu-system",
        "gpu-admission.gpu-system.svc",
        "gpu-admission.gpu-system.svc.cluster.local",
        "webhook.example.com",
    ]
    assert data["ipAddresses"] == ["127.0.0.1"]


def test_show_fails_with_exit_1_when_the_chain_is_broken(made: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    run("init", "--service", "x", "--namespace", "y", "--out", str(other), check_rc=0)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / TLS_CERT).write_bytes((made / TLS_CERT).read_bytes())
    (broken / CA_BUNDLE).write_bytes((other / CA_BUNDLE).read_bytes())
    proc = run("show", "--dir", str(broken))
    assert proc.returncode == 1 and "chain does not verify" in proc.stdout


def test_rotate(tmp_path: Path) -> None:
    out = tmp_path / "d"
    run("init", "--service", "s", "--namespace", "n", "--out", str(out), check_rc=0)
    assert run("rotate", "--dir", str(out), check_rc=0).stdout.startswith("nothing to do")
    serial = read_cert(out / TLS_CERT).serial_number
    # A renewal window longer than the certificate's life: renewed.
    proc = run("rotate", "--dir", str(out), "--renew-before", "400d", check_rc=0)
    assert "renewed the serving certificate" in proc.stdout and "inject" not in proc.stdout
    assert read_cert(out / TLS_CERT).serial_number != serial
    proc = run("rotate", "--dir", str(out), "--force-ca", check_rc=0)
    assert "rolled the CA over" in proc.stdout and "certs inject" in proc.stdout
    assert len(read_bundle(out / CA_BUNDLE)) == 2
    assert "PRIVATE KEY" not in proc.stdout + proc.stderr


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ((), "needs a sub-command"),
        (("init",), "the following arguments are required"),
        (("init", "--service", "Bad_Name", "--namespace", "n", "--out", "{tmp}/x"), "invalid Service name"),
        (("init", "--service", "s", "--namespace", "n", "--out", "{tmp}/x", "--ip", "1.2.3"), "invalid IP"),
        (("init", "--service", "s", "--namespace", "n", "--out", "{tmp}/x", "--dns", "a b"), "invalid DNS"),
        (("init", "--service", "s", "--namespace", "n", "--out", "{tmp}/x", "--days", "0"), "--days"),
        (("init", "--service", "s", "--namespace", "n", "--out", "{tmp}/x", "--days", "abc"), "--days"),
        (("init", "--service", "s", "--namespace", "n", "--out", "{tmp}/x", "--key-type", "dsa"), "invalid choice"),
        (("init", "--service", "s", "--namespace", "n", "--out", "{tmp}/x", "--rsa-bits", "1024"), "invalid choice"),
        (("init", "--service", "s", "--namespace", "n", "--out", "{tmp}/x", "--bogus"), "unrecognized arguments"),
        (("init", "--service", "s", "--namespace", "n", "--out", "/dev/null"), "not a directory"),
        (("rotate", "--dir", "{tmp}/missing"), "no such file"),
        (("rotate", "--dir", "{tmp}", "--renew-before", "soon"), "invalid duration"),
        (("show", "--dir", "{tmp}/missing"), "no such file"),
        (("show",), "required: --dir"),
        (("inject", "--ca-bundle", "{tmp}/missing.crt", "--webhook-name", "w"), "no such file"),
        (("inject", "--ca-bundle", "{tmp}/junk.crt", "--webhook-name", "w"), "not a PEM certificate bundle"),
        (("inject", "--ca-bundle", "{tmp}/junk.crt"), "--webhook-name"),
        (("secret", "--dir", "{tmp}", "--name", "n", "--namespace", "Bad"), "invalid namespace"),
        (("secret", "--dir", "{tmp}/missing", "--name", "n", "--namespace", "ns", "--print"), "no such file"),
    ],
)
def test_bad_arguments_give_one_line_and_exit_2(tmp_path: Path, args: tuple[str, ...], needle: str) -> None:
    (tmp_path / "junk.crt").write_text("not a certificate\n")
    proc = run(*(a.replace("{tmp}", str(tmp_path)) for a in args))
    line = assert_one_line_error(proc)
    assert needle in line


def test_init_refuses_existing_dir_unless_forced(made: Path, tmp_path: Path) -> None:
    proc = run("init", "--service", "gpu-admission", "--namespace", "gpu-system", "--out", str(made))
    assert "already holds" in assert_one_line_error(proc)
    copy_dir = tmp_path / "copy"
    run("init", "--service", "a", "--namespace", "b", "--out", str(copy_dir), check_rc=0)
    run("init", "--service", "a", "--namespace", "b", "--out", str(copy_dir), "--force", check_rc=0)


def test_secret_print(made: Path) -> None:
    proc = run(
        "secret", "--dir", str(made), "--name", "gpu-admission-tls", "--namespace", "gpu-system", "--print", check_rc=0
    )
    secret = yaml.safe_load(proc.stdout)
    assert secret["kind"] == "Secret" and secret["type"] == "kubernetes.io/tls"
    assert secret["metadata"] == {
        "name": "gpu-admission-tls",
        "namespace": "gpu-system",
        "labels": {"app.kubernetes.io/name": "gpu-admission", "app.kubernetes.io/managed-by": "gpu-admission"},
    }
    data = {k: base64.b64decode(v) for k, v in secret["data"].items()}
    assert data == {
        "tls.crt": (made / TLS_CERT).read_bytes(),
        "tls.key": (made / TLS_KEY).read_bytes(),
        "ca.crt": (made / "ca.crt").read_bytes(),
    }
    assert proc.stderr == ""


# -- inject and secret against a local HTTPS API server ----------------------------------------------------


def webhook_configs() -> dict[str, dict[str, Any]]:
    base = "/apis/admissionregistration.k8s.io/v1"
    svc = {"service": {"name": "gpu-admission", "namespace": "gpu-system", "path": "/mutate"}}
    return {
        f"{base}/mutatingwebhookconfigurations/gpu-admission": {
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "gpu-admission", "resourceVersion": "1"},
            "webhooks": [
                {"name": "mutate.gpu-admission.io", "clientConfig": {**svc, "caBundle": "b2xk"}, "sideEffects": "None"},
                {"name": "mutate2.gpu-admission.io", "clientConfig": dict(svc), "sideEffects": "None"},
            ],
        },
        f"{base}/validatingwebhookconfigurations/gpu-admission": {
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": "gpu-admission", "resourceVersion": "1"},
            "webhooks": [{"name": "validate.gpu-admission.io", "clientConfig": dict(svc), "sideEffects": "None"}],
        },
        f"{base}/validatingwebhookconfigurations/only-validating": {
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": "only-validating"},
            "webhooks": [{"name": "v.example.io", "clientConfig": {"url": "https://x/validate"}}],
        },
    }


class FakeObjects:
    """Stateful canned answers: GET returns the stored object, PATCH applies the patch to it."""

    def __init__(self, objects: dict[str, dict[str, Any]]) -> None:
        self.objects = objects

    def __call__(self, r: Recorded) -> Reply | None:
        if r.path.endswith("/secrets") and r.method == "POST":
            path = f"{r.path}/{r.body['metadata']['name']}"
            self.objects[path] = r.body
            return Reply(201, r.body)
        obj = self.objects.get(r.path)
        if obj is None:
            return Reply(404, status_body(404, "NotFound", f"{r.path.rsplit('/', 1)[-1]} not found"))
        if r.method == "GET":
            return Reply(200, obj)
        if r.method == "PATCH":
            if r.headers["content-type"] == "application/json-patch+json":
                self.objects[r.path] = jsonpatch.apply_patch(obj, r.body)
            elif r.headers["content-type"] == "application/merge-patch+json":
                merged = copy.deepcopy(obj)
                merged.setdefault("metadata", {}).setdefault("labels", {}).update(r.body["metadata"]["labels"])
                merged.setdefault("data", {}).update(r.body["data"])
                self.objects[r.path] = merged
            return Reply(200, self.objects[r.path])
        return None


@pytest.fixture
def cluster(made: Path, tmp_path: Path) -> Iterator[tuple[KubeTestServer, FakeObjects, Path]]:
    with KubeTestServer(made) as server:
        fake = FakeObjects(webhook_configs())
        server.route(fake)
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "test",
                    "contexts": [{"name": "test", "context": {"cluster": "local", "user": "admin"}}],
                    "clusters": [
                        {
                            "name": "local",
                            "cluster": {"server": server.url, "certificate-authority": str(made / CA_BUNDLE)},
                        }
                    ],
                    "users": [{"name": "admin", "user": {"token": "secret-token"}}],
                }
            )
        )
        yield server, fake, kubeconfig


def test_inject_patches_only_ca_bundle(made: Path, cluster: tuple[KubeTestServer, FakeObjects, Path]) -> None:
    server, fake, kubeconfig = cluster
    before = copy.deepcopy(fake.objects)
    bundle = (made / CA_BUNDLE).read_bytes()
    value = base64.b64encode(bundle).decode()
    proc = run(
        "inject",
        "--ca-bundle",
        str(made / CA_BUNDLE),
        "--webhook-name",
        "gpu-admission",
        "only-validating",
        "--kubeconfig",
        str(kubeconfig),
        check_rc=0,
    )
    assert "MutatingWebhookConfiguration gpu-admission: caBundle set" in proc.stdout
    patches = [r for r in server.requests if r.method == "PATCH"]
    assert len(patches) == 3
    for request in patches:
        assert request.headers["content-type"] == "application/json-patch+json"
        assert request.headers["authorization"] == "Bearer secret-token"
        for op in request.body:
            assert op["op"] in ("test", "add")
            assert op["path"].endswith("/name") if op["op"] == "test" else op["path"].endswith("/caBundle")
    # Only caBundle changed, in every webhook entry.
    for path, obj in fake.objects.items():
        expected = copy.deepcopy(before[path])
        for hook in expected["webhooks"]:
            hook["clientConfig"]["caBundle"] = value
        assert obj == expected
    # Idempotent: a second run sends no patch.
    count = len(patches)
    proc = run(
        "inject",
        "--ca-bundle",
        str(made / CA_BUNDLE),
        "--webhook-name",
        "gpu-admission",
        "--kubeconfig",
        str(kubeconfig),
        check_rc=0,
    )
    assert "already current" in proc.stdout
    assert len([r for r in server.requests if r.method == "PATCH"]) == count


def test_inject_unknown_name_patches_nothing(made: Path, cluster: tuple[KubeTestServer, FakeObjects, Path]) -> None:
    server, _, kubeconfig = cluster
    proc = run(
        "inject",
        "--ca-bundle",
        str(made / CA_BUNDLE),
        "--webhook-name",
        "gpu-admission",
        "--webhook-name",
        "nope",
        "--kubeconfig",
        str(kubeconfig),
    )
    assert "named nope" in assert_one_line_error(proc)
    assert not [r for r in server.requests if r.method == "PATCH"]


def test_secret_create_then_update(made: Path, cluster: tuple[KubeTestServer, FakeObjects, Path]) -> None:
    server, fake, kubeconfig = cluster
    args = (
        "secret",
        "--dir",
        str(made),
        "--name",
        "gpu-admission-tls",
        "--namespace",
        "gpu-system",
        "--kubeconfig",
        str(kubeconfig),
    )
    assert "created" in run(*args, check_rc=0).stdout
    path = "/api/v1/namespaces/gpu-system/secrets/gpu-admission-tls"
    stored = fake.objects[path]
    assert stored["type"] == "kubernetes.io/tls"
    assert base64.b64decode(stored["data"]["tls.key"]) == (made / TLS_KEY).read_bytes()
    assert "unchanged" in run(*args, check_rc=0).stdout
    stored["data"]["tls.crt"] = "c3RhbGU="
    proc = run(*args, check_rc=0)
    assert "updated" in proc.stdout
    assert base64.b64decode(fake.objects[path]["data"]["tls.crt"]) == (made / TLS_CERT).read_bytes()
    assert "PRIVATE KEY" not in proc.stdout + proc.stderr
    assert [r.method for r in server.requests] == ["GET", "POST", "GET", "GET", "PATCH"]


def test_secret_type_mismatch_and_api_refusal(made: Path, cluster: tuple[KubeTestServer, FakeObjects, Path]) -> None:
    server, fake, kubeconfig = cluster
    fake.objects["/api/v1/namespaces/gpu-system/secrets/opaque"] = {"type": "Opaque", "metadata": {"name": "opaque"}}
    proc = run(
        "secret", "--dir", str(made), "--name", "opaque", "--namespace", "gpu-system", "--kubeconfig", str(kubeconfig)
    )
    assert "exists with type 'Opaque'" in assert_one_line_error(proc)

    server.routes.insert(0, lambda r: Reply(403, status_body(403, "Forbidden", 'secrets "x" is forbidden: no')))
    proc = run(
        "secret", "--dir", str(made), "--name", "x", "--namespace", "gpu-system", "--kubeconfig", str(kubeconfig)
    )
    assert "is forbidden" in assert_one_line_error(proc, rc=1)


def test_kubeconfig_errors_are_one_line(made: Path, tmp_path: Path) -> None:
    bad = tmp_path / "kc"
    bad.write_text(
        yaml.safe_dump(
            {
                "current-context": "x",
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"exec": {"command": "aws"}}}],
            }
        )
    )
    proc = run("inject", "--ca-bundle", str(made / CA_BUNDLE), "--webhook-name", "w", "--kubeconfig", str(bad))
    assert "exec credential plugin" in assert_one_line_error(proc)
    proc = run(
        "inject", "--ca-bundle", str(made / CA_BUNDLE), "--webhook-name", "w", "--kubeconfig", str(tmp_path / "none")
    )
    assert "no such file" in assert_one_line_error(proc)
    # Unreachable API server: exit 1, one line.
    good = tmp_path / "kc2"
    good.write_text(
        yaml.safe_dump(
            {
                "current-context": "x",
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "clusters": [
                    {"name": "c", "cluster": {"server": "https://127.0.0.1:1", "insecure-skip-tls-verify": True}}
                ],
                "users": [{"name": "u", "user": {"token": "t"}}],
            }
        )
    )
    proc = run("inject", "--ca-bundle", str(made / CA_BUNDLE), "--webhook-name", "w", "--kubeconfig", str(good))
    assert "ConnectionFailed" in assert_one_line_error(proc, rc=1)
