"""`policies.subject`: what the golden cases cannot pin because they match warnings by substring.

A note the engine turns into a warning must be the whole line, not merely contain it: the cases below are
golden cases, re-read here, and their warnings compared whole.
"""

from __future__ import annotations

import pytest

from policies import placement
from policies.subject import pod_facts
from tests import test_golden as golden


@pytest.mark.parametrize(
    ("case", "warning"),
    [
        (
            "bad-input/trainjob-runtime-patches-not-a-list",
            "TrainJob: spec.runtimePatches is not a list: judged, not mutated",
        ),
        (
            "kinds/trainjob-runtime-not-found-denied",
            "TrainJob: ClusterTrainingRuntime torch-distributed not found: nodes judged from spec.trainer only, "
            "not mutated",
        ),
        (
            "bad-input/trainjob-without-runtime-ref",
            "TrainJob: its runtime not found: nodes judged from spec.trainer only, not mutated",
        ),
    ],
)
def test_a_trainjob_judged_without_its_runtime_says_why_in_one_whole_warning(case: str, warning: str) -> None:
    loaded = golden.load_case(golden.CASES / f"{case}.yaml")
    review = golden.run_case(loaded, loaded["input"])[0]
    assert warning in review.warnings, review.warnings


@pytest.mark.parametrize("garbage", ["x", None, 5, ["a list"]])
def test_pod_facts_refuses_a_pod_that_is_not_an_object_by_saying_so(garbage: object) -> None:
    """The pod view's reader contract (cluster/pods.py `Reader`): garbage raises ValueError, one line."""
    with pytest.raises(ValueError, match=r"^pod is not an object$"):
        pod_facts(garbage)  # type: ignore[arg-type]


def test_pod_facts_reads_the_units_and_the_job_of_a_pod() -> None:
    pod = {
        "metadata": {"namespace": "research", "labels": {"training.kubeflow.org/job-name": "bert"}},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": 2}}}]},
    }
    units, job = pod_facts(pod)
    assert units == {"nvidia.com/gpu": 2}
    assert job == placement.job_id("research", "training.kubeflow.org/job-name", "bert")
