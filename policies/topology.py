"""Topology label conventions: which node label is "the rack", and which keys are at rack level or finer.

No Kubernetes-standard rack label exists, so clusters carry one of several conventions
(shared/reference/gpu-resources.md §4). Each family below lists its switch-domain labels NARROWEST first;
note that EKS numbers its layers the other way round (layer-3 is nearest the node), while NVIDIA
Topograph's tier-0 is the switch nearest the node.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

HOSTNAME = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"
REGION = "topology.kubernetes.io/region"

# Switch-domain families, narrowest first. Index 0 of each is the rack-equivalent (leaf switch) level.
FAMILIES: tuple[tuple[str, ...], ...] = (
    # EKS: layer-3 is the closest to the node, layer-1 the broadest.
    ("topology.k8s.aws/network-node-layer-3", "topology.k8s.aws/network-node-layer-2",
     "topology.k8s.aws/network-node-layer-1"),
    # GKE A3/A4 reservations: sub-block (on GB200 the NVL72 domain) inside block.
    ("cloud.google.com/gce-topology-subblock", "cloud.google.com/gce-topology-block"),
    # OKE RDMA: local block inside network block inside island.
    ("oci.oraclecloud.com/rdma.local_block_id", "oci.oraclecloud.com/rdma.network_block_id",
     "oci.oraclecloud.com/rdma.hpc_island_id"),
    # NVIDIA Topograph >= 1.0: tier-0 is the switch closest to the node.
    ("fabric.topograph.run/tier-0", "fabric.topograph.run/tier-1", "fabric.topograph.run/tier-2",
     "fabric.topograph.run/tier-3"),
    # Older Topograph releases.
    ("network.topology.nvidia.com/block", "network.topology.nvidia.com/spine",
     "network.topology.nvidia.com/datacenter"),
    # Volcano label-based HyperNode discovery examples.
    ("volcano.sh/tor", "volcano.sh/hypernode"),
    # On-prem habits.
    ("topology.kubernetes.io/rack",),
    ("rack",),
)  # fmt: skip

# Keys finer than any rack: one host, or one NVLink domain (a GB200 NVL72 clique is within one rack).
FINER_THAN_RACK: frozenset[str] = frozenset(
    {
        HOSTNAME,
        "cloud.google.com/gce-topology-host",
        "nvidia.com/gpu.clique",
        "accelerator.topograph.run/domain",
        "network.topology.nvidia.com/accelerator",
    }
)

# Auto-detection order: every family's leaf level first, then the next level up, and so on.
AUTO_ORDER: tuple[str, ...] = tuple(
    fam[level] for level in range(max(len(f) for f in FAMILIES)) for fam in FAMILIES if level < len(fam)
)


def detect_rack_label(node_labels: Iterable[Mapping[str, str]]) -> tuple[str | None, int, int]:
    """The narrowest switch-domain label present on GPU nodes: (key or None, nodes with it, nodes total)."""
    labels = list(node_labels)
    for key in AUTO_ORDER:
        have = sum(1 for lab in labels if lab.get(key))
        if have:
            return key, have, len(labels)
    return None, 0, len(labels)


def rack_or_finer(rack_label: str | None) -> frozenset[str]:
    """Topology keys that confine a group of pods to one rack or less, given the rack label in use."""
    keys = set(FINER_THAN_RACK)
    for fam in FAMILIES:
        keys.add(fam[0])
        if rack_label in fam:
            keys.update(fam[: fam.index(rack_label) + 1])
    if rack_label:
        keys.add(rack_label)
    return frozenset(keys)
