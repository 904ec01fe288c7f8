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
    assert replica_selector("InferenceService", obj, "worker") is None
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


# -- TrainJob ------------------------------------------------------------------------------------------------

ANCESTOR = podviews.ANCESTOR
PATCH_MANAGER = podviews.PATCH_MANAGER


def _runtime() -> dict[str, Any]:
    """A ClusterTrainingRuntime with a launcher job (3 pods) listed before the trainer's node job (numNodes 2)."""
    launcher = {
        "name": "launcher",
        "template": {
            "metadata": {"labels": {ANCESTOR: "launcher"}},
            "spec": {"parallelism": 3, "template": {"spec": {"containers": [{"name": "launcher"}]}}},
        },
    }
    node_containers = [
        {"name": "sidecar"},
        {
            "name": "node",
            "resources": {"limits": {"nvidia.com/gpu": 2}},
            "env": [{"name": "A", "value": "1"}, {"name": "C", "value": "9"}],
        },
    ]
    node = {
        "name": "node",
        "template": {
            "metadata": {"labels": {ANCESTOR: "trainer"}},
            "spec": {"template": {"metadata": {"labels": {"app": "train"}}, "spec": {"containers": node_containers}}},
        },
    }
    return {
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": "torch"},
        "spec": {"mlPolicy": {"numNodes": 2}, "template": {"spec": {"replicatedJobs": [launcher, node]}}},
    }


def _trainjob(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "tj", "namespace": "ml"}, "spec": {"runtimeRef": {"name": "torch"}, **spec}}


def _resolver(runtime: dict[str, Any]) -> Any:
    return lambda kind, ns, name: runtime if (kind, ns, name) == ("ClusterTrainingRuntime", "", "torch") else None


def _train_views(obj: dict[str, Any], runtime: dict[str, Any] | None = None) -> list[Any]:
    return list(podviews.templates("TrainJob", obj, _resolver(runtime or _runtime())))


@pytest.mark.parametrize(
    ("ref", "namespace", "found"),
    [
        ({"name": "torch"}, "ml", ("ClusterTrainingRuntime", "", "torch")),
        ({"name": "torch", "kind": "TrainingRuntime"}, "ml", ("TrainingRuntime", "ml", "torch")),
        ({"name": "torch", "kind": "TrainingRuntime"}, None, ("TrainingRuntime", "", "torch")),
        ({"name": "torch", "apiGroup": "trainer.kubeflow.org"}, "ml", ("ClusterTrainingRuntime", "", "torch")),
        ({"name": "torch", "apiGroup": "example.com"}, "ml", None),
        ({"name": "torch", "kind": "JobSet"}, "ml", None),
        ({"name": ""}, "ml", None),
        ({"name": 5}, "ml", None),
        ({}, "ml", None),
    ],
)
def test_a_trainjob_references_a_trainer_runtime_by_kind_and_name(
    ref: dict[str, Any], namespace: str | None, found: Any
) -> None:
    meta = {} if namespace is None else {"namespace": namespace}
    assert podviews.runtime_ref({"metadata": meta, "spec": {"runtimeRef": ref}}) == found


def test_a_trainjob_has_a_view_per_replicated_job_with_its_pod_count() -> None:
    """The trainer's job runs numNodes pods (the TrainJob's, else the runtime's mlPolicy), another job its
    parallelism (default 1); each view is named after its job and reached through runtimePatches."""
    path = podviews.RUNTIME_PATH
    assert [(t.path, t.replicas, t.role) for t in _train_views(_trainjob())] == [
        (path, 3, "launcher"),
        (path, 2, "node"),
    ]
    with_nodes = _train_views(_trainjob(trainer={"numNodes": 4}))
    assert [t.replicas for t in with_nodes] == [3, 4]
    runtime = _runtime()
    launcher = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]
    del runtime["spec"]["mlPolicy"]
    launcher["parallelism"] = "3"
    assert [t.replicas for t in _train_views(_trainjob(), runtime)] == [1, 1]


def test_replicated_jobs_without_a_name_or_a_pod_template_are_skipped_and_the_rest_read() -> None:
    runtime = _runtime()
    jobs = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    jobs[0:0] = [{"name": "no-template", "template": {"spec": {}}}, {"template": jobs[0]["template"]}, "junk"]
    assert [t.role for t in _train_views(_trainjob(), runtime)] == ["launcher", "node"]


def test_a_runtime_pod_template_without_metadata_or_spec_is_viewed_with_empty_ones() -> None:
    runtime = _runtime()
    runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"] = {}
    launcher = _train_views(_trainjob(), runtime)[0]
    assert launcher.pod == {"metadata": {}, "spec": {}}


def test_spec_trainer_is_merged_into_the_node_container_of_the_trainer_job_only() -> None:
    """resourcesPerNode overrides the runtime's resources key by key (limits and requests), env is merged by
    name; other containers and the other jobs are left as the runtime has them."""
    trainer = {
        "resourcesPerNode": {"limits": {"nvidia.com/gpu": 8}, "requests": {"cpu": "4"}},
        "env": [{"name": "A", "value": "2"}, {"name": "B", "value": "3"}, "junk"],
    }
    launcher, node = _train_views(_trainjob(trainer=trainer))
    sidecar, main = node.pod["spec"]["containers"]
    assert sidecar == {"name": "sidecar"}
    assert main["resources"] == {"limits": {"nvidia.com/gpu": 8}, "requests": {"cpu": "4"}}
    assert main["env"] == [{"name": "A", "value": "2"}, {"name": "C", "value": "9"}, {"name": "B", "value": "3"}]
    assert launcher.pod["spec"]["containers"] == [{"name": "launcher"}]
    runtime = _runtime()
    runtime["spec"]["template"]["spec"]["replicatedJobs"][1]["template"]["spec"]["template"]["spec"] = {}
    assert _train_views(_trainjob(trainer=trainer), runtime)[1].pod["spec"] == {}  # no containers: nothing merged
    runtime["spec"]["template"]["spec"]["replicatedJobs"][1]["template"]["spec"]["template"]["spec"] = {
        "containers": [{"name": "node"}]  # no env of its own
    }
    merged = _train_views(_trainjob(trainer=trainer), runtime)[1].pod["spec"]["containers"][0]["env"]
    assert merged == [{"name": "A", "value": "2"}, {"name": "B", "value": "3"}]


def test_without_a_runtime_the_nodes_are_judged_from_spec_trainer_and_never_mutated() -> None:
    per_node = {"limits": {"nvidia.com/gpu": 8}}
    obj = _trainjob(trainer={"numNodes": 2, "resourcesPerNode": per_node})
    (view,) = podviews.templates("TrainJob", obj, lambda kind, ns, name: None)
    assert (view.path, view.replicas, view.role, view.readonly, view.fold) == (
        ("spec", "trainer"),
        2,
        "node",
        True,
        None,
    )
    assert view.pod == {"metadata": {}, "spec": {"containers": [{"name": "node", "resources": per_node}]}}
    assert list(podviews.templates("TrainJob", _trainjob(), None)) == []  # nothing asked, nothing to judge


def test_runtime_patches_that_are_no_list_make_the_views_read_only() -> None:
    for t in _train_views(_trainjob(runtimePatches="junk")):
        assert t.readonly and t.fold is None
    for t in _train_views(_trainjob()):
        assert not t.readonly and t.fold is not None


def _patch(manager: str, job: str, pod: dict[str, Any]) -> dict[str, Any]:
    jobs = [{"name": job, "template": {"spec": {"template": pod}}}]
    return {"manager": manager, "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": jobs}}}}


def test_other_managers_patches_are_merged_into_their_jobs_pods_in_order() -> None:
    """Labels, annotations and nodeSelector merge key by key; affinity and tolerations are replaced; a patch
    for one job leaves the other's pods alone; fields a runtime patch cannot set are not read."""
    first = _patch(
        "kueue.x-k8s.io/manager",
        "node",
        {
            "metadata": {"labels": {"queue": "a"}, "annotations": {"note": "x"}},
            "spec": {"nodeSelector": {"rack": "a"}, "tolerations": [{"key": "k"}], "containers": [{"name": "x"}]},
        },
    )
    second = _patch("other", "node", {"spec": {"nodeSelector": {"zone": "z"}, "affinity": {"nodeAffinity": {}}}})
    junk: list[Any] = ["junk", {"trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": None}}}}]
    runtime = _runtime()
    node_pod = runtime["spec"]["template"]["spec"]["replicatedJobs"][1]["template"]["spec"]["template"]
    node_pod["spec"]["nodeSelector"] = {"pool": "gpu"}
    launcher, node = _train_views(_trainjob(runtimePatches=[*junk, first, second]), runtime)
    assert node.pod["metadata"] == {"labels": {"app": "train", "queue": "a"}, "annotations": {"note": "x"}}
    assert node.pod["spec"]["nodeSelector"] == {"pool": "gpu", "rack": "a", "zone": "z"}
    assert node.pod["spec"]["tolerations"] == [{"key": "k"}]
    assert node.pod["spec"]["affinity"] == {"nodeAffinity": {}}
    assert [c["name"] for c in node.pod["spec"]["containers"]] == ["sidecar", "node"]
    assert launcher.pod["metadata"] == {} and "nodeSelector" not in launcher.pod["spec"]
    # A nodeSelector that is not a mapping on either side is replaced, not merged.
    third = _patch("third", "node", {"spec": {"nodeSelector": {"rack": "b"}}})
    node_pod["spec"]["nodeSelector"] = "junk"
    assert _train_views(_trainjob(runtimePatches=[third]), runtime)[1].pod["spec"]["nodeSelector"] == {"rack": "b"}


def test_editing_a_view_edits_neither_the_runtime_nor_another_managers_patch() -> None:
    """The runtime is shared by every TrainJob (and cached), another manager's patch is not ours: the views
    are deep copies."""
    runtime = _runtime()
    kueue = _patch("kueue.x-k8s.io/manager", "node", {"spec": {"affinity": {"nodeAffinity": {"terms": []}}}})
    obj = _trainjob(runtimePatches=[kueue])
    runtime_before, obj_before = repr(runtime), repr(obj)
    for t in _train_views(obj, runtime):
        t.pod["metadata"].setdefault("labels", {})["new"] = "1"
        t.pod["spec"].setdefault("affinity", {}).setdefault("nodeAffinity", {})["terms"] = ["x"]
        for c in t.pod["spec"].get("containers", []):
            c.setdefault("resources", {}).setdefault("limits", {})["x"] = 1
    assert repr(runtime) == runtime_before and repr(obj) == obj_before


def _our_jobs(obj: dict[str, Any]) -> Any:
    ours = [p for p in obj["spec"]["runtimePatches"] if isinstance(p, dict) and p.get("manager") == PATCH_MANAGER]
    assert len(ours) == 1
    return ours[0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]


def _mutate_and_fold(obj: dict[str, Any], edit: Any) -> None:
    views = _train_views(obj)
    for t in views:
        edit(t)
    for t in views:
        assert t.fold is not None
        t.fold(t.pod)


def test_what_the_mutations_add_is_written_as_our_own_runtime_patch_per_job() -> None:
    """Changed scheduling fields whole, new or changed labels and annotations only; unchanged jobs get no
    entry; a TrainJob with nothing added gets no patch at all."""

    def edit(t: Any) -> None:
        if t.role == "node":
            t.pod["metadata"]["labels"]["app"] = "train"  # unchanged: not written
            t.pod["metadata"]["labels"]["gpu-admission.io/job"] = "tj"
            t.pod["metadata"].setdefault("annotations", {})["kueue.x-k8s.io/podset-required-topology"] = "rack"
            t.pod["spec"]["nodeSelector"] = {"pool": "gpu"}
            t.pod["spec"]["containers"][1]["resources"]["limits"]["nvidia.com/mig-1g.10gb"] = 1  # not patchable

    obj = _trainjob()
    _mutate_and_fold(obj, edit)
    assert _our_jobs(obj) == [
        {
            "name": "node",
            "template": {
                "spec": {
                    "template": {
                        "metadata": {
                            "labels": {"gpu-admission.io/job": "tj"},
                            "annotations": {"kueue.x-k8s.io/podset-required-topology": "rack"},
                        },
                        "spec": {"nodeSelector": {"pool": "gpu"}},
                    }
                }
            },
        }
    ]
    untouched = _trainjob()
    _mutate_and_fold(untouched, lambda t: None)
    assert untouched["spec"] == {"runtimeRef": {"name": "torch"}}


def test_our_existing_runtime_patch_entry_is_updated_in_place_job_by_job() -> None:
    """A second admission (or a patch of ours already there) updates our one entry: the job's own item, the
    other jobs' items kept."""
    ours = _patch(PATCH_MANAGER, "launcher", {"spec": {"tolerations": [{"key": "old"}]}})
    ours["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"].append(
        {"name": "node", "template": {"spec": {"template": {"metadata": {"labels": {"kept": "1"}}}}}}
    )
    obj = _trainjob(runtimePatches=[_patch("kueue.x-k8s.io/manager", "node", {}), ours])

    def edit(t: Any) -> None:
        t.pod["metadata"].setdefault("labels", {})["role"] = t.role
        t.pod["spec"]["tolerations"] = [{"key": t.role}]

    _mutate_and_fold(obj, edit)
    assert len(obj["spec"]["runtimePatches"]) == 2
    launcher, node = _our_jobs(obj)
    assert launcher["name"] == "launcher" and node["name"] == "node"
    assert launcher["template"]["spec"]["template"]["spec"] == {"tolerations": [{"key": "launcher"}]}
    assert launcher["template"]["spec"]["template"]["metadata"] == {"labels": {"role": "launcher"}}
    assert node["template"]["spec"]["template"]["metadata"] == {"labels": {"kept": "1", "role": "node"}}
    assert node["template"]["spec"]["template"]["spec"] == {"tolerations": [{"key": "node"}]}


def test_our_entry_is_added_as_the_sixteenth_but_never_as_a_seventeenth() -> None:
    """The TrainJob CRD allows 16 runtimePatches: with 16 of other managers there is no room for ours, and the
    rules judge the pods as they stand."""

    def edit(t: Any) -> None:
        t.pod["spec"]["nodeSelector"] = {"pool": "gpu"}

    for others, written in ((podviews.MAX_RUNTIME_PATCHES - 1, True), (podviews.MAX_RUNTIME_PATCHES, False)):
        obj = _trainjob(runtimePatches=[{"manager": f"m{i}"} for i in range(others)])
        _mutate_and_fold(obj, edit)
        managers = [p["manager"] for p in obj["spec"]["runtimePatches"]]
        assert (PATCH_MANAGER in managers) is written and len(managers) == others + written


def test_a_malformed_entry_of_ours_is_left_as_it_is() -> None:
    """Where our own entry has something that is not a mapping (or a list) on the way, nothing is written."""

    def edit(t: Any) -> None:
        t.pod["metadata"].setdefault("labels", {})["new"] = "1"
        t.pod["spec"]["nodeSelector"] = {"pool": "gpu"}

    for spec in ({"replicatedJobs": "junk"}, {"replicatedJobs": [{"name": "node", "template": "junk"}]}):
        entry = {"manager": PATCH_MANAGER, "trainingRuntimeSpec": {"template": {"spec": spec}}}
        obj = _trainjob(runtimePatches=[entry])
        before = repr(spec["replicatedJobs"]) if spec["replicatedJobs"] == "junk" else None
        _mutate_and_fold(obj, edit)
        jobs = obj["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
        if before is not None:
            assert repr(jobs) == before
        else:
            assert jobs[1]["name"] == "launcher" and jobs[0] == {"name": "node", "template": "junk"}
