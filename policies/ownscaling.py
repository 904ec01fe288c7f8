"""Autoscaling bounds that workload kinds carry themselves, for the elasticity rules (spec §6, checklist 2).

An HPA or KEDA ScaledObject is a separate object; these kinds scale their own GPU pods:
- KServe InferenceService: `minReplicas` of the predictor (and transformer, explainer); 0 is scale-to-zero.
- KServe LLMInferenceService: `spec.scaling.minReplicas` (and `spec.prefill.scaling`).
- KubeRay: with `enableInTreeAutoscaling: true` the Ray autoscaler moves each worker group between its
  `minReplicas` and `maxReplicas` (RayService: a warm-pool question; RayJob: training that shrinks).
Pure: plain JSON in; a missing or mistyped field reads as the kind's default.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from policies.workloads import RAY_CLUSTER_SPEC, Json

RAY_MAX_DEFAULT = 2147483647  # WorkerGroupSpec.maxReplicas default (KubeRay CRD)


def _dict(value: Any) -> Json:
    return value if isinstance(value, dict) else {}


def _int(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _ray_groups(kind: str, obj: Json, gpu_roles: Collection[str]) -> list[tuple[str, int, int]]:
    """(group name, minReplicas, maxReplicas) of the autoscaled worker groups that ask for GPUs."""
    cluster: Any = obj
    for key in RAY_CLUSTER_SPEC.get(kind, ("-",)):
        cluster = _dict(cluster).get(str(key))
    cluster = _dict(cluster)
    if cluster.get("enableInTreeAutoscaling") is not True:
        return []
    groups = cluster.get("workerGroupSpecs")
    out = []
    for wg in groups if isinstance(groups, list) else []:
        name = _dict(wg).get("groupName")
        if isinstance(name, str) and name in gpu_roles:
            out.append((name, _int(wg.get("minReplicas"), 0), _int(wg.get("maxReplicas"), RAY_MAX_DEFAULT)))
    return out


WARM_KINDS = frozenset({"InferenceService", "LLMInferenceService", "RayService"})  # inference that scales itself


def warm_minimums(kind: str, obj: Json, gpu_roles: Collection[str]) -> list[tuple[str, int]]:
    """(field, minimum) of every autoscaling minimum the object sets for its GPU pods itself."""
    if kind not in WARM_KINDS:
        return []
    spec = _dict(obj.get("spec"))
    if kind == "InferenceService":
        # KServe defaults minReplicas to 1; a multi-node predictor's workers follow it.
        roles = {"worker": "predictor"}
        wanted = {roles.get(r, r) for r in gpu_roles}
        return [
            (f"spec.{role}.minReplicas", _int(_dict(spec.get(role)).get("minReplicas"), 1))
            for role in ("predictor", "transformer", "explainer")
            if role in wanted and isinstance(spec.get(role), dict)
        ]
    if kind == "LLMInferenceService":
        out = []
        for base, workload, prefix in (("spec", spec, ""), ("spec.prefill", _dict(spec.get("prefill")), "prefill-")):
            scaling = workload.get("scaling")
            asks = any(r.startswith(prefix) and (prefix or not r.startswith("prefill-")) for r in gpu_roles)
            if isinstance(scaling, dict) and asks:
                out.append((f"{base}.scaling.minReplicas", _int(scaling.get("minReplicas"), 1)))
        return out
    if kind == "RayService":
        return [
            (f"spec.rayClusterConfig.workerGroupSpecs[{name}].minReplicas", lo)
            for name, lo, _ in _ray_groups(kind, obj, gpu_roles)
        ]
    return []


ELASTIC_KINDS = frozenset({"RayJob"})  # training kinds with an autoscaler of their own


def elastic_training(kind: str, obj: Json, gpu_roles: Collection[str]) -> str | None:
    """Why a training kind's own autoscaler can shrink it mid-run (None: it cannot)."""
    if kind not in ELASTIC_KINDS:
        return None
    for name, lo, hi in _ray_groups(kind, obj, gpu_roles):
        if lo < hi:
            return f"Ray autoscaling of worker group {name}: minReplicas {lo} < maxReplicas {hi}"
    return None
