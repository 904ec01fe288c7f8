"""Native policies (policies/native.py, `gpu-admission policy native`, deploy/overlays/native): which objects are
generated from a policy, the namespace enforcement each binding stands for, the webhook's skip, the overlay.
Whether the API server accepts them and judges like the webhook is tests/e2e/test_native_e2e.py."""

from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from policies import native
from policies.document import RULE_IDS, default_policy
from policies.engine import ReviewContext, review
from tests.test_golden import CASES, inventory_for, load_case, policy_for
from webhook import suite

ROOT = Path(__file__).resolve().parent.parent
OVERLAY = ROOT / "deploy" / "overlays" / "native"


def gpu_admission(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "webhook", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip


def bindings(objects: list[dict[str, Any]], rule: str) -> dict[str, list[dict[str, Any]]]:
    """validationAction -> the binding's namespace label expressions, for one rule."""
    out = {}
    for o in objects:
        if o["kind"] == "ValidatingAdmissionPolicyBinding" and o["spec"]["policyName"] == native.NAME_PREFIX + rule:
            [action] = o["spec"]["validationActions"]
            exprs = o["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"]
            out[action] = exprs
    return out


EXCLUDED = {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": list(native.DEFAULT_EXCLUDED)}


def label(op: str, *values: str) -> dict[str, Any]:
    return {"key": "gpu-admission.io/enforcement", "operator": op, "values": list(values)}


def test_default_policy_bindings_follow_each_namespace_mode() -> None:
    objects = native.generate(default_policy())
    # enforce rule: Deny where the namespace enforces (label enforce, none or invalid), Warn / Audit where capped.
    assert bindings(objects, "training-elastic-shrink") == {
        "Deny": [EXCLUDED, label("NotIn", "warn", "audit", "off")],
        "Warn": [EXCLUDED, label("In", "warn")],
        "Audit": [EXCLUDED, label("In", "audit")],
    }
    # warn rule: never Deny.
    assert bindings(objects, "training-queue-priority") == {
        "Warn": [EXCLUDED, label("NotIn", "audit", "off")],
        "Audit": [EXCLUDED, label("In", "audit")],
    }
    vaps = [o for o in objects if o["kind"] == "ValidatingAdmissionPolicy"]
    assert {v["metadata"]["name"] for v in vaps} == {native.NAME_PREFIX + r for r in native.NATIVE_RULES}
    assert {v["spec"]["failurePolicy"] for v in vaps} == {"Fail"}


def test_policy_settings_shape_the_objects() -> None:
    warn_default = native.generate(policy_for({"defaultEnforcement": "warn", "failureMode": "open"}))
    assert bindings(warn_default, "training-elastic-shrink") == {
        "Deny": [EXCLUDED, label("In", "enforce")],
        "Warn": [EXCLUDED, label("NotIn", "enforce", "audit", "off")],
        "Audit": [EXCLUDED, label("In", "audit")],
    }
    assert {o["spec"]["failurePolicy"] for o in warn_default if o["kind"] == "ValidatingAdmissionPolicy"} == {"Ignore"}
    audit_default = native.generate(policy_for({"defaultEnforcement": "audit"}))
    assert bindings(audit_default, "training-queue-priority") == {
        "Warn": [EXCLUDED, label("In", "enforce", "warn")],
        "Audit": [EXCLUDED, label("NotIn", "enforce", "warn", "off")],
    }
    off = native.generate(policy_for({"rules": {"training-queue-priority": "off"}}))
    assert bindings(off, "training-queue-priority") == {}
    assert native.NAME_PREFIX + "training-queue-priority" not in {o["metadata"]["name"] for o in off}
    assert native.generate(policy_for({"defaultEnforcement": "off"})) != []  # namespaces labelled enforce still


def test_excluded_namespaces_are_the_callers() -> None:
    objects = native.generate(default_policy(), ("kube-system", "ops"))
    for o in objects:
        if o["kind"] == "ValidatingAdmissionPolicyBinding":
            first = o["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"][0]
            assert first == {
                "key": "kubernetes.io/metadata.name",
                "operator": "NotIn",
                "values": ["kube-system", "ops"],
            }


def test_every_rule_and_the_mutations_are_accounted_for() -> None:
    rows = dict(native.report(default_policy()))
    for rule in RULE_IDS:
        assert rule in rows, f"{rule}: neither generated nor said why not"
    from policies.document import MUTATION_IDS

    for mid in MUTATION_IDS:
        assert mid in rows, f"{mid}: neither generated nor said why not"
    assert rows["gpu-toleration"] == "webhook: no gpuNodes.tolerations in the policy: nothing to add"
    assert rows["training-queue-priority"] == "ValidatingAdmissionPolicy, warn"
    assert rows["training-elastic-shrink"].startswith("ValidatingAdmissionPolicy, enforce (templates;")
    off = dict(native.report(policy_for({"rules": {"training-elastic-shrink": "off"}})))
    assert off["training-elastic-shrink"] == "not generated: off in the policy"


def test_the_report_rows_are_whole_and_in_order() -> None:
    """`policy native --explain` prints these rows: rules first, then the two mutations, then what stays."""
    half = " (templates; its HPA/ScaledObject half stays in the webhook)"
    rules = [
        ("training-queue-priority", "not generated: off in the policy"),
        ("training-elastic-shrink", f"ValidatingAdmissionPolicy, warn{half}"),
        ("scheduler-topology-keys", "ValidatingAdmissionPolicy, warn"),
    ]
    overrides = {**MUTATING, "rules": {"training-queue-priority": "off", "training-elastic-shrink": "warn"}}
    rows = native.report(policy_for(overrides))
    assert rows[:5] == [
        *rules,
        ("gpu-toleration", "MutatingAdmissionPolicy (JSONPatch)"),
        ("scheduler-queue", "MutatingAdmissionPolicy (JSONPatch)"),
    ]
    assert rows[5:] == [(k, f"webhook: {v}") for k, v in native.NOT_NATIVE.items()]
    older = "webhook: MutatingAdmissionPolicy not generated (--no-mutations: Kubernetes < 1.36)"
    assert native.report(policy_for(overrides), mutations=False)[:5] == [
        *rules,
        ("gpu-toleration", older),
        ("scheduler-queue", older),
    ]
    assert native.report(policy_for(None))[:5] == [
        ("training-queue-priority", "ValidatingAdmissionPolicy, warn"),
        ("training-elastic-shrink", f"ValidatingAdmissionPolicy, enforce{half}"),
        ("scheduler-topology-keys", "ValidatingAdmissionPolicy, warn"),
        ("gpu-toleration", "webhook: no gpuNodes.tolerations in the policy: nothing to add"),
        (
            "scheduler-queue",
            "webhook: no training schedulerName, queue or priorityClassName in the policy: nothing to add",
        ),
    ]


# --- the webhook skips what the API server judges -------------------------------------------------------------


def _case(name: str) -> dict[str, Any]:
    return load_case(CASES / f"{name}.yaml")


def test_the_engine_skips_native_rules_on_templates_only() -> None:
    policy = policy_for(None)
    inv = inventory_for("examples/cluster/nodes.yaml", policy)
    elastic = _case("rules/training-elastic-shrink-elastic-policy")["input"]
    full = review(elastic, policy=policy, inventory=inv)
    assert [d.rule for d in full.denials] == ["training-elastic-shrink"]
    skipped = review(elastic, policy=policy, inventory=inv, ctx=ReviewContext(native=native.NATIVE_RULES))
    assert skipped.allowed and skipped.denials == ()
    assert {r.rule: r.outcome for r in skipped.results}["training-elastic-shrink"] == "native"
    assert skipped.patch == full.patch  # mutations are not native: unchanged

    hpa_case = _case("elasticity/hpa-on-pytorchjob")
    hpa = review(hpa_case["input"], policy=policy, inventory=inv, ctx=ReviewContext(native=native.NATIVE_RULES))
    assert [d.rule for d in hpa.denials] == ["training-elastic-shrink"]  # the HPA half stays in the webhook


def test_kinds_the_policies_do_not_match_keep_every_rule_in_the_webhook() -> None:
    """A kind the engine handles but the policies do not match (TrainJob, RayService, ...) is judged in full by
    the webhook even under --native: otherwise nobody would judge the native rules on it."""
    from policies.workloads import TEMPLATE_KINDS

    assert native.COVERED_KINDS <= TEMPLATE_KINDS
    uncovered = sorted(TEMPLATE_KINDS - native.COVERED_KINDS)
    assert uncovered, "every kind is matched: drop this test's premise"
    policy = policy_for({"rules": {"training-queue-priority": "enforce"}})
    inv = inventory_for("examples/cluster/nodes.yaml", policy)
    job = _case("rules/training-queue-priority-enforced")["input"]
    ctx = ReviewContext(native=native.NATIVE_RULES)
    assert review(job, policy=policy, inventory=inv, ctx=ctx).allowed  # PyTorchJob: the API server judges it
    from policies import engine

    original = engine.NATIVE_KINDS
    engine.NATIVE_KINDS = frozenset(original - {"PyTorchJob"})  # as for a kind the policies do not match
    try:
        r = review(job, policy=policy, inventory=inv, ctx=ctx)
    finally:
        engine.NATIVE_KINDS = original
    assert [d.rule for d in r.denials] == ["training-queue-priority"]


@pytest.mark.parametrize(
    "case_id", ["kinds/rayjob-autoscaling-denied", "kinds/trainjob-runtime-not-found-denied", "kinds/rayservice"]
)
def test_kinds_the_native_policies_do_not_read_are_judged_by_the_webhook(case_id: str) -> None:
    """The native CEL reads no TrainJob runtime, KServe PodSpec or RayService cluster, nor a RayJob's Ray
    autoscaling: under `serve --native` the webhook still judges those rules there, with the same verdict."""
    case = _case(case_id)
    policy = policy_for(case.get("policy"))
    inv = inventory_for("examples/cluster/nodes.yaml", policy)
    full = review(case["input"], policy=policy, inventory=inv)
    with_native = review(case["input"], policy=policy, inventory=inv, ctx=ReviewContext(native=native.NATIVE_RULES))
    assert [r.outcome for r in with_native.results if r.outcome == "native"] == []
    assert (with_native.allowed, with_native.denials, with_native.warnings) == (
        full.allowed,
        full.denials,
        full.warnings,
    )


# --- the command and the overlay ----------------------------------------------------------------------------


def test_policy_native_prints_the_objects_and_explains(tmp_path: Path) -> None:
    p = gpu_admission("policy", "native")
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("# gpu-admission policy native (sha256:")
    assert list(yaml.safe_load_all(p.stdout)) == native.generate(default_policy())
    e = gpu_admission("policy", "native", "--explain")
    assert e.returncode == 0 and "gpu-request-fits: webhook: needs the node inventory" in e.stdout
    mutating = tmp_path / "mutating.yaml"
    mutating.write_text(yaml.safe_dump({"apiVersion": "gpu-admission.io/v1alpha1", "kind": "Policy", **MUTATING}))
    m = gpu_admission("policy", "native", str(mutating))
    from policies.document import parse_policy_text

    want = native.generate(parse_policy_text(mutating.read_text()))
    assert m.returncode == 0 and list(yaml.safe_load_all(m.stdout)) == want
    assert m.stdout.count("kind: MutatingAdmissionPolicy\n") == 2
    v = gpu_admission("policy", "native", "--no-mutations", str(mutating))
    assert v.returncode == 0 and "MutatingAdmissionPolicy" not in v.stdout and "ValidatingAdmissionPolicy" in v.stdout
    ve = gpu_admission("policy", "native", "--no-mutations", "--explain", str(mutating))
    assert "gpu-toleration: webhook: MutatingAdmissionPolicy not generated (--no-mutations" in ve.stdout
    me = gpu_admission("policy", "native", "--explain", str(mutating))
    assert "scheduler-queue: MutatingAdmissionPolicy (JSONPatch)" in me.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: gpu-admission.io/v1alpha1\nkind: Policy\nrules: {training-same-rack: deny}\n")
    b = gpu_admission("policy", "native", str(bad))
    assert b.returncode == 2 and b.stdout == "" and len(b.stderr.splitlines()) == 1, b.stderr
    assert "training-same-rack" in b.stderr and "Traceback" not in b.stderr


def test_the_overlay_copy_is_current_for_the_default_policy() -> None:
    shipped = [d for d in yaml.safe_load_all((OVERLAY / "native-policies.yaml").read_text()) if d]
    assert shipped == native.generate(default_policy()), (
        "regenerate: gpu-admission policy native deploy/base/policy.yaml > deploy/overlays/native/native-policies.yaml"
    )


def test_the_overlay_runs_the_webhook_with_native_beside_the_policies() -> None:
    kubectl = subprocess.run(["kubectl", "kustomize", str(OVERLAY)], capture_output=True, text=True, timeout=120)
    if kubectl.returncode != 0 and "not found" in kubectl.stderr:
        pytest.fail(f"kubectl kustomize is needed: {kubectl.stderr}")
    assert kubectl.returncode == 0, kubectl.stderr
    docs = [d for d in yaml.safe_load_all(kubectl.stdout) if d]
    [deployment] = [d for d in docs if d["kind"] == "Deployment"]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[0] == "serve" and args.count("--native") == 1
    kinds = [d["kind"] for d in docs]
    assert kinds.count("ValidatingAdmissionPolicy") == len(native.NATIVE_RULES)
    assert "MutatingWebhookConfiguration" in kinds and "ValidatingWebhookConfiguration" in kinds
    for d in docs:
        if d["kind"].startswith("ValidatingAdmissionPolicy"):
            assert "namespace" not in d["metadata"], d["metadata"]  # cluster-scoped


# --- mutations: MutatingAdmissionPolicies ---------------------------------------------------------------------

TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
MUTATING = {
    "gpuNodes": {"tolerations": [TOLERATION, TOLERATION]},
    "training": {"schedulerName": "volcano", "queue": {"system": "kueue", "name": "team-a"}, "priorityClassName": "p"},
}


def _maps(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == "MutatingAdmissionPolicy"}


def test_mutations_the_policy_fills_in_become_mutating_admission_policies() -> None:
    objects = native.generate(policy_for(MUTATING))
    maps = _maps(objects)
    names = [native.NAME_PREFIX + m for m in native.MAP_MUTATIONS]
    assert sorted(maps) == sorted(names)  # one policy and one binding of the same name each
    assert [o["kind"] for o in objects].count("MutatingAdmissionPolicy") == 2
    assert [o["kind"] for o in objects].count("MutatingAdmissionPolicyBinding") == 2
    for o in objects:
        if o["kind"] == "MutatingAdmissionPolicy":
            spec = o["spec"]
            assert spec["failurePolicy"] == "Fail" and spec["reinvocationPolicy"] == "IfNeeded"
            assert [m["patchType"] for m in spec["mutations"]] == ["JSONPatch"]
            assert "'volcano'" in spec["mutations"][0]["jsonPatch"]["expression"] or o["metadata"]["name"].endswith(
                "gpu-toleration"
            )
        if o["kind"] == "MutatingAdmissionPolicyBinding":
            # mutations run wherever the namespace's enforcement is not off (policies/engine.py)
            assert o["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"] == [
                EXCLUDED,
                label("NotIn", "off"),
            ]
    tol = next(o for o in objects if o["kind"] == "MutatingAdmissionPolicy" and "toleration" in o["metadata"]["name"])
    # the duplicate toleration is added once, as the webhook's second append finds the first
    once = {**MUTATING, "gpuNodes": {"tolerations": [TOLERATION]}}
    tol_once = _maps(native.generate(policy_for(once)))[native.NAME_PREFIX + "gpu-toleration"]
    assert tol["spec"] == tol_once["spec"]
    off_default = native.generate(policy_for({**MUTATING, "defaultEnforcement": "off", "failureMode": "open"}))
    binding = next(o for o in off_default if o["kind"] == "MutatingAdmissionPolicyBinding")
    assert binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"][1] == label(
        "In", "enforce", "warn", "audit"
    )
    assert {o["spec"]["failurePolicy"] for o in off_default if o["kind"] == "MutatingAdmissionPolicy"} == {"Ignore"}
    assert _maps(native.generate(policy_for(MUTATING), mutations=False)) == {}
    excluded = native.generate(policy_for(MUTATING), ("ops",))
    assert all(
        o["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"][0]["values"] == ["ops"]
        for o in excluded
        if o["kind"] == "MutatingAdmissionPolicyBinding"
    )


@pytest.mark.parametrize(
    ("overrides", "mutation", "why"),
    [
        ({}, "gpu-toleration", "no gpuNodes.tolerations in the policy: nothing to add"),
        ({}, "scheduler-queue", "no training schedulerName, queue or priorityClassName in the policy: nothing to add"),
        ({**MUTATING, "mutations": {"gpu-toleration": False}}, "gpu-toleration", "off in the policy"),
        (
            {"training": {"queue": {"system": "kai", "name": "q"}}},
            "scheduler-queue",
            "a KAI queue label goes on the object and on the first template lacking one (an order CEL over a map "
            "does not keep)",
        ),
        (
            {"training": {"queue": {"system": "kueue", "name": "q"}}, "placement": {"gangSchedulers": {"kueue": True}}},
            "scheduler-queue",
            "training-rack reads the Kueue queue label it adds (gangSchedulers.kueue) and runs first in the webhook",
        ),
        (
            {"training": {"schedulerName": "kai-scheduler"}, "placement": {"gangSchedulers": {"kaiTopology": "t"}}},
            "scheduler-queue",
            "training-rack reads the schedulerName it sets (gangSchedulers.kaiTopology) and runs first in the webhook",
        ),
    ],
)
def test_a_mutation_stays_in_the_webhook_where_a_policy_could_not_mirror_it(
    overrides: dict[str, Any], mutation: str, why: str
) -> None:
    policy = policy_for(overrides)
    assert native.mutation_blocker(mutation, policy) == why  # the whole reason, as --explain prints it
    assert mutation not in native.native_mutations(policy)
    assert native.NAME_PREFIX + mutation not in _maps(native.generate(policy))
    assert dict(native.report(policy))[mutation] == f"webhook: {native.mutation_blocker(mutation, policy)}"


def test_the_same_queue_settings_without_the_gang_setting_are_native() -> None:
    kueue = policy_for({"training": {"queue": {"system": "kueue", "name": "q"}}})
    assert native.native_mutations(kueue) == {"scheduler-queue"}
    no_rack = policy_for(
        {
            "training": {"queue": {"system": "kueue", "name": "q"}},
            "placement": {"gangSchedulers": {"kueue": True}},
            "mutations": {"training-rack": False},
        }
    )
    assert native.native_mutations(no_rack) == {"scheduler-queue"}
    kai_no_topology = policy_for({"training": {"schedulerName": "kai-scheduler"}})  # no gangSchedulers.kaiTopology
    assert native.native_mutations(kai_no_topology) == {"scheduler-queue"}


@pytest.mark.parametrize(
    ("resources", "asks"),
    [
        ({"limits": {"nvidia.com/gpu": 1}}, True),
        ({"limits": {"nvidia.com/gpu": "0"}}, False),
        ({"limits": {"nvidia.com/gpu": 0}}, False),
        ({"limits": {"nvidia.com/gpu": "00"}}, False),
        ({"limits": {"nvidia.com/mig-1g.10gb": "2"}}, True),
        ({"limits": {"nvidia.com/gpu": "500m"}}, True),  # not a whole zero: asks (gpu-request-fits judges it)
        ({"requests": {"nvidia.com/gpu": "1"}}, True),
        ({"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "0"}}, False),  # the limit decides
        ({"limits": {"example.com/gpu": "1"}}, False),
        ({"limits": {"cpu": "1"}}, False),
        ({}, False),
    ],
)
def test_cel_asks_gpu_is_the_policies_gpu_test(resources: dict[str, Any], asks: bool) -> None:
    pod = {"spec": {"containers": [{"name": "c", "resources": resources}]}}
    assert native.cel_asks_gpu(pod) is asks
    init = {"spec": {"containers": [], "initContainers": [{"name": "i", "resources": resources}]}}
    assert native.cel_asks_gpu(init) is asks
    assert native.cel_asks_gpu({"spec": "x"}) is False and native.cel_asks_gpu("x") is False


def test_cel_asks_gpu_reads_no_gpu_from_containers_or_resources_that_are_not_mappings() -> None:
    """Malformed containers never raise (the engine calls it on whatever a pod holds) and ask for nothing."""
    for containers in (["x", 3, None], [{"resources": "x"}], [{"resources": {"limits": ["a"], "requests": "b"}}]):
        assert native.cel_asks_gpu({"spec": {"containers": containers}}) is False, containers
    limits_bad = [{"resources": {"limits": "x", "requests": {"nvidia.com/gpu": "1"}}}]
    assert native.cel_asks_gpu({"spec": {"containers": limits_bad}}) is True  # no limit: the request decides


# The fields of each generated object (admissionregistration.k8s.io/v1): a misspelt one is an object the API
# server refuses (strict field validation) or reads without the setting.
SHAPES = {
    "MutatingAdmissionPolicy": (
        {"name", "labels", "annotations"},
        {"failurePolicy", "reinvocationPolicy", "matchConstraints", "matchConditions", "variables", "mutations"},
    ),
    "MutatingAdmissionPolicyBinding": ({"name", "labels"}, {"policyName", "matchResources"}),
    "ValidatingAdmissionPolicy": (
        {"name", "labels", "annotations"},
        {"failurePolicy", "matchConstraints", "matchConditions", "variables", "validations"},
    ),
    "ValidatingAdmissionPolicyBinding": ({"name", "labels"}, {"policyName", "validationActions", "matchResources"}),
}


@pytest.mark.parametrize("closed", [True, False])
def test_every_generated_object_has_the_fields_of_its_kind(closed: bool) -> None:
    policy = policy_for({**MUTATING, "failureMode": "closed" if closed else "open"})
    objects = native.generate(policy)
    assert {o["kind"] for o in objects} == set(SHAPES)
    for o in objects:
        meta_keys, spec_keys = SHAPES[o["kind"]]
        assert set(o) == {"apiVersion", "kind", "metadata", "spec"}, o["kind"]
        assert o["apiVersion"] == "admissionregistration.k8s.io/v1"
        assert (set(o["metadata"]), set(o["spec"])) == (meta_keys, spec_keys), o["kind"]
        assert o["metadata"]["labels"] == native.MANAGED_BY
        if o["kind"].endswith("Binding"):
            assert re.fullmatch(re.escape(o["spec"]["policyName"]) + r"(-deny|-warn|-audit)?", o["metadata"]["name"])
        else:
            assert o["spec"]["failurePolicy"] == ("Fail" if closed else "Ignore")
            assert o["metadata"]["annotations"]["gpu-admission.io/policy-hash"] == policy.hash
        if o["kind"] == "MutatingAdmissionPolicy":
            mid = o["metadata"]["name"].removeprefix(native.NAME_PREFIX)
            assert o["metadata"]["annotations"] == {
                "gpu-admission.io/mutation": mid,
                "gpu-admission.io/checklist": {"gpu-toleration": "GPU nodes' taints tolerated",
                                               "scheduler-queue": "2. queue + priority"}[mid],
                "gpu-admission.io/policy-hash": policy.hash,
            }  # fmt: skip
            assert o["spec"]["matchConstraints"] == {"resourceRules": native._resource_rules()}
            assert [c["name"] for c in o["spec"]["matchConditions"]] == ["not-a-pod-update", "object"]
            assert [v["name"] for v in o["spec"]["variables"]] == [
                "kind",
                "templates",
                "objectClass",
                "gpu",
                "training",
            ]


def _job(resources: dict[str, Any], claims: list[Any] | None = None) -> dict[str, Any]:
    pod_spec: dict[str, Any] = {"containers": [{"name": "c", "image": "i", "resources": resources}]}
    if claims is not None:
        pod_spec["resourceClaims"] = claims
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "j", "namespace": "ml"},
        "spec": {"parallelism": 2, "template": {"spec": pod_spec}},
    }


def test_the_engine_skips_native_mutations_only_on_the_pods_the_policies_see() -> None:
    policy = policy_for(MUTATING)
    inv = inventory_for("examples/cluster/nodes.yaml", policy)
    skip = ReviewContext(native=native.NATIVE_RULES | set(native.MAP_MUTATIONS))
    job = _job({"limits": {"nvidia.com/gpu": "8"}})
    full = review(job, policy=policy, inventory=inv)
    assert {"gpu-toleration", "scheduler-queue"} <= set(full.mutations)
    skipped = review(job, policy=policy, inventory=inv, ctx=skip)
    assert not {"gpu-toleration", "scheduler-queue"} & set(skipped.mutations)
    outcomes = {r.rule: r.outcome for r in skipped.results}
    assert outcomes["gpu-toleration"] == outcomes["scheduler-queue"] == "native"
    # reported as mutations (the audit record leaves out the results of action "mutate")
    reported = {(r.rule, r.action) for r in skipped.results if r.outcome == "native" and r.rule in native.MAP_MUTATIONS}
    assert reported == {("gpu-toleration", "mutate"), ("scheduler-queue", "mutate")}
    assert "tolerations" not in skipped.object["spec"]["template"]["spec"]
    # without --native-mutations (VAPs only) the webhook keeps mutating
    rules_only = review(job, policy=policy, inventory=inv, ctx=ReviewContext(native=native.NATIVE_RULES))
    assert rules_only.patch == full.patch
    # a policy whose mutation cannot be native: the webhook does it although asked to skip
    kai = policy_for({**MUTATING, "training": {"queue": {"system": "kai", "name": "q"}}})
    assert "scheduler-queue" in review(job, policy=kai, inventory=inv, ctx=skip).mutations
    # a kind the policies do not match: the webhook does it
    from policies import engine

    original = engine.NATIVE_KINDS
    engine.NATIVE_KINDS = frozenset(original - {"Job"})
    try:
        assert "gpu-toleration" in review(job, policy=policy, inventory=inv, ctx=skip).mutations
    finally:
        engine.NATIVE_KINDS = original


# --- exceptions for native rules: the webhook marks, the policies skip ------------------------------------


def _native_review(case_id: str, obj: dict[str, Any] | None = None, *, native_rules: frozenset[str] | None = None,
                   mutate: bool = True) -> Any:  # fmt: skip
    """A golden case reviewed as `serve --native` does (its exceptions, its clock)."""
    case = _case(case_id)
    obj = copy.deepcopy(case["input"] if obj is None else obj)
    excs, now = suite.exceptions_for(case, obj)
    policy = policy_for(case.get("policy"))
    ctx = ReviewContext(exceptions=excs, now=now, native=native.NATIVE_RULES if native_rules is None else native_rules)
    return review(obj, policy=policy, inventory=inventory_for("examples/cluster/nodes.yaml", policy), ctx=ctx,
                  mutate=mutate, validate=not mutate)  # fmt: skip


def _marked(r: Any) -> str | None:
    return ((r.object.get("metadata") or {}).get("annotations") or {}).get(native.EXCEPTED_ANNOTATION)


def test_the_webhook_marks_the_native_rules_a_live_exception_lets_the_object_skip() -> None:
    r = _native_review("exceptions/named-workload-excepted-from-one-rule")
    assert r.allowed and _marked(r) == "training-elastic-shrink"
    ptr = "/metadata/annotations/" + native.EXCEPTED_ANNOTATION.replace("/", "~1")
    assert {"op": "add", "path": ptr, "value": "training-elastic-shrink"} in [dict(op) for op in r.patch] or any(
        op.get("path") == "/metadata/annotations" and native.EXCEPTED_ANNOTATION in op.get("value", {})
        for op in map(dict, r.patch)
    )
    # The validating call leaves the rule to the policy and says why it will pass there.
    v = _native_review("exceptions/named-workload-excepted-from-one-rule", r.object, mutate=False)
    result = {x.rule: x for x in v.results}["training-elastic-shrink"]
    assert result.outcome == "native" and "excepted by ml-research/dpo-elastic-trial" in result.message
    # The mark is the webhook's own key, not a user's: never an "unknown annotation" (gpu-admission-annotations).
    assert v.allowed, v.denials
    assert {x.rule: x.outcome for x in v.results}["gpu-admission-annotations"] == "pass"


def test_no_mark_for_other_workloads_expired_exceptions_or_rules_left_in_the_webhook() -> None:
    for case_id in ("exceptions/other-workload-not-excepted", "exceptions/expired-ignored-and-reported",
                    "exceptions/other-namespace-not-excepted"):  # fmt: skip
        assert _marked(_native_review(case_id)) is None, case_id
    # Without --native the webhook judges the rule itself and writes nothing.
    assert _marked(_native_review("exceptions/named-workload-excepted-from-one-rule", native_rules=frozenset())) is None
    # A native run that leaves this rule in the webhook (a policy with only the other two native) writes nothing.
    others = native.NATIVE_RULES - {"training-elastic-shrink"}
    assert _marked(_native_review("exceptions/named-workload-excepted-from-one-rule", native_rules=others)) is None


def test_no_mark_on_a_kind_the_native_policies_do_not_read(monkeypatch: pytest.MonkeyPatch) -> None:
    from policies import engine

    case_id = "exceptions/named-workload-excepted-from-one-rule"
    assert _marked(_native_review(case_id)) == "training-elastic-shrink"
    monkeypatch.setattr(engine, "NATIVE_KINDS", engine.NATIVE_KINDS - {_case(case_id)["input"]["kind"]})
    assert _marked(_native_review(case_id)) is None  # the webhook judges that kind's rules itself


def test_the_mark_names_every_excepted_native_rule_comma_separated() -> None:
    case = copy.deepcopy(_case("exceptions/named-workload-excepted-from-one-rule"))
    case["exceptions"][0]["spec"]["rules"] = ["training-queue-priority", "training-elastic-shrink"]
    obj = copy.deepcopy(case["input"])
    excs, now = suite.exceptions_for(case, obj)
    policy = policy_for(case.get("policy"))
    ctx = ReviewContext(exceptions=excs, now=now, native=native.NATIVE_RULES)
    inv = inventory_for("examples/cluster/nodes.yaml", policy)
    r = review(obj, policy=policy, inventory=inv, ctx=ctx, mutate=True, validate=False)
    assert _marked(r) == "training-elastic-shrink,training-queue-priority"


def test_a_mark_the_user_wrote_is_replaced_or_removed() -> None:
    """The policies trust the annotation only because the webhook rewrites it on every object it reviews."""
    base = _case("exceptions/other-workload-not-excepted")["input"]
    forged = copy.deepcopy(base)
    forged["metadata"].setdefault("annotations", {})[native.EXCEPTED_ANNOTATION] = ",".join(sorted(native.NATIVE_RULES))
    r = _native_review("exceptions/other-workload-not-excepted", forged)
    assert _marked(r) is None
    assert {"op": "remove", "path": "/metadata/annotations/" + native.EXCEPTED_ANNOTATION.replace("/", "~1")} in [
        dict(op) for op in r.patch
    ]
    excepted = copy.deepcopy(_case("exceptions/named-workload-excepted-from-one-rule")["input"])
    excepted["metadata"].setdefault("annotations", {})[native.EXCEPTED_ANNOTATION] = "scheduler-topology-keys"
    assert _marked(_native_review("exceptions/named-workload-excepted-from-one-rule", excepted)) == (
        "training-elastic-shrink"
    )
    empty = copy.deepcopy(base)
    empty["metadata"].setdefault("annotations", {})[native.EXCEPTED_ANNOTATION] = ""
    assert _marked(_native_review("exceptions/other-workload-not-excepted", empty)) is None


def test_an_object_already_marked_right_gets_no_patch_for_it() -> None:
    first = _native_review("exceptions/named-workload-excepted-from-one-rule")
    again = _native_review("exceptions/named-workload-excepted-from-one-rule", first.object)
    assert _marked(again) == "training-elastic-shrink"
    assert not any(native.EXCEPTED_ANNOTATION.replace("/", "~1") in dict(op).get("path", "") for op in again.patch)


def test_an_object_no_mutation_changes_gets_a_patch_for_the_mark_alone() -> None:
    """The mark is written (or a forged one removed) by the patch even when every mutation is already there."""
    case_id = "exceptions/named-workload-excepted-from-one-rule"
    mutated = _native_review(case_id).object
    del mutated["metadata"]["annotations"][native.EXCEPTED_ANNOTATION]
    r = _native_review(case_id, mutated)
    assert r.mutations == () and _marked(r) == "training-elastic-shrink"
    ptr = "/metadata/annotations/" + native.EXCEPTED_ANNOTATION.replace("/", "~1")
    assert [dict(op) for op in r.patch] == [{"op": "add", "path": ptr, "value": "training-elastic-shrink"}]
    forged = _native_review("exceptions/other-workload-not-excepted").object
    forged["metadata"].setdefault("annotations", {})[native.EXCEPTED_ANNOTATION] = "training-elastic-shrink"
    r = _native_review("exceptions/other-workload-not-excepted", forged)
    assert r.mutations == () and _marked(r) is None
    assert [dict(op) for op in r.patch] == [{"op": "remove", "path": ptr}]


def test_each_policy_skips_only_its_own_rule_when_marked() -> None:
    """The generated condition, read as the API server reads it (its CEL is checked by the e2e tests: celpy has
    no optional fields): one condition per policy, naming its own rule, matched as a whole item of the list."""
    for obj in native.generate(policy_for(None)):
        if obj["kind"] != "ValidatingAdmissionPolicy":
            continue
        rule = obj["metadata"]["annotations"]["gpu-admission.io/rule"]
        [cond] = [c for c in obj["spec"]["matchConditions"] if c["name"] == "not-excepted"]
        assert cond == native.not_excepted(rule)
        pattern = re.search(r"\.matches\('(.*)'\)$", cond["expression"])
        assert pattern and native.EXCEPTED_ANNOTATION in cond["expression"] and cond["expression"].startswith("!")
        rx = re.compile(pattern.group(1))
        assert rx.search(rule) and rx.search(f"a,{rule}") and rx.search(f"{rule},b") and rx.search(f"a,{rule},b")
        assert not rx.search(f"{rule}-x") and not rx.search(f"x{rule}") and not rx.search("")
