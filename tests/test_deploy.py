"""Safety properties of the deployment: kustomize renders, webhooks, RBAC, certificates, Dockerfile.

Renders `deploy/` and its overlays (cert-manager, validate-pods) with `kubectl kustomize` and checks what an
operator relies on: at least two spread replicas behind a PDB, a locked-down pod, webhooks that fail closed but never
cover the control plane or our own namespace, CEL conditions that cannot error, read-only RBAC for the
server, the certificate script's order of operations, and a lint of the Dockerfile.

The CEL matchConditions are checked structurally here and, when `celpy` (PyPI: cel-python) is installed,
evaluated on sample objects of every kind. The real API server's compile + dry-run is an e2e test.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import tomllib
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from webhook.cmd_serve import LEDGER_LEASE

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
BIND_HOOK = "bindings.validate.gpu-admission.io"  # fails open: never stops binding (reserved-bind)
BASE = DEPLOY / "base"
OVERLAY = DEPLOY / "overlays" / "cert-manager"
VALIDATE_PODS = DEPLOY / "overlays" / "validate-pods"
DOCKERFILE = ROOT / "Dockerfile"
DOCS = ROOT / "docs" / "deploy.md"

NS = "gpu-admission"
EXCLUDED_NAMESPACES = {"kube-system", "kube-node-lease", "kube-public", NS}
POLICY_CM = "gpu-admission-policy"
TLS_SECRET = "gpu-admission-tls"
SERVER_SA = "gpu-admission"
CERTS_SA = "gpu-admission-certs"
SERVE_ARGS = [
    "serve", "--port", "8443", "--tls-cert", "/tls/tls.crt", "--tls-key", "/tls/tls.key",
    "--policy-configmap", "gpu-admission/gpu-admission-policy",
    "--exception-group", "gpu-admission:exception-approvers", "--audit-stdout",
]  # fmt: skip
WORKLOAD_KINDS_RESOURCES = {
    ("apps", "deployments"), ("apps", "statefulsets"), ("apps", "replicasets"), ("apps", "daemonsets"),
    ("batch", "jobs"), ("batch", "cronjobs"), ("", "pods"),
    ("kubeflow.org", "pytorchjobs"), ("kubeflow.org", "tfjobs"), ("kubeflow.org", "mpijobs"),
    ("kubeflow.org", "xgboostjobs"), ("kubeflow.org", "paddlejobs"), ("jobset.x-k8s.io", "jobsets"),
    ("leaderworkerset.x-k8s.io", "leaderworkersets"), ("batch.volcano.sh", "jobs"),
    ("ray.io", "rayjobs"), ("ray.io", "rayclusters"), ("ray.io", "rayservices"),
    ("serving.kserve.io", "inferenceservices"), ("serving.kserve.io", "llminferenceservices"),
}  # fmt: skip
# Kinds whose pods the API server cannot see from the object (a TrainJob's are in its runtime): every object
# of these is sent, with no GPU condition (deploy/base/webhook-*.yaml says why).
ALWAYS_SENT = {("trainer.kubeflow.org", "trainjobs")}

# Spec §7: every kind the webhook must see -> (API group, resource). Pod templates: both configurations.
TEMPLATE_KINDS: dict[str, tuple[str, str]] = {
    "Pod": ("", "pods"),
    "Deployment": ("apps", "deployments"),
    "StatefulSet": ("apps", "statefulsets"),
    "ReplicaSet": ("apps", "replicasets"),
    "DaemonSet": ("apps", "daemonsets"),
    "Job": ("batch", "jobs"),
    "CronJob": ("batch", "cronjobs"),
    "PyTorchJob": ("kubeflow.org", "pytorchjobs"),
    "TFJob": ("kubeflow.org", "tfjobs"),
    "MPIJob": ("kubeflow.org", "mpijobs"),
    "XGBoostJob": ("kubeflow.org", "xgboostjobs"),
    "PaddleJob": ("kubeflow.org", "paddlejobs"),
    "JobSet": ("jobset.x-k8s.io", "jobsets"),
    "LeaderWorkerSet": ("leaderworkerset.x-k8s.io", "leaderworkersets"),
    "Volcano Job": ("batch.volcano.sh", "jobs"),
    "RayJob": ("ray.io", "rayjobs"),
    "RayCluster": ("ray.io", "rayclusters"),
    "RayService": ("ray.io", "rayservices"),
    "InferenceService": ("serving.kserve.io", "inferenceservices"),
    "LLMInferenceService": ("serving.kserve.io", "llminferenceservices"),
    "TrainJob": ("trainer.kubeflow.org", "trainjobs"),
}
# Validating only.
VALIDATE_ONLY_KINDS: dict[str, tuple[str, str]] = {
    "HorizontalPodAutoscaler": ("autoscaling", "horizontalpodautoscalers"),
    "ScaledObject": ("keda.sh", "scaledobjects"),
    "ConfigMap": ("", "configmaps"),
}
READ_VERBS = {"get", "list", "watch"}


# -- rendering -------------------------------------------------------------------------------------------


def _kustomize(path: Path) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    assert kubectl is not None, "kubectl is required (README): without it deploy/ cannot be rendered and checked"
    proc = subprocess.run([kubectl, "kustomize", str(path)], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, f"kubectl kustomize {path.relative_to(ROOT)} failed:\n{proc.stderr}"
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


@cache
def _render(which: str) -> tuple[dict[str, Any], ...]:
    paths = {
        "base": DEPLOY,
        "cert-manager": OVERLAY,
        "validate-pods": VALIDATE_PODS,
        "scan": DEPLOY / "overlays" / "scan",
    }
    return tuple(_kustomize(paths[which]))


def docs_of(which: str) -> list[dict[str, Any]]:
    return copy.deepcopy(list(_render(which)))


def find(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = find(docs, kind, name)
    assert len(found) == 1, f"expected exactly one {kind} {name}, found {len(found)}"
    return found[0]


RENDERS = ["base", "cert-manager", "validate-pods"]


@pytest.fixture(params=RENDERS)
def rendered(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    return docs_of(request.param)


def deployment(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return one(docs, "Deployment", "gpu-admission")


def pod_templates(docs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every pod template in the render: Deployment, Job, CronJob."""
    for d in docs:
        if d["kind"] in ("Deployment", "Job"):
            yield f"{d['kind']}/{d['metadata']['name']}", d["spec"]["template"]
        elif d["kind"] == "CronJob":
            yield f"CronJob/{d['metadata']['name']}", d["spec"]["jobTemplate"]["spec"]["template"]


def all_webhooks(docs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        for cfg in find(docs, kind):
            for hook in cfg["webhooks"]:
                yield kind, hook


def selector_matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    match_labels = selector.get("matchLabels") or {}
    return bool(match_labels) and all(labels.get(k) == v for k, v in match_labels.items())


# -- render: objects and fixed names ---------------------------------------------------------------------


def test_base_renders_every_object() -> None:
    docs = docs_of("base")
    for kind, name in [
        ("Namespace", NS),
        ("ServiceAccount", SERVER_SA),
        ("ServiceAccount", CERTS_SA),
        ("ClusterRole", "gpu-admission"),
        ("ClusterRoleBinding", "gpu-admission"),
        ("Role", "gpu-admission"),
        ("RoleBinding", "gpu-admission"),
        ("ConfigMap", POLICY_CM),
        ("Service", "gpu-admission"),
        ("Deployment", "gpu-admission"),
        ("PodDisruptionBudget", "gpu-admission"),
        ("Job", "gpu-admission-certs"),
        ("CronJob", "gpu-admission-certs-rotate"),
        ("MutatingWebhookConfiguration", "gpu-admission"),
        ("ValidatingWebhookConfiguration", "gpu-admission"),
    ]:
        one(docs, kind, name)
    for d in docs:
        cluster_scoped = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"}
        if d["kind"] not in cluster_scoped and "Webhook" not in d["kind"]:
            assert d["metadata"].get("namespace") == NS, f"{d['kind']} {d['metadata']['name']} not in {NS}"


def test_top_level_kustomization_points_at_base() -> None:
    top = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    assert top["resources"] == ["base"]


def test_service_and_container_ports(rendered: list[dict[str, Any]]) -> None:
    svc = one(rendered, "Service", "gpu-admission")
    assert svc["spec"].get("type", "ClusterIP") == "ClusterIP"
    (port,) = svc["spec"]["ports"]
    assert (port["name"], port["port"], port["targetPort"]) == ("https", 443, "https")
    pod = deployment(rendered)["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    assert {"name": "https", "containerPort": 8443, "protocol": "TCP"} in container["ports"]
    assert selector_matches({"matchLabels": svc["spec"]["selector"]}, pod["metadata"]["labels"])


def test_server_command_is_the_fixed_one(rendered: list[dict[str, Any]]) -> None:
    (container,) = deployment(rendered)["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["gpu-admission"]
    assert container["args"] == SERVE_ARGS
    assert container["image"].startswith("gpu-admission:")


def test_tls_secret_mounted_at_tls_without_the_ca_key(rendered: list[dict[str, Any]]) -> None:
    spec = deployment(rendered)["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    tls = mounts["/tls"]
    assert tls.get("readOnly") is True and "subPath" not in tls, "no subPath: rotated files must show up"
    volume = next(v for v in spec["volumes"] if v["name"] == tls["name"])
    assert volume["secret"]["secretName"] == TLS_SECRET
    keys = {item["key"] for item in volume["secret"]["items"]}
    assert keys == {"tls.crt", "tls.key", "ca.crt"}, "the server must not see ca.key"
    tmp = next(v for v in spec["volumes"] if v["name"] == mounts["/tmp"]["name"])
    assert "emptyDir" in tmp


# -- the Deployment's safety properties ------------------------------------------------------------------


def test_replicas_and_rollout_keep_two_serving(rendered: list[dict[str, Any]]) -> None:
    spec = deployment(rendered)["spec"]
    assert spec["replicas"] >= 2
    rolling = spec["strategy"]["rollingUpdate"]
    assert spec["strategy"]["type"] == "RollingUpdate" and rolling["maxUnavailable"] == 0


def test_pdb_selects_the_server_pods_only(rendered: list[dict[str, Any]]) -> None:
    pdb = one(rendered, "PodDisruptionBudget", "gpu-admission")
    assert pdb["spec"]["minAvailable"] == 1
    pods = dict(pod_templates(rendered))
    assert selector_matches(pdb["spec"]["selector"], pods["Deployment/gpu-admission"]["metadata"]["labels"])
    svc_selector = {"matchLabels": one(rendered, "Service", "gpu-admission")["spec"]["selector"]}
    for where, tpl in pods.items():
        if where != "Deployment/gpu-admission":
            labels = tpl["metadata"].get("labels", {})
            assert not selector_matches(pdb["spec"]["selector"], labels), f"PDB selects {where}"
            assert not selector_matches(svc_selector, labels), f"Service selects {where}"


def test_spread_across_nodes(rendered: list[dict[str, Any]]) -> None:
    spec = deployment(rendered)["spec"]["template"]["spec"]
    labels = deployment(rendered)["spec"]["template"]["metadata"]["labels"]
    anti = spec["affinity"]["podAntiAffinity"]
    terms = [t["podAffinityTerm"] for t in anti.get("preferredDuringSchedulingIgnoredDuringExecution", [])]
    terms += anti.get("requiredDuringSchedulingIgnoredDuringExecution", [])
    assert any(
        t["topologyKey"] == "kubernetes.io/hostname" and selector_matches(t["labelSelector"], labels) for t in terms
    ), "pod anti-affinity across nodes"
    spreads = spec["topologySpreadConstraints"]
    by_key = {c["topologyKey"]: c for c in spreads}
    host = by_key["kubernetes.io/hostname"]
    assert host["maxSkew"] == 1 and selector_matches(host["labelSelector"], labels)
    if host["whenUnsatisfiable"] == "DoNotSchedule":
        # A hard spread must not count tainted GPU nodes as empty domains, nor old + new ReplicaSet pods
        # together, or a rolling update on a small cluster deadlocks.
        assert host.get("nodeTaintsPolicy") == "Honor"
        assert host.get("matchLabelKeys") == ["pod-template-hash"]


def test_priority_class_and_quota(rendered: list[dict[str, Any]]) -> None:
    spec = deployment(rendered)["spec"]["template"]["spec"]
    assert spec["priorityClassName"] == "system-cluster-critical"
    quota = one(rendered, "ResourceQuota", "gpu-admission-critical-pods")
    (expr,) = quota["spec"]["scopeSelector"]["matchExpressions"]
    assert expr["scopeName"] == "PriorityClass" and "system-cluster-critical" in expr["values"]
    assert int(quota["spec"]["hard"]["pods"]) >= deployment(rendered)["spec"]["replicas"] + 1


def test_every_pod_is_locked_down(rendered: list[dict[str, Any]]) -> None:
    templates = list(pod_templates(rendered))
    assert templates
    for where, tpl in templates:
        spec = tpl["spec"]
        psc = spec["securityContext"]
        assert psc["runAsNonRoot"] is True and psc["runAsUser"] == 65532, where
        assert psc["seccompProfile"]["type"] == "RuntimeDefault", where
        assert not spec.get("hostNetwork") and not spec.get("hostPID") and not spec.get("hostIPC"), where
        for c in spec["containers"] + spec.get("initContainers", []):
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True, where
            assert sc["allowPrivilegeEscalation"] is False, where
            assert sc["capabilities"]["drop"] == ["ALL"] and not sc["capabilities"].get("add"), where
            assert sc["seccompProfile"]["type"] == "RuntimeDefault", where
            assert sc.get("runAsNonRoot", psc["runAsNonRoot"]) is True, where
            assert sc.get("privileged", False) is False, where
            assert "requests" in c["resources"] and "limits" in c["resources"], where
        for volume in spec.get("volumes", []):
            assert set(volume) - {"name"} <= {"secret", "configMap", "emptyDir"}, where
    ns = one(rendered, "Namespace", NS)
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def test_probes(rendered: list[dict[str, Any]]) -> None:
    (c,) = deployment(rendered)["spec"]["template"]["spec"]["containers"]
    for probe, path in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")]:
        get = c[probe]["httpGet"]
        assert (get["path"], get["scheme"], get["port"]) == (path, "HTTPS", "https"), probe
        assert c[probe]["timeoutSeconds"] <= 5
    assert c["startupProbe"]["httpGet"]["path"] == "/healthz"


def test_resources(rendered: list[dict[str, Any]]) -> None:
    (c,) = deployment(rendered)["spec"]["template"]["spec"]["containers"]
    res = c["resources"]
    assert set(res["requests"]) == {"cpu", "memory"} and set(res["limits"]) == {"cpu", "memory"}
    assert _mebibytes(res["requests"]["memory"]) >= 100, "spec §10: up to 100 MiB RSS per worker"
    assert _mebibytes(res["limits"]["memory"]) >= _mebibytes(res["requests"]["memory"])


def _mebibytes(quantity: str) -> float:
    units = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024}
    for suffix, factor in units.items():
        if quantity.endswith(suffix):
            return float(quantity[: -len(suffix)]) * factor
    return float(quantity) / 2**20


def test_graceful_termination(rendered: list[dict[str, Any]]) -> None:
    spec = deployment(rendered)["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    pre_stop = c["lifecycle"]["preStop"]
    if "exec" in pre_stop:
        command = pre_stop["exec"]["command"]
        assert Path(command[0]).name == "sleep", "preStop sleeps while endpoints drain"
        seconds = int(command[1])
    else:
        seconds = int(pre_stop["sleep"]["seconds"])
    timeouts = [h["timeoutSeconds"] for _, h in all_webhooks(rendered)]
    # Sleep, then finish in-flight reviews (each bounded by its webhook timeout).
    assert seconds > 0 and seconds + max(timeouts) < spec["terminationGracePeriodSeconds"]


def test_service_account_tokens(rendered: list[dict[str, Any]]) -> None:
    for sa in find(rendered, "ServiceAccount"):
        assert sa.get("automountServiceAccountToken") is False, "opt in per pod, not per ServiceAccount"
    for where, tpl in pod_templates(rendered):
        spec = tpl["spec"]
        assert spec["automountServiceAccountToken"] is True, f"{where} watches / writes the API"
        expected = SERVER_SA if where.startswith("Deployment/") else CERTS_SA
        assert spec["serviceAccountName"] == expected, where


# -- the policy ConfigMap --------------------------------------------------------------------------------


def test_policy_configmap(rendered: list[dict[str, Any]]) -> None:
    cm = one(rendered, "ConfigMap", POLICY_CM)
    assert cm["metadata"]["namespace"] == NS
    assert list(cm["data"]) == ["policy.yaml"]
    assert cm["data"]["policy.yaml"] == (BASE / "policy.yaml").read_text(encoding="utf-8")
    yaml.safe_load(cm["data"]["policy.yaml"])


def test_deploy_policy_is_the_default_policy() -> None:
    source = ROOT / "policies" / "default-policy.yaml"
    assert (BASE / "policy.yaml").read_bytes() == source.read_bytes(), (
        "deploy/base/policy.yaml must be a byte-for-byte copy of policies/default-policy.yaml: "
        "cp policies/default-policy.yaml deploy/base/policy.yaml"
    )


# -- webhooks --------------------------------------------------------------------------------------------


def test_webhook_common_settings(rendered: list[dict[str, Any]]) -> None:
    hooks = list(all_webhooks(rendered))
    assert len(hooks) >= 2
    names = [h["name"] for _, h in hooks]
    assert len(names) == len(set(names))
    for kind, h in hooks:
        name = h["name"]
        verb = _verb_of(h)  # admit: mutate, then judge the mutated object, in one call (Pods)
        assert verb in (("mutate", "admit") if kind.startswith("Mutating") else ("validate",)), name
        assert name.endswith(f".{verb}.gpu-admission.io"), name
        assert h["admissionReviewVersions"] == ["v1"], name
        assert h["sideEffects"] in ("None", "NoneOnDryRun"), name
        assert 1 <= h["timeoutSeconds"] <= 10, name
        assert h["failurePolicy"] in ("Fail", "Ignore"), f"{name}: failurePolicy must be explicit"
        assert h["matchPolicy"] == "Equivalent", name
        assert "objectSelector" not in h, f"{name}: users write object labels; never select on them"
        service = h["clientConfig"]["service"]
        path = "/bind" if name == BIND_HOOK else f"/{verb}"  # binds are judged (and counted) apart
        assert (service["namespace"], service["name"], service["path"], service.get("port", 443)) == (
            NS, "gpu-admission", path, 443,
        ), name  # fmt: skip
        assert "url" not in h["clientConfig"], name
        if kind.startswith("Mutating"):
            assert h["reinvocationPolicy"] == "IfNeeded", name
        for rule in h["rules"]:
            # Namespaces are cluster-scoped (their enforcement label is guarded); everything else is namespaced.
            assert rule.get("scope") == ("Cluster" if rule["resources"] == ["namespaces"] else "Namespaced"), name
            assert "*" not in rule["apiGroups"] and "*" not in rule["resources"], name
            if name == BIND_HOOK:  # the one subresource: the scheduler's binds (reserved-bind)
                assert rule == {"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods/binding"],
                                "operations": ["CREATE"], "scope": "Namespaced"}, name  # fmt: skip
                continue
            assert not any("/" in r for r in rule["resources"]), f"{name}: no subresources (status, scale)"


def test_failure_policy_fail_closed(rendered: list[dict[str, Any]]) -> None:
    for _, h in all_webhooks(rendered):
        if h["name"] == BIND_HOOK:
            continue
        assert h["failurePolicy"] == "Fail", f"{h['name']}: the documented choice is fail-closed"


def test_bind_check_fails_open_fast_and_spares_the_control_plane(rendered: list[dict[str, Any]]) -> None:
    """A bind webhook that failed closed would stop scheduling cluster-wide while the server is down."""
    (h,) = [h for _, h in all_webhooks(rendered) if h["name"] == BIND_HOOK]
    assert h["failurePolicy"] == "Ignore" and h["timeoutSeconds"] <= 2
    (expr,) = h["namespaceSelector"]["matchExpressions"]
    assert expr["operator"] == "NotIn" and {"kube-system", NS} <= set(expr["values"])


def test_ca_bundle_is_injected_not_shipped() -> None:
    base = docs_of("base")
    for _, h in all_webhooks(base):
        assert "caBundle" not in h["clientConfig"], (
            f"{h['name']}: a caBundle in the manifest would overwrite the injected one on every apply"
        )
    for cfg in find(base, "MutatingWebhookConfiguration") + find(base, "ValidatingWebhookConfiguration"):
        assert "cert-manager.io/inject-ca-from" not in (cfg["metadata"].get("annotations") or {})


def _is_policy_webhook(hook: dict[str, Any]) -> bool:
    return any("configmaps" in r["resources"] for r in hook["rules"])


def _namespace_expression(hook: dict[str, Any]) -> dict[str, Any]:
    selector = hook["namespaceSelector"]
    assert not selector.get("matchLabels"), hook["name"]
    (expr,) = [e for e in selector["matchExpressions"] if e["key"] == "kubernetes.io/metadata.name"]
    return expr


def test_namespace_selectors(rendered: list[dict[str, Any]]) -> None:
    for _, h in all_webhooks(rendered):
        expr = _namespace_expression(h)
        if _is_policy_webhook(h):
            assert (expr["operator"], expr["values"]) == ("In", [NS]), h["name"]
            assert h["rules"] == [
                {"apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"],
                 "operations": ["CREATE", "UPDATE", "DELETE"], "scope": "Namespaced"}
            ]  # fmt: skip
        else:
            assert expr["operator"] == "NotIn", h["name"]
            assert set(expr["values"]) >= EXCLUDED_NAMESPACES, h["name"]


def _rules_cover(hooks: list[dict[str, Any]], group: str, resource: str, operation: str) -> bool:
    return any(
        group in rule["apiGroups"] and resource in rule["resources"] and operation in rule["operations"]
        for h in hooks
        for rule in h["rules"]
    )


@pytest.mark.parametrize("kind", sorted(TEMPLATE_KINDS))
def test_template_kinds_are_mutated_and_validated(rendered: list[dict[str, Any]], kind: str) -> None:
    group, resource = TEMPLATE_KINDS[kind]
    for cfg_kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        hooks = one(rendered, cfg_kind, "gpu-admission")["webhooks"]
        if kind == "Pod":  # judged by pods.admit in the mutating stage (and again only in validate-pods)
            admit = [h for h in hooks if _verb_of(h) == "admit"]
            if cfg_kind.startswith("Mutating"):
                assert [h["name"] for h in admit] == ["pods.admit.gpu-admission.io"]
                assert _rules_cover(admit, group, resource, "CREATE")
            continue
        assert _rules_cover(hooks, group, resource, "CREATE"), f"{cfg_kind} misses {kind} CREATE"
        assert _rules_cover(hooks, group, resource, "UPDATE"), f"{cfg_kind} misses {kind} UPDATE"


def test_pods_take_one_call_unless_the_overlay_asks_for_two() -> None:
    """Base: no validating webhook for Pods (pods.admit judges them). validate-pods: a second, validating
    call on the stored object, with exactly the conditions, rules and namespaces of pods.admit."""
    for which in ("base", "cert-manager", "validate-pods"):
        docs = docs_of(which)
        admit = [h for _, h in all_webhooks(docs) if _verb_of(h) == "admit"]
        validating = one(docs, "ValidatingWebhookConfiguration", "gpu-admission")["webhooks"]
        pods = [h for h in validating if _rules_cover([h], "", "pods", "CREATE")]
        assert len(admit) == 1 and admit[0]["clientConfig"]["service"]["path"] == "/admit"
        if which != "validate-pods":
            assert pods == [], which
            continue
        (hook,) = pods
        assert hook["name"] == "pods.validate.gpu-admission.io"
        assert hook["clientConfig"]["service"]["path"] == "/validate"
        for key in ("rules", "namespaceSelector", "matchConditions", "failurePolicy", "timeoutSeconds"):
            assert hook[key] == admit[0][key], key
        others = {h["name"] for h in validating} - {hook["name"]}
        base = one(docs_of("base"), "ValidatingWebhookConfiguration", "gpu-admission")["webhooks"]
        assert others == {h["name"] for h in base}


@pytest.mark.parametrize("kind", sorted(VALIDATE_ONLY_KINDS))
def test_validate_only_kinds(rendered: list[dict[str, Any]], kind: str) -> None:
    group, resource = VALIDATE_ONLY_KINDS[kind]
    validating = one(rendered, "ValidatingWebhookConfiguration", "gpu-admission")["webhooks"]
    mutating = one(rendered, "MutatingWebhookConfiguration", "gpu-admission")["webhooks"]
    for op in ("CREATE", "UPDATE"):
        assert _rules_cover(validating, group, resource, op), f"validating misses {kind} {op}"
    assert not any(_rules_cover(mutating, group, resource, op) for op in ("CREATE", "UPDATE", "DELETE"))


def test_pod_webhooks_skip_mirror_pods_and_create_only(rendered: list[dict[str, Any]]) -> None:
    pod_hooks = [h for _, h in all_webhooks(rendered) if _rules_cover([h], "", "pods", "CREATE")]
    assert 1 <= len(pod_hooks) <= 2
    for h in pod_hooks:
        assert all(r["operations"] == ["CREATE"] for r in h["rules"]), h["name"]
        assert any(
            "kubernetes.io/config.mirror" in c["expression"] and "!" in c["expression"] for c in h["matchConditions"]
        ), f"{h['name']}: skip mirror pods"


# The validating conditions' test for our keys, on `labels` or `annotations` of some metadata.
USER_KEY_CLAUSE = "{where}.exists(k, k.startsWith('gpu-admission.io/'))"


def test_gpu_workload_webhooks_have_a_gpu_condition(rendered: list[dict[str, Any]]) -> None:
    for _, h in all_webhooks(rendered):
        touches_workloads = any(
            (g, r) in WORKLOAD_KINDS_RESOURCES for rule in h["rules"] for g in rule["apiGroups"]
            for r in rule["resources"]
        )  # fmt: skip
        if touches_workloads:
            text = " ".join(c["expression"] for c in h["matchConditions"])
            assert "'nvidia.com/'" in text, h["name"]
            assert "initContainers" in text and "limits" in text and "requests" in text, h["name"]
            if _verb_of(h) in ("validate", "admit"):  # any gpu-admission.io/ key: a typo on a CPU object is denied
                assert USER_KEY_CLAUSE.format(where="labels") in text, h["name"]
                assert USER_KEY_CLAUSE.format(where="annotations") in text, h["name"]
            else:  # nothing to mutate on a CPU object, except a gpu-memory ask (it becomes a MIG slice)
                assert "'gpu-admission.io/gpu-memory'" in text and "'gpu-admission.io/'" not in text, h["name"]
        sent = {(g, r) for rule in h["rules"] for g in rule["apiGroups"] for r in rule["resources"]} & ALWAYS_SENT
        if sent:  # alone in its webhook, which skips only the updates that change nothing we read
            assert [c["name"] for c in h["matchConditions"]] == ["create-or-relevant-update"], h["name"]
            assert all(set(rule["resources"]) == {r for _, r in sent} for rule in h["rules"]), h["name"]


def test_validating_user_key_clause_covers_the_object_and_every_pod_template(rendered: list[dict[str, Any]]) -> None:
    """Wherever the mutating twin looks for the gpu-memory annotation (each pod template), the validating
    webhook looks for any gpu-admission.io/ label or annotation; plus the object's own metadata. Pods are
    judged by pods.admit, whose condition looks at the Pod's own metadata."""
    mutating = {_family_of(h): h for k, h in all_webhooks(rendered) if k.startswith("Mutating")}
    judging = {_family_of(h): h for _, h in all_webhooks(rendered) if _verb_of(h) != "mutate"}
    assert set(mutating) == set(FAMILIES) and set(FAMILIES) <= set(judging)
    assert _verb_of(mutating["pods"]) == "admit"
    for family, m in mutating.items():
        if family in ALWAYS_SENT_FAMILIES:
            continue  # every object is sent: no clause to look for
        places = " ".join(c["expression"] for c in m["matchConditions"]).count("'gpu-admission.io/gpu-memory' in")
        text = " ".join(c["expression"] for c in judging[family]["matchConditions"])
        expected = 1 if family == "pods" else places + 1
        for where in ("labels", "annotations"):  # in a template's metadata, or beside a PodSpec (KServe)
            assert text.count(USER_KEY_CLAUSE.format(where=where)) == expected, (family, where)
        assert text.count("object.metadata.labels.exists(") == 1, family
        assert "'gpu-admission.io/gpu-memory'" not in text, f"{family}: subsumed by the prefix test"


# -- CEL: structure --------------------------------------------------------------------------------------

_STRING = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"")
_PATH = re.compile(r"(?<![\w.'])(object|oldObject|request|[a-z])((?:\.[A-Za-z_]\w*)+)")
_METHODS = {"exists", "all", "exists_one", "filter", "map", "startsWith", "endsWith", "contains", "size"}


def _strip_strings(expr: str) -> str:
    return _STRING.sub("''", expr)


def _paths(expr: str) -> Iterator[tuple[str, bool]]:
    """Field-selection paths in `expr` (strings removed), each with whether it is the argument of has()."""
    text = _strip_strings(expr)
    for m in _PATH.finditer(text):
        segments = m.group(2).split(".")[1:]
        while segments and segments[-1] in _METHODS:
            segments.pop()
        if not segments:
            continue
        in_has = text[max(0, m.start() - 4) : m.start()] == "has("
        yield ".".join([m.group(1), *segments]), in_has


def cel_structure_errors(expr: str) -> list[str]:
    errors: list[str] = []
    text = _strip_strings(expr)
    if expr.count("'") % 2:
        errors.append("unbalanced quotes")
    depth = {"(": 0, "[": 0, "{": 0}
    closing = {")": "(", "]": "[", "}": "{"}
    for ch in text:
        if ch in depth:
            depth[ch] += 1
        elif ch in closing:
            depth[closing[ch]] -= 1
            if depth[closing[ch]] < 0:
                errors.append(f"unbalanced {ch!r}")
    errors += [f"unclosed {k!r}" for k, v in depth.items() if v > 0]
    guards = set(re.findall(r"has\(([\w.]+)\)", text))
    for root in ("object", "oldObject"):
        first_use = re.search(rf"(?<![\w.]){root}\.", text)
        null_test = re.search(rf"(?<![\w.]){root} [!=]= null", text)
        if first_use and (null_test is None or null_test.start() > first_use.start()):
            errors.append(f"{root} is used before it is tested against null (DELETE has no object)")
    # The API server omits empty fields: request.name is absent for a create with generateName.
    always_present = {"object.metadata", "oldObject.metadata", "request.operation", "request.uid"}
    for path, in_has in _paths(expr):
        parts = path.split(".")
        # Every proper prefix below metadata must be guarded; a plain access must be guarded itself.
        needed = [".".join(parts[:i]) for i in range(2, len(parts))]
        if not in_has:
            needed.append(path)
        for prefix in needed:
            if prefix not in always_present and prefix.count(".") >= 1 and prefix not in guards:
                errors.append(f"{path}: no has({prefix}) guard")
    return sorted(set(errors))


def test_cel_conditions_are_structurally_sound(rendered: list[dict[str, Any]]) -> None:
    for _, h in all_webhooks(rendered):
        names = [c["name"] for c in h.get("matchConditions", [])]
        assert len(names) == len(set(names)) <= 64, h["name"]
        for c in h.get("matchConditions", []):
            errors = cel_structure_errors(c["expression"])
            assert not errors, f"{h['name']} / {c['name']}: {errors}"


def test_cel_structure_checker_catches_mistakes() -> None:
    assert cel_structure_errors("object != null && has(object.spec) && object.spec.x == 1")
    assert cel_structure_errors("object.spec.containers.exists(c, true)")
    assert cel_structure_errors("object != null && (has(object.spec)")
    assert cel_structure_errors("request.name == 'x'")
    assert not cel_structure_errors("object != null && has(object.spec) && has(object.spec.x) && object.spec.x")


# -- CEL: semantics on sample objects (needs celpy) -------------------------------------------------------

GPU = {"limits": {"nvidia.com/gpu": "1"}}
MIG = {"limits": {"nvidia.com/mig-1g.10gb": "1"}}
GPU_REQUESTS = {"requests": {"nvidia.com/gpu": "2"}}
CPU = {"limits": {"cpu": "1", "memory": "1Gi"}}
DRA_EXTENDED = {"limits": {"cpu": "1", "deviceclass.resource.kubernetes.io/gpu.nvidia.com": "1"}}


def _pod_template(resources: dict[str, Any] | None, *, init: bool = False, ann: bool = False) -> dict[str, Any]:
    main = {"name": "main", "image": "x"}
    if resources is not None and not init:
        main["resources"] = resources
    spec: dict[str, Any] = {"containers": [{"name": "sidecar", "image": "y", "resources": CPU}, main]}
    if init:
        spec["initContainers"] = [{"name": "warmup", "image": "z", "resources": resources}]
    metadata: dict[str, Any] = {"labels": {"app": "t"}}
    if ann:
        metadata["annotations"] = {"gpu-admission.io/gpu-memory": "10Gi"}
    return {"metadata": metadata, "spec": spec}


def _obj(kind: str, spec: dict[str, Any], **meta: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": kind, "metadata": {"name": "w", "namespace": "ml", **meta}, "spec": spec}


def _cpu_template() -> dict[str, Any]:
    return _pod_template(CPU)


def _kubeflow(field: str, chief: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def wrap(t: dict[str, Any]) -> dict[str, Any]:
        replicas = {chief: {"replicas": 1, "template": _cpu_template()}, "Worker": {"replicas": 4, "template": t}}
        return _obj("X", {field: replicas})

    return wrap


def _jobset(t: dict[str, Any]) -> dict[str, Any]:
    driver = {"name": "driver", "template": {"spec": {"template": _cpu_template()}}}
    workers = {"name": "workers", "replicas": 4, "template": {"spec": {"parallelism": 2, "template": t}}}
    return _obj("JobSet", {"replicatedJobs": [driver, workers]})


def _lws(role: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def wrap(t: dict[str, Any]) -> dict[str, Any]:
        other = "leaderTemplate" if role == "workerTemplate" else "workerTemplate"
        return _obj("LeaderWorkerSet", {"leaderWorkerTemplate": {"size": 4, role: t, other: _cpu_template()}})

    return wrap


def _volcano(t: dict[str, Any]) -> dict[str, Any]:
    tasks = [{"name": "ps", "template": _cpu_template()}, {"name": "worker", "replicas": 4, "template": t}]
    return _obj("Job", {"minAvailable": 5, "tasks": tasks})


def _cronjob(t: dict[str, Any]) -> dict[str, Any]:
    return _obj("CronJob", {"schedule": "@daily", "jobTemplate": {"spec": {"template": t}}})


def _ray_cluster_spec(t: dict[str, Any], *, head: bool) -> dict[str, Any]:
    if head:
        return {"headGroupSpec": {"template": t}}
    return {"headGroupSpec": {"template": _cpu_template()}, "workerGroupSpecs": [{"groupName": "g", "template": t}]}


def _podspec(t: dict[str, Any]) -> dict[str, Any]:
    """A pod template as KServe writes it: the PodSpec inline, its labels and annotations beside it."""
    return {**copy.deepcopy(t.get("spec", {})), **copy.deepcopy(t.get("metadata", {}))}


def _isvc(where: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def wrap(t: dict[str, Any]) -> dict[str, Any]:
        cpu = _podspec(_cpu_template())
        if where == "model":  # the GPU container as predictor.model, the others as containers
            pred = _podspec(t)
            listed = pred.get("containers", [])
            pred["model"], pred["containers"] = listed[-1], listed[:-1]
            return _obj("InferenceService", {"predictor": pred})
        if where == "worker":  # workerSpec has no labels of its own: they sit on the predictor
            pred = {**cpu, **copy.deepcopy(t.get("metadata", {}))}
            return _obj("InferenceService", {"predictor": {**pred, "workerSpec": copy.deepcopy(t.get("spec", {}))}})
        if where == "transformer":
            return _obj("InferenceService", {"predictor": cpu, "transformer": _podspec(t)})
        return _obj("InferenceService", {"predictor": _podspec(t)})

    return wrap


def _llmisvc(where: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def wrap(t: dict[str, Any]) -> dict[str, Any]:
        meta, spec = copy.deepcopy(t.get("metadata", {})), copy.deepcopy(t.get("spec", {}))
        cpu = _cpu_template()["spec"]
        if where == "worker":
            return _obj("LLMInferenceService", {"template": cpu, "worker": spec, **meta})
        if where == "prefill":
            return _obj("LLMInferenceService", {"template": cpu, "prefill": {"template": spec, **meta}})
        return _obj("LLMInferenceService", {"template": spec, **meta})

    return wrap


# family (the webhook name's first label) -> kind -> wrap(pod template) -> object of that kind
FAMILIES: dict[str, dict[str, Callable[[dict[str, Any]], dict[str, Any]]]] = {
    "pods": {"Pod": lambda t: _obj("Pod", t["spec"], **t["metadata"])},
    "workloads": {
        kind: (lambda t, kind=kind: _obj(kind, {"replicas": 2, "template": t}))
        for kind in ("Deployment", "StatefulSet", "ReplicaSet", "DaemonSet", "Job")
    },
    "cronjobs": {"CronJob": _cronjob},
    "kubeflow": {
        "PyTorchJob": _kubeflow("pytorchReplicaSpecs", "Master"),
        "TFJob": _kubeflow("tfReplicaSpecs", "Chief"),
        "MPIJob": _kubeflow("mpiReplicaSpecs", "Launcher"),
        "XGBoostJob": _kubeflow("xgbReplicaSpecs", "Master"),
        "PaddleJob": _kubeflow("paddleReplicaSpecs", "Master"),
    },
    "jobsets": {"JobSet": _jobset},
    "leaderworkersets": {
        "LeaderWorkerSet(worker)": _lws("workerTemplate"),
        "LeaderWorkerSet(leader)": _lws("leaderTemplate"),
    },
    "volcanojobs": {"Volcano Job": _volcano},
    "ray": {
        "RayCluster(worker)": lambda t: _obj("RayCluster", _ray_cluster_spec(t, head=False)),
        "RayCluster(head)": lambda t: _obj("RayCluster", _ray_cluster_spec(t, head=True)),
        "RayJob": lambda t: _obj("RayJob", {"entrypoint": "x.py", "rayClusterSpec": _ray_cluster_spec(t, head=False)}),
        "RayService": lambda t: _obj("RayService", {"rayClusterConfig": _ray_cluster_spec(t, head=False)}),
    },
    "inferenceservices": {
        f"InferenceService({where})": _isvc(where) for where in ("predictor", "model", "worker", "transformer")
    },
    "llminferenceservices": {
        f"LLMInferenceService({where})": _llmisvc(where) for where in ("template", "worker", "prefill")
    },
    "trainjobs": {
        "TrainJob": lambda t: _obj("TrainJob", {"runtimeRef": {"name": "torch"}, "trainer": {"numNodes": 2}})
    },
}


ALWAYS_SENT_FAMILIES = {"trainjobs"}


def _family_of(hook: dict[str, Any]) -> str:
    return hook["name"].split(".", 1)[0]


def _verb_of(hook: dict[str, Any]) -> str:
    return hook["name"].split(".")[1]


# gpu-admission.io/ keys the engine rejects (unknown key, unparsable value): a GPU ask that never happened.
TYPO_ANNOTATIONS = {"gpu-admission.io/gpu-memry": "10Gi"}
BAD_LABELS = {"gpu-admission.io/workload": "trainig"}
# Keys that only look like ours: another prefix, no slash, our prefix in a value.
LOOKALIKE_LABELS = {"gpu-admission.io": "x", "team.gpu-admission.io/owner": "x", "app": "gpu-admission.io"}
LOOKALIKE_ANNOTATIONS = {"example.com/gpu-admission.io": "x", "note": "gpu-admission.io/gpu-memory: 10Gi"}


def _with_meta(
    obj: dict[str, Any], labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    """A copy of `obj` (an object or a pod template) with extra labels / annotations in its metadata."""
    obj = copy.deepcopy(obj)
    metadata = obj.setdefault("metadata", {})
    if labels:
        metadata["labels"] = {**metadata.get("labels", {}), **labels}
    if annotations:
        metadata["annotations"] = {**metadata.get("annotations", {}), **annotations}
    return obj


def _user_key_cases(
    family: str, kind: str, wrap: Callable[[dict[str, Any]], dict[str, Any]], verb: str
) -> Iterator[tuple[str, str, dict[str, Any] | None, dict[str, Any] | None, str, bool]]:
    """CPU-only objects with and without gpu-admission.io/ keys: the validating webhook must see every key (the
    engine denies unknown or unparsable ones); the mutating webhook, with nothing to mutate, none of them."""
    call = verb in ("validate", "admit")
    cpu = _pod_template(CPU)
    lookalike = _with_meta(cpu, LOOKALIKE_LABELS, LOOKALIKE_ANNOTATIONS)
    creates = [
        ("CPU only, bad gpu-admission.io/ label on the pod template", wrap(_with_meta(cpu, BAD_LABELS)), call),
        ("CPU only, typo gpu-admission.io/ annotation on the pod template",
         wrap(_with_meta(cpu, annotations=TYPO_ANNOTATIONS)), call),
        ("no resources, typo gpu-admission.io/ annotation on the pod template",
         wrap(_with_meta(_pod_template(None), annotations=TYPO_ANNOTATIONS)), call),
        ("CPU only, look-alike keys on the pod template", wrap(lookalike), False),
    ]  # fmt: skip
    if family == "pods":
        for desc, obj, expected in creates:
            yield f"{kind}: {desc}", "CREATE", obj, None, "w", expected
        keyed = wrap(_with_meta(cpu, annotations=TYPO_ANNOTATIONS))
        yield f"{kind}: DELETE of a keyed CPU pod (object is null)", "DELETE", None, keyed, "w", False
        return
    plain = wrap(cpu)
    bare = {k: v for k, v in cpu.items() if k != "metadata"}  # a pod template without metadata
    keyed = _with_meta(plain, BAD_LABELS)
    creates += [
        ("CPU only, bad gpu-admission.io/ label on the object", keyed, call),
        ("CPU only, typo gpu-admission.io/ annotation on the object",
         _with_meta(plain, annotations=TYPO_ANNOTATIONS), call),
        ("CPU only, look-alike keys on the object and the pod template",
         _with_meta(wrap(lookalike), LOOKALIKE_LABELS, LOOKALIKE_ANNOTATIONS), False),
        ("pod template without metadata, no keys", wrap(bare), False),
        ("pod template without metadata, key on the object",
         _with_meta(wrap(bare), annotations=TYPO_ANNOTATIONS), call),
        ("empty spec, key on the object", _obj("X", {}, labels=BAD_LABELS), call),
    ]  # fmt: skip
    for desc, obj, expected in creates:
        yield f"{kind}: {desc}", "CREATE", obj, None, "w", expected
    yield f"{kind}: UPDATE adds a gpu-admission.io/ label to a CPU object", "UPDATE", keyed, plain, "w", call
    yield f"{kind}: UPDATE of a keyed CPU object, nothing changed", "UPDATE", keyed, keyed, "w", False
    yield f"{kind}: UPDATE removes the key from a CPU object", "UPDATE", plain, keyed, "w", False
    yield f"{kind}: DELETE of a keyed CPU object (object is null)", "DELETE", None, keyed, "w", False


def cel_cases(
    family: str, verb: str = "validate"
) -> Iterator[tuple[str, str, dict[str, Any] | None, dict[str, Any] | None, str, bool]]:
    """(description, operation, object, oldObject, request name, expected match) for one webhook family, as
    seen by its `verb` (admit, mutate or validate) webhook."""
    if family in ("horizontalpodautoscalers", "scaledobjects"):
        spec = {"scaleTargetRef": {"kind": "Deployment", "name": "d"}, "minReplicas": 1}
        obj = _obj("HPA", spec)
        status_only = {**copy.deepcopy(obj), "status": {"currentReplicas": 3}}
        finalizer = copy.deepcopy(obj)
        finalizer["metadata"]["finalizers"] = ["finalizer.keda.sh"]
        changed = copy.deepcopy(obj)
        changed["spec"]["minReplicas"] = 0
        yield "create", "CREATE", obj, None, "w", True
        yield "update of the spec", "UPDATE", changed, obj, "w", True
        yield "status-only update", "UPDATE", status_only, obj, "w", False
        yield "finalizer-only update", "UPDATE", finalizer, obj, "w", False
        return
    if family == "policy":
        cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": POLICY_CM, "namespace": NS},
              "data": {"policy.yaml": "x"}}  # fmt: skip
        other = copy.deepcopy(cm)
        other["metadata"]["name"] = "something-else"
        generated = copy.deepcopy(cm)
        generated["metadata"] = {"generateName": "gpu-admission-policy-", "namespace": NS}
        yield "create the policy", "CREATE", cm, None, POLICY_CM, True
        yield "update the policy", "UPDATE", cm, cm, POLICY_CM, True
        yield "delete the policy (object is null)", "DELETE", None, cm, POLICY_CM, True
        yield "another ConfigMap", "CREATE", other, None, "something-else", False
        yield "delete another ConfigMap", "DELETE", None, other, "something-else", False
        yield "generateName", "CREATE", generated, None, "", False
        return
    if family == "exceptions":
        exc = {"apiVersion": "gpu-admission.io/v1alpha1", "kind": "GPUPolicyException",
               "metadata": {"name": "e", "namespace": "ml"}, "spec": {"until": "2027-01-01T00:00:00Z"}}  # fmt: skip
        later = copy.deepcopy(exc)
        later["spec"]["until"] = "2027-02-01T00:00:00Z"
        relabelled = _with_meta(exc, labels={"team": "ml"})
        yield "create", "CREATE", exc, None, "e", True
        yield "until changed", "UPDATE", later, exc, "e", True
        yield "metadata-only update (an expired one can still be relabelled)", "UPDATE", relabelled, exc, "e", False
        yield "no spec (the schema refuses it; the webhook must not error)", "CREATE", _obj("X", {}), None, "e", True
        return
    if family == "bindings":  # no condition: a Binding has nothing to tell a GPU pod's from another's
        bind = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p", "namespace": "ml"},
                "target": {"apiVersion": "v1", "kind": "Node", "name": "n1"}}  # fmt: skip
        yield "a bind", "CREATE", bind, None, "p", True
        return
    if family == "namespaces":
        plain = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}}
        off = _with_meta(plain, labels={"gpu-admission.io/enforcement": "off"})
        warn = _with_meta(plain, labels={"gpu-admission.io/enforcement": "warn"})
        empty = _with_meta(plain, labels={"gpu-admission.io/enforcement": ""})
        other = _with_meta(off, labels={"team": "ml"})
        yield "create without the label", "CREATE", plain, None, "ml", False
        yield "create with the label", "CREATE", off, None, "ml", True
        yield "label set", "UPDATE", off, plain, "ml", True
        yield "label changed", "UPDATE", warn, off, "ml", True
        yield "label removed", "UPDATE", plain, off, "ml", True
        yield "label set to the empty value", "UPDATE", empty, plain, "ml", True
        yield "another label changed", "UPDATE", other, off, "ml", False
        yield "nothing changed", "UPDATE", off, off, "ml", False
        return
    if family in ALWAYS_SENT_FAMILIES:
        for kind, wrap in FAMILIES[family].items():
            obj = wrap(_cpu_template())
            relabelled = _with_meta(obj, BAD_LABELS)
            yield f"{kind}: CREATE, whatever its trainer asks", "CREATE", obj, None, "w", True
            yield f"{kind}: CREATE, empty spec", "CREATE", _obj("X", {}), None, "w", True
            yield f"{kind}: UPDATE, nothing changed", "UPDATE", obj, copy.deepcopy(obj), "w", False
            yield f"{kind}: UPDATE, labels changed", "UPDATE", relabelled, obj, "w", True
            yield f"{kind}: DELETE (object is null)", "DELETE", None, obj, "w", True
        return
    for kind, wrap in FAMILIES[family].items():
        yield from _user_key_cases(family, kind, wrap, verb)
        gpu = wrap(_pod_template(GPU))
        yield f"{kind}: GPU limit", "CREATE", gpu, None, "w", True
        yield f"{kind}: GPU request only", "CREATE", wrap(_pod_template(GPU_REQUESTS)), None, "w", True
        yield f"{kind}: MIG slice", "CREATE", wrap(_pod_template(MIG)), None, "w", True
        yield f"{kind}: GPU in an init container", "CREATE", wrap(_pod_template(GPU, init=True)), None, "w", True
        yield f"{kind}: gpu-memory annotation only", "CREATE", wrap(_pod_template(CPU, ann=True)), None, "w", True
        yield f"{kind}: CPU only", "CREATE", wrap(_pod_template(CPU)), None, "w", False
        yield f"{kind}: DRA extended resource", "CREATE", wrap(_pod_template(DRA_EXTENDED)), None, "w", True
        claimed = _pod_template(CPU)
        claimed["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
        yield f"{kind}: DRA claim (ResourceClaimTemplate)", "CREATE", wrap(claimed), None, "w", True
        yield f"{kind}: no resources", "CREATE", wrap(_pod_template(None)), None, "w", False
        yield f"{kind}: empty spec", "CREATE", _obj("X", {}), None, "w", False
        if family == "pods":
            mirror = wrap(_pod_template(GPU))
            mirror["metadata"]["annotations"] = {"kubernetes.io/config.mirror": "abc"}
            yield f"{kind}: mirror pod", "CREATE", mirror, None, "w", False
            continue
        same = copy.deepcopy(gpu)
        finalizer = copy.deepcopy(gpu)
        finalizer["metadata"]["finalizers"] = ["foregroundDeletion"]
        finalizer["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        relabelled = copy.deepcopy(gpu)
        relabelled["metadata"]["labels"] = {"gpu-admission.io/workload": "training"}
        edited = wrap(_pod_template(GPU_REQUESTS))
        yield f"{kind}: UPDATE, nothing changed", "UPDATE", same, gpu, "w", False
        yield f"{kind}: UPDATE, finalizers only (GC, deletion)", "UPDATE", finalizer, gpu, "w", False
        yield f"{kind}: UPDATE, labels changed", "UPDATE", relabelled, gpu, "w", True
        yield f"{kind}: UPDATE, template changed", "UPDATE", edited, gpu, "w", True
        yield f"{kind}: UPDATE to CPU only", "UPDATE", wrap(_pod_template(CPU)), gpu, "w", False
        yield f"{kind}: DELETE (object is null)", "DELETE", None, gpu, "w", False


def _celpy() -> Any:
    import celpy  # a test dependency (pyproject.toml): missing, the CEL contract would go unchecked
    from celpy import celtypes

    # CEL's heterogeneous equality (map != null is true), which cel-go - the API server - implements;
    # celpy 0.5's MapType.__eq__ handles None but its __ne__ raises.
    if not getattr(celtypes.MapType, "_gpu_admission_null_ne", False):
        ne = celtypes.MapType.__ne__

        def __ne__(self: Any, other: Any) -> Any:
            return True if other is None else ne(self, other)

        celtypes.MapType.__ne__ = __ne__  # type: ignore[method-assign]
        celtypes.MapType._gpu_admission_null_ne = True  # type: ignore[attr-defined]
    return celpy


@cache
def _program(expression: str) -> Any:
    celpy = _celpy()
    env = celpy.Environment()
    return env.program(env.compile(expression))


def _evaluate(
    celpy: Any, hook: dict[str, Any], op: str, obj: Any, old: Any, name: str, groups: tuple[str, ...] = ("dev",)
) -> bool:
    user = {"username": "alice", "groups": ["system:authenticated", *groups]}
    activation = {
        "object": celpy.json_to_cel(obj),
        "oldObject": celpy.json_to_cel(old),
        # Like the API server's AdmissionRequest: empty fields are omitted (name, with generateName).
        "request": celpy.json_to_cel(
            {"operation": op, "namespace": "ml", "userInfo": user, **({"name": name} if name else {})}
        ),
    }
    for condition in hook.get("matchConditions", []):
        result = _program(condition["expression"]).evaluate(activation)
        assert isinstance(result, celpy.celtypes.BoolType), f"{condition['name']} returned {result!r}"
        if not result:
            return False
    return True


def test_cel_conditions_on_sample_objects(rendered: list[dict[str, Any]]) -> None:
    celpy = _celpy()
    families_seen = set()
    for _, hook in all_webhooks(rendered):
        family = _family_of(hook)
        families_seen.add(family)
        cases = list(cel_cases(family, _verb_of(hook)))
        assert cases, f"no sample objects for {hook['name']}"
        for desc, op, obj, old, name, expected in cases:
            try:
                got = _evaluate(celpy, hook, op, obj, old, name)
            except Exception as exc:  # an erroring condition = failurePolicy applies
                pytest.fail(f"{hook['name']} [{desc}]: the condition errors: {exc}")
            assert got is expected, f"{hook['name']} [{desc}]: expected {'call' if expected else 'skip'}"
    assert families_seen >= set(FAMILIES)


@pytest.mark.parametrize(
    ("groups", "sent"),
    [
        (("dev",), True),
        (("gpu-admission:exception-approvers",), True),  # judged by the server, which knows the configured group
        (("system:masters",), False),
        (("system:serviceaccounts", "system:serviceaccounts:kube-system"), False),
    ],
)
def test_cluster_admins_and_kube_system_never_wait_on_the_namespace_webhook(
    rendered: list[dict[str, Any]], groups: tuple[str, ...], sent: bool
) -> None:
    """Never a lock-out: the enforcement label of a namespace changes without the webhook for these."""
    (hook,) = [h for _, h in all_webhooks(rendered) if h["name"] == "namespaces.validate.gpu-admission.io"]
    ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}}
    off = _with_meta(ns, labels={"gpu-admission.io/enforcement": "off"})
    assert _evaluate(_celpy(), hook, "UPDATE", off, ns, "ml", groups) is sent
    no_groups = {"username": "x"}  # a user without groups: the condition must not error
    activation_ok = _program(hook["matchConditions"][1]["expression"]).evaluate(
        {"request": _celpy().json_to_cel({"operation": "UPDATE", "userInfo": no_groups})}
    )
    assert bool(activation_ok) is True


def test_cel_cases_as_json_for_the_e2e_dry_run() -> None:
    """The sample cases serialise (the e2e suite can replay them against a real API server)."""
    for family in [*FAMILIES, "horizontalpodautoscalers", "scaledobjects", "policy", "exceptions", "namespaces"]:
        for verb in ("admit", "mutate", "validate"):
            json.dumps(list(cel_cases(family, verb)))


# -- RBAC ------------------------------------------------------------------------------------------------


def rules_of(docs: list[dict[str, Any]], sa: str) -> list[tuple[str, dict[str, Any]]]:
    """(binding scope, rule) for every rule granted to ServiceAccount gpu-admission/<sa>."""
    out: list[tuple[str, dict[str, Any]]] = []
    for binding in find(docs, "RoleBinding") + find(docs, "ClusterRoleBinding"):
        if not any(
            s["kind"] == "ServiceAccount" and s["name"] == sa and s.get("namespace") == NS
            for s in binding.get("subjects", [])
        ):
            continue
        ref = binding["roleRef"]
        role = one(docs, ref["kind"], ref["name"])
        scope = binding["metadata"].get("namespace", "cluster")
        out += [(scope, rule) for rule in role["rules"]]
    return out


def test_no_wildcards_or_escalation(rendered: list[dict[str, Any]]) -> None:
    for role in find(rendered, "Role") + find(rendered, "ClusterRole"):
        for rule in role["rules"]:
            for field in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule.get(field, []), f"{role['metadata']['name']}: wildcard {field}"
            forbidden = {"escalate", "bind", "impersonate", "delete", "deletecollection"}
            if role["metadata"]["name"] == "gpu-admission-exception-approver":
                # Approvers revoke an exception early by deleting it; that role grants nothing else.
                assert rule["resources"] == ["gpupolicyexceptions"], rule
                forbidden -= {"delete"}
            assert not set(rule["verbs"]) & forbidden
            assert "nonResourceURLs" not in rule


# What a pod's claims ask (claims, templates) and what nodes have (slices, classes): docs/policy.md "DRA".
DRA_RESOURCES = {
    ("resource.k8s.io", r) for r in ("deviceclasses", "resourceslices", "resourceclaims", "resourceclaimtemplates")
}


def test_server_rbac_is_read_only(rendered: list[dict[str, Any]]) -> None:
    """Read-only, except the ledger's one Lease in the server's namespace (docs/deploy.md "Ledger leader")."""
    rules = rules_of(rendered, SERVER_SA)
    assert rules
    granted: set[tuple[str, str]] = set()
    lease_verbs: set[str] = set()
    for scope, rule in rules:
        if rule["resources"] == ["leases"]:
            assert scope == NS and rule["apiGroups"] == ["coordination.k8s.io"], rule
            if set(rule["verbs"]) == {"create"}:
                assert "resourceNames" not in rule  # create cannot be restricted by name
            else:
                assert set(rule["verbs"]) <= {"get", "update"} and rule["resourceNames"] == [LEDGER_LEASE], (
                    rule
                )  # serve's default
            lease_verbs |= set(rule["verbs"])
            continue
        assert set(rule["verbs"]) <= READ_VERBS, f"server may only read: {rule}"
        assert "secrets" not in rule["resources"], "the TLS Secret is mounted, never read through the API"
        for g in rule["apiGroups"]:
            granted |= {(g, r) for r in rule["resources"]}
        if "configmaps" in rule["resources"]:
            assert scope == NS and rule.get("resourceNames") == [POLICY_CM], rule
    assert ("", "nodes") in granted and ("", "namespaces") in granted and ("", "pods") in granted
    assert ("autoscaling", "horizontalpodautoscalers") in granted and ("keda.sh", "scaledobjects") in granted
    assert ("", "configmaps") in granted
    assert granted >= DRA_RESOURCES, "the DRA inventory and claims are read (webhook/state.py: watch_dra)"
    allowed = {
        ("", "nodes"), ("", "namespaces"), ("", "configmaps"), ("autoscaling", "horizontalpodautoscalers"),
        ("keda.sh", "scaledobjects"), ("", "pods"), ("gpu-admission.io", "gpupolicyexceptions"),
        ("trainer.kubeflow.org", "trainingruntimes"), ("trainer.kubeflow.org", "clustertrainingruntimes"),
    } | WORKLOAD_KINDS_RESOURCES | DRA_RESOURCES  # fmt: skip
    assert granted <= allowed, f"unexpected grants: {granted - allowed}"
    assert lease_verbs == {"get", "update", "create"}, "the elector reads, creates and renews its Lease"


def test_certs_rbac_is_minimal() -> None:
    docs = docs_of("base")
    rules = rules_of(docs, CERTS_SA)
    assert rules
    for scope, rule in rules:
        resources = set(rule["resources"])
        verbs = set(rule["verbs"])
        if resources == {"secrets"}:
            assert scope == NS
            if verbs == {"create"}:
                assert "resourceNames" not in rule  # create cannot be restricted by name
            else:
                assert verbs <= {"get", "update", "patch"} and rule["resourceNames"] == [TLS_SECRET], rule
        else:
            assert resources <= {"mutatingwebhookconfigurations", "validatingwebhookconfigurations"}, rule
            assert rule["apiGroups"] == ["admissionregistration.k8s.io"] and scope == "cluster"
            assert verbs <= {"get", "patch"} and rule["resourceNames"] == ["gpu-admission"], rule


def test_docs_explain_every_permission(rendered: list[dict[str, Any]]) -> None:
    text = DOCS.read_text(encoding="utf-8")
    for sa in (SERVER_SA, CERTS_SA):
        for _, rule in rules_of(rendered, sa):
            for resource in rule["resources"]:
                assert f"`{resource}`" in text, f"docs/deploy.md: RBAC table lacks {resource}"


# -- certificates ----------------------------------------------------------------------------------------


def test_certs_job_and_cronjob() -> None:
    docs = docs_of("base")
    (script_cm,) = [d for d in find(docs, "ConfigMap") if d["metadata"]["name"].startswith(f"{CERTS_SA}-script")]
    assert script_cm["data"]["certs.sh"] == (BASE / "certs.sh").read_text(encoding="utf-8")
    job = one(docs, "Job", "gpu-admission-certs")
    cron = one(docs, "CronJob", "gpu-admission-certs-rotate")
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    assert job["spec"].get("ttlSecondsAfterFinished"), "lets a later apply re-create the (immutable) Job"
    cron_pod = cron["spec"]["jobTemplate"]["spec"]["template"]
    for pod, mode in [(job["spec"]["template"], "bootstrap"), (cron_pod, "rotate")]:
        spec = pod["spec"]
        (c,) = spec["containers"]
        assert c["command"] == ["/bin/sh", "/scripts/certs.sh", mode]
        assert c["image"] == deployment(docs)["spec"]["template"]["spec"]["containers"][0]["image"]
        volumes = {v["name"]: v for v in spec["volumes"]}
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        assert volumes[mounts["/certs"]]["emptyDir"].get("medium") == "Memory"
        assert volumes[mounts["/scripts"]]["configMap"]["name"] == script_cm["metadata"]["name"]
        assert spec["restartPolicy"] in ("OnFailure", "Never")


def test_certs_script_uses_only_the_cli() -> None:
    lines = (BASE / "certs.sh").read_text(encoding="utf-8").splitlines()
    # Commands only: comments and quoted strings (log messages) removed.
    script = "\n".join(_STRING.sub("''", ln) for ln in lines if not ln.lstrip().startswith("#"))
    proc = subprocess.run(["sh", "-n", str(BASE / "certs.sh")], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    for tool in ("kubectl", "curl", "wget", "openssl", "base64", "python"):
        assert not re.search(rf"(^|[\s;|&(]){tool}\b", script, re.M), f"certs.sh must not need {tool}"


FAKE_CLI = r"""#!/bin/sh
# A stand-in for `gpu-admission`: logs each call, simulates the certs sub-commands.
echo "$*" >> "$FAKE_LOG"
[ "$2" = "$FAKE_FAIL" ] && exit 1
case "$2" in
  fetch)
    out=""; prev=""
    for a in "$@"; do [ "$prev" = "--out" ] && out="$a"; prev="$a"; done
    case "$FAKE_SECRET" in
      full) for f in ca.crt ca.key tls.crt tls.key ca-bundle.crt; do echo pem > "$out/$f"; done ;;
      partial) for f in ca.crt tls.crt tls.key; do echo pem > "$out/$f"; done ;;
    esac ;;
  init)
    out=""; prev=""
    for a in "$@"; do [ "$prev" = "--out" ] && out="$a"; prev="$a"; done
    for f in ca.crt ca.key tls.crt tls.key ca-bundle.crt; do echo pem > "$out/$f"; done ;;
esac
exit 0
"""


def _run_certs_script(
    tmp_path: Path, mode: str | None, secret: str, fail: str = "", stale: bool = False
) -> tuple[int, list[str], Path]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "gpu-admission"
    fake.write_text(FAKE_CLI)
    fake.chmod(0o755)
    log = tmp_path / "calls.log"
    log.touch()
    material = tmp_path / "material"
    if stale:  # what a failed attempt leaves in the emptyDir when the container restarts in the same pod
        material.mkdir()
        for name in ("ca.crt", "ca.key", "tls.crt", "tls.key", "ca-bundle.crt"):
            (material / name).write_text("pem from the last attempt\n")
    env = {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
        "FAKE_LOG": str(log),
        "FAKE_SECRET": secret,
        "FAKE_FAIL": fail,
        "GPU_ADMISSION_CERTS_DIR": str(material),
    }
    argv = ["sh", str(BASE / "certs.sh")] + ([mode] if mode else [])
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30, check=False)
    lines = log.read_text().splitlines()
    for line in lines:  # every call the script made is one the real CLI accepts
        error = _parse_with_cli(line.split())
        assert error is None, f"certs.sh runs `gpu-admission {line}`, which the CLI rejects: {error}"
    calls = [line.split()[1] for line in lines]
    return proc.returncode, calls, material


@pytest.mark.parametrize(
    ("mode", "secret", "fail", "rc_ok", "expected"),
    [
        ("bootstrap", "missing", "", True, ["fetch", "init", "secret", "inject"]),
        ("bootstrap", "full", "", True, ["fetch", "rotate", "inject", "secret"]),
        ("rotate", "full", "", True, ["fetch", "rotate", "inject", "secret"]),
        ("rotate", "missing", "", False, ["fetch"]),  # only the bootstrap Job makes a CA
        ("bootstrap", "partial", "", False, ["fetch"]),  # managed elsewhere: change nothing
        ("bootstrap", "missing", "fetch", False, ["fetch"]),  # API error: never generate blindly
        ("bootstrap", "missing", "init", False, ["fetch", "init"]),
        ("rotate", "full", "inject", False, ["fetch", "rotate", "inject"]),  # trust before serve
        (None, "full", "", False, []),
    ],
)
def test_certs_script_order(
    tmp_path: Path, mode: str | None, secret: str, fail: str, rc_ok: bool, expected: list[str]
) -> None:
    rc, calls, _ = _run_certs_script(tmp_path, mode, secret, fail)
    assert (rc == 0) is rc_ok
    assert calls == expected


def test_certs_script_ignores_what_a_failed_attempt_left_behind(tmp_path: Path) -> None:
    # No Secret in the cluster: the material of the last attempt must not pass for it (fetch refuses to
    # overwrite files, and a rotation of unpublished material would skip creating the Secret's CA properly).
    rc, calls, material = _run_certs_script(tmp_path, "bootstrap", "missing", stale=True)
    assert rc == 0 and calls == ["fetch", "init", "secret", "inject"]
    assert (material / "tls.crt").read_text() == "pem\n"


def test_certs_script_arguments(tmp_path: Path) -> None:
    _, _, material = _run_certs_script(tmp_path, "bootstrap", "missing")
    lines = (tmp_path / "calls.log").read_text().splitlines()
    assert lines == [
        f"certs fetch --name {TLS_SECRET} --namespace {NS} --out {material} --missing-ok",
        f"certs init --service gpu-admission --namespace {NS} --out {material}",
        f"certs secret --dir {material} --name {TLS_SECRET} --namespace {NS} --include-ca",
        f"certs inject --ca-bundle {material}/ca-bundle.crt --webhook-name gpu-admission",
    ]


# -- certs.sh with the real CLI against a local HTTPS API server -------------------------------------------

SECRETS = f"/api/v1/namespaces/{NS}/secrets"
SECRET_PATH = f"{SECRETS}/{TLS_SECRET}"
MWC = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/gpu-admission"
VWC = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/gpu-admission"


def _cluster_objects() -> dict[str, dict[str, Any]]:
    svc = {"service": {"name": "gpu-admission", "namespace": NS, "path": "/mutate"}}
    return {
        MWC: {
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "gpu-admission"},
            "webhooks": [{"name": "pods.mutate.gpu-admission.io", "clientConfig": dict(svc)},
                         {"name": "workloads.mutate.gpu-admission.io", "clientConfig": dict(svc)}],
        },
        VWC: {
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": "gpu-admission"},
            "webhooks": [{"name": "pods.validate.gpu-admission.io", "clientConfig": dict(svc)}],
        },
    }  # fmt: skip


class _RealCertsScript:
    """certs.sh run by /bin/sh with the real `gpu-admission` CLI on PATH, talking to `server`."""

    def __init__(self, tmp_path: Path, server_url: str, ca_file: Path) -> None:
        import sys

        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        cli = bin_dir / "gpu-admission"
        cli.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m webhook "$@"\n')
        cli.chmod(0o755)
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "c",
            "contexts": [{"name": "c", "context": {"cluster": "c", "user": "certs"}}],
            "clusters": [{"name": "c", "cluster": {"server": server_url, "certificate-authority": str(ca_file)}}],
            "users": [{"name": "certs", "user": {"token": "certs-job-token"}}],
        }))  # fmt: skip
        self.material = tmp_path / "material"
        self.env = {
            "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
            "PYTHONPATH": str(ROOT),
            "HOME": str(tmp_path),
            "KUBECONFIG": str(kubeconfig),  # in the pod: the in-cluster credentials
            "GPU_ADMISSION_CERTS_DIR": str(self.material),
        }

    def __call__(self, mode: str) -> subprocess.CompletedProcess[str]:
        argv = ["sh", str(BASE / "certs.sh"), mode]
        proc = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=120, check=False)
        assert "PRIVATE KEY" not in proc.stdout + proc.stderr and "Traceback" not in proc.stderr
        return proc


def test_certs_script_with_the_real_cli(tmp_path: Path) -> None:
    import base64
    from datetime import timedelta

    from certs.publish import tls_secret
    from certs.rotation import init_dir
    from certs.status import chain_ok, dns_names
    from certs.store import parse_cert, parse_certs
    from tests.test_certs_cli import FakeObjects
    from tests.test_kubeclient import KubeTestServer, Reply, status_body

    init_dir(tmp_path / "api-tls", service="api", namespace="test", ips=["127.0.0.1"])
    with KubeTestServer(tmp_path / "api-tls") as server:
        fake = FakeObjects(_cluster_objects())
        server.route(fake)
        script = _RealCertsScript(tmp_path, server.url, tmp_path / "api-tls" / "ca-bundle.crt")

        def writes_since(start: int) -> list[tuple[str, str]]:
            return [(r.method, r.path) for r in server.requests[start:] if r.method != "GET"]

        def secret_files() -> dict[str, bytes]:
            return {k: base64.b64decode(v) for k, v in fake.objects[SECRET_PATH]["data"].items()}

        def assert_injected() -> None:
            bundle = fake.objects[SECRET_PATH]["data"]["ca-bundle.crt"]
            hooks = fake.objects[MWC]["webhooks"] + fake.objects[VWC]["webhooks"]
            assert [h["clientConfig"]["caBundle"] for h in hooks] == [bundle] * 3

        # The CronJob never creates a CA.
        proc = script("rotate")
        assert proc.returncode == 1 and "nothing to rotate" in proc.stderr
        assert writes_since(0) == []

        # Bootstrap: a new CA and serving certificate, the Secret (with the CA key), then caBundle.
        proc = script("bootstrap")
        assert proc.returncode == 0, proc.stderr
        assert writes_since(0) == [("POST", SECRETS), ("PATCH", MWC), ("PATCH", VWC)]
        assert {r.headers["authorization"] for r in server.requests} == {"Bearer certs-job-token"}
        secret = fake.objects[SECRET_PATH]
        assert secret["type"] == "kubernetes.io/tls"
        files = secret_files()
        assert sorted(files) == sorted(["ca.crt", "ca.key", "tls.crt", "tls.key", "ca-bundle.crt"])
        leaf, ca = parse_cert(files["tls.crt"], source="tls.crt"), parse_cert(files["ca.crt"], source="ca.crt")
        assert chain_ok(leaf, [ca])
        assert f"gpu-admission.{NS}.svc" in dns_names(leaf)
        assert_injected()

        # Again (the Job re-created by `kubectl apply -k`, the CronJob): nothing is due, nothing is written.
        for mode in ("bootstrap", "rotate"):
            start = len(server.requests)
            proc = script(mode)
            assert proc.returncode == 0, proc.stderr
            assert "nothing to do" in proc.stdout and "already current" in proc.stdout
            assert writes_since(start) == []
        assert secret_files() == files

        # A CA inside its 90-day window: rolled over, and the bundle is injected before the Secret changes.
        short = tmp_path / "short"
        init_dir(short, service="gpu-admission", namespace=NS, validity=timedelta(days=20),
                 ca_validity=timedelta(days=30))  # fmt: skip
        fake.objects[SECRET_PATH]["data"] = tls_secret(short, name=TLS_SECRET, namespace=NS, include_ca=True)["data"]
        old_ca = (short / "ca.crt").read_bytes()
        start = len(server.requests)
        proc = script("rotate")
        assert proc.returncode == 0, proc.stderr
        assert "rolled the CA over" in proc.stdout
        assert writes_since(start) == [("PATCH", MWC), ("PATCH", VWC), ("PATCH", SECRET_PATH)]
        files = secret_files()
        new_ca = parse_cert(files["ca.crt"], source="ca.crt")
        assert files["ca.crt"] != old_ca
        bundle = parse_certs(files["ca-bundle.crt"], source="bundle")
        assert bundle == [new_ca, parse_cert(old_ca, source="old")]
        assert chain_ok(parse_cert(files["tls.crt"], source="tls.crt"), [new_ca])
        assert_injected()

        # A Secret without the CA key is someone else's: change nothing.
        for key in ("ca.key", "ca-bundle.crt"):
            del fake.objects[SECRET_PATH]["data"][key]
        start = len(server.requests)
        proc = script("bootstrap")
        assert proc.returncode == 1 and "without the CA key" in proc.stderr
        assert writes_since(start) == []

        # The API refuses: stop after the read, generate nothing.
        server.routes.insert(0, lambda r: Reply(403, status_body(403, "Forbidden", "secrets is forbidden")))
        start = len(server.requests)
        proc = script("bootstrap")
        assert proc.returncode == 1
        assert proc.stderr.strip().splitlines() == ["gpu-admission: error: secrets is forbidden (HTTP 403 Forbidden)"]
        assert [(r.method, r.path) for r in server.requests[start:]] == [("GET", SECRET_PATH)]
        assert sorted(p.name for p in script.material.iterdir()) == []


# -- contracts with the CLI: every command line of the Deployment and certs.sh parses ------------------------


def _parse_with_cli(argv: list[str]) -> str | None:
    """None when the real `gpu-admission` parser accepts argv, else its error message."""
    # No skip here: a CLI that does not import or build, or a command that is gone, breaks the contract.
    from webhook.cli import build_parser

    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert argv[0] in commands, f"`gpu-admission {argv[0]}` is not a command (deploy/ runs it)"
    import contextlib
    import io

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            parser.parse_args(argv)
    except SystemExit as exc:
        if exc.code:
            return err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else f"exit {exc.code}"
    return None


def _certs_script_invocations() -> list[list[str]]:
    calls: list[list[str]] = []
    for line in (BASE / "certs.sh").read_text(encoding="utf-8").splitlines():
        words = line.strip().split()
        if words[:1] == ["gpu-admission"]:
            argv = [w.strip('"').replace("$DIR", "/d").replace("$", "") for w in words[1:]]
            calls.append(argv)
    return calls


def test_cli_accepts_the_server_command() -> None:
    error = _parse_with_cli(SERVE_ARGS)
    assert error is None, f"`gpu-admission {' '.join(SERVE_ARGS)}` is rejected ({error}); see docs/deploy.md"


def test_certs_script_invocations_are_found() -> None:
    assert sorted({argv[1] for argv in _certs_script_invocations()}) == ["fetch", "init", "inject", "rotate", "secret"]


@pytest.mark.parametrize("argv", _certs_script_invocations(), ids=lambda a: " ".join(a[:2]))
def test_cli_accepts_the_certs_script(argv: list[str]) -> None:
    error = _parse_with_cli(argv)
    assert error is None, f"`gpu-admission {' '.join(argv)}` is rejected ({error}); see docs/deploy.md"


# -- the cert-manager overlay ----------------------------------------------------------------------------


def test_overlay_replaces_the_certs_job_with_cert_manager() -> None:
    docs = docs_of("cert-manager")
    for kind in ("Job", "CronJob"):
        assert not find(docs, kind)
    assert not [d for d in docs if d["metadata"]["name"].startswith("gpu-admission-certs")]
    assert not rules_of(docs, CERTS_SA)
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        cfg = one(docs, kind, "gpu-admission")
        assert cfg["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == f"{NS}/gpu-admission"
    cert = one(docs, "Certificate", "gpu-admission")
    assert cert["metadata"]["namespace"] == NS
    assert cert["spec"]["secretName"] == TLS_SECRET
    assert "gpu-admission.gpu-admission.svc" in cert["spec"]["dnsNames"]
    assert "gpu-admission.gpu-admission.svc.cluster.local" in cert["spec"]["dnsNames"]
    assert "server auth" in cert["spec"]["usages"]
    # The issuer chain: Certificate -> CA Issuer -> CA Certificate -> SelfSigned Issuer, all present.
    ca_issuer = one(docs, "Issuer", cert["spec"]["issuerRef"]["name"])
    ca_secret = ca_issuer["spec"]["ca"]["secretName"]
    ca_cert = next(c for c in find(docs, "Certificate") if c["spec"]["secretName"] == ca_secret)
    assert ca_cert["spec"]["isCA"] is True
    assert ca_cert["spec"]["privateKey"]["rotationPolicy"] == "Never", "CA renewals keep old leaves valid"
    root = one(docs, "Issuer", ca_cert["spec"]["issuerRef"]["name"])
    assert "selfSigned" in root["spec"]
    assert ca_secret != TLS_SECRET


def test_overlay_keeps_everything_else() -> None:
    base = {(d["kind"], d["metadata"]["name"]) for d in docs_of("base")}
    overlay = {(d["kind"], d["metadata"]["name"]) for d in docs_of("cert-manager")}
    removed = {k for k in base - overlay if not k[1].startswith("gpu-admission-certs")}
    assert not removed, f"the overlay removed more than the certs bootstrap: {removed}"


# -- Dockerfile ------------------------------------------------------------------------------------------


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        if full:
            word, _, rest = full.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def stages(instructions: list[tuple[str, str]]) -> list[list[tuple[str, str]]]:
    result: list[list[tuple[str, str]]] = []
    for ins in instructions:
        if ins[0] == "FROM":
            result.append([])
        if result:
            result[-1].append(ins)
    return result


def stage_images(instructions: list[tuple[str, str]]) -> list[str]:
    """The base image of each stage, with the global ARGs (those before the first FROM) at their defaults:
    what `docker build` uses when no --build-arg is given."""
    defaults: dict[str, str] = {}
    for word, args in instructions:
        if word == "FROM":
            break
        if word == "ARG" and "=" in args:
            name, _, value = args.partition("=")
            defaults[name.strip()] = value.strip()

    def resolve(image: str) -> str:
        return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: defaults.get(m[1] or m[2], m[0]), image)

    return [resolve(stage[0][1].split()[0]) for stage in stages(instructions)]


def dockerfile_lint(text: str) -> list[str]:
    problems: list[str] = []
    ins = dockerfile_instructions(text)
    st = stages(ins)
    if len(st) < 2:
        return ["not a multi-stage build"]
    for image in stage_images(ins):
        if image.lower() == "scratch":
            continue
        reference = image.partition("@")[0]
        tag = reference.rpartition(":")[2] if ":" in reference.split("/")[-1] else ""
        if not tag or tag == "latest" or not re.search(r"\d", tag):
            problems.append(f"base image {image} is not pinned to a versioned tag")
    final = st[-1]
    if not any(w == "COPY" and "--from=" in a for w, a in final):
        problems.append("final stage copies nothing from the builder")
    users = [a for w, a in final if w == "USER"]
    if not users:
        problems.append("final stage has no USER")
    else:
        user = users[-1].split(":")[0]
        if user in ("root", "0") or not user.isdigit() or int(user) == 0:
            problems.append(f"USER {users[-1]} is not a numeric non-root uid")
    for w, a in ins:
        if w == "RUN" and re.search(r"\bpip3? install\b", a) and "--no-cache-dir" not in a:
            problems.append(f"pip install without --no-cache-dir: {a}")
        if w == "ADD" and re.search(r"https?://", a):
            problems.append("ADD of a URL")
    for w, a in final:
        if w == "RUN" and re.search(r"\b(apt-get|apk|gcc|make)\b|pip3? install", a):
            problems.append(f"build tooling in the final stage: {a}")
    for key in ("ENTRYPOINT", "CMD"):
        values = [a for w, a in final if w == key]
        if not values:
            problems.append(f"no {key}")
            continue
        try:
            parsed = json.loads(values[-1])
        except json.JSONDecodeError:
            parsed = None
        if not (isinstance(parsed, list) and all(isinstance(x, str) for x in parsed)):
            problems.append(f"{key} is not in exec (JSON array) form")
    env = " ".join(a for w, a in final if w == "ENV")
    if "PYTHONDONTWRITEBYTECODE=1" not in env:
        problems.append("PYTHONDONTWRITEBYTECODE=1 not set in the final stage")
    if any(w == "HEALTHCHECK" for w, _ in final):
        problems.append("HEALTHCHECK in the image: Kubernetes probes are the health check")
    return problems


def test_dockerfile_lint() -> None:
    assert dockerfile_lint(DOCKERFILE.read_text(encoding="utf-8")) == []


def test_dockerfile_lint_catches_mistakes() -> None:
    bad = "FROM python:latest\nRUN pip install x\nUSER root\nENTRYPOINT gpu-admission serve\n"
    problems = " ".join(dockerfile_lint(bad))
    assert "multi-stage" in problems
    bad2 = (
        "FROM python:3.11-slim AS b\nRUN pip install -r r.txt\nFROM python\nCOPY --from=b /opt/venv /opt/venv\n"
        'RUN pip install --no-cache-dir y\nUSER 0\nENTRYPOINT gpu-admission\nCMD ["serve"]\n'
    )
    problems = " ".join(dockerfile_lint(bad2))
    for needle in ("not pinned", "--no-cache-dir", "build tooling", "non-root", "exec", "PYTHONDONTWRITEBYTECODE"):
        assert needle in problems, needle


def test_dockerfile_matches_the_deployment() -> None:
    ins = dockerfile_instructions(DOCKERFILE.read_text(encoding="utf-8"))
    final = stages(ins)[-1]
    images = set(stage_images(ins))
    assert len(images) == 1, "builder and final stage must share the base image (the venv links into it)"
    assert next(iter(images)).startswith("python:3.11")
    assert json.loads(next(a for w, a in final if w == "ENTRYPOINT")) == ["gpu-admission"]
    assert json.loads(next(a for w, a in final if w == "CMD")) == SERVE_ARGS
    assert ("EXPOSE", "8443") in final
    user = next(a for w, a in final if w == "USER").split(":")[0]
    assert int(user) == deployment(docs_of("base"))["spec"]["template"]["spec"]["securityContext"]["runAsUser"]
    copies = [a for w, a in final if w == "COPY"]
    assert copies == ["--from=builder /opt/venv /opt/venv"], "only the venv goes into the final image"


def test_dockerignore_keeps_the_context_small() -> None:
    lines = [
        ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines() if ln.strip() and not ln.startswith("#")
    ]
    assert lines[0] == "*", "allow-list"
    allowed = {ln[1:].rstrip("/") for ln in lines if ln.startswith("!")}
    for w, a in dockerfile_instructions(DOCKERFILE.read_text(encoding="utf-8")):
        if w == "COPY" and "--from=" not in a:
            for source in a.split()[:-1]:
                assert source.rstrip("/") in allowed, f"COPY {source} is excluded by .dockerignore"
    for secret_ish in (".git", "tests", "deploy", ".venv"):
        assert secret_ish not in allowed


def test_requirements_lock_pins_every_dependency() -> None:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins: dict[str, str] = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        req = Requirement(line)
        (spec,) = req.specifier
        assert spec.operator == "==", f"{line}: exact pins only"
        assert not req.marker and not req.extras, line
        name = canonicalize_name(req.name)
        assert name not in pins, f"{name} pinned twice"
        pins[name] = spec.version
    for dep in project["dependencies"]:
        req = Requirement(dep)
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} from pyproject.toml is not in requirements.lock"
        assert req.specifier.contains(pins[name], prereleases=True), f"{name}=={pins[name]} violates {dep}"
    assert canonicalize_name(project["name"]) not in pins


# -- docs ------------------------------------------------------------------------------------------------


def test_deploy_docs_cover_the_operations() -> None:
    text = DOCS.read_text(encoding="utf-8")
    for heading in ("## Install", "## Upgrade", "## Uninstall", "## Emergency disable", "## Tuning", "## RBAC",
                    "## cert-manager", "## CLI requirements"):  # fmt: skip
        assert heading in text, heading
    assert "kubectl delete mutatingwebhookconfiguration gpu-admission" in text
    assert " ".join(["gpu-admission", *SERVE_ARGS]) in " ".join(text.split()), "the fixed container command"
    assert "kubectl delete validatingwebhookconfiguration gpu-admission" in text
    uninstall = text[text.index("## Uninstall") :]
    assert uninstall.index("webhookconfiguration") < uninstall.index("kubectl delete -k")
