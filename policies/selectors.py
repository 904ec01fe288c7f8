"""Evaluate a pod's node selection (nodeSelector + required node affinity) against node labels.

Used to answer "which GPU nodes could this pod land on?" against the inventory, so a pod pinned to
time-sliced nodes by a selector is recognised even when its resource name is plain `nvidia.com/gpu`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from policies.workloads import Json

_DECIMAL = re.compile(r"[+-]?[0-9]+")
INT64 = 2**63


def parse_int64(value: str) -> int | None:
    """A Gt/Lt operand as the scheduler reads it (Go's strconv.ParseInt(value, 10, 64), in apimachinery's
    labels.Requirement.Matches), None where it fails: ASCII digits after an optional sign, within 64 bits.
    Python's int() also takes " 8", "1_0" and non-ASCII digits, which would match nodes the scheduler does not."""
    if not _DECIMAL.fullmatch(value):
        return None
    n = int(value)
    return n if -INT64 <= n < INT64 else None


def expression_matches(expr: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key = expr.get("key")
    op = expr.get("operator")
    values = expr.get("values") or []
    if not isinstance(key, str) or not isinstance(values, list):
        return False
    present = key in labels
    value = labels.get(key, "")
    if op == "In":
        return present and value in values
    if op == "NotIn":
        return not present or value not in values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt") and present and len(values) == 1 and isinstance(values[0], str):
        have, want = parse_int64(value), parse_int64(values[0])
        if have is None or want is None:
            return False
        return have > want if op == "Gt" else have < want
    return False


def term_matches(term: Any, labels: Mapping[str, str]) -> bool:
    """A nodeSelectorTerm: its matchExpressions are ANDed (matchFields on metadata.name is honoured)."""
    if not isinstance(term, dict):
        return False
    exprs = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not isinstance(exprs, list) or not isinstance(fields, list) or not (exprs or fields):
        return False  # an empty term matches nothing (Kubernetes semantics)
    if not all(isinstance(e, dict) and expression_matches(e, labels) for e in exprs):
        return False
    name_labels = {"metadata.name": labels.get("kubernetes.io/hostname", "")}
    return all(isinstance(f, dict) and expression_matches(f, name_labels) for f in fields)


def required_terms(pod: Json) -> list[Any] | None:
    """The required nodeSelectorTerms, or None when the pod has none."""
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return None
    terms: Any = spec.get("affinity")
    for key in ("nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution", "nodeSelectorTerms"):
        terms = terms.get(key) if isinstance(terms, dict) else None
    return terms if isinstance(terms, list) else None


# (nodeName or "", nodeSelector items, required nodeSelectorTerms or None): everything node_filter reads.
NodeSelection = tuple[str, tuple[tuple[Any, Any], ...], list[Any] | None]
ANY_NODE: NodeSelection = ("", (), None)


def node_selection(pod: Json) -> NodeSelection:
    """The parts of a pod that decide which nodes it may land on; equal selections allow the same nodes
    (Inventory.candidates caches on this)."""
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return ANY_NODE
    pinned = spec.get("nodeName")
    raw = spec.get("nodeSelector")
    return (
        pinned if isinstance(pinned, str) else "",
        tuple(raw.items()) if isinstance(raw, dict) else (),
        required_terms(pod),
    )


def node_filter(pod: Json) -> Callable[[Mapping[str, str], str], bool]:
    """A predicate (node labels, node name) -> may this pod land there, with the pod's nodeName,
    nodeSelector and required terms read once rather than once per node."""
    return selection_filter(node_selection(pod))


def selection_filter(selection: NodeSelection) -> Callable[[Mapping[str, str], str], bool]:
    pinned, selector, terms = selection

    def matches(labels: Mapping[str, str], name: str) -> bool:
        if pinned and name and pinned != name:
            return False
        if any(labels.get(k) != v for k, v in selector):
            return False
        return terms is None or any(term_matches(t, labels) for t in terms)

    return matches
