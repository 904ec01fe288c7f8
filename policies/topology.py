"""Topology label conventions: the ordered levels of a cluster (NVLink domain, switch levels, zone), which
one is "the rack", and which keys are at a level or finer.

No Kubernetes-standard rack label exists, so clusters carry one of several conventions
(shared/reference/gpu-resources.md §4). Each family below lists its switch-domain labels NARROWEST first;
note that EKS numbers its layers the other way round (layer-3, or layer-4 on four-layer instance types, is
nearest the node), while NVIDIA Topograph's tier-0 is the switch nearest the node.

Levels, narrowest first: the multi-node NVLink domain (`nvidia.com/gpu.clique`: every GPU in it talks over
NVLink, so it comes before any switch), then the switch levels of the cluster's family, then the zone. The
host is below all of them and is not a level here (training-node-pack prefers it). Detected once per
inventory over the whole-card GPU nodes (where multi-node training runs).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

HOSTNAME = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"
REGION = "topology.kubernetes.io/region"

# Switch-domain families, narrowest first. Index 0 of each is the rack-equivalent (leaf switch) level.
FAMILIES: tuple[tuple[str, ...], ...] = (
    # EKS: layer-3 is the closest to the node (layer-4 on four-layer instance types), layer-1 the broadest.
    ("topology.k8s.aws/network-node-layer-4", "topology.k8s.aws/network-node-layer-3",
     "topology.k8s.aws/network-node-layer-2", "topology.k8s.aws/network-node-layer-1"),
    # GKE A3/A4 reservations: sub-block (on GB200 the NVL72 domain) inside block.
    ("cloud.google.com/gce-topology-subblock", "cloud.google.com/gce-topology-block"),
    # OKE RDMA: local block inside network block inside island.
    ("oci.oraclecloud.com/rdma.local_block_id", "oci.oraclecloud.com/rdma.network_block_id",
     "oci.oraclecloud.com/rdma.hpc_island_id"),
    # NVIDIA Topograph >= 1.0: tier-0 is the switch closest to the node.
    # (Topograph's leaf/spine/core keys of its older label scheme.)
    ("network.topology.nvidia.com/leaf", "network.topology.nvidia.com/spine", "network.topology.nvidia.com/core"),
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

# Multi-node NVLink domains (GFD's clique; Topograph's accelerator domain, new and old key), first found wins.
NVLINK_KEYS: tuple[str, ...] = (
    "nvidia.com/gpu.clique",
    "accelerator.topograph.run/domain",
    "network.topology.nvidia.com/accelerator",
)
CLIQUE = NVLINK_KEYS[0]

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


@dataclass(frozen=True)
class Level:
    """One topology level over the whole-card GPU nodes: its label key, kind (nvlink, switch or zone), how
    many domains, and the whole-card GPUs of its largest domain."""

    key: str
    kind: str
    domains: int
    largest_gpus: int
    nodes: int


def kind_of(key: str) -> str:
    if key in NVLINK_KEYS:
        return "nvlink"
    return "zone" if key in (ZONE, REGION) else "switch"


def auto_keys(present: Collection[str], rack: str | None) -> list[str]:
    """Level keys present on the nodes, narrowest first: an NVLink domain, the rack (`rack`, else the
    narrowest switch label found) and the coarser levels of its family, then the zone when any came before."""
    keys = [next((k for k in NVLINK_KEYS if k in present), "")]
    if rack is None:
        rack = next((k for k in AUTO_ORDER if k in present), None)
    family = next((f for f in FAMILIES if rack in f), (rack,) if rack else ())
    keys += [k for k in family[family.index(rack) :] if k in present] if rack else []
    # The zone tops a fabric the nodes describe; alone it is a failure domain, not a switch domain, and says
    # nothing about racks (a zone-only cluster keeps training-same-rack's "no rack label" answer).
    if any(keys) and ZONE in present:
        keys.append(ZONE)
    return [k for k in keys if k]


def candidate_keys(declared: Sequence[str], rack_setting: str) -> tuple[str, ...]:
    """Every key `auto_keys` or a declared `topology.levels` may make a level, in an order where any key
    comes before each coarser key it may be checked to nest in (policies/levelcounts.py counts these)."""
    if declared:
        keys: Iterable[str] = declared
    else:
        custom = (rack_setting,) if rack_setting not in ("auto", *AUTO_ORDER) else ()
        keys = (*NVLINK_KEYS, *AUTO_ORDER, *custom, ZONE)
    return tuple(dict.fromkeys(keys))


class LevelFacts(Protocol):
    """What build_levels reads of the nodes it places jobs on (policies/levelcounts.py: LevelView)."""

    @property
    def total(self) -> int: ...
    def key(self, key: str) -> KeyFacts: ...
    def nests(self, fine: str, coarse: str) -> bool: ...


class KeyFacts(Protocol):
    @property
    def have(self) -> int: ...
    @property
    def domains(self) -> Mapping[str, tuple[int, int]]: ...
    @property
    def largest(self) -> int: ...


def build_levels(nodes: LevelFacts, keys: Sequence[str], declared: bool) -> tuple[tuple[Level, ...], list[str]]:
    """Levels of `keys` over the counts of the whole-card nodes, and one-line warnings.

    Never a wrong hard constraint: an NVLink key on some nodes only is not a level (pinning a job to the
    clique nodes would strand one meant for the others); a level whose domains do not nest in the finer
    level kept before it is dropped (the order is then unknown)."""
    warnings: list[str] = []
    levels: list[Level] = []
    total = nodes.total
    for key in keys:
        facts = nodes.key(key)
        have = facts.have
        where = "topology.levels" if declared else "auto-detected"
        if not have:
            if declared and total:
                warnings.append(f"no whole-card GPU node carries {key!r} ({where}): level not used")
            continue
        if have < total:
            if kind_of(key) == "nvlink":
                warnings.append(
                    f"{key} is on {have} of {total} whole-card GPU nodes: NVLink domains are not used "
                    f"to place jobs (claims of a ComputeDomain channel still are)"
                )
                continue
            warnings.append(f"level label {key!r} is missing on {total - have} of {total} GPU nodes")
        if levels and not nodes.nests(levels[-1].key, key):
            warnings.append(
                f"topology levels nest wrongly: a {levels[-1].key} domain spans several {key} domains; {key} not used"
            )
            continue
        levels.append(Level(key, kind_of(key), len(facts.domains), facts.largest, have))
    return tuple(levels), warnings


def finer_keys(levels: Sequence[Level], upto: int) -> frozenset[str]:
    """Keys that confine a group of pods to one domain of `levels[upto]` or less."""
    keys = set(rack_or_finer(None))
    for level in levels[: upto + 1]:
        keys |= rack_or_finer(level.key)
    return frozenset(keys)


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


def domain_text(level: Level, rack_key: str | None) -> str:
    """How messages name one domain of a level: `rack`, `NVLink clique`, `zone`, `network-node-layer-2 domain`."""
    if level.kind == "nvlink":
        return "NVLink clique"
    if level.kind == "zone":
        return "zone"
    return "rack" if level.key == rack_key else f"{level.key.rsplit('/', 1)[-1]} domain"


def domains_text(level: Level, rack_key: str | None) -> str:
    """How messages name a level's domains: `racks`, `NVLink cliques`, `zones`, `network-node-layer-2 domains`."""
    return domain_text(level, rack_key) + "s"
