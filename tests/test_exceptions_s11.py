"""`policies.exceptions`, session 11 (issue #20): what the mutation run showed no test pinned."""

from __future__ import annotations

from typing import Any

import pytest

from policies import exceptions as ex
from tests.test_exceptions import exception


@pytest.mark.parametrize(("key", "shown"), [(None, "None"), (5, "5")])
def test_a_requirement_without_a_string_key_is_named_not_a_crash(key: Any, shown: str) -> None:
    expression = {"operator": "Exists"} if key is None else {"key": key, "operator": "Exists"}
    with pytest.raises(ex.ExceptionError) as info:
        ex.parse(exception(workloads={"selector": {"matchExpressions": [expression]}}))
    where = "spec.workloads.selector.matchExpressions[0].key"
    assert info.value.errors == [f"{where}: Invalid value: {shown}: must be a label key"]


def test_a_parsed_selector_keeps_its_expressions_and_matches_by_them() -> None:
    expr = {"key": "team", "operator": "In", "values": ["alignment"]}
    e = ex.parse(exception(workloads={"selector": {"matchExpressions": [expr]}}))
    assert e.selector is not None and e.selector.expressions == (expr,)
    assert e.selector.matches({"team": "alignment"})
    assert not e.selector.matches({"team": "research"}) and not e.selector.matches({})


@pytest.mark.parametrize("meta", [None, "junk", ["a list"]])
def test_the_labels_of_a_pod_or_template_without_metadata_are_none(meta: Any) -> None:
    pod = {"kind": "Pod", "apiVersion": "v1", "spec": {}} | ({} if meta is None else {"metadata": meta})
    assert ex.pod_labels(pod) == [{}]
    template = {"spec": {"containers": []}} | ({} if meta is None else {"metadata": meta})
    job = {"kind": "Job", "apiVersion": "batch/v1", "metadata": {"name": "j"}, "spec": {"template": template}}
    assert ex.pod_labels(job) == [{}]


@pytest.mark.parametrize("name", ["", 5, None])
def test_a_name_that_is_empty_or_no_string_is_required(name: Any) -> None:
    obj = exception()
    obj["metadata"]["name"] = name
    with pytest.raises(ex.ExceptionError) as info:
        ex.parse(obj)
    assert info.value.errors == ["metadata.name: Required value"]


def test_a_missing_requester_and_approver_are_each_required_and_nothing_more() -> None:
    obj = exception()
    del obj["spec"]["requester"], obj["spec"]["approver"]
    with pytest.raises(ex.ExceptionError) as info:
        ex.parse(obj)
    assert info.value.errors == ["spec.requester: Required value", "spec.approver: Required value"]
