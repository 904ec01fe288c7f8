"""Native policies on the real API server (issue #17 item 4): what `gpu-admission policy native` generates is
accepted (server-side dry run), and on every golden case the policies cover the API server's verdict for each
native rule is the webhook's.

Both ways, per case: the engine — what `serve` runs on /mutate, /validate and /admit — reviews the case as
`tests/test_golden.py` does (its policy, nodes, pod view, namespace labels); the ValidatingAdmissionPolicies
generated from the same policy judge the object the engine's mutations produced (what they see behind our
mutating webhook in deploy/overlays/native), created with dry-run=server in a namespace carrying the case's
labels. For each native rule the two must agree: denied by both (same message) or neither, warned by both or
neither. `audit` cannot be compared (a VAP's Audit action only annotates the API server's audit log).

`test_overlay_*` runs the deploy overlay's pieces together: the webhook with `--native` and the policies,
and checks the native rule is judged once, by the API server.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from policies import native
from policies.document import Policy
from policies.engine import review
from policies.userkeys import ENFORCEMENT
from tests import test_golden as golden
from tests.e2e import crds
from tests.e2e.cluster import ControlPlane
from tests.e2e.webhook import Webhook
from tests.nativecases import (
    MUTATING,
    TOLERATIONS,
    covered,
    excepts_native,
    mutating_cases,
    native_outcomes,
    touched,
)

pytestmark = pytest.mark.e2e

DENIED = re.compile(
    r"ValidatingAdmissionPolicy '" + native.NAME_PREFIX + r"([\w-]+)' with binding '[^']+' denied request: (.*)"
)
WARNED = re.compile(r"Warning: Validation failed for ValidatingAdmissionPolicy '" + native.NAME_PREFIX + r"([\w-]+)'")
# Kinds the policies match (with the CRDs of tests/e2e/crds.py installed).
COVERED_KINDS = native.COVERED_KINDS


PRIORITY_CLASSES = ("training-normal", "training-low", "training-high", "infra-critical")  # named by the cases


@pytest.fixture(scope="module")
def crds_installed(control_plane: ControlPlane) -> Iterator[None]:
    """The CRDs, and the PriorityClasses the cases name (the Priority admission plugin refuses a pod naming a
    missing one before any validating admission runs)."""
    crds.install(control_plane)
    items = [{"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": n}, "value": 1000}
             for n in PRIORITY_CLASSES]  # fmt: skip
    control_plane.kubectl("apply", "-f", "-", input={"apiVersion": "v1", "kind": "List", "items": items})
    yield
    control_plane.kubectl("delete", "priorityclass", *PRIORITY_CLASSES, "--ignore-not-found", check=False)


NATIVE_KINDS = "validatingadmissionpolicybindings,validatingadmissionpolicies"
MAP_KINDS = "mutatingadmissionpolicybindings,mutatingadmissionpolicies"


def apply_native(cp: ControlPlane, policy: Policy, kinds: tuple[str, ...] = ("Validating",)) -> None:
    """Replace whatever native policies are in the cluster with this policy's (of these kinds: Validating,
    Mutating). Updated in place, then the rest deleted: a MutatingAdmissionPolicy deleted and created again
    under the same name kept its old mutation in kube-apiserver 1.37.2 for over 90 s (a new generation does
    not)."""
    objects = [o for o in native.generate(policy) if o["kind"].startswith(kinds)]
    if objects:
        cp.kubectl("apply", "-f", "-", input={"apiVersion": "v1", "kind": "List", "items": objects})
    keep = {f"{o['kind'].lower()}.admissionregistration.k8s.io/{o['metadata']['name']}" for o in objects}
    for resources in (NATIVE_KINDS, MAP_KINDS):
        listed = cp.kubectl("get", resources, "-l", "app.kubernetes.io/component=native-policy", "-o", "name",
                            check=False).stdout.split()  # fmt: skip
        stale = [name for name in listed if name not in keep]
        if stale:
            cp.kubectl("delete", *stale, "--wait=true", check=False)


def judged(cp: ControlPlane, namespace: str, obj: dict[str, Any]) -> tuple[dict[str, str], set[str], str]:
    """Native rule -> denial message, native rules that warned, and any other refusal (the API server's own)."""
    p = cp.kubectl("create", "--dry-run=server", "-n", namespace, "-o", "name", "-f", "-", input=obj, check=False)
    denied = {m[1]: m[2].strip() for m in DENIED.finditer(p.stderr)}
    warned = {m[1] for m in WARNED.finditer(p.stderr)}
    other = p.stderr.strip() if p.returncode != 0 and not denied else ""
    return denied, warned, other


def creatable(obj: dict[str, Any], namespace: str) -> dict[str, Any]:
    """The object as a user would create it here: in the test namespace, named, and with what the API server's
    own validation requires and the engine never reads (a container image, a Job's restartPolicy)."""
    obj = copy.deepcopy(obj)
    meta = obj.setdefault("metadata", {})
    meta["namespace"] = namespace
    if not meta.get("name") and not meta.get("generateName"):
        meta["name"] = "case"
    for tpl in _pod_like(obj):
        spec = tpl.get("spec")
        if not isinstance(spec, dict):
            continue
        for key in ("containers", "initContainers"):
            for c in spec.get(key) or []:
                if isinstance(c, dict):
                    c.setdefault("image", "registry.example/gpu-admission-test:1")
        if obj.get("kind") in ("Job", "CronJob") and obj.get("apiVersion", "").startswith("batch/"):
            spec.setdefault("restartPolicy", "Never")
    return obj


def _pod_like(obj: dict[str, Any]) -> Iterator[dict[str, Any]]:
    from policies.workloads import templates

    for t in templates(obj):
        yield t.pod


def _policy_key(policy: Policy, kinds: str = "Validating") -> str:
    """The generated objects of these kinds without the policy hash: cases with equal keys share one apply."""
    objects = [o for o in native.generate(policy) if o["kind"].startswith(kinds)]
    for o in objects:
        o["metadata"].pop("annotations", None)
    return json.dumps(objects, sort_keys=True)


def test_generated_policies_are_accepted_by_the_api_server(control_plane: ControlPlane) -> None:
    """Server-side dry run of the objects for policies that exercise every generator branch."""
    variants: list[Any] = [
        None,
        {"defaultEnforcement": "warn"},
        {"defaultEnforcement": "audit", "failureMode": "open"},
        {"rules": {"training-queue-priority": "enforce", "training-elastic-shrink": "audit"}},
        {"rules": {"training-queue-priority": "off"}},
    ]
    variants += [*MUTATING.values(), {**MUTATING["kueue"], "defaultEnforcement": "off", "failureMode": "open"}]
    maps = 0
    for overrides in variants:
        objects = native.generate(golden.policy_for(overrides))
        assert objects, overrides
        p = control_plane.kubectl("apply", "--dry-run=server", "-f", "-",
                                  input={"apiVersion": "v1", "kind": "List", "items": objects})  # fmt: skip
        created = [line for line in p.stdout.splitlines() if line.endswith("created (server dry run)")]
        assert len(created) == len(objects), p.stdout + p.stderr
        maps += sum(o["kind"] == "MutatingAdmissionPolicy" for o in objects)
    assert maps == 6  # gpu-toleration and scheduler-queue for each of the three mutating policies
    rules_off = golden.policy_for({"rules": {r: "off" for r in native.NATIVE_RULES}})
    assert native.generate(rules_off) == []


def test_native_and_webhook_agree_on_every_golden_case_they_cover(
    control_plane: ControlPlane, crds_installed: None
) -> None:
    cp = control_plane
    namespaces: dict[str, str] = {}

    def namespace_for(labels: dict[str, str] | None) -> str:
        key = json.dumps(labels or {}, sort_keys=True)
        if key not in namespaces:
            name = f"native-{uuid.uuid4().hex[:8]}"
            ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels or {}}}
            cp.kubectl("create", "-f", "-", input=ns)
            namespaces[key] = name
        return namespaces[key]

    groups: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    skipped: dict[str, str] = {}
    excepted: list[str] = []
    for path in golden.case_files():
        case = golden.load_case(path)
        if not covered(case):
            skipped[golden.case_id(path)] = "kind not matched by the native policies"
            continue
        if excepts_native(case):
            excepted.append(golden.case_id(path))  # compared as the webhook's mutating call marks them
        policy = golden.policy_for(case.get("policy"))
        groups.setdefault(_policy_key(policy), []).append((golden.case_id(path), case))

    compared, refused, mismatches = 0, [], []
    shown: dict[str, int] = {"deny": 0, "warn": 0}
    for cases in groups.values():
        policy = golden.policy_for(cases[0][1].get("policy"))
        apply_native(cp, policy)
        time.sleep(2.0)  # the API server's policy informers pick the objects up asynchronously
        for cid, case in cases:
            r, _, inv, ctx = golden.run_case(case, copy.deepcopy(case["input"]))
            want_denied, want_warned = native_outcomes(r)
            ns = namespace_for(case.get("namespaceLabels"))
            # What reaches the policies under `serve --native`: the webhook's mutating call writes the native
            # rules a live GPUPolicyException lets the object skip (native.EXCEPTED_ANNOTATION).
            marked = review(copy.deepcopy(r.object), policy=policy, inventory=inv, mutate=True, validate=False,
                            ctx=dataclasses.replace(ctx, native=native.NATIVE_RULES)).object  # fmt: skip
            obj = creatable(marked, ns)
            got_denied, got_warned, other = _settled(cp, ns, obj, want_denied, want_warned)
            if other:
                refused.append(f"{cid}: {other.splitlines()[-1][:200]}")
                continue
            compared += 1
            shown["deny"] += bool(want_denied)
            shown["warn"] += bool(want_warned)
            if got_denied != want_denied or got_warned != want_warned:
                mismatches.append(f"{cid}: webhook denied {want_denied} warned {sorted(want_warned)}; "
                                  f"native denied {got_denied} warned {sorted(got_warned)}")  # fmt: skip
    print(f"\nnative vs webhook: {compared} golden cases compared, {len(refused)} refused by the API server's own "
          f"validation, {len(skipped)} not covered, {len(excepted)} with a GPUPolicyException for a native rule "
          f"(marked by the webhook); native rules denied in {shown['deny']}, warned in {shown['warn']}")  # fmt: skip
    for line in refused:
        print("  refused:", line)
    assert not mismatches, "\n".join(mismatches)
    # The comparison is not vacuous: most cases reach the API server's policies, and they deny and warn.
    assert compared >= 180 and shown["deny"] >= 7 and shown["warn"] >= 12, (compared, shown)
    assert len(excepted) >= 8 and not set(excepted) & {x.split(":")[0] for x in refused}, excepted


def _settled(
    cp: ControlPlane, ns: str, obj: dict[str, Any], want_denied: dict[str, str], want_warned: set[str]
) -> tuple[dict[str, str], set[str], str]:
    """The API server's verdict; retried briefly while it differs (a binding may still be on its way)."""
    deadline = time.monotonic() + 5.0
    while True:
        got = judged(cp, ns, obj)
        if (got[0] == want_denied and got[1] == want_warned) or got[2] or time.monotonic() > deadline:
            return got
        time.sleep(0.5)


# --- the overlay: the webhook with --native beside the policies --------------------------------------------


def _input(case: str) -> dict[str, Any]:
    return dict(yaml.safe_load((Path(golden.CASES) / f"{case}.yaml").read_text())["input"])


def test_overlay_judges_native_rules_once_in_the_api_server(
    control_plane: ControlPlane, crds_installed: None, namespace: str
) -> None:
    """The webhook with --native beside the default policy's native policies: an elastic PyTorchJob is denied
    by the API server's policy (validating admission policies run before validating webhooks, so the webhook
    is not even called); an unqueued PyTorchJob gets one queue warning, the API server's, and the webhook's
    audit record says the rule was left to it."""
    cp = control_plane
    apply_native(cp, golden.policy_for(None))
    wh = Webhook(cp, "--native")
    try:
        elastic = creatable(_input("rules/training-elastic-shrink-elastic-policy"), namespace)
        deadline = time.monotonic() + 10
        while True:
            denied, _, other = judged(cp, namespace, elastic)
            if denied or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert list(denied) == ["training-elastic-shrink"], (denied, other)

        job = creatable(_input("rules/training-queue-priority-warns"), namespace)
        name = job["metadata"]["name"]
        # The validating configuration can take effect a moment after the mutating one wait_effective probed,
        # and the audit record lands after the answer: retry the dry run until the webhook's record is there.
        deadline = time.monotonic() + 20
        while True:
            p = cp.kubectl("create", "--dry-run=server", "-n", namespace, "-f", "-", input=job)
            queue_warnings = [w for w in p.stderr.splitlines() if "training-queue-priority" in w]
            assert len(queue_warnings) == 1 and "ValidatingAdmissionPolicy" in queue_warnings[0], p.stderr
            records = wh.wait_audit(lambda x: x.get("name") == name and x.get("webhook") == "validate", 2.0)
            if records or time.monotonic() > deadline:
                break
        assert records, "the webhook was not called for the PyTorchJob"
        outcomes = {x["rule"]: x["outcome"] for x in records[-1]["rules"]}
        assert outcomes["training-queue-priority"] == "native", records[-1]
        assert outcomes["training-elastic-shrink"] == "native", records[-1]
        assert not any("training-queue-priority" in w for w in records[-1].get("warnings") or []), records[-1]
    finally:
        wh.close()
        cp.kubectl("delete", "validatingadmissionpolicybindings,validatingadmissionpolicies", "-l",
                   "app.kubernetes.io/component=native-policy", check=False)  # fmt: skip


def test_overlay_honours_an_exception_for_a_native_rule_and_no_forged_mark(
    control_plane: ControlPlane, crds_installed: None, namespace: str
) -> None:
    """A live GPUPolicyException for training-elastic-shrink lets its named PyTorchJob through the API server's
    policy (the webhook's mutating call marks it); another elastic job that carries the mark itself, with no
    exception, is denied there: the webhook removed the mark before the policy read it."""
    from tests.e2e.test_exceptions_e2e import elastic_job, exception

    cp = control_plane
    _install_exception_crd(cp)
    apply_native(cp, golden.policy_for(None))
    cp.kubectl("apply", "-n", namespace, "-f", "-", input=exception(namespace, workloads={"names": ["dpo"]}))
    wh = Webhook(cp, "--native")
    try:
        excepted = creatable(elastic_job("dpo"), namespace)
        forged = creatable(elastic_job("other"), namespace)
        forged["metadata"]["annotations"] = {native.EXCEPTED_ANNOTATION: "training-elastic-shrink"}
        deadline = time.monotonic() + 20  # the server's exception watch and the bindings settle
        while True:
            got_excepted, got_forged = judged(cp, namespace, excepted), judged(cp, namespace, forged)
            if (not got_excepted[0] and got_forged[0]) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert got_excepted[0] == {} and not got_excepted[2], got_excepted
        assert list(got_forged[0]) == ["training-elastic-shrink"], got_forged
        p = cp.kubectl("create", "--dry-run=server", "-n", namespace, "-o", "json", "-f", "-", input=excepted)
        annotations = json.loads(p.stdout)["metadata"].get("annotations") or {}
        assert annotations.get(native.EXCEPTED_ANNOTATION) == "training-elastic-shrink", annotations
    finally:
        wh.close()
        cp.kubectl("delete", "gpupolicyexceptions", "--all", "-n", namespace, check=False)
        cp.kubectl("delete", NATIVE_KINDS, "-l", "app.kubernetes.io/component=native-policy", check=False)


def _install_exception_crd(cp: ControlPlane) -> None:
    """The GPUPolicyException CRD from deploy/, before the server starts (its watch finds the resource at once)."""
    from tests.e2e.webhook import render

    [crd] = [d for d in render(cp) if d["kind"] == "CustomResourceDefinition"]
    cp.kubectl("apply", "-f", "-", input=crd)
    cp.kubectl("wait", "--for=condition=Established", "crd/gpupolicyexceptions.gpu-admission.io", "--timeout=60s")


# --- mutations: MutatingAdmissionPolicies beside the webhook --------------------------------------------------


def created_json(cp: ControlPlane, namespace: str, obj: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    p = cp.kubectl("create", "--dry-run=server", "-n", namespace, "-o", "json", "-f", "-", input=obj, check=False)
    if p.returncode != 0:
        return None, p.stderr.strip()
    return json.loads(p.stdout), ""


PROBE = {
    "apiVersion": "batch/v1",
    "kind": "Job",
    "metadata": {"name": "probe"},
    "spec": {"parallelism": 2, "template": {"spec": {"restartPolicy": "Never", "containers": [
        {"name": "c", "image": "registry.example/test:1", "resources": {"limits": {"nvidia.com/gpu": "8"}}}
    ]}}},
}  # fmt: skip


# Each policy group of the comparison gets its own policy names and binds only its own namespaces: a
# MutatingAdmissionPolicy replaced in place, or deleted and made again under its name, kept its old mutation
# in kube-apiserver 1.37.2 for over 90 s (seen under load), so reusing names compared against stale policies.
GROUP_LABEL = "gpu-admission.test/map-group"


def apply_group(cp: ControlPlane, policy: Policy, group: str) -> list[str]:
    """Create this policy's MutatingAdmissionPolicies and bindings under names of their own for `group`, bound
    only to namespaces labelled with it; their kubectl names (to delete them)."""
    objects = copy.deepcopy([o for o in native.generate(policy) if o["kind"].startswith("Mutating")])
    for o in objects:
        o["metadata"]["name"] += f"-{group}"
        if o["kind"].endswith("Binding"):
            o["spec"]["policyName"] += f"-{group}"
            selector = o["spec"].setdefault("matchResources", {}).setdefault("namespaceSelector", {})
            selector.setdefault("matchExpressions", []).append(
                {"key": GROUP_LABEL, "operator": "In", "values": [group]}
            )
    cp.kubectl("create", "-f", "-", input={"apiVersion": "v1", "kind": "List", "items": objects})
    return [f"{o['kind'].lower()}.admissionregistration.k8s.io/{o['metadata']['name']}" for o in objects]


def _wait_mutating_policies(
    cp: ControlPlane, policy: Policy, namespace: str, labels: dict[str, str], plain: str, timeout: float = 90.0
) -> None:
    """Until a training Job asking for GPUs comes out of a dry run in `namespace` (labelled `labels`) as the
    webhook would make it there from what the API server makes of it in `plain` (no binding matches: its
    defaults, no mutation): the API server picks new policies and bindings up asynchronously (seconds apart,
    more under load). The labels matter: under a policy whose default enforcement is off, only a namespace
    labelled otherwise is mutated (without them the wait took a policy not yet in effect for the webhook's
    verdict, and the next check compared against it)."""
    from dataclasses import replace

    from policies.engine import review
    from policies.subject import ReviewContext

    inv = golden.inventory_for(golden.DEFAULT_NODES, policy)
    generated = native.native_mutations(policy)  # the webhook's other mutations are not the policies' to make
    only = replace(policy, mutations={m: on and m in generated for m, on in policy.mutations.items()})
    base, problem = created_json(cp, plain, {**PROBE, "metadata": {"name": "probe", "namespace": plain}})
    assert base is not None, problem
    want = touched(review(base, policy=only, inventory=inv, ctx=ReviewContext(namespace_labels=labels)).object)
    deadline = time.monotonic() + timeout
    while True:
        made, problem = created_json(cp, namespace, {**PROBE, "metadata": {"name": "probe", "namespace": namespace}})
        assert made is not None, problem
        if touched(made) == want:
            return
        assert time.monotonic() < deadline, f"the MutatingAdmissionPolicies did not take effect: {touched(made)}"
        time.sleep(0.5)


def test_native_and_webhook_mutations_agree_on_every_golden_case_they_cover(
    control_plane: ControlPlane, crds_installed: None
) -> None:
    """Each covered golden case, with its policy plus the mutating settings above, two ways: the webhook alone
    (the engine's object, created where no MutatingAdmissionPolicy binds) and the overlay (created where the
    policies bind, then the engine with --native-mutations on what the API server made of it). The fields the
    two mutations touch must be equal."""
    from dataclasses import replace

    from policies.engine import review

    cp = control_plane
    namespaces: dict[str, str] = {}

    def namespace_for(labels: dict[str, str] | None, group: str = "") -> str:
        labels = {**(labels or {}), **({GROUP_LABEL: group} if group else {})}
        key = json.dumps(labels, sort_keys=True)
        if key not in namespaces:
            name = f"native-map-{uuid.uuid4().hex[:8]}"
            ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}
            cp.kubectl("create", "-f", "-", input=ns)
            namespaces[key] = name
        return namespaces[key]

    webhook_only = namespace_for({"gpu-admission.io/enforcement": "off"})  # no binding matches it
    installed: list[str] = []
    group_numbers = itertools.count()
    skip = native.NATIVE_RULES | set(native.MAP_MUTATIONS)
    compared, refused, not_native, mutated, mismatches = 0, [], 0, 0, []
    for variant, settings in MUTATING.items():
        groups: dict[str, list[tuple[str, dict[str, Any]]]] = {}
        for cid, case, policy in mutating_cases(settings):
            if not native.native_mutations(policy):
                not_native += 1  # e.g. the case's own gang-scheduler settings keep scheduler-queue in the webhook
                continue
            key = _policy_key(policy, "Mutating")
            groups.setdefault(key, []).append((cid, case))
        for cases in groups.values():
            group = f"g{next(group_numbers)}"
            group_policy = golden.policy_for(cases[0][1]["policy"])
            if installed:
                cp.kubectl("delete", *installed, "--wait=false", check=False)
            installed = apply_group(cp, group_policy, group)
            enforced = {"gpu-admission.io/enforcement": "enforce"}
            probe_ns = namespace_for(enforced, group)
            _wait_mutating_policies(cp, group_policy, probe_ns, {**enforced, GROUP_LABEL: group}, webhook_only)
            for cid, case in cases:
                r, policy, inv, ctx = golden.run_case(case, copy.deepcopy(case["input"]))
                want, problem = created_json(cp, webhook_only, creatable(r.object, webhook_only))
                ns = namespace_for(case.get("namespaceLabels"), group)
                deadline = time.monotonic() + 10.0
                while True:
                    made, problem2 = created_json(cp, ns, creatable(case["input"], ns))
                    if want is None or made is None:
                        break
                    got = review(made, policy=policy, inventory=inv, ctx=replace(ctx, native=frozenset(skip))).object
                    if touched(got) == touched(want) or time.monotonic() > deadline:
                        break
                    time.sleep(0.5)  # a binding may still be on its way
                if want is None or made is None:
                    refused.append(f"{variant}/{cid}: {(problem or problem2).splitlines()[-1][:200]}")
                    continue
                compared += 1
                mutated += bool({"gpu-toleration", "scheduler-queue"} & set(r.mutations))
                if touched(got) != touched(want):
                    mismatches.append(f"{variant}/{cid}: webhook {touched(want)}\n   native {touched(got)}")
    if installed:
        cp.kubectl("delete", *installed, "--wait=false", check=False)
    print(f"\nnative vs webhook mutations: {compared} case runs compared ({mutated} mutated by them), "
          f"{len(refused)} refused by the API server's own validation, {not_native} with a policy that keeps "
          f"them in the webhook")  # fmt: skip
    for line in refused:
        print("  refused:", line)
    assert not mismatches, "\n".join(mismatches)
    assert compared >= 300 and mutated >= 100, (compared, mutated)


def test_overlay_makes_the_inventory_free_mutations_once_in_the_api_server(
    control_plane: ControlPlane, crds_installed: None, namespace: str
) -> None:
    """The webhook with --native --native-mutations beside the policies generated from the policy it serves:
    a training Job gets the tolerations, queue label, schedulerName and priorityClassName once, from the API
    server, while the webhook still adds what needs the inventory (same-rack podAffinity) and reports neither
    of the two mutations as its own."""
    from policies.document import parse_policy_text
    from tests.e2e.webhook import NAMESPACE, POLICY_CONFIGMAP
    from webhook.suite import deep_merge

    cp = control_plane
    plain = f"native-plain-{uuid.uuid4().hex[:6]}"  # neither the policies nor the webhook mutate there
    ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": plain, "labels": {ENFORCEMENT: "off"}}}
    cp.kubectl("create", "-f", "-", input=ns)
    wh = Webhook(cp, "--native", "--native-mutations")  # creates its namespace and the policy ConfigMap
    original = cp.get_json("configmap", POLICY_CONFIGMAP, "-n", NAMESPACE)["data"]["policy.yaml"]
    text = yaml.safe_dump(deep_merge(yaml.safe_load(original), copy.deepcopy(MUTATING["kueue"])), sort_keys=False)
    policy = parse_policy_text(text)
    assert native.native_mutations(policy) == set(native.MAP_MUTATIONS)
    try:
        cp.kubectl("patch", "configmap", POLICY_CONFIGMAP, "-n", NAMESPACE, "--type=merge", "-p",
                   json.dumps({"data": {"policy.yaml": text}}))  # fmt: skip
        apply_native(cp, policy, ("Validating", "Mutating"))
        labels = cp.get_json("namespace", namespace)["metadata"].get("labels") or {}
        _wait_mutating_policies(cp, policy, namespace, labels, plain)
        job = creatable({**PROBE, "metadata": {"name": "overlay-job"}}, namespace)
        deadline = time.monotonic() + 30
        while True:  # until the webhook serves the new policy (it reloads the ConfigMap from a watch)
            made, problem = created_json(cp, namespace, job)
            assert made is not None, problem
            records = wh.wait_audit(lambda x: x.get("name") == "overlay-job" and x.get("webhook") == "mutate"
                                    and x.get("policyHash") == policy.hash, 2.0)  # fmt: skip
            if records or time.monotonic() > deadline:
                break
        assert records, "the webhook never reviewed the Job under the mutating policy"
        assert not {"gpu-toleration", "scheduler-queue"} & set(records[-1]["mutations"]), records[-1]
        spec = made["spec"]["template"]["spec"]
        assert spec["tolerations"] == TOLERATIONS  # each once: the webhook did not add them again
        assert spec["schedulerName"] == "volcano" and spec["priorityClassName"] == "training-normal"
        assert made["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
        assert "podAffinity" in spec["affinity"]  # the webhook's own mutations still apply
    finally:
        cp.kubectl("patch", "configmap", POLICY_CONFIGMAP, "-n", NAMESPACE, "--type=merge", "-p",
                   json.dumps({"data": {"policy.yaml": original}}), check=False)  # fmt: skip
        wh.close()
        for resources in (NATIVE_KINDS, MAP_KINDS):
            cp.kubectl("delete", resources, "-l", "app.kubernetes.io/component=native-policy", check=False)
        cp.kubectl("delete", "namespace", plain, "--wait=false", check=False)
