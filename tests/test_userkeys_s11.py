"""userkeys.read on objects that are no mapping, and its errors when no object is named (session 11's mutation
survivors, issue #20)."""

from __future__ import annotations

from typing import Any

import pytest

from policies import userkeys


@pytest.mark.parametrize("obj", [None, [], "metadata", 5, ["metadata"]])
def test_an_object_that_is_no_mapping_has_none_of_our_keys(obj: Any) -> None:
    assert userkeys.read(obj) is userkeys.NONE
    # beside an object with a key, it adds nothing and raises nothing
    keys = userkeys.read(obj, {"metadata": {"labels": {userkeys.WORKLOAD: "batch"}}})
    assert (keys.workload, keys.errors) == ("batch", ())


def test_errors_of_an_unnamed_object_name_no_place() -> None:
    keys = userkeys.read({"metadata": {"annotations": {"gpu-admission.io/latncy": "online", userkeys.LATENCY: "x"}}})
    assert keys.errors == (
        "unknown annotation gpu-admission.io/latncy (did you mean gpu-admission.io/latency?)",
        "annotation gpu-admission.io/latency='x': must be one of online, offline",
    )
    named = userkeys.read({"metadata": {"annotations": {userkeys.LATENCY: "x"}}}, where=("Pod",))
    assert named.errors == ("annotation gpu-admission.io/latency='x' on Pod: must be one of online, offline",)
