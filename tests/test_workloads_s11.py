"""policies/workloads.py in process, for its mutants (session 11, issue #20): where each kind keeps its pod
templates and how many pods each stands for, read field by field (the golden cases see these only through the
verdict), and the small accessors: `effective_kind`, `suspended`, `ray_group_pods`, `ray_service_selector`,
`lookup`, `containers`."""

from __future__ import annotations

from typing import Any

import pytest

from policies.workloads import (
    APPS_KINDS,
    KUBEFLOW_REPLICA_SPECS,
    Template,
    containers,
    effective_kind,
    ray_group_pods,
    ray_service_selector,
    suspended,
    templates,
)


def pod(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"containers": [{"name": name}]}}


def at(obj: Any, path: tuple[str | int, ...]) -> Any:
    """The value at a template path (keys and list indexes), to check that `templates` points at its pod."""
    for part in path:
        obj = obj[part]
    return obj


def listed(obj: Any) -> list[tuple[tuple[str | int, ...], str, int, str]]:
    """(path, pod name, replicas, role) of each template; the pod found at the path is the template's own."""
    out = []
    for t in templates(obj):
        assert isinstance(t, Template)
        assert at(obj, t.path) is t.pod, t.path
        assert t.fold is None and t.readonly is False
        out.append((t.path, t.pod["metadata"]["name"], t.replicas, t.role))
    return out


# -- effective_kind ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("obj", "kind"),
    [
        ({"kind": "Job", "apiVersion": "batch/v1"}, "Job"),
        ({"kind": "Job", "apiVersion": "batch.volcano.sh/v1alpha1"}, "VolcanoJob"),
        ({"kind": "Job", "apiVersion": "batch.volcano.sh/"}, "VolcanoJob"),
        ({"kind": "Job", "apiVersion": "batch.volcano.sh"}, "Job"),  # no group/version separator: not Volcano's
        ({"kind": "Job", "apiVersion": "x.batch.volcano.sh/v1"}, "Job"),
        ({"kind": "Job", "apiVersion": "BATCH.VOLCANO.SH/v1alpha1"}, "Job"),
        ({"kind": "Job"}, "Job"),
        ({"kind": "Job", "apiVersion": 5}, "Job"),
        ({"kind": "Deployment", "apiVersion": "batch.volcano.sh/v1alpha1"}, "Deployment"),
        ({"kind": "Pod", "apiVersion": "v1"}, "Pod"),
        ({"kind": "pod"}, "pod"),
        ({"kind": 5}, ""),
        ({"kind": None}, ""),
        ({}, ""),
        ({"apiVersion": "batch.volcano.sh/v1alpha1"}, ""),
    ],
)
def test_the_effective_kind(obj: dict[str, Any], kind: str) -> None:
    assert effective_kind(obj) == kind


# -- templates ---------------------------------------------------------------------------------------------


def test_a_pod_is_its_own_template() -> None:
    p = {"kind": "Pod", **pod("p")}
    assert listed(p) == [((), "p", 1, "pod")]
    assert next(iter(templates(p))).pod is p
    bare: dict[str, Any] = {"kind": "Pod", "metadata": {"name": "x"}}
    assert [(t.path, t.replicas, t.role) for t in templates(bare)] == [((), 1, "pod")]


@pytest.mark.parametrize("kind", sorted(APPS_KINDS))
def test_an_apps_kind_has_one_template_of_its_replicas(kind: str) -> None:
    obj = {"kind": kind, "spec": {"replicas": 3, "template": pod("t")}}
    assert listed(obj) == [(("spec", "template"), "t", 3, "replica")]
    obj = {"kind": kind, "spec": {"template": pod("t")}}
    assert listed(obj) == [(("spec", "template"), "t", 1, "replica")]
    for bad in (True, "3", 2.0, None):
        assert listed({"kind": kind, "spec": {"replicas": bad, "template": pod("t")}})[0][2] == 1, bad
    assert listed({"kind": kind, "spec": {"replicas": 0, "template": pod("t")}})[0][2] == 0
    assert listed({"kind": kind, "spec": {"replicas": 3, "template": "x"}}) == []
    assert listed({"kind": kind, "spec": {"replicas": 3}}) == []
    assert listed({"kind": kind, "spec": "x"}) == []
    assert listed({"kind": kind}) == []


def test_a_batch_job_has_one_template_of_its_parallelism() -> None:
    obj = {"kind": "Job", "apiVersion": "batch/v1", "spec": {"parallelism": 4, "replicas": 9, "template": pod("w")}}
    assert listed(obj) == [(("spec", "template"), "w", 4, "worker")]
    assert listed({"kind": "Job", "spec": {"template": pod("w")}}) == [(("spec", "template"), "w", 1, "worker")]
    assert listed({"kind": "Job", "spec": {"parallelism": True, "template": pod("w")}})[0][2] == 1
    assert listed({"kind": "Job", "spec": {"parallelism": 4, "template": ["x"]}}) == []
    assert listed({"kind": "Job", "spec": None}) == []


def test_a_cronjob_has_its_job_templates_template() -> None:
    path = ("spec", "jobTemplate", "spec", "template")
    obj = {
        "kind": "CronJob",
        "spec": {"parallelism": 7, "jobTemplate": {"spec": {"parallelism": 2, "template": pod("c")}}},
    }
    assert listed(obj) == [(path, "c", 2, "worker")]
    obj = {"kind": "CronJob", "spec": {"jobTemplate": {"spec": {"template": pod("c")}}}}
    assert listed(obj) == [(path, "c", 1, "worker")]
    assert listed({"kind": "CronJob", "spec": {"jobTemplate": {"spec": {"parallelism": 2, "template": 5}}}}) == []
    assert listed({"kind": "CronJob", "spec": {"jobTemplate": {"spec": "x"}}}) == []
    assert listed({"kind": "CronJob", "spec": {"jobTemplate": "x"}}) == []
    assert listed({"kind": "CronJob", "spec": {"template": pod("c")}}) == []
    assert listed({"kind": "CronJob"}) == []


@pytest.mark.parametrize("kind", sorted(KUBEFLOW_REPLICA_SPECS))
def test_a_kubeflow_job_has_one_template_per_replica_type(kind: str) -> None:
    key = KUBEFLOW_REPLICA_SPECS[kind]
    specs = {
        "Master": {"replicas": 1, "template": pod("m")},
        "Worker": {"replicas": 4, "template": pod("w")},
        "Chief": {"template": pod("c")},  # no replicas: 1
        "Odd": {"replicas": "4", "template": pod("o")},  # not an int: 1
        "NoTemplate": {"replicas": 2},
        "BadTemplate": {"replicas": 2, "template": "x"},
        "NotAMapping": ["x"],
    }
    obj = {"kind": kind, "spec": {key: specs}}
    assert listed(obj) == [
        (("spec", key, "Master", "template"), "m", 1, "Master"),
        (("spec", key, "Worker", "template"), "w", 4, "Worker"),
        (("spec", key, "Chief", "template"), "c", 1, "Chief"),
        (("spec", key, "Odd", "template"), "o", 1, "Odd"),
    ]
    other = next(k for k in KUBEFLOW_REPLICA_SPECS.values() if k != key)
    assert listed({"kind": kind, "spec": {other: specs}}) == []  # another kind's key is not read
    assert listed({"kind": kind, "spec": {key: ["x"]}}) == []
    assert listed({"kind": kind}) == []


def test_a_jobset_has_one_template_per_replicated_job_of_replicas_times_parallelism() -> None:
    path = ("spec", "replicatedJobs")
    rjs = [
        {"name": "leader", "replicas": 1, "template": {"spec": {"template": pod("l")}}},
        {"name": "workers", "replicas": 3, "template": {"spec": {"parallelism": 2, "template": pod("w")}}},
        {"replicas": 2, "template": {"spec": {"template": pod("u")}}},  # unnamed: its index
        {"name": 5, "template": {"spec": {"parallelism": 4, "template": pod("n")}}},  # name not a string, replicas 1
        {"name": "no-template", "replicas": 3, "template": {"spec": {}}},
        {"name": "bad-template", "template": {"spec": {"template": "x"}}},
        "not a mapping",
        {"name": "bad-replicas", "replicas": True, "template": {"spec": {"parallelism": "2", "template": pod("b")}}},
    ]
    obj = {"kind": "JobSet", "spec": {"replicatedJobs": rjs}}
    assert listed(obj) == [
        ((*path, 0, "template", "spec", "template"), "l", 1, "leader"),
        ((*path, 1, "template", "spec", "template"), "w", 6, "workers"),
        ((*path, 2, "template", "spec", "template"), "u", 2, "replicatedJobs[2]"),
        ((*path, 3, "template", "spec", "template"), "n", 4, "replicatedJobs[3]"),
        ((*path, 7, "template", "spec", "template"), "b", 1, "bad-replicas"),
    ]
    assert listed({"kind": "JobSet", "spec": {"replicatedJobs": {"a": rjs[0]}}}) == []
    assert listed({"kind": "JobSet"}) == []


def test_a_leaderworkerset_has_a_leader_and_workers_per_group() -> None:
    lwt = "leaderWorkerTemplate"
    obj = {
        "kind": "LeaderWorkerSet",
        "spec": {"replicas": 3, lwt: {"size": 4, "leaderTemplate": pod("l"), "workerTemplate": pod("w")}},
    }
    assert listed(obj) == [
        (("spec", lwt, "leaderTemplate"), "l", 3, "leader"),
        (("spec", lwt, "workerTemplate"), "w", 9, "worker"),  # 3 groups of 1 leader + 3 workers
    ]
    # no leader template: every pod of a group is a worker
    obj = {"kind": "LeaderWorkerSet", "spec": {"replicas": 3, lwt: {"size": 4, "workerTemplate": pod("w")}}}
    assert listed(obj) == [(("spec", lwt, "workerTemplate"), "w", 12, "worker")]
    obj = {
        "kind": "LeaderWorkerSet",
        "spec": {"replicas": 3, lwt: {"size": 4, "leaderTemplate": "x", "workerTemplate": pod("w")}},
    }
    assert listed(obj) == [(("spec", lwt, "workerTemplate"), "w", 12, "worker")]
    # defaults: one group of one pod; a group of one is its leader alone
    obj = {"kind": "LeaderWorkerSet", "spec": {lwt: {"leaderTemplate": pod("l"), "workerTemplate": pod("w")}}}
    assert listed(obj) == [
        (("spec", lwt, "leaderTemplate"), "l", 1, "leader"),
        (("spec", lwt, "workerTemplate"), "w", 0, "worker"),
    ]
    obj = {
        "kind": "LeaderWorkerSet",
        "spec": {"replicas": 2, lwt: {"size": 0, "leaderTemplate": pod("l"), "workerTemplate": pod("w")}},
    }
    assert [r for _, _, r, _ in listed(obj)] == [2, 0]  # never a negative count
    obj = {"kind": "LeaderWorkerSet", "spec": {"replicas": 2, lwt: {"size": 3, "workerTemplate": pod("w")}}}
    assert listed(obj) == [(("spec", lwt, "workerTemplate"), "w", 6, "worker")]
    obj = {"kind": "LeaderWorkerSet", "spec": {"replicas": 2, lwt: {"size": 3, "leaderTemplate": pod("l")}}}
    assert listed(obj) == [(("spec", lwt, "leaderTemplate"), "l", 2, "leader")]
    obj = {
        "kind": "LeaderWorkerSet",
        "spec": {"replicas": "2", lwt: {"size": "3", "leaderTemplate": pod("l"), "workerTemplate": pod("w")}},
    }
    assert [r for _, _, r, _ in listed(obj)] == [1, 0]
    assert listed({"kind": "LeaderWorkerSet", "spec": {lwt: "x"}}) == []
    assert listed({"kind": "LeaderWorkerSet"}) == []


def test_a_volcano_job_has_one_template_per_task() -> None:
    tasks = [
        {"name": "master", "replicas": 1, "template": pod("m")},
        {"name": "worker", "replicas": 8, "template": pod("w")},
        {"replicas": 2, "template": pod("u")},
        {"name": ["x"], "template": pod("n")},
        {"name": "bad", "replicas": 2, "template": "x"},
        "not a mapping",
        {"name": "odd", "replicas": 2.0, "template": pod("o")},
    ]
    obj = {"kind": "Job", "apiVersion": "batch.volcano.sh/v1alpha1", "spec": {"tasks": tasks}}
    assert listed(obj) == [
        (("spec", "tasks", 0, "template"), "m", 1, "master"),
        (("spec", "tasks", 1, "template"), "w", 8, "worker"),
        (("spec", "tasks", 2, "template"), "u", 2, "tasks[2]"),
        (("spec", "tasks", 3, "template"), "n", 1, "tasks[3]"),
        (("spec", "tasks", 6, "template"), "o", 1, "odd"),
    ]
    # a batch/v1 Job's template, not the tasks, and the other way round
    batch = {"kind": "Job", "apiVersion": "batch/v1", "spec": {"tasks": tasks}}
    assert listed(batch) == []
    volcano = {"kind": "Job", "apiVersion": "batch.volcano.sh/v1alpha1", "spec": {"template": pod("t")}}
    assert listed(volcano) == []
    assert listed({"kind": "Job", "apiVersion": "batch.volcano.sh/v1alpha1", "spec": {"tasks": {"a": tasks[0]}}}) == []


@pytest.mark.parametrize(
    ("kind", "base"),
    [("RayCluster", ("spec",)), ("RayJob", ("spec", "rayClusterSpec")), ("RayService", ("spec", "rayClusterConfig"))],
)
def test_a_ray_cluster_has_a_head_and_its_worker_groups(kind: str, base: tuple[str, ...]) -> None:
    cluster = {
        "headGroupSpec": {"replicas": 5, "template": pod("h")},  # the head is always one pod
        "workerGroupSpecs": [
            {"groupName": "gpu", "replicas": 2, "numOfHosts": 4, "template": pod("g")},
            {"template": pod("u")},  # unnamed, no counts: 1
            {"groupName": "off", "replicas": 3, "suspend": True, "template": pod("s")},
            {"groupName": "bad", "template": "x"},
            "not a mapping",
            {"groupName": 7, "minReplicas": 3, "template": pod("m")},
        ],
    }
    obj: dict[str, Any] = {"kind": kind}
    holder = obj
    for key in base:
        holder[key] = {}
        holder = holder[key]
    holder.update(cluster)
    assert listed(obj) == [
        ((*base, "headGroupSpec", "template"), "h", 1, "head"),
        ((*base, "workerGroupSpecs", 0, "template"), "g", 8, "gpu"),
        ((*base, "workerGroupSpecs", 1, "template"), "u", 1, "workerGroupSpecs[1]"),
        ((*base, "workerGroupSpecs", 2, "template"), "s", 0, "off"),
        ((*base, "workerGroupSpecs", 5, "template"), "m", 3, "workerGroupSpecs[5]"),
    ]
    holder["headGroupSpec"] = {"template": "x"}
    holder["workerGroupSpecs"] = {"gpu": cluster["workerGroupSpecs"][0]}
    assert listed(obj) == []


def test_a_ray_kind_reads_only_its_own_cluster_spec() -> None:
    cluster = {"headGroupSpec": {"template": pod("h")}}
    assert listed({"kind": "RayJob", "spec": cluster}) == []
    assert listed({"kind": "RayService", "spec": {"rayClusterSpec": cluster}}) == []
    assert listed({"kind": "RayCluster", "spec": {"rayClusterConfig": cluster}}) == []
    assert listed({"kind": "RayJob", "spec": {"rayClusterSpec": "x"}}) == []
    assert listed({"kind": "RayJob", "spec": "x"}) == []


@pytest.mark.parametrize("kind", ["ConfigMap", "", "Service", "HorizontalPodAutoscaler"])
def test_other_kinds_have_no_template(kind: str) -> None:
    assert listed({"kind": kind, "spec": {"template": pod("t"), "replicas": 2}}) == []


def test_a_view_kind_reads_its_pods_through_podviews() -> None:
    """A TrainJob without a runtime: judged from spec.trainer, read-only (podviews.py); an InferenceService's
    predictor is a view whose fold writes back."""
    tj = {
        "kind": "TrainJob",
        "spec": {"trainer": {"numNodes": 3, "resourcesPerNode": {"limits": {"nvidia.com/gpu": 8}}}},
    }
    found = list(templates(tj))
    assert [(t.path, t.replicas, t.role, t.readonly) for t in found] == [(("spec", "trainer"), 3, "node", True)]
    runtime = {
        "spec": {
            "template": {"spec": {"replicatedJobs": [{"name": "init", "template": {"spec": {"template": pod("i")}}}]}}
        }
    }
    asked: list[tuple[str, str, str]] = []

    def resolve(kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        asked.append((kind, namespace, name))
        return runtime

    tj["spec"]["runtimeRef"] = {"name": "torch"}
    found = list(templates(tj, resolve))
    assert asked == [("ClusterTrainingRuntime", "", "torch")]
    assert [(t.pod["metadata"]["name"], t.replicas, t.role, t.readonly) for t in found] == [("i", 1, "init", False)]
    isvc = {"kind": "InferenceService", "spec": {"predictor": {"minReplicas": 2, "containers": [{"name": "m"}]}}}
    found = list(templates(isvc))
    assert len(found) == 1 and found[0].fold is not None


# -- suspended, ray_group_pods, ray_service_selector -----------------------------------------------------------


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        ({"kind": "Job", "spec": {"suspend": True}}, True),
        ({"kind": "JobSet", "spec": {"suspend": True, "replicatedJobs": []}}, True),
        ({"kind": "PyTorchJob", "spec": {"runPolicy": {"suspend": True}}}, True),
        ({"kind": "PyTorchJob", "spec": {"suspend": False, "runPolicy": {"suspend": True}}}, True),
        ({"kind": "Job", "spec": {"suspend": False}}, False),
        ({"kind": "Job", "spec": {"suspend": "true"}}, False),
        ({"kind": "Job", "spec": {"suspend": 1}}, False),
        ({"kind": "PyTorchJob", "spec": {"runPolicy": {"suspend": False}}}, False),
        ({"kind": "PyTorchJob", "spec": {"runPolicy": {"suspend": "yes"}}}, False),
        ({"kind": "PyTorchJob", "spec": {"runPolicy": ["suspend"]}}, False),
        ({"kind": "Job", "spec": {}}, False),
        ({"kind": "Job", "spec": "suspend"}, False),
        ({"kind": "Job"}, False),
        # never a Pod, whatever fields it carries
        ({"kind": "Pod", "spec": {"suspend": True}}, False),
        ({"kind": "Pod", "spec": {"runPolicy": {"suspend": True}}}, False),
        ({"kind": "pod", "spec": {"suspend": True}}, True),  # not the Pod kind
        ({"spec": {"suspend": True}}, True),
    ],
)
def test_suspended(obj: dict[str, Any], expected: bool) -> None:
    assert suspended(obj) is expected


@pytest.mark.parametrize(
    ("wg", "pods"),
    [
        ({"replicas": 3, "numOfHosts": 2}, 6),
        ({"replicas": 3}, 3),
        ({"numOfHosts": 4}, 4),
        ({}, 1),
        ({"minReplicas": 2, "numOfHosts": 2}, 4),
        ({"replicas": 5, "minReplicas": 2}, 5),
        ({"replicas": 0, "minReplicas": 2}, 0),
        ({"replicas": "5", "minReplicas": 2}, 2),
        ({"replicas": True, "minReplicas": "2", "numOfHosts": False}, 1),
        ({"replicas": 3, "numOfHosts": 2, "suspend": True}, 0),
        ({"replicas": 3, "numOfHosts": 2, "suspend": False}, 6),
        ({"replicas": 3, "numOfHosts": 2, "suspend": "true"}, 6),
    ],
)
def test_ray_group_pods(wg: dict[str, Any], pods: int) -> None:
    assert ray_group_pods(wg) == pods


def test_a_ray_service_selector_names_the_service_and_the_group() -> None:
    svc = {"kind": "RayService", "metadata": {"name": "llm"}}
    assert ray_service_selector(svc, "gpu-workers") == {
        "matchLabels": {
            "ray.io/originated-from-crd": "RayService",
            "ray.io/originated-from-cr-name": "llm",
            "ray.io/group": "gpu-workers",
        }
    }
    assert ray_service_selector(svc, "head") == {
        "matchLabels": {
            "ray.io/originated-from-crd": "RayService",
            "ray.io/originated-from-cr-name": "llm",
            "ray.io/group": "headgroup",  # KubeRay's label for the head group
        }
    }
    assert ray_service_selector(svc, "Head")["matchLabels"]["ray.io/group"] == "Head"  # type: ignore[index]


@pytest.mark.parametrize(
    ("meta", "role"),
    [
        ({"name": "llm"}, "workerGroupSpecs[0]"),  # an unnamed group: no label selects its pods
        ({"name": "llm"}, "workerGroupSpecs[12]"),
        ({"name": ""}, "head"),
        ({"name": ""}, "gpu"),
        ({"name": 5}, "head"),
        ({"name": ["llm"]}, "gpu"),
        ({}, "head"),
        (None, "gpu"),
    ],
)
def test_no_ray_service_selector_without_a_name_or_a_group_name(meta: Any, role: str) -> None:
    assert ray_service_selector({"kind": "RayService", "metadata": meta}, role) is None


def test_a_group_named_like_an_index_but_otherwise_is_selected() -> None:
    svc = {"metadata": {"name": "llm"}}
    assert ray_service_selector(svc, "workergroupspecs[0]") is not None
    assert ray_service_selector(svc, "workers[0]") is not None


# -- containers ------------------------------------------------------------------------------------------


def test_containers_of_a_pod_init_first_mappings_only() -> None:
    spec = {
        "initContainers": [{"name": "i1"}, "junk", {"name": "i2"}],
        "containers": [{"name": "a"}, None, {"name": "b"}],
        "ephemeralContainers": [{"name": "e"}],
    }
    p = {"spec": spec}
    assert [c["name"] for c in containers(p)] == ["i1", "i2", "a", "b"]
    assert [c["name"] for c in containers(p, init=False)] == ["a", "b"]
    assert [c["name"] for c in containers(p, init=True)] == ["i1", "i2", "a", "b"]
    assert all(c is spec["containers"][0] for c in containers(p, init=False) if c["name"] == "a")
    assert list(containers({"spec": {"initContainers": [{"name": "i"}], "containers": "x"}})) == [{"name": "i"}]
    assert list(containers({"spec": {"initContainers": {"name": "i"}, "containers": [{"name": "a"}]}})) == [
        {"name": "a"}
    ]
    assert list(containers({"spec": "x"})) == []
    assert list(containers({})) == []
