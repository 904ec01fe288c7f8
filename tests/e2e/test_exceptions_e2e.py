"""GPUPolicyExceptions and the namespace enforcement label on the real control plane (issue #17, item 1).

The CRD, its RBAC and the webhook configurations come from deploy/ as operators install them; the API server
runs the RBAC authorizer (tests/e2e/cluster.py: --authorization-mode=RBAC), and users are impersonated with
`kubectl --as/--as-group` by the admin (system:masters), so every "forbidden" below is the real authorizer's
or the real webhook's answer.
"""

from __future__ import annotations

import copy
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import yaml

from tests.e2e import crds
from tests.e2e.cluster import ControlPlane
from tests.e2e.webhook import Webhook, render

pytestmark = pytest.mark.e2e

Obj = dict[str, Any]
APPROVERS = "gpu-admission:exception-approvers"
AS_APPROVER = ("--as=alice", f"--as-group={APPROVERS}")
AS_USER = ("--as=mallory", "--as-group=ml-team")


def stamp(delta: timedelta) -> str:
    return (datetime.now(UTC) + delta).strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.fixture(scope="module")
def installed(control_plane: ControlPlane) -> None:
    """The workload CRDs, and from deploy/: the GPUPolicyException CRD and its RBAC (before the server starts,
    so its watch finds the resource at once)."""
    crds.install(control_plane)
    wanted = [
        d
        for d in render(control_plane)
        if d["kind"] == "CustomResourceDefinition"
        or (d["kind"] in ("ClusterRole", "ClusterRoleBinding") and "exception" in d["metadata"]["name"])
    ]
    assert len(wanted) == 4, [d["metadata"]["name"] for d in wanted]
    control_plane.kubectl("apply", "-f", "-", input={"apiVersion": "v1", "kind": "List", "items": wanted})
    control_plane.kubectl(
        "wait", "--for=condition=Established", "crd/gpupolicyexceptions.gpu-admission.io", "--timeout=60s"
    )
    # Tenants may edit their namespaces (so only the webhook stands between them and the label).
    rbac = [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "e2e-namespace-editor"},
            "rules": [{"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "patch", "update"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "e2e-namespace-editor"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "e2e-namespace-editor"},
            "subjects": [
                {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "mallory"},
                {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": APPROVERS},
            ],
        },
    ]
    control_plane.kubectl("apply", "-f", "-", input={"apiVersion": "v1", "kind": "List", "items": rbac})


@pytest.fixture(scope="module")
def webhook(control_plane: ControlPlane, installed: None) -> Iterator[Webhook]:
    wh = Webhook(control_plane)
    try:
        yield wh
    finally:
        wh.close()


def exception(ns: str, name: str = "dpo-trial", **spec: Any) -> Obj:
    body: Obj = {
        "rules": ["training-elastic-shrink"],
        "workloads": {"names": ["dpo"]},
        "reason": "elastic DPO trial on spare capacity, INC-4211",
        "requester": "alice@example.com",
        "approver": "platform-oncall@example.com",
        "until": stamp(timedelta(days=7)),
    }
    body.update(spec)
    return {
        "apiVersion": "gpu-admission.io/v1alpha1",
        "kind": "GPUPolicyException",
        "metadata": {"name": name, "namespace": ns},
        "spec": body,
    }


def elastic_job(name: str, gpus: int = 4) -> Obj:
    container = {"name": "pytorch", "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                 "resources": {"limits": {"nvidia.com/gpu": gpus}}}  # fmt: skip
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "labels": {"kueue.x-k8s.io/queue-name": "research"}},
        "spec": {
            "elasticPolicy": {"rdzvBackend": "c10d", "minReplicas": 1, "maxReplicas": 4},
            "pytorchReplicaSpecs": {
                "Worker": {"replicas": 2, "template": {"spec": {"containers": [container]}}},
            },
        },
    }


def apply(cp: ControlPlane, ns: str, obj: Obj, *flags: str) -> subprocess.CompletedProcess[str]:
    return cp.kubectl("apply", "-n", ns, "-f", "-", *flags, input=yaml.safe_dump(obj), check=False)


def dry_run(cp: ControlPlane, ns: str, obj: Obj) -> subprocess.CompletedProcess[str]:
    return apply(cp, ns, obj, "--dry-run=server")


def wait_for(what: str, predicate: Any, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.3)


# -- acceptance: one named workload through one rule, nothing else, until it expires -----------------------


def test_an_exception_lets_one_workload_through_one_rule_and_stops_when_it_expires(
    control_plane: ControlPlane, webhook: Webhook, namespace: str
) -> None:
    cp = control_plane
    before = dry_run(cp, namespace, elastic_job("dpo"))
    assert before.returncode != 0 and "denied the request: training-elastic-shrink" in before.stderr, before.stderr

    until = stamp(timedelta(seconds=40))
    created = apply(cp, namespace, exception(namespace, until=until), *AS_APPROVER)
    assert created.returncode == 0, created.stderr

    # The server's watch picks it up (the first dry run after that is allowed).
    allowed = wait_for(
        "the exception to take effect", lambda: (r := dry_run(cp, namespace, elastic_job("dpo"))).returncode == 0 and r
    )
    assert f"Warning: training-elastic-shrink excepted by {namespace}/dpo-trial until {until}" in allowed.stderr

    # Nothing else: another rule on the same workload, and the same rule on another workload, still deny.
    other_rule = dry_run(cp, namespace, elastic_job("dpo", gpus=16))
    assert other_rule.returncode != 0 and "denied the request: gpu-request-fits" in other_rule.stderr
    assert "training-elastic-shrink" not in other_rule.stderr.split("denied the request:")[1]
    other_job = dry_run(cp, namespace, elastic_job("sft"))
    assert other_job.returncode != 0 and "denied the request: training-elastic-shrink" in other_job.stderr

    # The workload really exists, and the audit log says which exception let it through.
    assert apply(cp, namespace, elastic_job("dpo")).returncode == 0

    def dpo_excepted(r: dict[str, Any]) -> bool:
        return (
            r.get("name") == "dpo"
            and r.get("namespace") == namespace
            and r.get("exceptions") == [f"{namespace}/dpo-trial"]
        )

    assert webhook.wait_audit(dpo_excepted), webhook.audit_records()[-3:]

    cp.kubectl("delete", "pytorchjob", "dpo", "-n", namespace)  # (an unchanged re-apply is never sent to us)

    # Past `until`, the rule applies again and says why.
    expired_at = datetime.strptime(until, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    time.sleep(max(0.0, expired_at - time.time() + 0.5))
    after = dry_run(cp, namespace, elastic_job("dpo"))
    assert after.returncode != 0 and "denied the request: training-elastic-shrink" in after.stderr
    assert f"Warning: training-elastic-shrink applies again: exception {namespace}/dpo-trial expired" in after.stderr
    assert webhook.server is not None
    with webhook.server.client() as client:
        metrics = client.get("/metrics").raise_for_status().text
    assert (
        f'gpu_admission_exceptions_applied_total{{exception="{namespace}/dpo-trial",rule="training-elastic-shrink"}}'
        in metrics
    )
    assert "exception expired: ignored" in webhook.server.log_tail(100_000)


# -- acceptance: RBAC -------------------------------------------------------------------------------------


def test_only_the_approver_group_may_create_an_exception(
    control_plane: ControlPlane, webhook: Webhook, namespace: str
) -> None:
    cp = control_plane
    refused = apply(cp, namespace, exception(namespace, "by-mallory"), *AS_USER)
    assert refused.returncode != 0
    assert 'gpupolicyexceptions.gpu-admission.io "by-mallory" is forbidden: User "mallory" cannot' in refused.stderr
    # The built-in edit role (aggregated) reads exceptions but cannot write them.
    cp.kubectl("create", "rolebinding", "mallory-edit", "-n", namespace, "--clusterrole=edit", "--user=mallory")
    wait_for(
        "edit to aggregate read access",
        lambda: cp.kubectl("get", "gpupolicyexceptions", "-n", namespace, *AS_USER, check=False).returncode == 0,
    )
    still = apply(cp, namespace, exception(namespace, "by-mallory"), *AS_USER)
    assert still.returncode != 0 and "is forbidden" in still.stderr
    granted = apply(cp, namespace, exception(namespace, "by-alice"), *AS_APPROVER)
    assert granted.returncode == 0, granted.stderr
    patched = cp.kubectl("patch", "gpupolicyexception", "by-alice", "-n", namespace, "--type=merge",
                         "-p", '{"spec":{"reason":"extended"}}', *AS_USER, check=False)  # fmt: skip
    assert patched.returncode != 0 and "is forbidden" in patched.stderr


def label(cp: ControlPlane, ns: str, value: str, *who: str) -> subprocess.CompletedProcess[str]:
    return cp.kubectl(
        "label", "namespace", ns, f"gpu-admission.io/enforcement={value}", "--overwrite", *who, check=False
    )


def test_only_the_approver_group_may_flip_the_enforcement_label(
    control_plane: ControlPlane, webhook: Webhook, namespace: str
) -> None:
    cp = control_plane
    refused = label(cp, namespace, "off", *AS_USER)
    assert refused.returncode != 0, refused.stdout
    assert (
        'admission webhook "namespaces.validate.gpu-admission.io" denied the request: changing namespace label '
        "gpu-admission.io/enforcement (unset to 'off') needs membership of group " + APPROVERS
    ) in refused.stderr
    # Mallory can still edit her namespace otherwise: only this label is guarded.
    other = cp.kubectl("label", "namespace", namespace, "team=ml", *AS_USER, check=False)
    assert other.returncode == 0, other.stderr
    assert label(cp, namespace, "warn", *AS_APPROVER).returncode == 0
    assert label(cp, namespace, "enforce", *AS_USER).returncode != 0
    removed = cp.kubectl("label", "namespace", namespace, "gpu-admission.io/enforcement-", *AS_USER, check=False)
    assert removed.returncode != 0 and "('warn' to unset)" in removed.stderr
    typo = label(cp, namespace, "of", *AS_APPROVER)
    assert typo.returncode != 0 and "Unsupported value: 'of'" in typo.stderr
    labels = cp.get_json("namespace", namespace)["metadata"]["labels"]
    assert labels["gpu-admission.io/enforcement"] == "warn" and labels["team"] == "ml"


def test_cluster_admins_change_the_label_even_with_the_webhook_down(
    control_plane: ControlPlane, webhook: Webhook, namespace: str
) -> None:
    """Never a lock-out: system:masters is never sent to the webhook (failurePolicy Fail notwithstanding)."""
    cp = control_plane
    webhook.stop_server()
    try:
        assert label(cp, namespace, "audit").returncode == 0  # the admin kubeconfig: system:masters
        down = label(cp, namespace, "off", *AS_APPROVER)
        assert down.returncode != 0 and "failed calling webhook" in down.stderr  # fails closed for others
        plain = cp.kubectl("label", "namespace", namespace, "team=ml", *AS_USER, check=False)
        assert plain.returncode == 0, plain.stderr  # and other namespace updates never wait on it
    finally:
        webhook.start_server()


# -- acceptance: hostile exceptions are refused at apply, with a field path --------------------------------


HOSTILE: list[tuple[str, dict[str, Any], str]] = [
    ("In without values", {"workloads": {"selector": {"matchExpressions": [{"key": "team", "operator": "In"}]}}},
     "spec.workloads.selector.matchExpressions[0].values"),
    ("an unknown operator",
     {"workloads": {"selector": {"matchExpressions": [{"key": "team", "operator": "Like", "values": ["a"]}]}}},
     'spec.workloads.selector.matchExpressions[0].operator: Unsupported value: "Like"'),
    ("a bad label key", {"workloads": {"selector": {"matchLabels": {"bad key!": "x"}}}},
     "spec.workloads.selector.matchLabels: Invalid value"),
    ("a bad label value", {"workloads": {"selector": {"matchLabels": {"team": "a b"}}}},
     "spec.workloads.selector.matchLabels.team"),
    ("an empty selector", {"workloads": {"selector": {}}}, "spec.workloads.selector: Invalid value"),
    ("no workloads", {"workloads": {}}, "spec.workloads: Invalid value"),
    ("an unknown rule", {"rules": ["training-pool"]}, 'spec.rules[0]: Unsupported value: "training-pool"'),
    ("until not a date", {"until": "next tuesday"}, "spec.until"),
    ("until in the past", {"until": "2020-01-01T00:00:00Z"},
     'spec.until: Invalid value: \'2020-01-01T00:00:00Z\': must be in the future'),
    ("until more than 366 days ahead", {"until": stamp(timedelta(days=400))}, "must be at most 366 days"),
    ("approver is the requester", {"approver": "alice@example.com"}, "spec.approver: Invalid value"),
]  # fmt: skip


@pytest.mark.parametrize(("spec", "path"), [(s, p) for _, s, p in HOSTILE], ids=[d for d, _, _ in HOSTILE])
def test_a_hostile_exception_is_refused_at_apply_with_its_field_path(
    control_plane: ControlPlane, webhook: Webhook, namespace: str, spec: dict[str, Any], path: str
) -> None:
    r = apply(control_plane, namespace, exception(namespace, **copy.deepcopy(spec)), *AS_APPROVER)
    assert r.returncode != 0, r.stdout
    assert path in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    got = control_plane.kubectl("get", "gpupolicyexceptions", "-n", namespace, "-o", "name").stdout
    assert got.strip() == ""
