"""`certs inject` against the real kube-apiserver through a kubeconfig whose user is an `exec` plugin, as on
EKS, GKE and AKS. The plugin is tests/fixtures/exec_plugin.py printing credentials the test API server
accepts: its static admin token (tokens.csv), or the admin client certificate."""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.cluster import ControlPlane
from tests.e2e.test_certs_e2e import certs, get_vwc, one_line_error
from tests.e2e.test_certs_e2e import webhook_name as webhook_name  # a fixture

pytestmark = pytest.mark.e2e

PLUGIN = Path(__file__).resolve().parents[1] / "fixtures" / "exec_plugin.py"


def exec_kubeconfig(cp: ControlPlane, tmp_path: Path, *runs: dict[str, Any]) -> tuple[Path, Path]:
    """A kubeconfig for the control plane whose only credential is the scripted exec plugin."""
    assert cp.pki is not None
    steps = tmp_path / "plugin.json"
    steps.write_text(json.dumps({"runs": list(runs)}))
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "cloud",
        "clusters": [
            {
                "name": "cloud",
                "cluster": {
                    "server": cp.server,
                    "certificate-authority-data": base64.b64encode(cp.pki.ca_cert.read_bytes()).decode(),
                },
            }
        ],
        "users": [
            {
                "name": "sso-user",
                "user": {
                    "exec": {
                        "apiVersion": "client.authentication.k8s.io/v1",
                        "command": sys.executable,
                        "args": [str(PLUGIN), str(steps)],
                        "interactiveMode": "IfAvailable",
                        "provideClusterInfo": True,
                    }
                },
            }
        ],
        "contexts": [{"name": "cloud", "context": {"cluster": "cloud", "user": "sso-user"}}],
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(doc))
    return path, steps


def runs_of(steps: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(f"{steps}.log").read_text().splitlines()]


def inject(bundle: Path, webhook: str, kubeconfig: Path, rc: int | None = 0) -> Any:
    return certs(
        "inject", "--ca-bundle", str(bundle), "--webhook-name", webhook, "--kubeconfig", str(kubeconfig), rc=rc
    )


def test_certs_inject_with_an_exec_token(control_plane: ControlPlane, webhook_name: str, tmp_path: Path) -> None:
    cp = control_plane
    assert cp.pki is not None
    certs("init", "--service", "gpu-admission", "--namespace", "gpu-admission", "--out", str(tmp_path / "tls"))
    bundle = tmp_path / "tls" / "ca-bundle.crt"
    # The first token is one the API server does not know (a revoked session): it answers 401, the client
    # runs the plugin again and retries with the fresh token.
    kubeconfig, steps = exec_kubeconfig(cp, tmp_path, {"token": "revoked-session"}, {"token": cp.pki.admin_token})
    proc = inject(bundle, webhook_name, kubeconfig)
    assert f"ValidatingWebhookConfiguration {webhook_name}: caBundle set for" in proc.stdout
    value = base64.b64encode(bundle.read_bytes()).decode()
    assert [h["clientConfig"].get("caBundle") for h in get_vwc(cp, webhook_name)["webhooks"]] == [value, value]
    first, _ = runs_of(steps)
    assert first["exec_info"]["spec"]["interactive"] is False
    assert first["exec_info"]["spec"]["cluster"]["server"] == cp.server


def test_certs_inject_with_an_exec_client_certificate(
    control_plane: ControlPlane, webhook_name: str, tmp_path: Path
) -> None:
    cp = control_plane
    assert cp.pki is not None
    certs("init", "--service", "gpu-admission", "--namespace", "gpu-admission", "--out", str(tmp_path / "tls"))
    bundle = tmp_path / "tls" / "ca-bundle.crt"
    pair = {"cert": cp.pki.admin_cert.read_text(), "key": cp.pki.admin_key.read_text(), "expires_in": 600}
    kubeconfig, _ = exec_kubeconfig(cp, tmp_path, pair)
    proc = inject(bundle, webhook_name, kubeconfig)
    assert "caBundle set for" in proc.stdout


def test_a_failing_exec_plugin_is_a_one_line_error(
    control_plane: ControlPlane, webhook_name: str, tmp_path: Path
) -> None:
    certs("init", "--service", "gpu-admission", "--namespace", "gpu-admission", "--out", str(tmp_path / "tls"))
    kubeconfig, _ = exec_kubeconfig(
        control_plane, tmp_path, {"exit": 255, "stderr": "Token has expired and refresh failed"}
    )
    proc = inject(tmp_path / "tls" / "ca-bundle.crt", webhook_name, kubeconfig, rc=None)
    line = one_line_error(proc, 2)
    assert "exec plugin" in line and "failed with exit code 255: Token has expired and refresh failed" in line
    assert all("caBundle" not in h["clientConfig"] for h in get_vwc(control_plane, webhook_name)["webhooks"])
