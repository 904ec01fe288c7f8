"""The workload kinds of 2026 through the real API server: `kubectl apply` of each golden case's input is
mutated or denied as the case says (issue #15 item 5).

Each test replays one case of tests/cases/ on the cluster of examples/cluster/nodes.yaml (the cases' default):
the CRDs are the structural ones of tests/e2e/crds.py, the webhook configurations are deploy/'s, so the API
server's CEL conditions decide whether our webhooks are called at all. A mutated case's stored spec must
equal the case's expected spec; a denied case's `kubectl apply` must fail naming each expected rule.
"""

from __future__ import annotations

import copy
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e import crds
from tests.e2e.cluster import ControlPlane
from tests.e2e.webhook import Webhook

pytestmark = pytest.mark.e2e

CASES = Path(__file__).resolve().parent.parent / "cases"
# One or more cases per kind: mutated (allowed) and denied, each as its golden case says.
KIND_CASES = [
    "kinds/trainjob-runtime-not-found-denied",  # first: before any runtime of that name was ever cached
    "kinds/trainjob",
    "kinds/trainjob-namespaced-runtime-with-kueue-patch",
    "kinds/rayservice",
    "kinds/rayservice-autoscaling-to-zero-denied",
    "kinds/rayjob",
    "kinds/rayjob-autoscaling-denied",
    "kinds/raycluster",
    "kinds/leaderworkerset",
    "kinds/inferenceservice",
    "kinds/inferenceservice-multi-node",
    "kinds/inferenceservice-too-many-gpus-denied",
    "kinds/llminferenceservice",
    "kinds/llminferenceservice-multi-node",
    "kinds/llminferenceservice-prefill-scale-to-zero-denied",
    # GPUs through a ResourceClaimTemplate only: the API server's conditions must still send them (#15)
    "kinds/rayservice-claim-time-sliced-denied",
    "kinds/llminferenceservice-claim-too-many-gpus-denied",
]


@pytest.fixture(scope="module", autouse=True)
def _crds(control_plane: ControlPlane) -> None:
    """Before the webhook starts, so its runtime cache lists the Trainer runtimes at once."""
    crds.install(control_plane)


def load(case_id: str) -> dict[str, Any]:
    case: dict[str, Any] = yaml.safe_load((CASES / f"{case_id}.yaml").read_text(encoding="utf-8"))
    return case


def placed(obj: dict[str, Any], namespace: str) -> dict[str, Any]:
    """The object as it is applied here: in the test's namespace (cluster-scoped objects stay without one)."""
    obj = copy.deepcopy(obj)
    if obj["kind"] not in crds.CLUSTER_SCOPED | {"DeviceClass"}:
        obj["metadata"]["namespace"] = namespace
    return obj


def apply(cp: ControlPlane, obj: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    """`kubectl apply`, retried while a just-created CRD is not yet in kubectl's discovery."""
    deadline = time.monotonic() + 30
    while True:
        r = cp.kubectl("apply", "-f", "-", input=yaml.safe_dump(obj), check=False)
        if r.returncode == 0 or time.monotonic() > deadline or "no matches for kind" not in r.stderr:
            return r
        time.sleep(0.5)


@pytest.fixture
def related(control_plane: ControlPlane, request: pytest.FixtureRequest, namespace: str) -> Iterator[None]:
    """The case's related objects (a TrainJob's runtime), created first and deleted after the test."""
    made: list[dict[str, Any]] = []
    for obj in load(request.node.callspec.params["case_id"]).get("related") or []:
        obj = placed(obj, namespace)
        r = apply(control_plane, obj)
        assert r.returncode == 0, r.stderr
        made.append(obj)
    try:
        yield
    finally:
        for obj in made:
            control_plane.kubectl("delete", "-f", "-", "--ignore-not-found", input=yaml.safe_dump(obj), check=False)


RACK = "topology.kubernetes.io/rack"


def unpinned(value: Any) -> Any:
    """`value` without the rack placement pins (`topology.kubernetes.io/rack In [...]`): the server has a pod
    view and pins the rack it chose (docs/policy.md, "Placement"), the golden cases have none."""
    if isinstance(value, list):
        kept = [
            unpinned(v)
            for v in value
            if not (isinstance(v, dict) and v.get("key") == RACK and v.get("operator") == "In")
        ]
        return [v for v in kept if v != {"matchExpressions": []}]
    if isinstance(value, dict):
        return {k: unpinned(v) for k, v in value.items()}
    return value


@pytest.mark.parametrize("case_id", KIND_CASES)
def test_apply_is_mutated_or_denied_as_the_golden_case_says(
    control_plane: ControlPlane, webhook: Webhook, namespace: str, related: None, case_id: str
) -> None:
    cp = control_plane
    case = load(case_id)
    expect = case["expect"]
    obj = placed(case["input"], namespace)
    kind, name = obj["kind"], obj["metadata"]["name"]
    if not expect["allowed"]:
        # A claim's template and class are read from the webhook's watch caches: created a moment ago (related),
        # they may not be there yet (allowed with a note, or denied as an unknown class); retried until they are.
        deadline = time.monotonic() + 20
        while case.get("related") and time.monotonic() < deadline:
            r = apply(cp, obj)
            if r.returncode != 0 and all(f"{rule}:" in r.stderr for rule in expect.get("denials", [])):
                break
            cp.kubectl("delete", "-f", "-", "--ignore-not-found", "--wait=true", input=yaml.safe_dump(obj), check=False)
            time.sleep(0.5)
        r = apply(cp, obj)
        assert r.returncode != 0, f"{case_id}: applied, expected a denial"
        for rule in expect.get("denials", []):
            assert f"{rule}:" in r.stderr, f"{case_id}: {r.stderr}"
        return
    # The webhook reads a TrainJob's runtime from its cache: a runtime created a moment ago may not be there
    # yet (the review then judges spec.trainer alone and denies), so an allowed case is retried briefly.
    deadline = time.monotonic() + 20
    while True:
        r = apply(cp, obj)
        if r.returncode == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert r.returncode == 0, f"{case_id}: {r.stderr}"
    stored = cp.get_json(f"{kind.lower()}.{obj['apiVersion'].split('/')[0]}", name, "-n", namespace)
    if "object" in expect:
        spec = unpinned(stored["spec"])
        assert spec == expect["object"]["spec"], f"{case_id}: the stored spec differs from the case"
    else:
        assert stored["spec"] == case["input"]["spec"], f"{case_id}: not mutated, as the case says"
