"""Autoscaling bounds that kinds carry themselves (policies/ownscaling.py): every minimum a rule is given, with the
kind's defaults. The golden cases in tests/cases/kinds/ show the verdicts; these pin the figures and the fields."""

from __future__ import annotations

from typing import Any

from policies.ownscaling import RAY_MAX_DEFAULT, elastic_training, warm_minimums

ISVC_ALL = {
    "spec": {
        "predictor": {"model": {"modelFormat": {"name": "huggingface"}}},  # no minReplicas: KServe's default, 1
        "transformer": {"minReplicas": 0, "containers": []},
        "explainer": {"minReplicas": 3, "containers": []},
    }
}


def test_an_inference_service_gives_the_minimum_of_each_gpu_component_with_kserve_default_of_one() -> None:
    roles = {"predictor", "transformer", "explainer"}
    assert warm_minimums("InferenceService", ISVC_ALL, roles) == [
        ("spec.predictor.minReplicas", 1),
        ("spec.transformer.minReplicas", 0),
        ("spec.explainer.minReplicas", 3),
    ]


def test_a_component_without_gpus_or_absent_gives_no_minimum() -> None:
    assert warm_minimums("InferenceService", ISVC_ALL, {"predictor"}) == [("spec.predictor.minReplicas", 1)]
    only_predictor = {"spec": {"predictor": {"minReplicas": 2}}}
    assert warm_minimums("InferenceService", only_predictor, {"predictor", "transformer"}) == [
        ("spec.predictor.minReplicas", 2)
    ]


def test_gpus_in_the_multi_node_workers_alone_hold_the_predictor_minimum() -> None:
    """A multi-node predictor's workers follow its minReplicas: GPUs asked only by `workerSpec` (role worker)
    make the predictor's minimum the one to judge."""
    obj = {"spec": {"predictor": {"minReplicas": 0, "workerSpec": {"pipelineParallelSize": 2}}}}
    assert warm_minimums("InferenceService", obj, {"worker"}) == [("spec.predictor.minReplicas", 0)]


LLM = {"spec": {"scaling": {}, "prefill": {"scaling": {"minReplicas": 0}}}}


def test_an_llm_inference_service_gives_each_scaled_workload_that_asks_gpus_default_one() -> None:
    assert warm_minimums("LLMInferenceService", LLM, {"main", "prefill-main"}) == [
        ("spec.scaling.minReplicas", 1),
        ("spec.prefill.scaling.minReplicas", 0),
    ]
    assert warm_minimums("LLMInferenceService", LLM, {"leader", "worker"}) == [("spec.scaling.minReplicas", 1)]
    # GPUs in the prefill pods only: the decode workload's scaling is not the warm pool's business.
    assert warm_minimums("LLMInferenceService", LLM, {"prefill-main", "prefill-worker"}) == [
        ("spec.prefill.scaling.minReplicas", 0)
    ]
    no_scaling = {"spec": {"prefill": {"replicas": 2}}}
    assert warm_minimums("LLMInferenceService", no_scaling, {"main", "prefill-main"}) == []


def _ray(kind: str, groups: Any, autoscaling: Any = True) -> dict[str, Any]:
    key = "rayClusterConfig" if kind == "RayService" else "rayClusterSpec"
    return {"spec": {key: {"enableInTreeAutoscaling": autoscaling, "workerGroupSpecs": groups}}}


RAY_GROUPS = [
    {"groupName": "cpu", "minReplicas": 0, "maxReplicas": 8},
    {"groupName": "gpu", "maxReplicas": 4},  # no minReplicas: KubeRay's default, 0
    {"groupName": "big-gpu", "minReplicas": 2},  # no maxReplicas: KubeRay's default, 2147483647
    {"groupName": 7, "minReplicas": 0},
    "not a group",
]


def test_a_ray_service_gives_the_minimum_of_each_autoscaled_gpu_worker_group() -> None:
    base = "spec.rayClusterConfig.workerGroupSpecs"
    assert warm_minimums("RayService", _ray("RayService", RAY_GROUPS), {"gpu", "big-gpu", "head"}) == [
        (f"{base}[gpu].minReplicas", 0),
        (f"{base}[big-gpu].minReplicas", 2),
    ]
    for off in (False, "true", None):  # only the boolean true turns the Ray autoscaler on
        assert warm_minimums("RayService", _ray("RayService", RAY_GROUPS, off), {"gpu"}) == []
    for groups in (5, {"groupName": "gpu"}, None):
        assert warm_minimums("RayService", _ray("RayService", groups), {"gpu"}) == []


def test_a_ray_job_is_elastic_when_a_gpu_group_may_shrink_and_not_at_a_fixed_size() -> None:
    groups = [{"groupName": "gpu", "minReplicas": 2, "maxReplicas": 2}, {"groupName": "cpu", "maxReplicas": 9}]
    assert elastic_training("RayJob", _ray("RayJob", groups), {"gpu"}) is None
    unbounded = [{"groupName": "gpu", "minReplicas": 2}]
    assert elastic_training("RayJob", _ray("RayJob", unbounded), {"gpu"}) == (
        f"Ray autoscaling of worker group gpu: minReplicas 2 < maxReplicas {RAY_MAX_DEFAULT}"
    )
    assert elastic_training("RayCluster", _ray("RayJob", unbounded), {"gpu"}) is None
