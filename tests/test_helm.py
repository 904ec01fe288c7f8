"""The Helm chart (deploy/helm/gpu-admission): generated from the kustomize manifests, the same objects for
the default values, and every documented option renders, lints and means what docs/deploy.md says.

`helm` is built from Go modules by scripts/helm/build.sh (cached). The real API server's dry-run of every
render and an install/upgrade/uninstall are in tests/e2e/test_helm_e2e.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from scripts.helm.generate import NAMESPACE
from tests.helmchart import CHART, OPTIONS, POLICY_FILE, ROOT, by_key, helm, template
from tests.test_deploy import docs_of, one
from webhook.cli import build_parser
from webhook.cmd_serve import LEDGER_LEASE


def test_chart_is_generated_from_the_manifests() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "scripts.helm.generate", "--check"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(("values", "render"), [([], "base"), (OPTIONS["cert-manager"], "cert-manager")])
def test_default_values_give_the_kustomize_objects(values: list[str], render: str) -> None:
    helm_objects = by_key(template(*values))
    kustomize_objects = by_key(docs_of(render))
    assert sorted(helm_objects) == sorted(kustomize_objects)
    for key, obj in kustomize_objects.items():
        assert helm_objects[key] == obj, key


@pytest.mark.parametrize("option", list(OPTIONS))
def test_every_option_lints(option: str) -> None:
    proc = helm("lint", "--strict", str(CHART), *OPTIONS[option])
    assert "1 chart(s) linted, 0 chart(s) failed" in proc.stdout


def _server(objs: list[dict[str, Any]]) -> dict[str, Any]:
    deployment = one(objs, "Deployment", "gpu-admission")
    (server,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "server"]
    return server


def _hooks(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    kinds = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
    return [h for o in objs if o["kind"] in kinds for h in o["webhooks"]]


def _changed(option: str) -> dict[tuple[str, str, str, str], dict[str, Any]]:
    """The objects an option changes, against the default render."""
    default, rendered = by_key(template()), by_key(template(*OPTIONS[option]))
    return {k: v for k, v in rendered.items() if default.get(k) != v}


def test_replicas() -> None:
    objs = template(*OPTIONS["replicas"])
    assert one(objs, "Deployment", "gpu-admission")["spec"]["replicas"] == 3
    assert [k[1] for k in _changed("replicas")] == ["Deployment"]


def test_failure_policy() -> None:
    hooks = _hooks(template(*OPTIONS["failure-policy"]))
    assert hooks and {h["failurePolicy"] for h in hooks} == {"Ignore"}
    assert sorted(k[1] for k in _changed("failure-policy")) == [
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    ]


def _excluded(objs: list[dict[str, Any]]) -> set[tuple[str, ...]]:
    """The NotIn namespace lists of the webhooks (the policy webhook selects its own namespace with In)."""
    found = set()
    for hook in _hooks(objs):
        (expression,) = hook["namespaceSelector"]["matchExpressions"]
        if expression["operator"] == "NotIn":
            found.add(tuple(expression["values"]))
        else:
            assert (expression["operator"], expression["values"]) == ("In", [NAMESPACE]), hook["name"]
    return found


def test_excluded_namespaces_always_keep_our_own(tmp_path: Path) -> None:
    assert _excluded(template()) == {("kube-system", "kube-node-lease", "kube-public", NAMESPACE)}
    assert _excluded(template(*OPTIONS["excluded-namespaces"])) == {
        ("kube-system", "kube-node-lease", "kube-public", "monitoring", NAMESPACE)
    }
    (tmp_path / "none.yaml").write_text("excludedNamespaces: []\n")
    assert _excluded(template("-f", str(tmp_path / "none.yaml"))) == {(NAMESPACE,)}
    assert _excluded(template("--set", f"excludedNamespaces={{{NAMESPACE},kube-system}}")) == {
        (NAMESPACE, "kube-system")
    }


def test_resources_image_and_policy() -> None:
    server = _server(template(*OPTIONS["resources"]))
    assert server["resources"] == {
        "requests": {"cpu": "200m", "memory": "128Mi"},
        "limits": {"cpu": "1", "memory": "512Mi"},
    }
    images = {c["image"] for o in template(*OPTIONS["image"]) for c in _pod_containers(o)}
    assert images == {"registry.example.com/ml/gpu-admission:0.1.1"}
    policy = one(template(*OPTIONS["policy"]), "ConfigMap", "gpu-admission-policy")
    assert policy["data"]["policy.yaml"] == POLICY_FILE.read_text()
    assert [k[1:] for k in _changed("policy")] == [("ConfigMap", NAMESPACE, "gpu-admission-policy")]


def _pod_containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    spec = obj.get("spec", {})
    if obj["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    return list(spec.get("template", {}).get("spec", {}).get("containers", []))


def test_audit_options_reach_the_server_command() -> None:
    server = _server(template(*OPTIONS["audit-file"]))
    args = build_parser().parse_args(server["args"])
    assert (args.audit_stdout, args.audit_file, args.audit_backups, args.audit_compress, args.audit_queue) == (
        False, "/tmp/audit/decisions.jsonl", 3, True, 5000,
    )  # fmt: skip
    assert args.audit_max_bytes == 20 * 1024 * 1024
    default = build_parser().parse_args(_server(template())["args"])
    assert default.audit_stdout and default.audit_file is None


def test_limits_reach_the_server_command(tmp_path: Path) -> None:
    """Each limit value sets its flag; null leaves the server's default. From a values file numbers are float64
    to Helm: an integer limit must still arrive as digits (16777216, not 1.6777216e+07)."""
    (tmp_path / "limits.yaml").write_text(
        "limits: {maxBody: 16777216, maxBytesInflight: 67108864, maxHeaderBytes: 65536, maxConnections: 900,\n"
        "         headerTimeout: 3, bodyTimeout: 12.5, idleTimeout: 2.5, keepaliveTimeout: 95, handshakeTimeout: 4}\n"
    )
    server = _server(template("-f", str(tmp_path / "limits.yaml")))
    assert "16777216" in server["args"]
    args = build_parser().parse_args(server["args"])
    assert (args.max_body, args.max_bytes_inflight, args.max_header_bytes, args.max_connections) == (
        16777216, 67108864, 65536, 900,
    )  # fmt: skip
    assert (args.header_timeout, args.body_timeout, args.idle_timeout, args.handshake_timeout) == (3, 12.5, 2.5, 4)
    assert args.keepalive_timeout == 95
    set_args = build_parser().parse_args(_server(template(*OPTIONS["limits"]))["args"])
    assert (set_args.max_body, set_args.max_connections, set_args.idle_timeout, set_args.handshake_timeout) == (
        16777216, 900, 2.5, 4,
    )  # fmt: skip
    default, parsed = build_parser().parse_args(_server(template())["args"]), set_args
    assert (parsed.max_header_bytes, parsed.header_timeout) == (default.max_header_bytes, default.header_timeout)
    assert [k[1] for k in _changed("limits")] == ["Deployment"]


@pytest.mark.parametrize(("option", "render"), [("validate-pods", "validate-pods"), ("scan", "scan")])
def test_overlay_values_give_the_overlay_objects(option: str, render: str) -> None:
    """validatePods and scan.interval give what `kubectl apply -k deploy/overlays/<that>` applies."""
    values = OPTIONS[option] if option != "scan" else ["--set", "scan.interval=3600"]
    helm_objects = by_key(template(*values))
    kustomize_objects = by_key(docs_of(render))
    assert sorted(helm_objects) == sorted(kustomize_objects)
    for key, obj in kustomize_objects.items():
        assert helm_objects[key] == obj, key


def test_scan_values_reach_the_server_command() -> None:
    args = build_parser().parse_args(_server(template(*OPTIONS["scan"]))["args"])
    assert (args.scan_interval, args.scan_qps, args.scan_page_size) == (3600, 5, 500)
    assert build_parser().parse_args(_server(template())["args"]).scan_interval == 0
    assert not [o for o in template() if o["metadata"]["name"] == "gpu-admission-scan"]


def test_native_sets_the_flag_and_nothing_else() -> None:
    assert build_parser().parse_args(_server(template(*OPTIONS["native"]))["args"]).native is True
    assert build_parser().parse_args(_server(template())["args"]).native is False
    assert [k[1] for k in _changed("native")] == ["Deployment"]


def test_ledger_leader_election_is_on_by_default_and_can_be_turned_off() -> None:
    assert build_parser().parse_args(_server(template())["args"]).ledger_lease == LEDGER_LEASE
    off = template(*OPTIONS["no-ledger-election"])
    assert build_parser().parse_args(_server(off)["args"]).ledger_lease == ""
    assert [k[1] for k in _changed("no-ledger-election")] == ["Deployment"]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (["--set", "ledgerLeaderElection=maybe"], "/ledgerLeaderElection"),
        (["--set", "scan.interval=30"], "/scan/interval"),
        (["--set", "limits.idleTimeout=0"], "/limits/idleTimeout"),
        (["--set", "limits.idleTimeout=0.0"], "/limits/idleTimeout"),
        (["--set", "limits.keepaliveTimeout=0"], "/limits/keepaliveTimeout"),
        (["--set", "limits.bodyTimeout=soon"], "/limits/bodyTimeout"),
        (["--set", "limits.maxBody=-1"], "/limits/maxBody"),
        (["--set", "validatePods=yes"], "/validatePods"),
        (["--set", "replicas=0"], "replicas"),
        (["--set", "failurePolicy=Maybe"], "failurePolicy"),
        (["--set", "certificates.mode=vault"], "/certificates/mode"),
        (["--set", "excludedNamespaces={Not_A_Name}"], "/excludedNamespaces/0"),
        (["--set", "audit.file=/var/log/audit.jsonl"], "/audit/file"),
        (["--set", "replica=3"], "replica"),
    ],
)
def test_schema_rejects_bad_values(values: list[str], message: str) -> None:
    proc = helm("template", "gpu-admission", str(CHART), *values, check=False)
    assert proc.returncode != 0 and "values don't meet the specifications of the schema" in proc.stderr
    assert message in proc.stderr
