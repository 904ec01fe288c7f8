"""`policies.subject`: what the golden cases cannot pin because they match warnings by substring.

A note the engine turns into a warning must be the whole line, not merely contain it: the cases below are
golden cases, re-read here, and their warnings compared whole.
"""

from __future__ import annotations

import pytest

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
