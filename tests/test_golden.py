"""Golden cases: every YAML file under tests/cases/ is one object in, the expected verdict (and object) out.

The format is described in tests/cases/README.md. Besides each case's own expectations, every case checks
the engine's contracts (spec §5, §6):
- the RFC 6902 patch, applied to the input with the `jsonpatch` library, gives exactly `review.object`;
- a second review of the mutated object adds nothing (empty patch, no mutation) and reaches the same verdict;
- denial messages are one line that starts with the rule id and says how to fix it; warnings are one short line.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml

from cluster.pods import PodView
from policies import inventory as inventory_mod
from policies.document import MUTATION_IDS, RULE_IDS, Policy, compile_policy, default_policy_text
from policies.engine import WARNING_LIMIT, Review, ReviewContext, review
from policies.placement import Capacity
from policies.subject import pod_facts
from webhook import suite
from webhook.cmd_check import cel_checker
from webhook.state import capacity_of
from webhook.suite import deep_merge, resolver

ROOT = Path(__file__).resolve().parent.parent
CASES = Path(__file__).resolve().parent / "cases"
DEFAULT_NODES = "examples/cluster/nodes.yaml"
FOLDERS = ("mutations", "rules", "kinds", "bad-input", "namespaces", "elasticity", "clusters", "exceptions", "dra")


def case_files() -> list[Path]:
    """The case files (`gpu-admission test`'s settings file is not one)."""
    return suite.case_files(CASES)


def case_id(path: Path) -> str:
    return path.relative_to(CASES).with_suffix("").as_posix()


def load_case(path: Path) -> dict[str, Any]:
    case = yaml.safe_load(path.read_text(encoding="utf-8"))
    problem = suite.case_problem(case)
    assert problem is None, f"{path}: {problem}"
    assert isinstance(case, dict)
    return case


def _params() -> list[Any]:
    params = []
    for path in case_files():
        try:
            raw = yaml.safe_load(path.read_text(encoding="utf-8"))
        except yaml.YAMLError:
            raw = None  # reported by the case's own test
        reason = raw.get("xfail") if isinstance(raw, dict) else None
        marks = [pytest.mark.xfail(reason=str(reason), strict=True)] if reason else []
        params.append(pytest.param(path, id=case_id(path), marks=marks))
    return params


# --- building what a case decides with ------------------------------------------------------------------


@functools.cache
def _default_document() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(default_policy_text())
    return doc


def policy_for(overrides: Any) -> Policy:
    doc = deep_merge(copy.deepcopy(_default_document()), overrides or {})
    return compile_policy(doc)


@functools.cache
def _node_objects(nodes: str) -> tuple[Any, ...]:
    if nodes == "none":
        return ()
    docs = [d for d in yaml.safe_load_all((ROOT / nodes).read_text(encoding="utf-8")) if d]
    out: list[Any] = []
    for d in docs:
        out.extend(d["items"] if d.get("kind") == "List" else [d])
    return tuple(out)


def inventory_for(nodes: Any, policy: Policy) -> inventory_mod.Inventory:
    """`nodes` is a file (relative to the repository), "none", or a list of Node objects written in the case."""
    objects = nodes if isinstance(nodes, list) else list(_node_objects(str(nodes)))
    return inventory_mod.build_cluster(copy.deepcopy(objects), policy)


def capacity_for(pods: list[Any] | str | None) -> Capacity | None:
    """The pod view of the case's `pods` (a list of Pods, or a file of them relative to the repository), as
    the server keeps it; None without the key (placement by allocatable only, as `check` without --pods)."""
    if pods is None:
        return None
    if isinstance(pods, str):
        pods = list(_node_objects(pods))
    view = PodView(pod_facts)
    view.load({str(i): copy.deepcopy(p) for i, p in enumerate(pods)})
    return capacity_of(view.snapshot())


def run_case(case: dict[str, Any], obj: Any) -> tuple[Review, Policy, inventory_mod.Inventory, ReviewContext]:
    policy = policy_for(case.get("policy"))
    inv = inventory_for(case.get("nodes", DEFAULT_NODES), policy)
    excs, now = suite.exceptions_for(case, obj)
    ctx = ReviewContext(
        namespace_labels=case.get("namespaceLabels"),
        resolve=resolver(case.get("related") or []),
        capacity=capacity_for(case.get("pods")),
        exceptions=excs,
        now=now,
        cel_check=cel_checker(),
        reservations=suite.reservations_for(case.get("reservations") or []),
    )
    return review(obj, policy=policy, inventory=inv, ctx=ctx), policy, inv, ctx


# --- reading a review -----------------------------------------------------------------------------------


def summary(r: Review) -> str:
    lines = [f"allowed={r.allowed} workload={r.workload} mutations={list(r.mutations)}"]
    lines += [f"  deny: {d.message}" for d in r.denials]
    lines += [f"  warn: {w}" for w in r.warnings]
    return "\n".join(lines)


def containers_by_id(value: Any, seen: dict[int, int]) -> dict[int, int]:
    """id() -> number of places of every dict and list inside a JSON value."""
    if isinstance(value, dict | list):
        seen[id(value)] = seen.get(id(value), 0) + 1
        for item in value.values() if isinstance(value, dict) else value:
            containers_by_id(item, seen)
    return seen


def assert_no_aliasing(r: Review) -> None:
    """The mutated object is a tree (a mapping or list shared by two places would print as a YAML anchor, and
    editing one place would silently edit the other), and the patch owns its values."""
    in_object = containers_by_id(r.object, {})
    shared = sum(1 for n in in_object.values() if n > 1)
    assert not shared, f"review.object shares {shared} mapping(s) or list(s) between two places"
    in_patch = containers_by_id([op.get("value") for op in r.patch], {})
    both = len(in_patch.keys() & in_object.keys())
    assert not both, f"{both} patch value(s) are the same Python objects as parts of review.object"


# --- the test -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", _params())
def test_case(path: Path) -> None:
    case = load_case(path)
    expect = case["expect"]
    original = copy.deepcopy(case["input"])
    r, policy, inv, ctx = run_case(case, case["input"])
    got = summary(r)

    assert case["input"] == original, "the engine must not modify its input"
    problems = suite.compare(expect, r)  # the expectations, read as `gpu-admission test` reads them
    assert not problems, "\n".join(problems) + "\n" + got
    if any(res.outcome == "excepted" for res in r.results):
        assert r.exceptions, f"rules excepted but no exception named in the review\n{got}"
    assert len(r.mutations) == len(set(r.mutations)), got
    if not any(res.outcome == "error" for res in r.results):  # a failed mutation drops those applied before it
        applied = [(res.rule, res.action) for res in r.results if res.outcome == "applied"]
        assert applied == [(m, "mutate") for m in r.mutations], got  # each applied mutation reported as one
    message = r.denial_message()

    # One line per denial: the rule id, what was found, how to fix it. Warnings: one short line.
    for d in r.denials:
        assert "\n" not in d.message and "\r" not in d.message, d.message
        assert d.message.startswith(f"{d.rule}: "), d.message
        assert "Fix: " in d.message, d.message
    assert "\n" not in message
    for w in r.warnings:
        assert "\n" not in w and "\r" not in w and len(w) <= WARNING_LIMIT, w

    assert_no_aliasing(r)

    # The patch applies cleanly to the original and gives exactly the mutated object.
    if isinstance(original, dict):
        patched = jsonpatch.apply_patch(copy.deepcopy(original), copy.deepcopy(list(r.patch)), in_place=False)
        assert patched == r.object, "patch applied to the input differs from review.object"
        if not r.mutations:
            assert r.patch == () and r.object == original, "no mutation reported, yet the object changed"

        # A second pass over the mutated object adds nothing and reaches the same verdict.
        mutated = copy.deepcopy(r.object)
        again = review(mutated, policy=policy, inventory=inv, ctx=ctx)
        assert again.patch == (), f"second pass patched: {list(again.patch)}"
        assert again.mutations == (), f"second pass mutated: {list(again.mutations)}"
        assert again.allowed is r.allowed, summary(again)
        assert {d.rule for d in again.denials} == {d.rule for d in r.denials}, summary(again)


# --- the cases cover the contract -------------------------------------------------------------------------


def _all_cases() -> list[tuple[Path, dict[str, Any]]]:
    return [(p, load_case(p)) for p in case_files()]


def test_cases_are_grouped_in_the_documented_folders() -> None:
    files = case_files()
    assert files, "no golden cases found"
    for path in files:
        assert path.relative_to(CASES).parts[0] in FOLDERS, f"{path}: not in one of {FOLDERS}"
    for folder in FOLDERS:
        assert any(p.relative_to(CASES).parts[0] == folder for p in files), f"no case in {folder}/"


def test_every_mutation_is_shown_applied() -> None:
    applied: set[str] = set()
    for _, case in _all_cases():
        if not case.get("xfail"):
            applied.update(case["expect"].get("mutations") or [])
    assert sorted(set(MUTATION_IDS) - applied) == [], "mutations no case shows applied"


def test_every_rule_is_shown_firing() -> None:
    fired: set[str] = set()
    for _, case in _all_cases():
        if not case.get("xfail"):
            fired.update(case["expect"].get("denials") or [])
            fired.update(case["expect"].get("warnings") or [])
    assert sorted(set(RULE_IDS) - fired) == [], "rules no case shows denying or warning"


def test_every_rule_is_shown_denying() -> None:
    """Rules that only warn by default (training-topology-scheduler, training-queue-priority) need a case with
    a policy override that enforces them."""
    denied: set[str] = set()
    for _, case in _all_cases():
        if not case.get("xfail"):
            denied.update(case["expect"].get("denials") or [])
    assert sorted(set(RULE_IDS) - denied) == [], "rules no case shows denying"


def test_elasticity_without_a_resolver() -> None:
    """`serve` before its workload cache (or without cluster access) reviews an HPA with no resolver: targets
    are not looked up, a training kind is still known by its kind, and nothing raises."""
    policy = policy_for(None)
    inv = inventory_for(DEFAULT_NODES, policy)
    ctx = ReviewContext(resolve=None)
    for kind, allowed in (("Deployment", True), ("PyTorchJob", False)):
        hpa = {
            "apiVersion": "autoscaling/v2",
            "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "scaler", "namespace": "ml"},
            "spec": {"scaleTargetRef": {"kind": kind, "name": "llama"}, "minReplicas": 0, "maxReplicas": 4},
        }
        r = review(hpa, policy=policy, inventory=inv, ctx=ctx)
        assert r.allowed is allowed, summary(r)
        assert not [x for x in r.results if x.outcome == "error"], summary(r)
        if not allowed:
            assert [d.rule for d in r.denials] == ["training-elastic-shrink"], summary(r)
            assert "scales training workload PyTorchJob llama" in r.denials[0].message
