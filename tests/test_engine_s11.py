"""policies/engine.py in process, for its mutants (session 11, issue #20): what the golden cases do not read of
a review — `kind`, `handled` and `policy_hash` of the untouched paths, the failure modes of a mutation or a rule
that raises (results, messages and the object shipped, read whole), `short`, `denial_message`, `_namespace`.
tests/test_properties.py covers the failure modes over generated workloads; it is not in the per-mutant
selection (hypothesis, minutes per mutant)."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest

from policies import engine
from policies.engine import Finding, Review, RuleResult, review, short
from policies.mutations import MUTATIONS
from policies.rules import RULES
from policies.subject import ReviewContext
from tests.test_golden import DEFAULT_NODES, inventory_for, policy_for

POLICY = policy_for(None)
CLOSED = policy_for({"failureMode": "closed"})
OPEN = policy_for({"failureMode": "open"})
INVENTORY = inventory_for(DEFAULT_NODES, POLICY)


def gpu_pod(gpus: int = 1, **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ml", **meta},
        "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": gpus}}}]},
    }


def cpu_pod() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "c"}, "spec": {"containers": [{"name": "c"}]}}


# -- the untouched paths -------------------------------------------------------------------------------------


@pytest.mark.parametrize("obj", [None, 5, "Pod", [{"kind": "Pod"}]])
def test_what_is_no_object_is_not_handled(obj: Any) -> None:
    r = review(obj, policy=POLICY, inventory=INVENTORY)
    assert r == Review(
        kind="",
        workload=None,
        allowed=True,
        denials=(),
        warnings=("object is not a JSON object: not handled",),
        mutations=(),
        patch=(),
        object={},
        results=(),
        policy_hash=POLICY.hash,
        handled=False,
    )
    assert r.handled is False and r.verdict == "warn"


@pytest.mark.parametrize("kind", ["ConfigMap", "Service", ""])
def test_a_kind_the_engine_does_not_know_is_not_handled(kind: str) -> None:
    obj = {"kind": kind, "metadata": {"name": "x"}, "data": {"nvidia.com/gpu": "1"}}
    r = review(obj, policy=POLICY, inventory=INVENTORY)
    assert r == Review(kind, None, True, (), (), (), (), obj, (), POLICY.hash, False)
    assert r.object is obj and r.handled is False and r.verdict == "allow"


def test_a_pod_that_asks_no_gpu_is_handled_untouched() -> None:
    obj = cpu_pod()
    r = review(obj, policy=POLICY, inventory=INVENTORY)
    assert r == Review("Pod", None, True, (), (), (), (), obj, (), POLICY.hash, True)
    assert r.handled is True and r.object is obj


def test_a_namespace_with_enforcement_off_is_handled_untouched() -> None:
    obj = gpu_pod(8)
    ctx = ReviewContext(namespace_labels={"gpu-admission.io/enforcement": "off"})
    r = review(obj, policy=POLICY, inventory=INVENTORY, ctx=ctx)
    assert r == Review("Pod", None, True, (), (), (), (), obj, (), POLICY.hash, True)


def test_a_gpu_template_that_asks_no_gpu_after_all_is_handled_untouched() -> None:
    """A gpu-admission.io/ label lets the object past the cheap filter; with no GPU and no misspelt key the
    full read lets it through untouched."""
    obj = {"kind": "Deployment", "metadata": {"name": "d", "labels": {"gpu-admission.io/workload": "inference"}}}
    obj["spec"] = {"template": {"metadata": {}, "spec": {"containers": [{"name": "c"}]}}}
    r = review(obj, policy=POLICY, inventory=INVENTORY)
    assert r == Review("Deployment", None, True, (), (), (), (), obj, (), POLICY.hash, True)


def test_the_policy_hash_is_the_policys_on_every_path() -> None:
    other = policy_for({"rules": {"training-queue-priority": "off"}})
    assert other.hash != POLICY.hash
    for obj in (None, {"kind": "ConfigMap"}, cpu_pod(), gpu_pod()):
        assert review(obj, policy=other, inventory=INVENTORY).policy_hash == other.hash


# -- a mutation or a rule that raises ------------------------------------------------------------------------


def _raising(what: str) -> Any:
    def fn(s: Any, *pod: Any) -> Any:
        if pod:  # a mutation edits the pod first: a half-applied change would show in the object
            pod[0].pod.setdefault("metadata", {}).setdefault("labels", {})["x-half-applied"] = what
        raise KeyError(f"{what} broke")

    return fn


def _only_raising(registry: tuple[Any, ...], ids: set[str]) -> tuple[Any, ...]:
    return tuple(dataclasses.replace(m, fn=_raising(m.id)) if m.id in ids else m for m in registry)


def training_job() -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "ft", "namespace": "ml"},
        "spec": {
            "parallelism": 2,
            "completions": 2,
            "completionMode": "Indexed",
            "template": {
                "metadata": {"labels": {"gpu-admission.io/workload": "training"}},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "t", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 8}}}],
                },
            },
        },
    }


def _mutation_ids(policy: Any, obj: dict[str, Any]) -> list[str]:
    return list(review(copy.deepcopy(obj), policy=policy, inventory=INVENTORY).mutations)


def test_a_mutation_that_raises_under_failure_mode_closed_denies_and_mutation_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    obj = training_job()
    applied = _mutation_ids(CLOSED, obj)
    assert len(applied) >= 3, applied
    broken = applied[1]
    monkeypatch.setattr(engine, "MUTATIONS", _only_raising(MUTATIONS, {broken}))
    original = copy.deepcopy(obj)
    r = review(obj, policy=CLOSED, inventory=INVENTORY)
    assert obj == original
    message = (
        f"{broken}: internal error (KeyError); failing closed per policy. Fix: report this object to the platform team"
    )
    assert r.allowed is False
    assert Finding(broken, message) in r.denials
    assert r.denials[0] == Finding(broken, message)  # found while mutating, before any rule
    mutate = [x for x in r.results if x.action == "mutate"]
    assert RuleResult(broken, "mutate", "error", message) in mutate
    assert [x.rule for x in mutate if x.outcome == "applied"] == [m for m in applied if m != broken]
    assert list(r.mutations) == [m for m in applied if m != broken]
    # closed: the object keeps what ran, the broken mutation's half-applied edit among it (it is denied)
    labels = r.object["spec"]["template"]["metadata"]["labels"]
    assert labels.get("x-half-applied") == broken
    assert r.verdict == "deny"
    assert r.denial_message().startswith(message)


def test_a_mutation_that_raises_under_failure_mode_open_ships_the_original_and_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    obj = training_job()
    applied = _mutation_ids(OPEN, obj)
    broken = applied[1]
    monkeypatch.setattr(engine, "MUTATIONS", _only_raising(MUTATIONS, {broken, *applied[2:]}))
    original = copy.deepcopy(obj)
    r = review(obj, policy=OPEN, inventory=INVENTORY)
    assert obj == original
    assert r.object == original and r.patch == () and r.mutations == ()
    message = f"{broken}: internal error (KeyError); allowed (failing open per policy)"
    mutate = [(x.rule, x.action, x.outcome, x.message) for x in r.results if x.action == "mutate"]
    unchanged = "failed, and failing open ships the object unchanged"
    assert mutate == [
        (applied[0], "mutate", "skip", f"{applied[0]}: not applied: {broken} {unchanged}"),
        (broken, "mutate", "error", message),
    ]  # the first failure stops the mutations: the later ones (raising too) never ran
    assert message in r.warnings
    assert not any(f.rule == broken for f in r.denials)
    # the rules judged the original object (as shipped), rebuilt after the fall-back
    plain = review(copy.deepcopy(original), policy=OPEN, inventory=INVENTORY, mutate=False)
    assert [(x.rule, x.outcome) for x in r.results if x.action != "mutate"] == [
        (x.rule, x.outcome) for x in plain.results
    ]
    assert r.workload == plain.workload == "training"


def test_a_rule_that_raises_follows_the_failure_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    obj = gpu_pod(1)
    judged = [
        x.rule for x in review(copy.deepcopy(obj), policy=CLOSED, inventory=INVENTORY).results if x.outcome == "pass"
    ]
    broken = judged[0]
    monkeypatch.setattr(engine, "RULES", _only_raising(RULES, {broken}))
    r = review(copy.deepcopy(obj), policy=CLOSED, inventory=INVENTORY)
    message = (
        f"{broken}: internal error (KeyError); failing closed per policy. Fix: report this object to the platform team"
    )
    assert r.allowed is False and Finding(broken, message) in r.denials
    action = engine._cap(CLOSED.rules.get(broken, "enforce"), CLOSED.default_enforcement)
    assert RuleResult(broken, action, "error", message) in r.results
    r = review(copy.deepcopy(obj), policy=OPEN, inventory=INVENTORY)
    message = f"{broken}: internal error (KeyError); allowed (failing open per policy)"
    assert r.allowed is True and r.denials == ()
    assert message in r.warnings and RuleResult(broken, action, "error", message) in r.results


# -- small functions -----------------------------------------------------------------------------------------


def test_short_keeps_a_warning_of_the_limit_and_cuts_a_longer_one_to_it() -> None:
    at = "x" * engine.WARNING_LIMIT
    assert short(at) == at
    assert short(at + "y") == "x" * (engine.WARNING_LIMIT - 1) + "…"
    assert len(short(at + "y")) == engine.WARNING_LIMIT
    assert short("a\n b\t c  d") == "a b c d"
    assert short("abcdef", 4) == "abc…"
    assert short("abcd", 4) == "abcd"


def test_the_denial_message_joins_the_denials_in_order() -> None:
    r = Review("Pod", None, False, (Finding("a", "a: one"), Finding("b", "b: two")), (), (), (), {}, (), "h")
    assert r.denial_message() == "a: one | b: two"
    assert dataclasses.replace(r, denials=()).denial_message() == ""


@pytest.mark.parametrize(
    ("obj", "ns"),
    [
        ({"metadata": {"namespace": "ml"}}, "ml"),
        ({"metadata": {"namespace": ""}}, "default"),
        ({"metadata": {"namespace": 5}}, "default"),
        ({"metadata": {"namespace": None}}, "default"),
        ({"metadata": {}}, "default"),
        ({"metadata": "ml"}, "default"),
        ({"metadata": ["namespace"]}, "default"),
        ({}, "default"),
    ],
)
def test_the_namespace_of_an_object(obj: dict[str, Any], ns: str) -> None:
    assert engine._namespace(obj) == ns


def test_an_action_is_capped_by_the_mode() -> None:
    assert engine._cap("enforce", "warn") == "warn"
    assert engine._cap("warn", "enforce") == "warn"
    assert engine._cap("audit", "audit") == "audit"
    assert engine._cap("off", "audit") == "off"
    assert engine._cap("enforce", "off") == "off"


# -- every result of a review, read against the policy ------------------------------------------------------

CASES = [
    "namespaces/rule-audit-in-enforce",
    "namespaces/audit",
    "namespaces/warn",
    "namespaces/warn-elasticity",
    "exceptions/warning-rule-excepted",
    "exceptions/named-workload-excepted-from-one-rule",
    "exceptions/expired-ignored-and-reported",
    "clusters/gpu-operator-default-training-pool",
    "mutations/training-rack-added-kueue-topology-on-workload",
]


def _check_results(r: Review, policy: Any, labels: Any) -> None:
    from policies import userkeys
    from policies.workloads import ELASTICITY_KINDS

    mode = userkeys.namespace_mode(labels, policy.default_enforcement)[0]
    judged = [x for x in r.results if x.action != "mutate"]
    expected = [
        rule.id for rule in engine.RULES if r.kind not in ELASTICITY_KINDS or rule.elasticity
    ]  # every rule, in order, once: none skipped past an error, an exception or an off rule
    assert [x.rule for x in judged] == expected
    for x in judged:
        action = engine._cap(policy.rules.get(x.rule, "enforce"), mode)
        assert x.action == action, x
        if x.outcome in ("pass", "skip"):
            assert x.message == "" and x.outcome == ("skip" if action == "off" else "pass"), x
        elif x.outcome == "deny":
            assert action == "enforce" and x.message.startswith(f"{x.rule}: ") and ". Fix: " in x.message
            assert Finding(x.rule, " ".join(x.message.split())) in r.denials
        elif x.outcome in ("warn", "audit"):
            assert x.outcome == action and x.message.startswith(f"{x.rule}: ") and ". Fix: " not in x.message
            assert (short(x.message) in r.warnings) is (action == "warn")
        elif x.outcome == "excepted":
            assert x.message == " ".join(x.message.split()) and x.message.startswith(f"{x.rule}: ")
            assert "(excepted by " in x.message and x.rule in [rule for rule, _ in r.excepted]
        else:
            raise AssertionError(x)
    assert r.allowed is (not r.denials)


@pytest.mark.parametrize("name", CASES)
def test_every_result_of_a_golden_case_carries_its_action_and_message(name: str) -> None:
    from tests.test_golden import CASES as ROOT_CASES
    from tests.test_golden import load_case, run_case

    case = load_case(ROOT_CASES / f"{name}.yaml")
    r, policy, _, ctx = run_case(case, case["input"])
    assert r.kind == case["input"]["kind"] and r.policy_hash == policy.hash and r.handled is True
    _check_results(r, policy, ctx.namespace_labels)


def test_a_rule_turned_off_is_skipped_and_the_rest_still_run() -> None:
    first = engine.RULES[0].id
    policy = policy_for({"rules": {first: "off"}})
    r = review(gpu_pod(1), policy=policy, inventory=INVENTORY)
    assert RuleResult(first, "off", "skip") in r.results
    _check_results(r, policy, None)


def test_after_a_rule_raises_the_other_rules_still_run(monkeypatch: pytest.MonkeyPatch) -> None:
    first = engine.RULES[0].id
    monkeypatch.setattr(engine, "RULES", _only_raising(RULES, {first}))
    for policy in (OPEN, CLOSED):
        r = review(gpu_pod(1), policy=policy, inventory=INVENTORY)
        judged = [x.rule for x in r.results if x.action != "mutate"]
        assert judged == [rule.id for rule in RULES]


def test_validate_false_runs_no_rule_and_mutate_false_returns_the_object_itself() -> None:
    obj = training_job()
    r = review(obj, policy=POLICY, inventory=INVENTORY, validate=False)
    assert r.mutations and all(x.action == "mutate" for x in r.results) and r.denials == ()
    assert r.kind == "Job" and r.policy_hash == POLICY.hash and r.workload == "training"
    r = review(obj, policy=POLICY, inventory=INVENTORY, mutate=False)
    assert r.object is obj and r.patch == () and r.mutations == ()
    assert not any(x.action == "mutate" for x in r.results)


def test_a_pod_with_only_a_misspelt_key_is_judged_by_that_rule_alone_and_never_mutated() -> None:
    obj = cpu_pod()
    obj["metadata"]["annotations"] = {"gpu-admission.io/gpu-memroy": "10Gi"}
    original = copy.deepcopy(obj)
    r = review(obj, policy=POLICY, inventory=INVENTORY)
    assert [x.rule for x in r.results] == ["gpu-admission-annotations"]
    assert r.mutations == () and r.patch == () and r.object is obj and obj == original


def test_an_autoscaler_is_judged_by_the_elasticity_rules_only() -> None:
    hpa = {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "h", "namespace": "ml"},
        "spec": {"scaleTargetRef": {"kind": "Deployment", "name": "d"}, "minReplicas": 0, "maxReplicas": 3},
    }
    r = review(hpa, policy=POLICY, inventory=INVENTORY)
    assert r.kind == "HorizontalPodAutoscaler" and r.mutations == () and r.patch == ()
    _check_results(r, POLICY, None)


def test_a_native_rule_is_skipped_with_no_message_when_nothing_excepts_it() -> None:
    from policies.native import NATIVE_RULES

    native = frozenset(NATIVE_RULES)
    r = review(gpu_pod(1), policy=POLICY, inventory=INVENTORY, ctx=ReviewContext(native=native))
    skipped = [x for x in r.results if x.outcome == "native"]
    assert skipped and all(x.message == "" for x in skipped)
    for x in skipped:
        assert x.action == engine._cap(POLICY.rules.get(x.rule, "enforce"), POLICY.default_enforcement)


def test_a_job_with_only_a_misspelt_key_is_never_mutated() -> None:
    """The misspelt-key path judges without mutating: a Job (whose pods a mutation could label) included."""
    job = training_job()
    tpl = job["spec"]["template"]
    tpl["metadata"] = {"annotations": {"gpu-admission.io/gpu-memroy": "10Gi"}}
    tpl["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1"}}
    original = copy.deepcopy(job)
    r = review(job, policy=POLICY, inventory=INVENTORY)
    assert [x.rule for x in r.results] == ["gpu-admission-annotations"]
    assert r.mutations == () and r.patch == () and r.object is job and job == original
