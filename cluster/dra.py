"""The Dynamic Resource Allocation objects the server keeps (resource.k8s.io/v1, Kubernetes 1.34+): whether the
cluster serves them, ResourceSlices indexed by node, and claims / templates / slices cut to what is read.

What the objects mean is policies/dra.py's business; this module only keeps them current and small.
"""

from __future__ import annotations

import threading
from typing import Any

from cluster.kubeclient import JSON, KubeClient, KubeError
from cluster.reflector import Change, object_key

API = "/apis/resource.k8s.io/v1"
PATHS = {
    "DeviceClass": f"{API}/deviceclasses",
    "ResourceSlice": f"{API}/resourceslices",
    "ResourceClaim": f"{API}/resourceclaims",
    "ResourceClaimTemplate": f"{API}/resourceclaimtemplates",
}
# Attributes and capacities of a device that are read (policies/dra.py); the rest (UUIDs, PCI addresses,
# engine counts) is dropped as the object is decoded: up to 128 devices x 32 entries per slice.
DEVICE_ATTRIBUTES = ("type", "productName", "profile")
DEVICE_CAPACITY = ("memory",)


def served(client: KubeClient) -> tuple[bool, str]:
    """Whether the API server serves resource.k8s.io/v1, and why not (a 404 is "not served"; any other error
    is reported and also read as not served: the webhook then judges device-plugin resources only)."""
    try:
        client.get(API)
    except KubeError as exc:
        return False, "resource.k8s.io/v1 not served" if exc.not_found else f"resource.k8s.io/v1: {exc}"
    except Exception as exc:  # a transport error: the reflectors would retry, discovery does not
        return False, f"resource.k8s.io/v1: {type(exc).__name__}: {exc}"
    return True, ""


def _meta(obj: JSON) -> JSON:
    meta = obj.get("metadata")
    out: JSON = {}
    if isinstance(meta, dict):
        for key in ("name", "namespace", "resourceVersion"):
            if isinstance(meta.get(key), str):
                out[key] = meta[key]
    return out


def slim_spec(obj: Any) -> JSON | None:
    """A claim, template or class cut to metadata and spec (a claim's status holds its allocation)."""
    if not isinstance(obj, dict):
        return None
    return {"kind": obj.get("kind"), "metadata": _meta(obj), "spec": obj.get("spec")}


def slim_class(obj: Any) -> JSON | None:
    """A DeviceClass cut to metadata and spec, keeping its labels: gpu-admission's generated classes are known by
    one (policies/dra.py TIER_LABEL). Classes are few and cluster-scoped: their labels cost nothing."""
    slim = slim_spec(obj)
    if slim is None:
        return None
    labels = _mapping(_mapping(obj.get("metadata")).get("labels"))
    if labels:
        slim["metadata"]["labels"] = dict(labels)
    return slim


# Set on the claim the scheduler makes for a pod's DRA extended resources (kept: policies/dra.py skips it).
EXTENDED_CLAIM_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"


def slim_claim(obj: Any) -> JSON | None:
    """A ResourceClaim cut to metadata, spec and where its devices were allocated: each result's request (the
    pool, device and driver names are not read) and the allocation's node selector."""
    slim = slim_spec(obj)
    if slim is None:
        return None
    notes = _mapping(_mapping(obj.get("metadata")).get("annotations"))
    if EXTENDED_CLAIM_ANNOTATION in notes:
        slim["metadata"]["annotations"] = {EXTENDED_CLAIM_ANNOTATION: notes[EXTENDED_CLAIM_ANNOTATION]}
    allocation = _mapping(_mapping(obj.get("status")).get("allocation"))
    if allocation:
        results = _mapping(allocation.get("devices")).get("results")
        slim["status"] = {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": r.get("request")}
                        for r in (results if isinstance(results, list) else [])
                        if isinstance(r, dict)
                    ]
                },
                "nodeSelector": allocation.get("nodeSelector"),
            }
        }
    return slim


def slim_slice(obj: Any) -> JSON | None:
    """A ResourceSlice cut to its driver, node and the devices' read attributes."""
    if not isinstance(obj, dict) or not isinstance(obj.get("spec"), dict):
        return None
    spec = obj["spec"]
    devices = []
    for d in spec.get("devices") if isinstance(spec.get("devices"), list) else []:
        if not isinstance(d, dict):
            continue
        attrs = _mapping(d.get("attributes"))
        caps = _mapping(d.get("capacity"))
        devices.append(
            {
                "name": d.get("name"),
                "attributes": {k: attrs[k] for k in DEVICE_ATTRIBUTES if k in attrs},
                "capacity": {k: caps[k] for k in DEVICE_CAPACITY if k in caps},
            }
        )
    slim = {"driver": spec.get("driver"), "nodeName": spec.get("nodeName"), "devices": devices}
    return {"kind": "ResourceSlice", "metadata": _meta(obj), "spec": slim}


def _mapping(value: Any) -> JSON:
    return value if isinstance(value, dict) else {}


def slice_node(obj: JSON | None) -> str:
    spec = obj.get("spec") if isinstance(obj, dict) else None
    node = spec.get("nodeName") if isinstance(spec, dict) else None
    return node if isinstance(node, str) else ""


class SliceIndex:
    """ResourceSlices by the node they belong to: a slice event touches one node's entry (two when a slice
    moved, which the API forbids but a relist may show as delete + add)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_node: dict[str, dict[str, JSON]] = {}

    def apply(self, change: Change) -> set[str]:
        """Apply one reflector change; the nodes whose slices changed."""
        if change.type == "SYNCED":
            return set()
        touched = set()
        with self._lock:
            for obj, add in ((change.old, False), (change.new, True)):
                node = slice_node(obj)
                if not node or obj is None:
                    continue
                touched.add(node)
                table = self._by_node.setdefault(node, {})
                if add:
                    table[object_key(obj)] = obj
                else:
                    table.pop(object_key(obj), None)
                if not table:
                    del self._by_node[node]
        return touched

    def slices(self, node: str) -> list[JSON]:
        with self._lock:
            return list(self._by_node.get(node, {}).values())

    def all(self) -> list[JSON]:
        with self._lock:
            return [s for table in self._by_node.values() for s in table.values()]
