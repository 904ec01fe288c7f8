"""The native policies' CEL run by the API server's own CEL code, in process (tests/celeval.py): what a
MutatingAdmissionPolicy makes of an object is what the webhook's mutation makes of it, on every golden case
the policies cover and on edge inputs, and a second run adds nothing (`reinvocationPolicy: IfNeeded`); each
ValidatingAdmissionPolicy judges a golden case like the webhook's rule; `cel_asks_gpu` is the CEL's GPU test.

The same comparisons against a real API server are tests/e2e/test_native_e2e.py (slower, so fewer edges; and a
mutant of policies/native.py never reaches it: these are the tests mutation testing runs)."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import pytest

from policies import native
from policies.document import Policy
from policies.engine import review
from policies.subject import ReviewContext
from tests import celeval
from tests import test_golden as golden
from tests.nativecases import (
    MUTATING,
    TOLERATIONS,
    covered,
    excepts_native,
    mutating_cases,
    native_outcomes,
    touched,
)

NAMESPACE = "ml"


def namespace_labels(labels: dict[str, str] | None) -> dict[str, str]:
    return {**(labels or {}), "kubernetes.io/metadata.name": NAMESPACE}


def through_maps(policy: Policy, objects: list[Any], labels: list[dict[str, str] | None]) -> list[Any]:
    """Each object as the API server hands it to the webhooks: after every MutatingAdmissionPolicy of the
    policy whose binding selects the object's namespace (labels[i]). A policy that fails on an object refuses
    it (failurePolicy Fail): the object becomes the error's text, and a refusal stays as it is."""
    generated = native.generate(policy)
    out: list[Any] = [copy.deepcopy(o) for o in objects]
    for mid in native.MAP_MUTATIONS:
        name = native.NAME_PREFIX + mid
        maps = [o for o in generated if o["metadata"]["name"] == name and o["kind"] == "MutatingAdmissionPolicy"]
        if not maps:
            continue
        [binding] = [o for o in generated if o["metadata"]["name"] == name and o["kind"].endswith("Binding")]
        selector = binding["spec"]["matchResources"]["namespaceSelector"]
        picked = [
            i
            for i, lb in enumerate(labels)
            if isinstance(out[i], dict) and celeval.selects(selector, namespace_labels(lb))
        ]
        results = celeval.evaluate(maps[0], [out[i] for i in picked], namespace=NAMESPACE)
        for i, r in zip(picked, results, strict=True):
            if r.error or r.refused:
                out[i] = f"{mid}: {r.error or r.refused}"
            elif r.matched:
                out[i] = r.object
    return out


def _groups() -> dict[str, list[tuple[str, dict[str, Any]]]]:
    """The covered golden cases under each mutating policy, grouped by the policy they end up with."""
    groups: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for variant, settings in MUTATING.items():
        for cid, case, policy in mutating_cases(settings):
            if native.native_mutations(policy):
                groups.setdefault(f"{variant}:{policy.hash}", []).append((cid, case))
    return groups


def admitted(cases: list[tuple[str, dict[str, Any]]], refused: list[str]) -> list[tuple[str, dict[str, Any], Any]]:
    """(id, case, its input as admission sees it) for the cases whose input the API server would take; the
    others go to `refused` (the e2e test meets them as the API server's own refusals)."""
    out = []
    for (cid, case), o in zip(cases, celeval.admitted([c["input"] for _, c in cases]), strict=True):
        if o.refused:
            refused.append(f"{cid}: {o.refused}")
        else:
            out.append((cid, case, o.object))
    return out


def as_admitted(objects: list[Any]) -> list[Any]:
    """Objects the webhook produced, as the API server stores them (refused: the reason, to compare too)."""
    return [o.refused or o.object for o in celeval.admitted(objects)]


def test_mutating_policies_make_the_webhooks_mutations_on_every_covered_golden_case() -> None:
    """Each case two ways: the webhook alone, and the policies first with the webhook (--native-mutations)
    after them. The whole object must come out the same, and running the policies again on it changes
    nothing (the API server re-runs them after our webhook, reinvocationPolicy IfNeeded)."""
    skip = frozenset(native.MAP_MUTATIONS)  # --native-mutations (--native would add the exception mark)
    compared, mutated, refused, mismatches = 0, 0, [], []
    failed: dict[str, str] = {}
    for cases in _groups().values():
        policy = golden.policy_for(cases[0][1]["policy"])
        kept = admitted(cases, refused)
        labels = [c.get("namespaceLabels") for _, c, _ in kept]
        made = through_maps(policy, [obj for _, _, obj in kept], labels)
        wanted, webhooked = [], []
        for (_, case, obj), after_maps in zip(kept, made, strict=True):
            want, _, inv, ctx = golden.run_case(case, copy.deepcopy(obj))
            wanted.append(want.object)
            if not isinstance(after_maps, str):
                after_maps = review(after_maps, policy=policy, inventory=inv, ctx=replace(ctx, native=skip)).object
            webhooked.append(after_maps)
            mutated += bool({"gpu-toleration", "scheduler-queue"} & set(want.mutations))
        wanted, webhooked = as_admitted(wanted), as_admitted(webhooked)
        again = through_maps(policy, webhooked, labels)
        for (cid, _, _), after_maps, want_obj, got_obj, after in zip(kept, made, wanted, webhooked, again,
                                                                     strict=True):  # fmt: skip
            if isinstance(after_maps, str):
                failed[cid] = after_maps
                continue
            compared += 1
            if got_obj != want_obj:
                mismatches.append(f"{cid}: webhook {touched(want_obj)}\n   native {touched(got_obj)}")
            elif after != got_obj:
                mismatches.append(f"{cid}: a second run changed {touched(got_obj)} into {touched(after)}")
    assert not mismatches, "\n".join(mismatches)
    assert compared >= 300 and mutated >= 100, (compared, mutated)  # not vacuous
    # Where a policy fails, the request is refused with the policy's error: only on objects the API server's
    # own validation refuses too (after the mutating policies, so they meet it first).
    assert set(failed) == WITHOUT_A_POD_SPEC, failed
    # The API server refuses some inputs on decoding, before any admission: only the bad-input cases (and the
    # two mutations cases below) may be among them. A bound on the count would fail each time a bad-input case
    # is added; a bound on where they come from fails when a good case stops decoding.
    refused_ids = {r.split(": ", 1)[0] for r in refused}
    assert {c for c in refused_ids if not c.startswith("bad-input/")} == REFUSED_ON_DECODING, sorted(refused_ids)


# Mutations cases whose input the API server cannot decode: they show that the webhook keeps what it does not
# understand (a label holding a number, fields no schema knows), which only a raw AdmissionReview can carry.
REFUSED_ON_DECODING = {"mutations/inference-spread-job-labelled-inference", "mutations/unknown-fields-survive"}


# A Deployment with `spec: null` decodes to a template whose containers are null: the policies' CEL fails on
# it (list + null). The API server's validation refuses such a Deployment anyway (no selector, no containers).
WITHOUT_A_POD_SPEC = {"bad-input/spec-is-null"}


def _pod(tolerations: Any = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
    if tolerations is not None:
        spec["tolerations"] = tolerations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": NAMESPACE}, "spec": spec}


def _pytorchjob(template: dict[str, Any]) -> dict[str, Any]:
    """A custom resource: the API server hands its JSON to the policies as written (no type to decode into)."""
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "pj", "namespace": NAMESPACE},
            "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 2, "template": template}}}}  # fmt: skip


def both_ways(policy: Policy, obj: dict[str, Any]) -> tuple[Any, Any, Any]:
    """The object after the policy's MutatingAdmissionPolicies alone; after the webhook alone; after the
    policies and then the webhook with --native-mutations (the last two as the API server stores them)."""
    [(admitted_obj, refusal)] = [(o.object, o.refused) for o in celeval.admitted([obj])]
    assert not refusal, refusal
    inventory = golden.inventory_for(golden.DEFAULT_NODES, policy)
    [made] = through_maps(policy, [admitted_obj], [None])
    alone = review(copy.deepcopy(admitted_obj), policy=policy, inventory=inventory).object
    after = review(copy.deepcopy(made), policy=policy, inventory=inventory,
                   ctx=ReviewContext(native=frozenset(native.MAP_MUTATIONS))).object  # fmt: skip
    [alone, after] = as_admitted([alone, after])
    return made, alone, after


TOLERATING = golden.policy_for({"gpuNodes": {"tolerations": TOLERATIONS}})
NVIDIA, DEDICATED = TOLERATIONS


@pytest.mark.parametrize(
    "tolerations",
    [
        None,
        [],
        [NVIDIA],  # already there: not added again
        [DEDICATED, NVIDIA],
        [{**NVIDIA, "key": "nvidia.com/gpu-x"}],  # each field compared: a different one is another toleration
        [{**NVIDIA, "operator": "Equal"}],
        [{**NVIDIA, "value": "x"}],
        [{**NVIDIA, "effect": "NoExecute"}],
        [{**NVIDIA, "tolerationSeconds": 30}],  # the webhook compares the whole item
        [{**DEDICATED, "value": "other"}],
        [{"key": "other", "operator": "Exists"}],
    ],
)
def test_the_toleration_policy_adds_what_the_webhook_adds(tolerations: Any) -> None:
    made, alone, after = both_ways(TOLERATING, _pod(tolerations))
    assert made == alone == after  # the policy alone makes the webhook's object; the webhook adds nothing to it
    if tolerations is not None:
        assert made["spec"]["tolerations"][: len(tolerations)] == tolerations  # appended, the user's kept first


def test_a_null_tolerations_list_is_replaced_and_a_non_list_left_alone() -> None:
    """On a custom resource's template, where the API server keeps what the user wrote."""
    gpu = {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}
    made, alone, after = both_ways(TOLERATING, _pytorchjob({"spec": {**gpu, "tolerations": None}}))
    assert made["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["tolerations"] == TOLERATIONS
    assert alone == after  # the webhook adds its other mutations (training-pool) either way
    made, alone, after = both_ways(TOLERATING, _pytorchjob({"spec": {**gpu, "tolerations": {"a": 1}}}))
    assert made["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["tolerations"] == {"a": 1}
    assert alone == after


QUEUEING = {
    "kueue": golden.policy_for(MUTATING["kueue"]),
    "volcano": golden.policy_for(MUTATING["volcano"]),
}


def _training_job(meta: dict[str, Any] | None = None, template_meta: dict[str, Any] | None = None) -> dict[str, Any]:
    template: dict[str, Any] = {
        "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}
    }
    if template_meta is not None:
        template["metadata"] = template_meta
    job: dict[str, Any] = {"apiVersion": "batch/v1", "kind": "Job", "spec": {"parallelism": 2, "template": template}}
    job["metadata"] = {"name": "j", "namespace": NAMESPACE, **(meta or {})}
    return job


@pytest.mark.parametrize("variant", sorted(QUEUEING))
@pytest.mark.parametrize(
    ("meta", "template_meta"),
    [
        ({}, None),
        ({}, {}),
        ({"labels": None}, {"labels": None, "annotations": None}),
        ({"labels": {"app": "x"}}, {"annotations": {"a": "b"}}),
        ({"labels": {"kueue.x-k8s.io/queue-name": "mine"}}, None),  # queued already: no queue added
        ({}, {"annotations": {"scheduling.volcano.sh/queue-name": "mine"}}),
    ],
)
def test_the_queue_policy_adds_what_the_webhook_adds(
    variant: str, meta: dict[str, Any], template_meta: dict[str, Any] | None
) -> None:
    # the webhook leaves scheduler-queue to the policy: a queue the policy failed to add would be missing
    _, alone, after = both_ways(QUEUEING[variant], _training_job(meta, template_meta))
    assert after == alone


def test_labels_that_are_not_a_map_are_refused_before_any_policy() -> None:
    """The queue policies' guards for labels that are not a map never meet one at the object's root: the API
    server refuses such an object first, whatever its kind."""
    bad = {"labels": "not-a-map"}
    pj = _pytorchjob({"spec": {}})
    pj["metadata"] |= bad
    for obj in (_training_job(bad), pj):
        [o] = celeval.admitted([obj])
        assert "metadata" in o.refused or "ObjectMeta" in o.refused, o


def test_a_volcano_job_gets_its_queue_in_the_spec_and_keeps_one_it_names() -> None:
    policy = QUEUEING["volcano"]
    task = {"name": "t", "replicas": 2, "template": _training_job()["spec"]["template"]}
    vj = {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "metadata": {"name": "v", "namespace": NAMESPACE},
          "spec": {"tasks": [task]}}  # fmt: skip
    named = copy.deepcopy(vj)
    named["spec"]["queue"] = "mine"
    made, kept = through_maps(policy, [vj, named], [None, None])
    assert made["spec"]["queue"] == "team-b"
    assert kept["spec"]["queue"] == "mine"
    assert "annotations" not in (made["spec"]["tasks"][0]["template"].get("metadata") or {})  # the spec holds it


def test_keys_with_a_slash_or_a_tilde_are_escaped_in_json_pointers() -> None:
    queue = "kueue.x-k8s.io/queue-name"
    assert native._ptr("metadata", "labels", queue) == "/metadata/labels/kueue.x-k8s.io~1queue-name"
    assert native._ptr("a~b", "c/d~") == "/a~0b/c~1d~0"
    # and the API server reads the pointer back to the key: a label added beside existing ones
    [made] = through_maps(QUEUEING["kueue"], [_training_job({"labels": {"app": "x"}})], [None])
    assert made["metadata"]["labels"] == {"app": "x", "kueue.x-k8s.io/queue-name": "team-a"}


def _literal(value: Any) -> Any:
    """A constant as `_cel` writes it, evaluated by the API server's CEL: the value a patch would add."""
    expr = f"[JSONPatch{{op: 'add', path: '/metadata/annotations', value: {{'v': {native._cel(value)}}}}}]"
    pol = {"kind": "MutatingAdmissionPolicy", "spec": {"mutations": [{"patchType": "JSONPatch",
                                                                      "jsonPatch": {"expression": expr}}]}}  # fmt: skip
    [r] = celeval.evaluate(pol, [{"apiVersion": "example.com/v1", "kind": "Thing", "metadata": {"name": "x"}}])
    assert not r.error, r.error
    assert r.object is not None
    return r.object["metadata"]["annotations"]["v"]


@pytest.mark.parametrize(
    "value",
    [
        "plain",
        "it's",
        "back\\slash",
        {"key": "k", "operator": "Exists"},
        [{"a": "b"}, {"c": "d"}],
        {"l": ["x", "y"]},
        [],
    ],
)
def test_cel_literals_evaluate_to_the_value(value: Any) -> None:
    assert _literal(value) == value


def _asks(resources: Any, container_key: str = "containers") -> bool:
    # A custom kind: the policies read its amounts as written (a Pod's are quantities by then).
    pod = {"apiVersion": "example.com/v1", "kind": "Thing", "metadata": {"name": "p"},
           "spec": {container_key: [{"name": "c", "resources": resources}]}}  # fmt: skip
    check = {"expression": native._asks_gpu("object"), "messageExpression": "'x'"}
    vap = {"kind": "ValidatingAdmissionPolicy", "spec": {"validations": [check]}}
    [r] = celeval.evaluate(vap, [pod])
    assert not r.error, r.error
    [(passed, _)] = r.validations
    return passed


@pytest.mark.parametrize("amount", [1, 0, "0", "00", "1", "500m", "٠", "0x0", "", True, False, " 0", "1e3", "0.0", 0.5])
@pytest.mark.parametrize("where", ["limits", "requests"])
def test_cel_asks_gpu_is_the_policies_cel(amount: Any, where: str) -> None:
    """The webhook skips --native-mutations on exactly the pods whose CEL asks for a GPU: the Python twin must
    give the CEL's answer for every amount, including ones the API server's own validation refuses later."""
    resources = {where: {"nvidia.com/gpu": amount}}
    for key in ("containers", "initContainers"):
        pod = {"spec": {key: [{"name": "c", "resources": resources}]}}
        assert native.cel_asks_gpu(pod) is _asks(resources, key), (amount, where, key)


@pytest.mark.parametrize(
    "resources",
    [
        {"limits": {"nvidia.com/gpu": "0"}, "requests": {"nvidia.com/gpu": "1"}},  # the limit decides
        {"limits": {"cpu": "1"}, "requests": {"nvidia.com/gpu": "1"}},
        {"limits": {"example.com/gpu": "1"}},
        {"limits": {"nvidia.com/mig-1g.10gb": "1"}},
        {},
    ],
)
def test_cel_asks_gpu_reads_limits_before_requests_like_the_cel(resources: dict[str, Any]) -> None:
    assert native.cel_asks_gpu({"spec": {"containers": [{"name": "c", "resources": resources}]}}) is _asks(resources)


# --- ValidatingAdmissionPolicies ------------------------------------------------------------------------------


def test_validating_policies_judge_every_covered_golden_case_like_the_webhook() -> None:
    """Each native rule's policy on the object the webhook's mutating call produced under `serve --native`
    (its mutations, and the mark of the native rules a GPUPolicyException lets it skip), with the action of the
    binding that selects the case's namespace: denied with the webhook's message, or warned, exactly where the
    webhook's rule denies or warns (tests/e2e/test_native_e2e.py makes the same comparison on an API server)."""
    groups: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for path in golden.case_files():
        case = golden.load_case(path)
        if covered(case):
            groups.setdefault(golden.policy_for(case.get("policy")).hash, []).append((golden.case_id(path), case))
    compared, shown, excepted, refused, mismatches = 0, {"deny": 0, "warn": 0}, 0, [], []
    failed: dict[str, str] = {}
    for cases in groups.values():
        policy = golden.policy_for(cases[0][1].get("policy"))
        generated = native.generate(policy)
        kept = admitted(cases, refused)
        reviews, marked = [], []
        for _, case, obj in kept:
            r, _, inv, ctx = golden.run_case(case, copy.deepcopy(obj))
            reviews.append(r)
            marked.append(review(copy.deepcopy(r.object), policy=policy, inventory=inv, mutate=True, validate=False,
                                 ctx=replace(ctx, native=native.NATIVE_RULES)).object)  # fmt: skip
            excepted += excepts_native(case)
        got: list[tuple[dict[str, str], set[str]]] = [({}, set()) for _ in kept]
        for vap in (o for o in generated if o["kind"] == "ValidatingAdmissionPolicy"):
            rule = vap["metadata"]["annotations"]["gpu-admission.io/rule"]
            bindings = [o for o in generated if o["kind"].endswith("Binding") and o["spec"]["policyName"] ==
                        vap["metadata"]["name"]]  # fmt: skip
            for i, ((cid, case, _), result) in enumerate(zip(kept, celeval.evaluate(vap, marked), strict=True)):
                if result.error or result.refused:
                    failed[cid] = f"{rule}: {result.error or result.refused}"
                failing = [m for passed, m in result.validations if not passed]
                if not result.matched or not failing:
                    continue
                labels = namespace_labels(case.get("namespaceLabels"))
                for b in bindings:
                    if celeval.selects(b["spec"]["matchResources"]["namespaceSelector"], labels):
                        [action] = b["spec"]["validationActions"]
                        if action == "Deny":
                            got[i][0][rule] = failing[0]
                        elif action == "Warn":
                            got[i][1].add(rule)
        for (cid, _, _), r, (denied, warned) in zip(kept, reviews, got, strict=True):
            if cid in failed:
                continue
            want_denied, want_warned = native_outcomes(r)
            compared += 1
            shown["deny"] += bool(want_denied)
            shown["warn"] += bool(want_warned)
            if (denied, warned) != (want_denied, want_warned):
                mismatches.append(f"{cid}: webhook denied {want_denied} warned {sorted(want_warned)}; "
                                  f"native denied {denied} warned {sorted(warned)}")  # fmt: skip
    assert not mismatches, "\n".join(mismatches)
    assert compared >= 180 and shown["deny"] >= 7 and shown["warn"] >= 12, (compared, shown)
    assert excepted >= 8, excepted  # the exception cases are compared, as the webhook marks them
    assert set(failed) == WITHOUT_A_POD_SPEC, failed  # refused by the API server's validation before the policies
    assert len(refused) <= 40, refused


def test_match_conditions_skip_pod_updates_and_objects_without_one() -> None:
    vap = next(o for o in native.generate(golden.policy_for(None)) if o["kind"] == "ValidatingAdmissionPolicy")
    pod = _pod()
    [created] = celeval.evaluate(vap, [pod])
    [updated] = celeval.evaluate(vap, [pod], operation="UPDATE")
    job = _training_job()
    [job_updated] = celeval.evaluate(vap, [job], operation="UPDATE")
    assert created.matched and not updated.matched and job_updated.matched
