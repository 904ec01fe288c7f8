"""`policies.scan`, session 11 (issue #20): what the mutation run showed no test pinned."""

from __future__ import annotations

from policies import scan
from policies.engine import Review, RuleResult


def test_a_nameless_object_is_reported_with_an_empty_name_not_a_placeholder() -> None:
    """`result_of` copies the object's place as it is: no name is "", like the other fields."""
    r = Review(kind="Pod", workload=None, allowed=True, denials=(), warnings=(), mutations=(), patch=(), object={},
               results=(RuleResult("a", "warn", "warn", "a: meh"),), policy_hash="h")  # fmt: skip
    for obj in ({}, {"metadata": {}}, {"metadata": {"name": ""}}, {"metadata": None}):
        got = scan.result_of(obj, r)
        assert (got.name, got.namespace, got.kind, got.api_version, got.uid) == ("", "", "", "", ""), obj
        assert got.findings == (scan.Finding("a", "warn", "a: meh"),)
