"""Scanning a cluster: list what runs (paged, rate-limited, read-only), judge it with policies/scan.py.

Used by `gpu-admission scan` (webhook/cmd_scan.py) and by the server's periodic scan (`serve --scan-interval`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from cluster.kubeclient import KubeClient, KubeError
from cluster.lister import RateLimiter, pages
from cluster.nodes import NodeTransform
from policies import exceptions as exceptions_mod
from policies import inventory as inventory_mod
from policies import scan as scan_mod
from policies.document import Policy, PolicyError, default_policy, parse_policy_text
from policies.engine import ReviewContext
from policies.exceptions import Exemption
from policies.inventory import Inventory

log = logging.getLogger("gpu-admission.scan")

# (API path prefix, plural, kind), listed in this order: Deployments and StatefulSets before the autoscalers
# that target them, the Trainer's runtimes before the TrainJobs whose pods they hold (resolved from what the
# scan has listed). A kind served at two versions is listed at both and judged once (by uid).
KINDS: tuple[tuple[str, str, str], ...] = (
    ("/apis/trainer.kubeflow.org/v1alpha1", "trainingruntimes", "TrainingRuntime"),
    ("/apis/trainer.kubeflow.org/v1alpha1", "clustertrainingruntimes", "ClusterTrainingRuntime"),
    ("/apis/apps/v1", "deployments", "Deployment"),
    ("/apis/apps/v1", "statefulsets", "StatefulSet"),
    ("/apis/apps/v1", "replicasets", "ReplicaSet"),
    ("/apis/apps/v1", "daemonsets", "DaemonSet"),
    ("/apis/batch/v1", "jobs", "Job"),
    ("/apis/batch/v1", "cronjobs", "CronJob"),
    ("/apis/kubeflow.org/v1", "pytorchjobs", "PyTorchJob"),
    ("/apis/kubeflow.org/v1", "tfjobs", "TFJob"),
    ("/apis/kubeflow.org/v2beta1", "mpijobs", "MPIJob"),
    ("/apis/kubeflow.org/v1", "xgboostjobs", "XGBoostJob"),
    ("/apis/kubeflow.org/v1", "paddlejobs", "PaddleJob"),
    ("/apis/jobset.x-k8s.io/v1alpha2", "jobsets", "JobSet"),
    ("/apis/leaderworkerset.x-k8s.io/v1", "leaderworkersets", "LeaderWorkerSet"),
    ("/apis/batch.volcano.sh/v1alpha1", "jobs", "Job.batch.volcano.sh"),
    ("/apis/ray.io/v1", "rayjobs", "RayJob"),
    ("/apis/ray.io/v1", "rayclusters", "RayCluster"),
    ("/apis/ray.io/v1", "rayservices", "RayService"),
    ("/apis/trainer.kubeflow.org/v1alpha1", "trainjobs", "TrainJob"),
    ("/apis/serving.kserve.io/v1beta1", "inferenceservices", "InferenceService"),
    ("/apis/serving.kserve.io/v1alpha2", "llminferenceservices", "LLMInferenceService"),
    ("/apis/serving.kserve.io/v1alpha1", "llminferenceservices", "LLMInferenceService"),
    ("/api/v1", "pods", "Pod"),
    ("/apis/autoscaling/v2", "horizontalpodautoscalers", "HorizontalPodAutoscaler"),
    ("/apis/keda.sh/v1alpha1", "scaledobjects", "ScaledObject"),
)
# HPA / ScaledObject targets and TrainJob runtimes, as the server resolves them (webhook/state.py).
RESOLVED_KINDS = ("Deployment", "StatefulSet", "TrainingRuntime", "ClusterTrainingRuntime")
CLUSTER_SCOPED = frozenset({"ClusterTrainingRuntime"})  # listed whole even when the scan is of one namespace
POLICY_KEY = "policy.yaml"


@dataclass(frozen=True)
class Limits:
    page_size: int = 100  # objects per list request
    qps: float = 5.0  # list requests per second


@dataclass
class ScanResult:
    results: list[scan_mod.ObjectResult] = field(default_factory=list)
    unreadable: list[scan_mod.Unreadable] = field(default_factory=list)
    owned: int = 0  # judged through their controller
    not_served: list[str] = field(default_factory=list)  # kinds the cluster does not serve (CRD absent)
    list_errors: list[str] = field(default_factory=list)  # kinds that could not be listed (RBAC, errors)
    requests: int = 0
    seconds: float = 0.0
    policy_source: str = ""
    policy_hash: str = ""
    notes: list[str] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        out = {v: 0 for v in (scan_mod.PASS, scan_mod.FAIL, scan_mod.WARN, scan_mod.SKIP, scan_mod.ERROR)}
        for r in self.results:
            out[r.verdict] += 1
        return out

    def per_rule(self) -> dict[tuple[str, str], int]:
        """(rule, result) -> objects: the scan metric's series."""
        out: dict[tuple[str, str], int] = {}
        for r in self.results:
            for f in r.findings:
                out[(f.rule, f.result)] = out.get((f.rule, f.result), 0) + 1
        return out


class Lister:
    """Paged, rate-limited lists over one client, counting requests."""

    def __init__(self, client: KubeClient, limits: Limits) -> None:
        self.client = client
        self.limits = limits
        self.limiter = RateLimiter(limits.qps)

    @property
    def requests(self) -> int:
        return self.limiter.acquired

    def each(self, path: str) -> Iterator[Any]:
        for page in pages(self.client, path, page_size=self.limits.page_size, limiter=self.limiter):
            yield from page

    def get(self, path: str) -> dict[str, Any]:
        self.limiter.acquire()
        return self.client.get(path)


def cluster_policy(lister: Lister, namespace: str, name: str) -> tuple[Policy, str]:
    """The policy in the ConfigMap the server watches; the built-in policy (said so) when there is none."""
    try:
        cm = lister.get(f"/api/v1/namespaces/{namespace}/configmaps/{name}")
    except KubeError as exc:
        if exc.not_found:
            return default_policy(), f"built-in (ConfigMap {namespace}/{name} not found)"
        raise
    data = cm.get("data")
    text = data.get(POLICY_KEY) if isinstance(data, dict) else None
    if not isinstance(text, str):
        raise PolicyError([f"ConfigMap {namespace}/{name} has no data key {POLICY_KEY!r}"])
    return parse_policy_text(text), f"configmap:{namespace}/{name}"


def inventory(lister: Lister, policy: Policy) -> Inventory:
    transform = NodeTransform()
    nodes = [n for n in (transform(o) for o in lister.each("/api/v1/nodes")) if n is not None]
    return inventory_mod.build(nodes, policy)


def namespace_labels(lister: Lister) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for ns in lister.each("/api/v1/namespaces"):
        meta = ns.get("metadata") if isinstance(ns, dict) else None
        if isinstance(meta, dict) and isinstance(meta.get("name"), str):
            labels = meta.get("labels")
            out[meta["name"]] = dict(labels) if isinstance(labels, dict) else {}
    return out


def exceptions(lister: Lister, result: ScanResult) -> dict[str, tuple[Exemption, ...]]:
    parsed = []
    path = f"/apis/{exceptions_mod.API_VERSION}/{exceptions_mod.PLURAL}"
    try:
        for obj in lister.each(path):
            try:
                parsed.append(exceptions_mod.parse(obj))
            except exceptions_mod.ExceptionError as exc:
                meta = obj.get("metadata") if isinstance(obj, dict) else None
                name = f"{meta.get('namespace')}/{meta.get('name')}" if isinstance(meta, dict) else "?"
                result.notes.append(f"{exceptions_mod.KIND} {name} left out: {exc}")
    except KubeError as exc:
        if not exc.not_found:
            raise
        result.notes.append(f"{exceptions_mod.KIND} is not served (CRD not installed): no exceptions apply")
    return exceptions_mod.index(parsed)


@dataclass(frozen=True)
class Basis:
    """What objects are judged with. The CLI lists it from the cluster; the server has it already."""

    policy: Policy
    policy_source: str
    inventory: Inventory
    namespace_labels: dict[str, dict[str, str]]
    exceptions: Callable[[str], tuple[Exemption, ...]]  # namespace -> its exceptions


def basis_from_cluster(
    lister: Lister, result: ScanResult, policy: Policy | None, policy_configmap: tuple[str, str]
) -> Basis:
    if policy is None:
        policy, source = cluster_policy(lister, *policy_configmap)
    else:
        source = "file"
    inv = inventory(lister, policy)
    result.notes.extend(inv.warnings)
    labels = namespace_labels(lister)
    excs = exceptions(lister, result)
    return Basis(policy, source, inv, labels, lambda ns: excs.get(ns, ()))


def run(
    client: KubeClient,
    *,
    policy: Policy | None = None,
    policy_configmap: tuple[str, str] = ("gpu-admission", "gpu-admission-policy"),
    basis: Basis | None = None,
    namespace: str | None = None,
    limits: Limits = Limits(),
    include_owned: bool = False,
    now: Callable[[], float] = time.time,
) -> ScanResult:
    """Judge every handled object of the cluster (or of `namespace`). Read-only."""
    started = time.monotonic()
    lister = Lister(client, limits)
    result = ScanResult()
    if basis is None:
        basis = basis_from_cluster(lister, result, policy, policy_configmap)
    result.policy_source, result.policy_hash = basis.policy_source, basis.policy.hash
    served = _served_kinds(lister, result)
    targets: dict[tuple[str, str, str], dict[str, Any]] = {}
    seen: set[str] = set()
    clock = now()
    scanned_kinds = {k.split(".")[0] for _, _, k in KINDS}

    def resolve(kind: str, ns: str, name: str) -> dict[str, Any] | None:
        return targets.get((kind, ns, name))

    for prefix, plural, kind in KINDS:
        if (prefix, plural) not in served:
            continue
        scoped = namespace and kind not in CLUSTER_SCOPED
        path = f"{prefix}/namespaces/{namespace}/{plural}" if scoped else f"{prefix}/{plural}"
        try:
            for i, obj in enumerate(lister.each(path)):
                bad = scan_mod.unreadable(obj, kind, f"item {i}")
                if bad is not None:
                    result.unreadable.append(bad)
                    continue
                meta = obj["metadata"]
                uid = str(meta.get("uid") or f"{kind}/{meta.get('namespace')}/{meta['name']}")
                if uid in seen:
                    continue  # listed again after a restarted (410) list
                seen.add(uid)
                obj.setdefault("kind", kind.split(".")[0])
                obj.setdefault("apiVersion", prefix.removeprefix("/apis/").removeprefix("/api/"))
                ns = str(meta.get("namespace") or "")
                if kind in RESOLVED_KINDS:
                    targets[(kind, ns, meta["name"])] = obj
                if not include_owned and scan_mod.owned_by_scanned(obj, scanned_kinds):
                    result.owned += 1
                    continue
                if not scan_mod.judged(obj):
                    continue
                ctx = ReviewContext(
                    namespace_labels=basis.namespace_labels.get(ns),
                    resolve=resolve,
                    namespace=ns,
                    exceptions=basis.exceptions(ns),
                    now=clock,
                )
                result.results.append(scan_mod.judge(obj, policy=basis.policy, inventory=basis.inventory, ctx=ctx))
        except KubeError as exc:
            result.list_errors.append(f"{kind} ({path}): {exc}")
    result.requests = lister.requests
    result.seconds = time.monotonic() - started
    return result


def _served_kinds(lister: Lister, result: ScanResult) -> set[tuple[str, str]]:
    """(path prefix, plural) the API server serves: one discovery request per group version."""
    served: set[tuple[str, str]] = set()
    for prefix in dict.fromkeys(p for p, _, _ in KINDS):
        try:
            doc = lister.get(prefix)
        except KubeError as exc:
            if not exc.not_found:
                result.list_errors.append(f"discovery {prefix}: {exc}")
            for p, _plural, kind in KINDS:
                if p == prefix:
                    result.not_served.append(kind)
            continue
        resources = doc.get("resources")
        names = {r.get("name") for r in resources if isinstance(r, dict)} if isinstance(resources, list) else set()
        for p, plural, kind in KINDS:
            if p == prefix:
                if plural in names:
                    served.add((p, plural))
                else:
                    result.not_served.append(kind)
    at_some_version = {k for p, plural, k in KINDS if (p, plural) in served}
    result.not_served[:] = [k for k in dict.fromkeys(result.not_served) if k not in at_some_version]
    return served
