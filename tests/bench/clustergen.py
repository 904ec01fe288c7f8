"""Generated GPU clusters for the scale benchmark and tests: Node objects as GFD, the device plugin and the
kubelet write them, 16 nodes per rack, 8 racks per block, 64 racks per zone.

Rack kinds repeat in a fixed pattern of 20 racks (deterministic, so runs compare): 13 of 8x H100 whole cards,
2 of 4x GB200 in NVLink cliques (nvidia.com/gpu.clique, one NVL72 per rack), 1 of 8x A100 with MIG mixed,
1 of 8x H100 MIG single (1g.10gb), 1 of 4x L4 time-sliced (4 replicas), 1 of 8x A100 whole cards and
1 of CPU nodes. `heavy=True` adds what real Node objects also carry and the inventory never reads
(status.images, conditions, nodeInfo, managedFields: ~20 KB each), for the list / decode measurements.
"""

from __future__ import annotations

from typing import Any

Json = dict[str, Any]
PER_RACK = 16
RACKS_PER_BLOCK = 8
RACKS_PER_ZONE = 64
PATTERN = ("h100",) * 13 + ("gb200", "gb200", "a100-mig", "h100-mig1g", "l4-ts", "a100", "cpu")

_PRODUCTS = {
    "h100": ("NVIDIA-H100-80GB-HBM3", 8, 81559, "hopper"),
    "h100-mig1g": ("NVIDIA-H100-80GB-HBM3-MIG-1g.10gb", 8, 9856, "hopper"),
    "gb200": ("NVIDIA-GB200", 4, 189471, "blackwell"),
    "a100-mig": ("NVIDIA-A100-SXM4-80GB", 8, 81920, "ampere"),
    "a100": ("NVIDIA-A100-SXM4-80GB", 8, 81920, "ampere"),
    "l4-ts": ("NVIDIA-L4", 4, 23034, "ada-lovelace"),
}


def rack_kind(rack: int) -> str:
    return PATTERN[rack % len(PATTERN)]


def node(i: int, *, heavy: bool = False, generation: int = 0) -> Json:
    """Node number i of the cluster (its rack, block and zone follow from i)."""
    rack = i // PER_RACK
    kind = rack_kind(rack)
    name = f"{kind}-r{rack:05d}-{i % PER_RACK:02d}"
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "node.kubernetes.io/instance-type": f"gpu.{kind}",
        "topology.kubernetes.io/region": "region-1",
        "topology.kubernetes.io/zone": f"zone-{rack // RACKS_PER_ZONE}",
        "topology.kubernetes.io/rack": f"rack-{rack:05d}",
        "gpu-admission.example/block": f"block-{rack // RACKS_PER_BLOCK:04d}",
    }
    resources: dict[str, str] = {"cpu": "224", "memory": "2064Gi", "pods": "110"}
    if kind != "cpu":
        product, count, mem, family = _PRODUCTS[kind]
        labels |= {
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.product": product,
            "nvidia.com/gpu.count": str(count),
            "nvidia.com/gpu.memory": str(mem),
            "nvidia.com/gpu.family": family,
            "nvidia.com/gpu.replicas": "1",
            "nvidia.com/gpu.sharing-strategy": "none",
            "nvidia.com/cuda.driver-version.full": "570.124.06",
        }
        gpus = {"nvidia.com/gpu": str(count)}
        if kind == "gb200":
            labels["nvidia.com/gpu.clique"] = f"cluster-1.{rack:05d}"
        elif kind == "a100-mig":
            labels["nvidia.com/mig.strategy"] = "mixed"
            labels |= {"nvidia.com/mig-1g.10gb.count": "14", "nvidia.com/mig-3g.40gb.count": "4"}
            gpus = {"nvidia.com/mig-1g.10gb": "14", "nvidia.com/mig-3g.40gb": "4", "nvidia.com/gpu": "4"}
        elif kind == "h100-mig1g":  # GFD's single strategy: the -MIG- product and the MIG attribute labels
            labels["nvidia.com/mig.strategy"] = "single"
            labels |= {"nvidia.com/gpu.slices.gi": "1", "nvidia.com/gpu.slices.ci": "1"}
            gpus = {"nvidia.com/gpu": str(count * 7)}
        elif kind == "l4-ts":
            labels |= {"nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.sharing-strategy": "time-slicing"}
            gpus = {"nvidia.com/gpu": str(count * 4)}
        resources |= gpus
    obj: Json = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, "resourceVersion": str(1000 + i + generation)},
        "spec": {"providerID": f"gen://{name}"},
        "status": {"capacity": dict(resources), "allocatable": dict(resources)},
    }
    if heavy:
        _add_weight(obj, i, generation)
    return obj


def _add_weight(obj: Json, i: int, generation: int) -> None:
    """What a kubelet-managed Node carries besides the inventory's fields (sizes as on a busy GPU node). The
    bulky parts (images, managedFields) are the same objects for every node: the bytes on the wire are what
    matter, and building them afresh per node would make the fake API server slower than a real one."""
    name = obj["metadata"]["name"]
    obj["metadata"] |= {
        "uid": f"00000000-0000-4000-8000-{i:012d}",
        "creationTimestamp": "2026-11-01T00:00:00Z",
        "annotations": _ANNOTATIONS,
        "managedFields": _MANAGED_FIELDS,
    }
    status = obj["status"]
    status["conditions"] = _conditions(generation % 60)
    status["addresses"] = [{"type": "InternalIP", "address": f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}"},
                           {"type": "Hostname", "address": name}]  # fmt: skip
    status["nodeInfo"] = {**_NODE_INFO, "machineID": f"{i:032x}", "systemUUID": f"{i:032x}"}
    status["images"] = _IMAGES


_ANNOTATIONS = {
    "node.alpha.kubernetes.io/ttl": "0",
    "volumes.kubernetes.io/controller-managed-attach-detach": "true",
    "nfd.node.kubernetes.io/feature-labels": ",".join(f"feature.node.kubernetes.io/cpu-{k}" for k in range(40)),
}
_MANAGED_FIELDS = [
    {
        "manager": m,
        "operation": "Update",
        "apiVersion": "v1",
        "time": "2026-11-30T08:00:00Z",
        "fieldsType": "FieldsV1",
        "fieldsV1": {"f:metadata": {"f:labels": {f"f:label-{k}": {} for k in range(24)}}},
    }
    for m in ("kubelet", "gpu-feature-discovery", "node-feature-discovery", "kube-controller-manager")
]
_NODE_INFO = {
    "bootID": "0" * 32,
    "kernelVersion": "6.8.0-1015-nvidia",
    "osImage": "Ubuntu 24.04.1 LTS",
    "containerRuntimeVersion": "containerd://2.0.4",
    "kubeletVersion": "v1.33.13",
    "operatingSystem": "linux",
    "architecture": "amd64",
}
_IMAGES = [
    {
        "names": [f"nvcr.io/nvidia/pytorch@sha256:{k * 7919:064x}", f"nvcr.io/nvidia/pytorch:24.{k:02d}-py3"],
        "sizeBytes": 9_000_000_000 + k,
    }
    for k in range(50)
]
_CONDITIONS: dict[int, list[Json]] = {}


def _conditions(minute: int) -> list[Json]:
    if minute not in _CONDITIONS:
        _CONDITIONS[minute] = [
            {
                "type": t,
                "status": "False" if t != "Ready" else "True",
                "lastHeartbeatTime": f"2026-11-30T08:{minute:02d}:00Z",
                "lastTransitionTime": "2026-11-01T00:00:00Z",
                "reason": f"Kubelet{t}",
                "message": f"kubelet reports {t}",
            }
            for t in ("MemoryPressure", "DiskPressure", "PIDPressure", "Ready")
        ]
    return _CONDITIONS[minute]


def cluster(n: int, *, heavy: bool = False) -> list[Json]:
    return [node(i, heavy=heavy) for i in range(n)]
