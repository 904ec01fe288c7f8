"""kubeconfig exec credential plugins (cluster/execcred.py) through the real client, with a fake plugin.

The plugin is tests/fixtures/exec_plugin.py, scripted per test; the API server is test_kubeclient's
KubeTestServer (real HTTPS on loopback). Against the real kube-apiserver: tests/e2e/test_exec_auth_e2e.py.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography.hazmat.primitives.serialization import Encoding

from certs.authority import make_ca
from certs.keys import key_to_pem
from cluster.execcred import ExecPlugin, ExecPluginError, parse_credential, parse_exec, run_plugin
from cluster.kubeclient import KubeClient, KubeConfigError, KubeError, load_kubeconfig
from tests.test_kubeclient import KubeTestServer, Recorded, Reply, issue_client_cert, status_body
from tests.test_kubeclient import api as api
from tests.test_kubeclient import tls_dir as tls_dir

PLUGIN = Path(__file__).parent / "fixtures" / "exec_plugin.py"
V1 = "client.authentication.k8s.io/v1"
V1BETA1 = "client.authentication.k8s.io/v1beta1"


def script(tmp_path: Path, *runs: dict[str, Any]) -> Path:
    path = tmp_path / "plugin.json"
    path.write_text(json.dumps({"runs": list(runs)}))
    return path


def plugin_log(script_path: Path) -> list[dict[str, Any]]:
    log = Path(f"{script_path}.log")
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def exec_stanza(script_path: Path, **extra: Any) -> dict[str, Any]:
    stanza: dict[str, Any] = {
        "apiVersion": V1,
        "command": sys.executable,
        "args": [str(PLUGIN), str(script_path)],
        "interactiveMode": "Never",
    }
    stanza.update(extra)
    return stanza


def kubeconfig(tmp_path: Path, server: str, ca: bytes, user: dict[str, Any], **cluster: Any) -> Path:
    path = tmp_path / "kubeconfig"
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "cloud",
        "contexts": [{"name": "cloud", "context": {"cluster": "eks", "user": "me"}}],
        "clusters": [
            {
                "name": "eks",
                "cluster": {"server": server, "certificate-authority-data": base64.b64encode(ca).decode(), **cluster},
            }
        ],
        "users": [{"name": "me", "user": user}],
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def accept_tokens(server: KubeTestServer, accepted: set[str]) -> None:
    @server.route
    def auth(r: Recorded) -> Reply:
        if r.headers.get("authorization", "").removeprefix("Bearer ") not in accepted:
            return Reply(401, status_body(401, "Unauthorized", "Unauthorized"))
        return Reply(200, {"kind": "APIVersions", "who": r.headers["authorization"]})


def test_token_from_plugin_with_args_env_and_exec_info(api: KubeTestServer, tls_dir: Path, tmp_path: Path) -> None:
    steps = script(tmp_path, {"token": "tok-1"})
    ca = (tls_dir / "ca.crt").read_bytes()
    env = [{"name": "FAKE_PROFILE", "value": "prod"}, {"name": "FAKE_EMPTY", "value": ""}]
    stanza = exec_stanza(steps, env=env)
    stanza["args"].append("--region=eu-west-1")
    path = kubeconfig(tmp_path, api.url, ca, {"exec": stanza})
    accept_tokens(api, {"tok-1"})
    with KubeClient.from_config(path, timeout=10) as client:
        client.get("/api")
        client.get("/api")
    assert [r.headers["authorization"] for r in api.requests] == ["Bearer tok-1", "Bearer tok-1"]
    (run,) = plugin_log(steps)  # one run: no expiry, no 401
    assert run["args"] == ["--region=eu-west-1"]
    assert run["env"] == {"FAKE_PROFILE": "prod", "FAKE_EMPTY": ""}
    assert run["exec_info"] == {"apiVersion": V1, "kind": "ExecCredential", "spec": {"interactive": False}}
    assert run["stdin"] == ""  # no terminal: stdin is closed


def test_provide_cluster_info_passes_the_cluster(api: KubeTestServer, tls_dir: Path, tmp_path: Path) -> None:
    steps = script(tmp_path, {"token": "tok-1", "apiVersion": V1BETA1})
    ca = (tls_dir / "ca.crt").read_bytes()
    extension = {"name": "client.authentication.k8s.io/exec", "extension": {"audience": "eks-prod"}}
    stanza = exec_stanza(steps, apiVersion=V1BETA1, provideClusterInfo=True)
    del stanza["interactiveMode"]  # optional in v1beta1 (IfAvailable)
    path = kubeconfig(tmp_path, api.url, ca, {"exec": stanza}, extensions=[extension])
    accept_tokens(api, {"tok-1"})
    with KubeClient.from_config(path, timeout=10) as client:
        client.get("/api")
    info = plugin_log(steps)[0]["exec_info"]
    assert info["apiVersion"] == V1BETA1
    assert info["spec"] == {
        "interactive": False,
        "cluster": {
            "server": api.url,
            "certificate-authority-data": base64.b64encode(ca).decode(),
            "config": {"audience": "eks-prod"},
        },
    }


def test_expired_token_reruns_the_plugin(api: KubeTestServer, tls_dir: Path, tmp_path: Path) -> None:
    steps = script(tmp_path, {"token": "tok-1", "expires_in": 1.0}, {"token": "tok-2", "expires_in": 3600})
    path = kubeconfig(tmp_path, api.url, (tls_dir / "ca.crt").read_bytes(), {"exec": exec_stanza(steps)})
    accept_tokens(api, {"tok-1", "tok-2"})
    with KubeClient.from_config(path, timeout=10) as client:
        client.get("/api")
        time.sleep(1.1)
        client.get("/api")
        client.get("/api")
    assert [r.headers["authorization"] for r in api.requests] == ["Bearer tok-1", "Bearer tok-2", "Bearer tok-2"]
    assert len(plugin_log(steps)) == 2


def test_401_reruns_the_plugin_and_retries_once(api: KubeTestServer, tls_dir: Path, tmp_path: Path) -> None:
    steps = script(tmp_path, {"token": "revoked"}, {"token": "tok-2"})
    path = kubeconfig(tmp_path, api.url, (tls_dir / "ca.crt").read_bytes(), {"exec": exec_stanza(steps)})
    accept_tokens(api, {"tok-2"})
    with KubeClient.from_config(path, timeout=10) as client:
        assert client.get("/api")["who"] == "Bearer tok-2"
        client.get("/api")
    assert [r.headers["authorization"] for r in api.requests] == ["Bearer revoked", "Bearer tok-2", "Bearer tok-2"]
    assert len(plugin_log(steps)) == 2


def test_a_token_still_refused_after_a_rerun_is_a_401(api: KubeTestServer, tls_dir: Path, tmp_path: Path) -> None:
    steps = script(tmp_path, {"token": "wrong"})
    path = kubeconfig(tmp_path, api.url, (tls_dir / "ca.crt").read_bytes(), {"exec": exec_stanza(steps)})
    accept_tokens(api, set())
    with KubeClient.from_config(path, timeout=10) as client, pytest.raises(KubeError) as info:
        client.get("/api")
    assert info.value.status == 401
    assert len(api.requests) == 1  # the plugin gave the same token again: no pointless retry


def test_refresh_failure_later_is_a_one_line_kube_error(api: KubeTestServer, tls_dir: Path, tmp_path: Path) -> None:
    steps = script(tmp_path, {"token": "tok-1", "expires_in": 1.0}, {"exit": 1, "stderr": "SSO session expired"})
    path = kubeconfig(tmp_path, api.url, (tls_dir / "ca.crt").read_bytes(), {"exec": exec_stanza(steps)})
    accept_tokens(api, {"tok-1"})
    with KubeClient.from_config(path, timeout=10) as client:
        client.get("/api")
        time.sleep(1.1)
        with pytest.raises(KubeError) as info:
            client.get("/api")
    assert info.value.status == 0 and info.value.reason == "ExecCredentialFailed"
    assert "failed with exit code 1: SSO session expired" in str(info.value)
    assert "\n" not in str(info.value)


def test_client_certificate_from_plugin(tls_dir: Path, tmp_path: Path) -> None:
    client_ca = make_ca()
    pair = issue_client_cert(client_ca, "exec-user")
    steps = script(
        tmp_path, {"cert": pair.cert.public_bytes(Encoding.PEM).decode(), "key": key_to_pem(pair.key).decode()}
    )
    with KubeTestServer(tls_dir, client_ca=client_ca.cert) as server:
        server.route(lambda r: Reply(200, {"kind": "Status", "who": r.peer_cn, "auth": r.headers.get("authorization")}))
        path = kubeconfig(tmp_path, server.url, (tls_dir / "ca.crt").read_bytes(), {"exec": exec_stanza(steps)})
        with KubeClient.from_config(path, timeout=10) as client:
            assert client.get("/api") == {"kind": "Status", "who": "exec-user", "auth": None}


# -- one-line errors ---------------------------------------------------------------------------------------


def plugin_for(tmp_path: Path, *runs: dict[str, Any], **stanza: Any) -> ExecPlugin:
    return parse_exec(exec_stanza(script(tmp_path, *runs), **stanza), where="kubeconfig kc: user 'me'", base=tmp_path)


@pytest.mark.parametrize(
    ("step", "message"),
    [
        ({"exit": 3, "stderr": "line one\nAccessDenied: not authorized"}, "failed with exit code 3: AccessDenied"),
        ({"raw": "Please visit https://login to sign in"}, "printed no JSON ExecCredential"),
        ({"raw": "[1, 2]"}, "printed something other than an ExecCredential"),
        ({"token": "t", "apiVersion": V1BETA1}, "apiVersion 'client.authentication.k8s.io/v1beta1', the kubeconfig"),
        ({"raw": json.dumps({"apiVersion": V1, "kind": "ExecCredential"})}, "without a status"),
        ({"raw": json.dumps({"apiVersion": V1, "kind": "ExecCredential", "status": {}})}, "neither a token nor"),
        ({"cert": "-----BEGIN CERTIFICATE-----", "key": ""}, "only one of clientCertificateData"),
        ({"token": "t", "expires_in": -60}, "a credential that expired at"),
        (
            {
                "raw": json.dumps(
                    {
                        "apiVersion": V1,
                        "kind": "ExecCredential",
                        "status": {"token": "t", "expirationTimestamp": "tomorrow"},
                    }
                )
            },
            "not RFC 3339",
        ),
    ],
)
def test_plugin_failures_are_one_line(tmp_path: Path, step: dict[str, Any], message: str) -> None:
    with pytest.raises(ExecPluginError) as info:
        run_plugin(plugin_for(tmp_path, step))
    text = str(info.value)
    assert message in text and "\n" not in text and text.startswith("kubeconfig kc: user 'me': exec plugin")


def test_plugin_timeout_kills_it(tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(ExecPluginError, match=r"did not finish within 0.5 s"):
        run_plugin(plugin_for(tmp_path, {"token": "t", "sleep": 30}), timeout=0.5)
    assert time.monotonic() - started < 10


def test_missing_and_not_executable_plugins(tmp_path: Path) -> None:
    missing = parse_exec(
        {
            "apiVersion": V1,
            "command": "aws-iam-nonexistent",
            "interactiveMode": "Never",
            "installHint": "Install the AWS CLI:\n  https://aws.amazon.com/cli/",
        },
        where="kubeconfig kc: user 'me'",
        base=tmp_path,
    )
    with pytest.raises(ExecPluginError) as info:
        run_plugin(missing)
    assert str(info.value) == (
        "kubeconfig kc: user 'me': exec plugin 'aws-iam-nonexistent' not found "
        "(Install the AWS CLI: https://aws.amazon.com/cli/)"
    )
    script_file = tmp_path / "bin" / "get-token"
    script_file.parent.mkdir()
    script_file.write_text("#!/bin/sh\necho hi\n")
    relative = parse_exec(
        {"apiVersion": V1, "command": "./bin/get-token", "interactiveMode": "Never"},
        where="kubeconfig kc: user 'me'",
        base=tmp_path,
    )
    assert relative.command == str(script_file)  # relative to the kubeconfig's directory, as kubectl does
    with pytest.raises(ExecPluginError, match="is not executable"):
        run_plugin(relative)
    os.chmod(script_file, 0o755)
    with pytest.raises(ExecPluginError, match="printed no JSON"):
        run_plugin(relative)


@pytest.mark.parametrize(
    ("stanza", "message"),
    [
        ({"apiVersion": V1, "command": "x"}, "interactiveMode is required"),
        ({"apiVersion": V1, "command": "x", "interactiveMode": "Always"}, "Always needs a terminal"),
        ({"apiVersion": V1, "command": "x", "interactiveMode": "Sometimes"}, "must be Never, IfAvailable or Always"),
        ({"apiVersion": "client.authentication.k8s.io/v1alpha1", "command": "x"}, "v1alpha1' is not supported"),
        ({"apiVersion": V1, "interactiveMode": "Never"}, "exec needs a command"),
        ({"apiVersion": V1, "command": "x", "interactiveMode": "Never", "args": "--flag"}, "args must be a list"),
        ({"apiVersion": V1, "command": "x", "interactiveMode": "Never", "env": [{"value": "v"}]}, "env[0] needs"),
    ],
)
def test_exec_stanza_errors_at_load(tmp_path: Path, tls_dir: Path, stanza: dict[str, Any], message: str) -> None:
    path = kubeconfig(tmp_path, "https://127.0.0.1:6443", (tls_dir / "ca.crt").read_bytes(), {"exec": stanza})
    with pytest.raises(KubeConfigError) as info:
        load_kubeconfig(path)
    assert message in str(info.value) and f"kubeconfig {path}: user 'me'" in str(info.value)


def test_exec_with_a_token_or_auth_provider_is_refused(tmp_path: Path, tls_dir: Path) -> None:
    ca = (tls_dir / "ca.crt").read_bytes()
    both = kubeconfig(tmp_path, "https://h:1", ca, {"exec": exec_stanza(tmp_path / "s"), "token": "x"})
    with pytest.raises(KubeConfigError, match="sets both exec and token: keep one of them"):
        load_kubeconfig(both)
    legacy = kubeconfig(tmp_path, "https://h:1", ca, {"auth-provider": {"name": "gcp", "config": {}}})
    with pytest.raises(KubeConfigError) as info:
        load_kubeconfig(legacy)
    assert "legacy auth-provider 'gcp'" in str(info.value) and "exec plugin" in str(info.value)


def test_a_failing_plugin_fails_the_client_at_creation(tmp_path: Path, tls_dir: Path) -> None:
    steps = script(tmp_path, {"exit": 1, "stderr": "error: no credentials for profile prod"})
    path = kubeconfig(tmp_path, "https://127.0.0.1:1", (tls_dir / "ca.crt").read_bytes(), {"exec": exec_stanza(steps)})
    with pytest.raises(KubeConfigError, match="exit code 1: error: no credentials for profile prod"):
        KubeClient.from_config(path)


def test_fractional_and_zulu_timestamps(tmp_path: Path) -> None:
    plugin = plugin_for(tmp_path, {"token": "t"})
    for stamp, expected in (("2030-01-02T03:04:05Z", 1893553445.0), ("2030-01-02T03:04:05.5+00:00", 1893553445.5)):
        body = {"apiVersion": V1, "kind": "ExecCredential", "status": {"token": "t", "expirationTimestamp": stamp}}
        assert parse_credential(json.dumps(body).encode(), plugin, now=0).expires_at == expected
