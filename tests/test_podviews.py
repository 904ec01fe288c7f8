"""Pods of kinds without a pod template (policies/podviews.py): KServe's bare PodSpecs and a TrainJob's runtime
pods. The golden cases in tests/cases/kinds/ show the verdicts; these pin the counts, names, boundaries and the
fields written back, which mutation testing found loose."""

from __future__ import annotations

from typing import Any

import pytest

from policies import podviews
from policies.podviews import Group, llm_group, llm_group_size, replica_selector

# -- LLMInferenceService groups -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("parallelism", "size"),
    [
        ({}, 1),
        ({"tensor": 8}, 1),
        ({"pipeline": 4}, 4),
        ({"pipeline": 0}, 1),
        ({"pipeline": "4"}, 1),  # not an int: no size
        ({"data": 16, "dataLocal": 8}, 2),  # data / dataLocal when data-parallel
        ({"data": 4}, 4),
        ({"data": 4, "dataLocal": 0}, 4),
        ({"data": 4, "dataLocal": 1}, 4),
        ({"data": 1, "dataLocal": 1}, 1),
        ({"data": 6, "dataLocal": 4}, 1),  # integer division, as Go's
        ({"dataLocal": 8}, 1),  # data missing: 1 / 8, at least 1
        ({"data": 1, "pipeline": 4}, 1),  # data parallelism wins over pipeline, even at 1
        ({"dataLocal": 1, "pipeline": 4}, 1),
        ({"data": 0, "dataLocal": 0, "pipeline": 3}, 3),  # neither above 0: not data-parallel
    ],
)
def test_llm_group_size_is_kserves_parallelism_size(parallelism: dict[str, Any], size: int) -> None:
    """ParallelismSpec.GetSize: max(data, 1) / max(dataLocal, 1) (at least 1) when data or dataLocal is above 0,
    else pipeline, else 1 pod per replica."""
    assert llm_group_size({"parallelism": parallelism}) == size


def _llm(name: str, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": spec}


def test_an_llm_workload_with_workers_is_a_group_named_after_its_leaderworkerset() -> None:
    obj = _llm(
        "m",
        replicas=3,
        parallelism={"pipeline": 2},
        template={},
        worker={},
        prefill={"parallelism": {"data": 8, "dataLocal": 2}, "template": {}, "worker": {}},
    )
    assert llm_group(obj, "leader") == Group("m-kserve-mn", 2, 3)
    assert llm_group(obj, "worker") == Group("m-kserve-mn", 2, 3)
    # The prefill workload is its own LeaderWorkerSet with its own size; its replicas default to 1.
    assert llm_group(obj, "prefill-leader") == Group("m-kserve-mn-prefill", 4, 1)
    assert llm_group(obj, "prefill-worker") == Group("m-kserve-mn-prefill", 4, 1)


def test_an_llm_workload_without_workers_or_without_a_name_is_no_group() -> None:
    assert llm_group(_llm("m", template={}), "main") is None
    assert llm_group(_llm("m", template={}, prefill={"worker": {}}), "main") is None
    assert llm_group(_llm("m", worker={}, prefill={"template": {}}), "prefill-main") is None
    assert llm_group(_llm("", worker={}), "worker") is None
    assert llm_group({"spec": {"worker": {}}}, "worker") is None
    assert llm_group({"metadata": {"name": 5}, "spec": {"worker": {}}}, "worker") is None
    assert replica_selector("LLMInferenceService", {"metadata": {"name": ["m"]}}, "main") is None


@pytest.mark.parametrize("replicas", [None, 0, -2, "3", True])
def test_an_llm_group_count_is_at_least_one(replicas: Any) -> None:
    spec: dict[str, Any] = {"worker": {}}
    if replicas is not None:
        spec["replicas"] = replicas
    assert llm_group(_llm("m", **spec), "worker") == Group("m-kserve-mn", 1, 1)


def test_an_llm_group_name_kserve_would_hash_is_not_known() -> None:
    """kmeta.ChildName hashes a name longer than 63 characters: the LeaderWorkerSet's name is then not known."""
    fits = "n" * (podviews.NAME_LIMIT - len("-kserve-mn"))
    assert llm_group(_llm(fits, worker={}), "worker") == Group(fits + "-kserve-mn", 1, 1)
    assert llm_group(_llm(fits + "n", worker={}), "worker") is None
    prefill = "p" * (podviews.NAME_LIMIT - len("-kserve-mn-prefill"))
    assert llm_group(_llm(prefill, prefill={"worker": {}}), "prefill-worker") == Group(
        prefill + "-kserve-mn-prefill", 1, 1
    )
    assert llm_group(_llm(prefill + "p", prefill={"worker": {}}), "prefill-worker") is None


# -- spreading ----------------------------------------------------------------------------------------------


def test_each_inference_service_component_spreads_by_its_own_labels_and_its_followers_by_none() -> None:
    obj = {"metadata": {"name": "isvc"}}
    for role in ("predictor", "transformer", "explainer"):
        assert replica_selector("InferenceService", obj, role) == {
            "matchLabels": {"serving.kserve.io/inferenceservice": "isvc", "component": role}
        }
    for role in ("worker", "canary[0]"):
        assert replica_selector("InferenceService", obj, role) is None
    llm = {"matchLabels": {"app.kubernetes.io/name": "isvc", "kserve.io/component": "workload"}}
    assert replica_selector("LLMInferenceService", obj, "prefill-main") == llm
    assert replica_selector("Deployment", obj, "main") is None
    assert replica_selector("InferenceService", {"metadata": {}}, "predictor") is None


# -- LLMInferenceService views ------------------------------------------------------------------------------


def _views(kind: str, obj: dict[str, Any], resolve: Any = None) -> list[tuple[Any, int, str]]:
    return [(t.path, t.replicas, t.role) for t in podviews.templates(kind, obj, resolve)]


def test_an_llm_service_has_a_view_per_workload_pod_spec_with_its_pod_count() -> None:
    """`template` alone is the main pod (replicas of it, 0 kept: scaled to zero); with `worker` it leads a group
    and the workers are the rest of each group; prefill likewise, under its own prefix."""
    obj = _llm(
        "m",
        replicas=2,
        parallelism={"pipeline": 3},
        template={},
        worker={},
        prefill={"replicas": 0, "template": {}},
    )
    assert _views("LLMInferenceService", obj) == [
        (("spec", "template"), 2, "leader"),
        (("spec", "worker"), 4, "worker"),
        (("spec", "prefill", "template"), 0, "prefill-main"),
    ]
    assert _views("LLMInferenceService", _llm("m", template={})) == [(("spec", "template"), 1, "main")]


def test_llm_workers_without_a_main_pod_spec_are_every_pod_of_the_group() -> None:
    assert _views("LLMInferenceService", _llm("m", parallelism={"pipeline": 2}, worker={})) == [
        (("spec", "worker"), 2, "worker")
    ]
    # A group of one pod with a main pod spec has no worker pods.
    assert _views("LLMInferenceService", _llm("m", replicas=3, template={}, worker={}))[1] == (
        ("spec", "worker"),
        0,
        "worker",
    )


def test_an_llm_view_reads_and_writes_the_labels_beside_its_pod_spec() -> None:
    """A workload's labels and annotations sit beside its pod spec: the view shares them, and labels the view
    gains are written back beside the pod spec they belong to."""
    labels = {"team": "a"}
    obj = _llm("m", template={"containers": []}, labels=labels, worker={"containers": []})
    main, worker = podviews.templates("LLMInferenceService", obj, None)
    assert main.pod["metadata"]["labels"] is labels and worker.pod["metadata"]["labels"] is labels
    bare = _llm("m", template={"containers": []}, worker={})
    views = list(podviews.templates("LLMInferenceService", bare, None))  # all read first, as the engine does
    for t in views:
        t.pod["metadata"]["annotations"]["gpu-admission.io/queue"] = "q"
        t.pod["spec"]["nodeSelector"] = {"role": t.role}
    for t in views:
        assert t.fold is not None
        t.fold(t.pod)
    assert bare["spec"]["annotations"] == {"gpu-admission.io/queue": "q"}
    assert "labels" not in bare["spec"]  # none added: none written
    assert bare["spec"]["template"]["nodeSelector"] == {"role": "leader"}
    assert bare["spec"]["worker"]["nodeSelector"] == {"role": "worker"}


# -- InferenceService views ---------------------------------------------------------------------------------


def test_an_inference_service_has_a_view_per_component_with_its_minimum_replicas() -> None:
    """The predictor, its multi-node workers (pipelineParallelSize - 1 per replica), the transformer and the
    explainer, each with KServe's minReplicas default 1 (and at least 1)."""
    obj = {
        "metadata": {"name": "isvc"},
        "spec": {
            "predictor": {"minReplicas": 2, "workerSpec": {"pipelineParallelSize": 3}},
            "transformer": {"minReplicas": 3},
            "explainer": {},
        },
    }
    assert _views("InferenceService", obj) == [
        (("spec", "predictor"), 2, "predictor"),
        (("spec", "predictor", "workerSpec"), 4, "worker"),
        (("spec", "transformer"), 3, "transformer"),
        (("spec", "explainer"), 1, "explainer"),
    ]


@pytest.mark.parametrize(("minimum", "replicas"), [(None, 1), (0, 1), (-1, 1), ("2", 1), (True, 1), (4, 4)])
def test_an_inference_service_component_runs_at_least_one_pod(minimum: Any, replicas: int) -> None:
    comp: dict[str, Any] = {} if minimum is None else {"minReplicas": minimum}
    spec = {"predictor": dict(comp), "transformer": dict(comp), "explainer": dict(comp)}
    assert [r for _, r, _ in _views("InferenceService", {"spec": spec})] == [replicas] * 3


@pytest.mark.parametrize(("size", "workers"), [(None, 0), (1, 0), (2, 2), (0, 0), ("3", 0), (4, 6)])
def test_an_inference_service_has_pipeline_parallel_size_less_one_workers_per_replica(size: Any, workers: int) -> None:
    worker: dict[str, Any] = {} if size is None else {"pipelineParallelSize": size}
    obj = {"spec": {"predictor": {"minReplicas": 2, "workerSpec": worker}}}
    assert _views("InferenceService", obj)[1] == (("spec", "predictor", "workerSpec"), workers, "worker")


def test_an_inference_service_view_reads_the_labels_beside_its_pod_spec_and_writes_new_ones_back() -> None:
    """The predictor's labels and annotations sit beside its PodSpec, and its workers carry the predictor's;
    each other component has its own."""
    pred_labels, comp_labels = {"team": "a"}, {"team": "b"}
    obj = {
        "spec": {
            "predictor": {"labels": pred_labels, "workerSpec": {}},
            "transformer": {"labels": comp_labels},
            "explainer": {},
        }
    }
    views = list(podviews.templates("InferenceService", obj, None))
    assert [t.pod["metadata"]["labels"] for t in views] == [pred_labels, pred_labels, comp_labels, {}]
    assert views[0].pod["metadata"]["labels"] is pred_labels and views[1].pod["metadata"]["labels"] is pred_labels
    for t in views:
        t.pod["metadata"]["annotations"]["gpu-admission.io/queue"] = "q"
        assert t.fold is not None
        t.fold(t.pod)
    for comp in ("predictor", "transformer", "explainer"):
        assert obj["spec"][comp]["annotations"] == {"gpu-admission.io/queue": "q"}
    assert "annotations" not in obj["spec"]["predictor"]["workerSpec"]  # beside the predictor's PodSpec, not in it


def test_a_predictor_view_lists_the_model_container_before_the_predictors_own() -> None:
    """The model (or framework) container sits outside `containers`: the view lists it first, then every
    container of `containers` that is a mapping; the PodSpec's own list is left as it was."""
    model = {"name": "kserve-container", "resources": {"limits": {"nvidia.com/gpu": 1}}}
    side = {"name": "side"}
    listed: list[Any] = [side, "junk"]
    pred = {"model": model, "containers": listed}
    (view,) = podviews.templates("InferenceService", {"spec": {"predictor": pred}}, None)
    assert view.pod["spec"]["containers"] == [model, side]
    assert view.pod["spec"]["containers"][0] is model
    assert view.fold is not None
    view.fold(view.pod)
    assert pred["containers"] is listed and listed == [side, "junk"]
    only = {"spec": {"predictor": {"model": model, "containers": "junk"}}}
    assert next(podviews.templates("InferenceService", only, None)).pod["spec"]["containers"] == [model]
