"""Workload classes by kind and the default latency class (session 11's mutation survivors, issue #20).

`tests/test_classify.py` covers bare Pods; these cover a Job's spec read by `by_kind` when it is no mapping, and
`default_latency`, whose "offline" only the engine's `inference and online` tests read (so a wrong default for
any other class never showed through a golden case).
"""

from __future__ import annotations

from typing import Any

import pytest

from policies.classify import by_kind, classify, default_latency


@pytest.mark.parametrize("spec", [None, [], "parallelism: 4", 4])
def test_a_job_whose_spec_is_no_mapping_is_batch_not_an_error(spec: Any) -> None:
    assert by_kind("Job", {"spec": spec}) == "batch"
    assert classify("Job", {"spec": spec}, None) == "batch"


@pytest.mark.parametrize(
    ("parallelism", "expected"),
    [(2, "training"), (1, "batch"), (True, "batch"), ("4", "batch"), (None, "batch")],
)
def test_a_job_is_training_only_for_a_whole_parallelism_above_one(parallelism: Any, expected: str) -> None:
    assert by_kind("Job", {"spec": {"parallelism": parallelism}}) == expected


@pytest.mark.parametrize(
    ("workload", "expected"),
    [("inference", "online"), ("training", "offline"), ("batch", "offline"), (None, "offline")],
)
def test_only_inference_defaults_to_online(workload: str | None, expected: str) -> None:
    assert default_latency(workload) == expected
