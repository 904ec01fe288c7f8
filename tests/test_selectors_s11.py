"""policies/selectors.py in process, for its mutants (session 11, issue #20): each node-selector operator on
both sides (Gt and Lt at, below and above the bound), mistyped expressions and terms, matchFields on the node's
name, what `node_selection` reads, and the predicate `selection_filter` makes (nodeName, nodeSelector, terms)."""

from __future__ import annotations

from typing import Any

import pytest

from policies.selectors import (
    ANY_NODE,
    expression_matches,
    node_filter,
    node_selection,
    required_terms,
    selection_filter,
    term_matches,
)

LABELS = {"gpu": "h100", "count": "8", "zone": "z1", "empty": "", "kubernetes.io/hostname": "gpu-1"}


def expr(key: Any, op: Any, values: Any = None) -> dict[str, Any]:
    e: dict[str, Any] = {"key": key, "operator": op}
    if values is not None:
        e["values"] = values
    return e


@pytest.mark.parametrize(
    ("e", "expected"),
    [
        (expr("gpu", "In", ["a100", "h100"]), True),
        (expr("gpu", "In", ["a100"]), False),
        (expr("missing", "In", ["h100"]), False),
        (expr("missing", "In", [""]), False),  # absent is not the empty value
        (expr("empty", "In", [""]), True),
        (expr("gpu", "In", []), False),
        (expr("gpu", "In"), False),
        (expr("gpu", "NotIn", ["a100"]), True),
        (expr("gpu", "NotIn", ["h100"]), False),
        (expr("missing", "NotIn", ["h100"]), True),
        (expr("missing", "NotIn", [""]), True),
        (expr("empty", "NotIn", [""]), False),
        (expr("gpu", "NotIn"), True),
        (expr("gpu", "Exists"), True),
        (expr("empty", "Exists"), True),
        (expr("missing", "Exists"), False),
        (expr("gpu", "DoesNotExist"), False),
        (expr("missing", "DoesNotExist"), True),
        (expr("gpu", "exists"), False),  # operators are case-sensitive
        (expr("gpu", "in", ["h100"]), False),
        (expr("gpu", None), False),
        (expr(None, "Exists"), False),
        (expr(5, "DoesNotExist"), False),
        (expr("gpu", "In", "h100"), False),  # values not a list
        (expr("missing", "DoesNotExist", {"a": 1}), False),
        (expr("gpu", "In", None), False),
    ],
)
def test_set_operators(e: dict[str, Any], expected: bool) -> None:
    assert expression_matches(e, LABELS) is expected


@pytest.mark.parametrize(
    ("op", "bound", "expected"),
    [
        ("Gt", "7", True),
        ("Gt", "8", False),
        ("Gt", "9", False),
        ("Gt", "-1", True),
        ("Lt", "9", True),
        ("Lt", "8", False),
        ("Lt", "7", False),
        ("Lt", "100", True),
        ("Gt", "x", False),
        ("Lt", "x", False),
        ("Gt", "", False),
        ("Lt", "1.5", False),
    ],
)
def test_gt_and_lt_compare_integers_strictly(op: str, bound: str, expected: bool) -> None:
    assert expression_matches(expr("count", op, [bound]), LABELS) is expected


def test_gt_and_lt_need_a_present_integer_label_and_exactly_one_string_value() -> None:
    assert not expression_matches(expr("missing", "Gt", ["-5"]), LABELS)
    assert not expression_matches(expr("missing", "Lt", ["5"]), LABELS)
    assert not expression_matches(expr("gpu", "Gt", ["1"]), LABELS)  # the label is no integer
    assert not expression_matches(expr("gpu", "Lt", ["1"]), LABELS)
    assert not expression_matches(expr("empty", "Lt", ["1"]), LABELS)
    assert not expression_matches(expr("count", "Gt", ["1", "2"]), LABELS)
    assert not expression_matches(expr("count", "Lt", ["10", "20"]), LABELS)
    assert not expression_matches(expr("count", "Gt", []), LABELS)
    assert not expression_matches(expr("count", "Gt", [1]), LABELS)  # a number, not a string
    assert not expression_matches(expr("count", "Lt", [10]), LABELS)
    assert not expression_matches(expr("count", "gt", ["1"]), LABELS)
    assert not expression_matches(expr("count", "LT", ["10"]), LABELS)
    assert expression_matches(expr("count", "Gt", ["+7"]), LABELS)


# -- terms ---------------------------------------------------------------------------------------------------


def test_a_term_ands_its_expressions() -> None:
    both = {"matchExpressions": [expr("gpu", "In", ["h100"]), expr("zone", "In", ["z1"])]}
    one = {"matchExpressions": [expr("gpu", "In", ["h100"]), expr("zone", "In", ["z2"])]}
    assert term_matches(both, LABELS)
    assert not term_matches(one, LABELS)
    assert not term_matches({"matchExpressions": [expr("gpu", "In", ["h100"]), "junk"]}, LABELS)


@pytest.mark.parametrize(
    "term",
    [
        {},
        {"matchExpressions": []},
        {"matchExpressions": [], "matchFields": []},
        {"matchExpressions": None, "matchFields": None},
        "term",
        None,
        ["matchExpressions"],
    ],
)
def test_an_empty_or_mistyped_term_matches_nothing(term: Any) -> None:
    assert not term_matches(term, LABELS)
    assert not term_matches(term, {})


def test_matchfields_compare_metadata_name_with_the_hostname_label() -> None:
    by_name = {"matchFields": [expr("metadata.name", "In", ["gpu-1"])]}
    assert term_matches(by_name, LABELS)
    assert not term_matches(by_name, {**LABELS, "kubernetes.io/hostname": "gpu-2"})
    assert term_matches({"matchFields": [expr("metadata.name", "NotIn", ["gpu-2"])]}, LABELS)
    assert not term_matches({"matchFields": [expr("metadata.name", "NotIn", ["gpu-1"])]}, LABELS)
    # a field other than metadata.name is never there
    assert not term_matches({"matchFields": [expr("metadata.uid", "Exists")]}, LABELS)
    # both parts must match
    assert term_matches({"matchExpressions": [expr("gpu", "Exists")], "matchFields": by_name["matchFields"]}, LABELS)
    assert not term_matches(
        {"matchExpressions": [expr("gpu", "DoesNotExist")], "matchFields": by_name["matchFields"]}, LABELS
    )
    assert not term_matches({"matchFields": [expr("metadata.name", "In", ["gpu-1"]), 5]}, LABELS)


def test_a_node_without_a_hostname_label_has_the_empty_name() -> None:
    unnamed = {"gpu": "h100"}
    assert term_matches({"matchFields": [expr("metadata.name", "In", [""])]}, unnamed)
    assert not term_matches({"matchFields": [expr("metadata.name", "In", ["gpu-1"])]}, unnamed)
    assert term_matches({"matchFields": [expr("metadata.name", "Exists")]}, unnamed)
    # an integer comparison on the empty name is simply false, never an error
    assert not term_matches({"matchFields": [expr("metadata.name", "Gt", ["1"])]}, unnamed)
    assert not term_matches({"matchFields": [expr("metadata.name", "Lt", ["1"])]}, unnamed)


@pytest.mark.parametrize(
    "term",
    [
        {"matchExpressions": 5, "matchFields": [expr("metadata.name", "In", ["gpu-1"])]},
        {"matchExpressions": "gpu", "matchFields": [expr("metadata.name", "In", ["gpu-1"])]},
        {"matchExpressions": [expr("gpu", "Exists")], "matchFields": 5},
        {"matchExpressions": [expr("gpu", "Exists")], "matchFields": {"key": "metadata.name"}},
        {"matchExpressions": {"key": "gpu", "operator": "Exists"}},
    ],
)
def test_a_term_with_a_part_that_is_no_list_matches_nothing_and_never_raises(term: Any) -> None:
    assert not term_matches(term, LABELS)


# -- required terms and the selection -----------------------------------------------------------------------


def terms_pod(terms: Any) -> dict[str, Any]:
    aff = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}
    return {"spec": {"affinity": aff}}


def test_required_terms_are_read_from_the_required_node_affinity_only() -> None:
    terms = [{"matchExpressions": [expr("gpu", "Exists")]}]
    assert required_terms(terms_pod(terms)) is terms
    assert required_terms(terms_pod([])) == []
    assert required_terms(terms_pod("x")) is None
    preferred = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}
    assert required_terms({"spec": {"affinity": preferred}}) is None
    assert (
        required_terms(
            {"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": terms}}}}
        )
        is None
    )
    assert required_terms({"spec": {"affinity": {"nodeAffinity": "x"}}}) is None
    assert required_terms({"spec": {"affinity": "x"}}) is None
    assert required_terms({"spec": {"nodeSelectorTerms": terms}}) is None
    assert required_terms({"spec": {}}) is None
    assert required_terms({"spec": "x"}) is None
    assert required_terms({}) is None


def test_node_selection_reads_node_name_selector_and_terms() -> None:
    terms = [{"matchExpressions": [expr("gpu", "Exists")]}]
    pod = terms_pod(terms)
    pod["spec"].update(nodeName="gpu-1", nodeSelector={"gpu": "h100", "zone": "z1"})
    assert node_selection(pod) == ("gpu-1", (("gpu", "h100"), ("zone", "z1")), terms)
    assert node_selection({"spec": {"nodeName": 5, "nodeSelector": ["gpu"]}}) == ("", (), None)
    assert node_selection({"spec": {}}) == ("", (), None)
    assert node_selection({"spec": None}) == ANY_NODE
    assert node_selection({}) == ANY_NODE
    assert ANY_NODE == ("", (), None)


def test_the_filter_checks_node_name_then_selector_then_terms() -> None:
    terms = [{"matchExpressions": [expr("gpu", "In", ["a100"])]}, {"matchExpressions": [expr("zone", "In", ["z1"])]}]
    allow = selection_filter(("gpu-1", (("gpu", "h100"),), terms))
    assert allow(LABELS, "gpu-1")
    assert allow(LABELS, "")  # a node of no name (a declared pool) is not ruled out by nodeName
    assert not allow(LABELS, "gpu-2")
    assert not allow({**LABELS, "gpu": "a100"}, "gpu-1")  # the selector, though a term matches
    assert not allow({"gpu": "h100"}, "gpu-1")  # no term matches
    assert allow({"gpu": "h100", "zone": "z1"}, "gpu-1")  # the second term
    assert not selection_filter(("", (), []))(LABELS, "gpu-1")  # no term at all matches nothing
    assert selection_filter(ANY_NODE)({}, "any")
    assert selection_filter(("", (("gpu", "h100"),), None))(LABELS, "x")
    assert not selection_filter(("", (("gpu", "h100"), ("missing", "")), None))(LABELS, "x")


def test_node_filter_reads_the_pod() -> None:
    pod = terms_pod([{"matchExpressions": [expr("gpu", "Exists")]}])
    pod["spec"].update(nodeName="gpu-1", nodeSelector={"zone": "z1"})
    assert node_filter(pod)(LABELS, "gpu-1")
    assert not node_filter(pod)(LABELS, "gpu-2")
    assert not node_filter(pod)({"zone": "z1"}, "gpu-1")
    assert node_filter(pod)(LABELS, "")  # no node name: nodeName is not checked
    assert not node_filter(pod)({"gpu": "h100"}, "gpu-1")
    assert node_filter({})({}, "x")
