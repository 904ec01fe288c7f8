"""The examples against the webhook as deployed from deploy/ in kind: what users see with `kubectl apply`.

Server-side dry runs only (`kubectl apply --dry-run=server`): the API server runs the whole admission chain,
our two webhook configurations included, and returns the object as it would have stored it, mutations and
all; nothing is persisted and nothing needs scheduling. The one exception is the KEDA example, whose
ScaledObject can only be judged against a Deployment that exists.

Expectations (which object gets which mutation, warning or denial) come from tests/test_examples.py, where
the same examples are checked with `gpu-admission check`; here the real API server must agree.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from tests.kind.conftest import EXAMPLES
from tests.kind.kube import Kind, objects, probe_pod, wait_until
from tests.test_examples import ALLOWED, ALLOWED_DIRS, DENIED, example_files

pytestmark = pytest.mark.kind

RACK = "topology.kubernetes.io/rack"
HOSTNAME = "kubernetes.io/hostname"
NAMESPACE = "gpu-admission"
POLICY_CONFIGMAP = "gpu-admission-policy"
#: Which validating webhook of deploy/base/webhook-validating.yaml judges each kind in the examples.
# kind -> the webhook that judges it (Pods: mutated and judged in one call by pods.admit).
JUDGING_WEBHOOK = {
    "Pod": "pods.admit",
    "Deployment": "workloads.validate",
    "Job": "workloads.validate",
    "PyTorchJob": "kubeflow.validate",
    "JobSet": "jobsets.validate",
    "ScaledObject": "scaledobjects.validate",
    "HorizontalPodAutoscaler": "horizontalpodautoscalers.validate",
}
WARNING_LINE = re.compile(r"^Warning: ([a-z0-9]+(?:-[a-z0-9]+)+): ", re.MULTILINE)

Json = dict[str, Any]


def docs_of(relpath: str) -> list[Json]:
    return [d for d in yaml.safe_load_all((EXAMPLES / relpath).read_text(encoding="utf-8")) if d]


def key(obj: Json) -> str:
    return f"{obj['kind']}/{obj['metadata']['name']}"


def pod_specs(obj: Json) -> list[Json]:
    """The pod spec(s) of the kinds the examples use."""
    spec = obj.get("spec") or {}
    kind = obj["kind"]
    if kind == "Pod":
        return [spec]
    if kind in ("Deployment", "StatefulSet", "ReplicaSet", "DaemonSet", "Job"):
        return [spec["template"]["spec"]]
    if kind == "PyTorchJob":
        return [r["template"]["spec"] for r in spec["pytorchReplicaSpecs"].values()]
    if kind == "JobSet":
        return [rj["template"]["spec"]["template"]["spec"] for rj in spec["replicatedJobs"]]
    return []


def _node_terms(spec: Json) -> list[Json]:
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    return list(required.get("nodeSelectorTerms") or [])


def _pod_affinity(spec: Json, which: str) -> list[Json]:
    return list((((spec.get("affinity") or {}).get("podAffinity") or {}).get(which)) or [])


def _limits(spec: Json) -> list[dict[str, str]]:
    return [
        {k: str(v) for k, v in ((c.get("resources") or {}).get("limits") or {}).items()}
        for c in spec.get("containers") or []
    ]


def training_pool(obj: Json, spec: Json) -> bool:
    terms = _node_terms(spec)
    return bool(terms) and all(
        {"key": "nvidia.com/gpu.slices.gi", "operator": "DoesNotExist"} in (t.get("matchExpressions") or [])
        and any(
            e.get("key") == "nvidia.com/gpu.sharing-strategy"
            and e.get("operator") == "NotIn"
            and "time-slicing" in e.get("values", [])
            for e in t.get("matchExpressions") or []
        )
        for t in terms
    )


def online_exclusive(obj: Json, spec: Json) -> bool:
    terms = _node_terms(spec)
    return bool(terms) and all(
        any(
            e.get("key") == "nvidia.com/gpu.sharing-strategy"
            and e.get("operator") == "NotIn"
            and {"time-slicing", "mps"} <= set(e.get("values", []))
            for e in t.get("matchExpressions") or []
        )
        for t in terms
    )


def training_rack(obj: Json, spec: Json) -> bool:
    name = obj["metadata"]["name"]
    return any(
        t.get("topologyKey") == RACK and name in ((t.get("labelSelector") or {}).get("matchLabels") or {}).values()
        for t in _pod_affinity(spec, "requiredDuringSchedulingIgnoredDuringExecution")
    )


def training_node_pack(obj: Json, spec: Json) -> bool:
    return any(
        t.get("weight") == 100 and (t.get("podAffinityTerm") or {}).get("topologyKey") == HOSTNAME
        for t in _pod_affinity(spec, "preferredDuringSchedulingIgnoredDuringExecution")
    )


def inference_spread(obj: Json, spec: Json) -> bool:
    return HOSTNAME in {c.get("topologyKey") for c in spec.get("topologySpreadConstraints") or []}


def gpu_slice(obj: Json, spec: Json) -> bool:
    limits = _limits(spec)
    return any(k.startswith("nvidia.com/mig-") for lim in limits for k in lim) and not any(
        "nvidia.com/gpu" in lim for lim in limits
    )


#: mutation id -> what it leaves in every pod spec of the returned object
MUTATIONS: dict[str, Callable[[Json, Json], bool]] = {
    "training-pool": training_pool,
    "online-exclusive": online_exclusive,
    "training-rack": training_rack,
    "training-node-pack": training_node_pack,
    "inference-spread": inference_spread,
    "gpu-slice": gpu_slice,
}
#: mutations whose marks no other mutation leaves: absent unless expected
DISTINCT = ("training-rack", "training-node-pack", "inference-spread", "gpu-slice")


def rule_warnings(stderr: str) -> set[str]:
    """Rule ids of the `Warning: <rule>: …` lines kubectl printed (from the webhook's response warnings)."""
    return set(WARNING_LINE.findall(stderr))


def dry_run(kind: Kind, *args: str) -> Any:
    return kind.kubectl("apply", "--dry-run=server", "-o", "json", *args, check=False)


# --- allowed: admitted, with the expected mutations and warnings -----------------------------------------


@pytest.mark.parametrize("relpath", example_files(*ALLOWED_DIRS))
def test_allowed_example_is_admitted_with_its_mutations(cluster: Kind, relpath: str) -> None:
    r = dry_run(cluster, "-f", str(EXAMPLES / relpath))
    assert r.returncode == 0, f"{relpath}: {r.stderr}"
    returned = {key(o): o for o in objects(r.stdout)}
    wanted = ALLOWED[relpath]
    assert sorted(returned) == sorted(wanted), r.stdout[-2000:]
    originals = {key(d): d for d in docs_of(relpath)}
    for k, exp in wanted.items():
        obj, original = returned[k], originals[k]
        specs, original_specs = pod_specs(obj), pod_specs(original)
        assert len(specs) == len(original_specs), k
        for m in exp.mutations:
            assert specs and all(MUTATIONS[m](obj, s) for s in specs), f"{relpath} {k}: no {m} in {specs}"
        for m in DISTINCT:
            if m not in exp.mutations:
                assert not any(MUTATIONS[m](obj, s) for s in specs), f"{relpath} {k}: unexpected {m}"
        if not exp.mutations:  # untouched: no placement added, resources as written
            for s, o in zip(specs, original_specs, strict=True):
                assert s.get("affinity") == o.get("affinity"), f"{relpath} {k}"
                assert s.get("topologySpreadConstraints") == o.get("topologySpreadConstraints"), f"{relpath} {k}"
                assert _limits(s) == _limits(o), f"{relpath} {k}"
    expected_warnings = set().union(*(e.warnings for e in wanted.values()))
    assert rule_warnings(r.stderr) == expected_warnings, r.stderr


def test_pytorchjob_worker_gets_same_rack_pod_affinity(cluster: Kind) -> None:
    r = dry_run(cluster, "-f", str(EXAMPLES / "training" / "pytorchjob-2x8.yaml"))
    assert r.returncode == 0, r.stderr
    (job,) = objects(r.stdout)
    worker = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    assert worker["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == [
        {"labelSelector": {"matchLabels": {"training.kubeflow.org/job-name": "llama3-8b-sft"}}, "topologyKey": RACK}
    ]


def test_warnings_show_as_warning_lines(cluster: Kind) -> None:
    r = dry_run(cluster, "-f", str(EXAMPLES / "training" / "pytorchjob-2x8.yaml"))
    assert r.returncode == 0, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.startswith("Warning: training-topology-scheduler: ")]
    assert lines, r.stderr
    assert "16-GPU job" in lines[0], lines


# --- denied: refused at apply time, naming the rule ------------------------------------------------------


def _delete_for_real(kind: Kind, docs: list[Json]) -> None:
    for d in docs:
        ns = d["metadata"].get("namespace", "default")
        kind.kubectl("delete", d["kind"].lower(), d["metadata"]["name"], "-n", ns, "--ignore-not-found", check=False)
        labels = ((d.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
        if not labels:
            continue
        selector = ",".join(f"{a}={b}" for a, b in labels.items())

        def gone(ns: str = ns, selector: str = selector) -> bool:
            # no kubelet on the fake nodes: their pods never finish a graceful deletion
            kind.kubectl(
                "delete", "pods", "-n", ns, "-l", selector, "--grace-period=0", "--force", "--wait=false", check=False
            )
            left = kind.kubectl("get", "pods", "-n", ns, "-l", selector, "-o", "name", check=False)
            return left.returncode == 0 and not left.stdout.strip()

        wait_until(gone, timeout=60, what=f"pods {selector} in {ns} to go", interval=1)


@pytest.mark.parametrize("relpath", example_files("denied"))
def test_denied_example_is_refused_with_its_rule_id(cluster: Kind, relpath: str) -> None:
    wanted = DENIED[relpath]
    docs = docs_of(relpath)
    assert sorted(key(d) for d in docs) == sorted(wanted)
    # An autoscaler is judged against its target as the webhook's cache holds it: store the allowed objects of
    # the file for real first (the target Deployment), then dry-run the file until the cache has caught up.
    autoscaled = any(d["kind"] in ("ScaledObject", "HorizontalPodAutoscaler") for d in docs)
    stored = [d for d in docs if not wanted[key(d)].denials] if autoscaled else []
    rules = {rule for e in wanted.values() for rule in e.denials}
    try:
        if stored:
            cluster.kubectl("apply", "-f", "-", input={"apiVersion": "v1", "kind": "List", "items": stored})
        last: list[Any] = []

        def refused() -> Any:
            r = dry_run(cluster, "-f", str(EXAMPLES / relpath))
            last[:] = [r]
            return r if r.returncode != 0 and all(f"{rule}:" in r.stderr for rule in rules) else None

        try:
            r = wait_until(refused, timeout=30 if stored else 0, what=f"{relpath} to be denied by {sorted(rules)}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}: exit {last[0].returncode}, {last[0].stderr}") from None
        for k, exp in wanted.items():
            if exp.denials:
                webhook = JUDGING_WEBHOOK[k.split("/")[0]]
                assert f'admission webhook "{webhook}.gpu-admission.io" denied the request' in r.stderr, (
                    f"{relpath} {k}: {r.stderr}"
                )
        assert "Fix:" in r.stderr, r.stderr
    finally:
        _delete_for_real(cluster, stored)


def test_a_denied_object_is_not_stored(cluster: Kind) -> None:
    path = EXAMPLES / "denied" / "sixteen-gpu-pod.yaml"
    r = cluster.kubectl("apply", "-f", str(path), check=False)
    assert r.returncode != 0 and "gpu-request-fits:" in r.stderr, r.stderr
    got = cluster.kubectl("get", "pod", "llama3-70b-eval", "-n", "ml-research", check=False)
    assert got.returncode != 0 and "NotFound" in got.stderr, got.stdout


# --- what the webhook never sees --------------------------------------------------------------------------


def test_kube_system_and_our_namespace_are_not_intercepted(cluster: Kind) -> None:
    r = cluster.kubectl(
        "create", "--dry-run=server", "-o", "json", "-f", "-", input=probe_pod("ml-research", "probe"), check=False
    )
    assert r.returncode != 0 and 'gpu-admission.io" denied the request' in r.stderr, r.stderr  # control
    for ns in ("kube-system", NAMESPACE):
        r = cluster.kubectl(
            "create", "--dry-run=server", "-o", "json", "-f", "-", input=probe_pod(ns, "probe"), check=False
        )
        assert r.returncode == 0, f"{ns}: {r.stderr}"
        pod = json.loads(r.stdout)
        assert pod["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu.shared": "2"}
        assert "affinity" not in pod["spec"], ns
        assert not rule_warnings(r.stderr), r.stderr


def test_an_invalid_policy_edit_is_refused(cluster: Kind) -> None:
    cm = cluster.get_json("configmap", POLICY_CONFIGMAP, "-n", NAMESPACE)
    text = cm["data"]["policy.yaml"]
    assert "training-same-rack: enforce" in text
    bad = json.dumps({"data": {"policy.yaml": text.replace("training-same-rack: enforce", "training-same-rack: deny")}})
    patch = ("patch", "configmap", POLICY_CONFIGMAP, "-n", NAMESPACE, "--type=merge", "-p", bad, "--dry-run=server")
    r = cluster.kubectl(*patch, check=False)
    assert r.returncode != 0, r.stdout
    assert "policy.validate.gpu-admission.io" in r.stderr and "rules.training-same-rack" in r.stderr, r.stderr
