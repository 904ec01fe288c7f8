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
        (("secret", "--dir", "{tmp}", "--name", "n", "--namespace", "ns", "--include-ca", "--print"), "no such file"),
        (("fetch",), "the following arguments are required: --name, --namespace, --out"),
        (("fetch", "--name", "Bad_Name", "--namespace", "ns", "--out", "{tmp}/x"), "invalid Secret name"),
        (("fetch", "--name", "n", "--namespace", "Bad", "--out", "{tmp}/x"), "invalid namespace"),
        (("fetch", "--name", "n", "--namespace", "ns", "--out", "/dev/null"), "not a directory"),
        (("fetch", "--name", "n", "--namespace", "ns", "--out", "{tmp}", "--bogus"), "unrecognized arguments"),
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
                "users": [
                    {
                        "name": "u",
                        "user": {
                            "exec": {
                                "apiVersion": "client.authentication.k8s.io/v1",
                                "command": "gpu-admission-test-no-such-plugin",
                                "interactiveMode": "Never",
                                "installHint": "install the plugin",
                            }
                        },
                    }
                ],
            }
        )
    )
    proc = run("inject", "--ca-bundle", str(made / CA_BUNDLE), "--webhook-name", "w", "--kubeconfig", str(bad))
    assert "exec plugin 'gpu-admission-test-no-such-plugin' not found (install the plugin)" in assert_one_line_error(
        proc
    )
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


# -- secret --include-ca and fetch: the round trip the certs Job relies on ---------------------------------

SECRET = "gpu-admission-tls"
SECRET_PATH = f"/api/v1/namespaces/gpu-system/secrets/{SECRET}"
ALL_FILES = ("ca.crt", "ca.key", "tls.crt", "tls.key", CA_BUNDLE)
SERVING_FILES = ("ca.crt", "tls.crt", "tls.key")


def secret_cmd(made: Path, kubeconfig: Path, *extra: str) -> tuple[str, ...]:
    return ("secret", "--dir", str(made), "--name", SECRET, "--namespace", "gpu-system", "--kubeconfig",
            str(kubeconfig), *extra)  # fmt: skip


def fetch_cmd(out: Path, kubeconfig: Path, *extra: str, name: str = SECRET) -> tuple[str, ...]:
    return ("fetch", "--name", name, "--namespace", "gpu-system", "--out", str(out), "--kubeconfig",
            str(kubeconfig), *extra)  # fmt: skip


def assert_no_key_material(proc: subprocess.CompletedProcess[str]) -> None:
    assert "PRIVATE KEY" not in proc.stdout + proc.stderr and "BEGIN" not in proc.stdout + proc.stderr


def assert_layout(out: Path, names: tuple[str, ...], source: Path) -> None:
    """`out` holds exactly `names` (no temporary files), byte-equal to `source`, with the store's modes."""
    assert sorted(p.name for p in out.iterdir()) == sorted(names)
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o700
    for name in names:
        assert (out / name).read_bytes() == (source / name).read_bytes(), name
        assert stat.S_IMODE(os.stat(out / name).st_mode) == (0o600 if name.endswith(".key") else 0o644), name


def test_secret_include_ca_then_fetch_round_trip(
    made: Path, cluster: tuple[KubeTestServer, FakeObjects, Path], tmp_path: Path
) -> None:
    server, fake, kubeconfig = cluster
    proc = run(*secret_cmd(made, kubeconfig, "--include-ca"), check_rc=0)
    assert "with ca.key and ca-bundle.crt) created" in proc.stdout
    assert_no_key_material(proc)
    stored = fake.objects[SECRET_PATH]
    assert stored["type"] == "kubernetes.io/tls"
    assert {k: base64.b64decode(v) for k, v in stored["data"].items()} == {
        n: (made / n).read_bytes() for n in ALL_FILES
    }

    out = tmp_path / "fetched" / "pki"  # parents created too
    before = len(server.requests)
    proc = run(*fetch_cmd(out, kubeconfig), check_rc=0)
    assert proc.stdout.startswith("wrote ") and proc.stdout.count("\n") == 1 and proc.stderr == ""
    assert f"from Secret gpu-system/{SECRET}" in proc.stdout
    assert_no_key_material(proc)
    assert_layout(out, ALL_FILES, made)
    # `fetch` needs `get` on that one Secret and nothing else.
    assert [(r.method, r.path) for r in server.requests[before:]] == [("GET", SECRET_PATH)]
    assert server.requests[-1].headers["authorization"] == "Bearer secret-token"
    # What came back is a working directory: it verifies, and rotation finds nothing due.
    run("show", "--dir", str(out), check_rc=0)
    assert run("rotate", "--dir", str(out), check_rc=0).stdout.startswith("nothing to do")
    # ... and publishing it again changes nothing.
    assert "unchanged" in run(*secret_cmd(out, kubeconfig, "--include-ca"), check_rc=0).stdout


def test_secret_without_include_ca_keeps_the_ca_key_out(
    made: Path, cluster: tuple[KubeTestServer, FakeObjects, Path], tmp_path: Path
) -> None:
    _, fake, kubeconfig = cluster
    run(*secret_cmd(made, kubeconfig), check_rc=0)
    assert sorted(fake.objects[SECRET_PATH]["data"]) == sorted(SERVING_FILES)
    out = tmp_path / "three"
    run(*fetch_cmd(out, kubeconfig), check_rc=0)
    assert_layout(out, SERVING_FILES, made)
    # Adding the CA later merges the two keys into the existing Secret.
    proc = run(*secret_cmd(made, kubeconfig, "--include-ca"), check_rc=0)
    assert "updated" in proc.stdout
    assert sorted(fake.objects[SECRET_PATH]["data"]) == sorted(ALL_FILES)


def test_secret_print_include_ca(made: Path) -> None:
    proc = run("secret", "--dir", str(made), "--name", SECRET, "--namespace", "gpu-system", "--include-ca",
               "--print", check_rc=0)  # fmt: skip
    data = {k: base64.b64decode(v) for k, v in yaml.safe_load(proc.stdout)["data"].items()}
    assert data == {n: (made / n).read_bytes() for n in ALL_FILES}  # printed because --print asked for it


def test_secret_include_ca_checks_the_ca_material(made: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    run("init", "--service", "x", "--namespace", "y", "--out", str(other), check_rc=0)
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for name in ALL_FILES:
        (mixed / name).write_bytes((made / name).read_bytes())
    (mixed / "ca.key").write_bytes((other / "ca.key").read_bytes())
    cmd = ("secret", "--dir", str(mixed), "--name", "n", "--namespace", "ns", "--include-ca", "--print")
    proc = run(*cmd)
    assert "ca.key does not match" in assert_one_line_error(proc)
    assert_no_key_material(proc)
    (mixed / "ca.key").write_bytes((made / "ca.key").read_bytes())
    (mixed / CA_BUNDLE).write_bytes((other / CA_BUNDLE).read_bytes())
    assert "does not hold" in assert_one_line_error(run(*cmd))
    # Without --include-ca neither file is read.
    (mixed / "ca.key").unlink()
    (mixed / CA_BUNDLE).unlink()
    run("secret", "--dir", str(mixed), "--name", "n", "--namespace", "ns", "--print", check_rc=0)


def test_fetch_missing_secret(cluster: tuple[KubeTestServer, FakeObjects, Path], tmp_path: Path) -> None:
    _, _, kubeconfig = cluster
    out = tmp_path / "out"
    line = assert_one_line_error(run(*fetch_cmd(out, kubeconfig)), rc=1)
    assert f"Secret gpu-system/{SECRET} not found" in line
    assert not out.exists()
    proc = run(*fetch_cmd(out, kubeconfig, "--missing-ok"), check_rc=0)
    assert proc.stdout == f"Secret gpu-system/{SECRET} not found: nothing fetched\n" and proc.stderr == ""
    assert not out.exists()
    # An existing, empty directory (the Job's emptyDir) stays empty.
    out.mkdir()
    run(*fetch_cmd(out, kubeconfig, "--missing-ok"), check_rc=0)
    assert list(out.iterdir()) == []


def test_fetch_refuses_to_overwrite_unless_forced(
    made: Path, cluster: tuple[KubeTestServer, FakeObjects, Path], tmp_path: Path
) -> None:
    server, _, kubeconfig = cluster
    run(*secret_cmd(made, kubeconfig), check_rc=0)  # tls.crt, tls.key, ca.crt only
    other = tmp_path / "other"
    run("init", "--service", "x", "--namespace", "y", "--out", str(other), check_rc=0)
    before = len(server.requests)
    proc = run(*fetch_cmd(other, kubeconfig))
    assert "already holds ca.crt, ca.key, tls.crt, tls.key, ca-bundle.crt: use --force" in assert_one_line_error(proc)
    assert len(server.requests) == before, "refused before calling the API"
    proc = run(*fetch_cmd(other, kubeconfig, "--force"), check_rc=0)
    assert "removed" in proc.stdout and "(not in the Secret)" in proc.stdout
    assert_no_key_material(proc)
    # The directory now is the Secret: the other CA's key and bundle are gone, not left next to a foreign ca.crt.
    assert_layout(other, SERVING_FILES, made)


UNUSABLE_IDS = [
    "type",
    "no-ca",
    "empty",
    "no-data",
    "tls-mismatch",
    "ca-mismatch",
    "ca-key-junk",
    "junk-cert",
    "junk-bundle",
    "base64",
]


def _other_pair(tmp_path: Path, name: str) -> str:
    from certs.rotation import init_dir

    init_dir(tmp_path / "elsewhere", service="x", namespace="y", overwrite=True)
    return base64.b64encode((tmp_path / "elsewhere" / name).read_bytes()).decode()


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        (lambda s, t: s.update(type="Opaque"), "has type 'Opaque', not kubernetes.io/tls"),
        (lambda s, t: s["data"].pop("ca.crt"), "lacks ca.crt"),
        (lambda s, t: s["data"].update({"tls.crt": "", "tls.key": ""}), "lacks tls.crt, tls.key"),
        (lambda s, t: s.pop("data"), "lacks tls.crt, tls.key, ca.crt"),
        (lambda s, t: s["data"].update({"tls.key": _other_pair(t, "tls.key")}), "tls.key does not match tls.crt"),
        (lambda s, t: s["data"].update({"ca.key": _other_pair(t, "ca.key")}), "ca.key does not match ca.crt"),
        (lambda s, t: s["data"].update({"ca.key": "bm90IGEga2V5"}), "ca.key: not a readable"),
        (lambda s, t: s["data"].update({"tls.crt": "bm90IGEgY2VydA=="}), "tls.crt: not a PEM certificate"),
        (lambda s, t: s["data"].update({"ca-bundle.crt": "bm9uZQ=="}), "ca-bundle.crt: not a PEM certificate"),
        (lambda s, t: s["data"].update({"ca.crt": "%%%"}), "ca.crt is not valid base64"),
    ],
    ids=UNUSABLE_IDS,
)
def test_fetch_unusable_secret_writes_nothing(
    made: Path, cluster: tuple[KubeTestServer, FakeObjects, Path], tmp_path: Path, change: Any, needle: str
) -> None:
    _, fake, kubeconfig = cluster
    run(*secret_cmd(made, kubeconfig, "--include-ca"), check_rc=0)
    change(fake.objects[SECRET_PATH], tmp_path)
    out = tmp_path / "out"
    proc = run(*fetch_cmd(out, kubeconfig, "--missing-ok"))
    line = assert_one_line_error(proc, rc=1)
    assert line.startswith(f"gpu-admission: error: Secret gpu-system/{SECRET}") and needle in line, line
    assert_no_key_material(proc)
    assert not out.exists()


def test_fetch_api_errors_are_one_line_exit_1(
    made: Path, cluster: tuple[KubeTestServer, FakeObjects, Path], tmp_path: Path
) -> None:
    server, _, kubeconfig = cluster
    run(*secret_cmd(made, kubeconfig, "--include-ca"), check_rc=0)
    server.routes.insert(0, lambda r: Reply(403, status_body(403, "Forbidden", f'secrets "{SECRET}" is forbidden: no')))
    out = tmp_path / "out"
    proc = run(*fetch_cmd(out, kubeconfig, "--missing-ok"))  # --missing-ok covers 404 only
    assert "is forbidden" in assert_one_line_error(proc, rc=1)
    assert not out.exists()
    server.routes[0] = lambda r: Reply(
        500, {"kind": "Status", "code": 500, "reason": "InternalError", "message": "etcd"}
    )
    assert "InternalError" in assert_one_line_error(run(*fetch_cmd(out, kubeconfig, "--missing-ok")), rc=1)
    # Unreachable API server.
    dead = tmp_path / "dead-kubeconfig"
    dead.write_text(kubeconfig.read_text().replace(server.url, "https://127.0.0.1:1"))
    proc = run(*fetch_cmd(out, dead, "--missing-ok"))
    assert "ConnectionFailed" in assert_one_line_error(proc, rc=1)
    assert not out.exists()
