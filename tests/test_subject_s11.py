"""`policies.subject`, session 11 (issue #20): the gang sizes `_derive_job` gives a workload's job."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from policies import inventory as inventory_mod
from policies import placement
from policies.document import default_policy
from policies.engine import ReviewContext
from policies.subject import Job, build, meta_map, meta_str
from webhook.manifests import load_objects

LIMIT = placement.MAX_GANG_PODS
ROOT = Path(__file__).resolve().parent.parent
POLICY = default_policy()
INV = inventory_mod.build(load_objects([str(ROOT / "examples/cluster/nodes.yaml")]), POLICY)


def _container(limits: dict[str, Any]) -> dict[str, Any]:
    return {"name": "c", "image": "trainer", "resources": {"limits": limits}}


def _job(pods: int, gpus: int) -> dict[str, Any]:
    template = {"spec": {"restartPolicy": "Never", "containers": [_container({"nvidia.com/gpu": gpus})]}}
    spec = {"parallelism": pods, "completions": pods, "completionMode": "Indexed", "template": template}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "namespace": "ml"}, "spec": spec}


def _job_of(obj: dict[str, Any]) -> Job:
    return build(obj, POLICY, INV, ReviewContext()).job


@pytest.mark.parametrize(
    ("pods", "sizes"),
    [
        (1, ()),
        (2, (8, 8)),
        (placement.MAX_GANG_PODS, (8,) * placement.MAX_GANG_PODS),
        (placement.MAX_GANG_PODS + 1, ()),
    ],
)
def test_a_workloads_gang_sizes_are_one_per_pod_from_two_pods_up_to_the_limit(
    pods: int, sizes: tuple[int, ...]
) -> None:
    job = _job_of(_job(pods, 8))
    assert (job.sizes, job.multi_pod, job.gpus) == (sizes, pods > 1, 8 * pods)


def test_a_pod_with_no_whole_gpu_has_no_place_in_the_gang_sizes() -> None:
    """The launcher asks a MIG slice: it is a GPU pod of the job, but takes no whole GPU, so it is no piece."""
    launcher = {"replicas": 1, "template": {"spec": {"containers": [_container({"nvidia.com/mig-1g.10gb": 1})]}}}
    worker = {"replicas": 2, "template": {"spec": {"containers": [_container({"nvidia.com/gpu": 8})]}}}
    obj = {
        "apiVersion": "kubeflow.org/v2beta1",
        "kind": "MPIJob",
        "metadata": {"name": "m", "namespace": "ml"},
        "spec": {"mpiReplicaSpecs": {"Launcher": launcher, "Worker": worker}},
    }
    job = _job_of(obj)
    assert (job.sizes, job.multi_pod, job.gpus) == ((8, 8), True, 16)


@pytest.mark.parametrize(
    "obj", [{}, {"metadata": None}, {"metadata": ["a list"]}, {"metadata": {"name": 5, "labels": "x"}}]
)
def test_metadata_that_is_missing_or_mistyped_reads_as_empty(obj: dict[str, Any]) -> None:
    assert meta_str(obj, "name") == "" and meta_map(obj, "labels") == {}


@pytest.mark.parametrize("obj", ["x", None, ["a list"]])
def test_meta_map_of_no_object_is_empty(obj: Any) -> None:
    assert meta_map(obj, "labels") == {}
