"""The GPU inventory the engine decides with, read from Node objects (GFD + topology labels) or declared pools.

Live nodes are the truth; declared pools describe nodes the webhook cannot see (or name the pool training
must land in). Everything here is computed once per inventory change, not per request.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from policies import gpulabels, mig, topology
from policies.document import Policy, Pool
from policies.resources import GPU, GPU_SHARED, is_gpu_resource, parse_count
from policies.selectors import NodeSelection, node_selection, selection_filter
from policies.workloads import Json

SHARING_LABEL = gpulabels.SHARING
PRODUCT_LABEL = gpulabels.PRODUCT
MIG_STRATEGY_LABEL = gpulabels.MIG_STRATEGY
SHARED_STRATEGIES = gpulabels.SHARED_STRATEGIES
_MIB = 2**20
# Candidates cached per inventory: distinct node selections seen (pods of one job share one), and the
# longest selection worth keeping (a normal one is a few hundred characters; a huge one is just recomputed).
CANDIDATES_CACHE_SIZE = 128
CANDIDATES_KEY_LIMIT = 4096


@dataclass(frozen=True)
class Offer:
    """One GPU resource a node advertises: `kind` is whole, mig or shared (time-sliced / MPS)."""

    resource: str
    count: int
    memory_bytes: int
    compute: int
    kind: str
    profile: str = ""


@dataclass(frozen=True)
class GpuNode:
    name: str
    labels: Mapping[str, str]
    product: str
    sharing: str
    mig_strategy: str
    whole_gpus: int
    memory_bytes: int
    offers: tuple[Offer, ...]
    rack: str | None
    pool: str | None
    # MIG is on for some GPU of the node (gpulabels.partitioned), whatever `mig_strategy` (GFD's naming
    # scheme, labelled on every GPU node by a default GPU Operator) says.
    partitioned: bool = False
    declared: bool = False  # synthesised from a declared pool: no live labels to select it by

    @property
    def shared(self) -> bool:
        return self.sharing in SHARED_STRATEGIES

    @property
    def whole_card(self) -> bool:
        """Whole, unshared cards only: not MIG, not time-sliced or MPS (the training-pool definition)."""
        return not self.shared and not self.partitioned and self.whole_gpus > 0

    def offer(self, resource: str) -> Offer | None:
        for o in self.offers:
            if o.resource == resource:
                return o
        return None


@dataclass(frozen=True)
class Inventory:
    nodes: tuple[GpuNode, ...]
    rack_label: str | None
    rack_or_finer: frozenset[str]
    zones: bool
    max_whole_gpus: int
    max_memory_bytes: int
    warnings: tuple[str, ...]
    max_rack_gpus: int = 0  # whole-card GPUs in the largest rack (0: no rack label)
    # Node-affinity expressions selecting the whole-card GPU nodes (training-pool) and the unshared ones
    # (online-exclusive), exact on this inventory.
    whole_card_expressions: tuple[Json, ...] = gpulabels.BASE_EXPRESSIONS
    not_shared_expressions: tuple[Json, ...] = gpulabels.BASE_EXPRESSIONS[:1]
    # node selection -> candidates, least recently used first. Safe on the instance: an inventory never
    # changes (a node event builds a new one, which starts empty).
    _candidates: dict[str, tuple[GpuNode, ...]] = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def empty(self) -> bool:
        return not self.nodes

    def candidates(self, pod: Json) -> list[GpuNode]:
        """GPU nodes the pod's nodeSelector / required node affinity allow (nodeName, nodeSelector and the
        required terms; tolerations, preferred affinity and pod affinity do not narrow it)."""
        selection = node_selection(pod)
        # repr, not a JSON dump: it tells None from NaN, 1 from 1.0 and a date from its string, so equal keys
        # are equal selections even for YAML-loaded input.
        try:
            key = repr(selection)
        except RecursionError:
            key = ""
        if not key or len(key) > CANDIDATES_KEY_LIMIT:
            return self._match(selection)
        cache = self._candidates
        # pop + insert keeps the most recently used last. Each step stays valid if another thread's review
        # touches the cache in between: at worst an entry is computed twice or evicted late.
        hit = cache.pop(key, None)
        if hit is None:
            hit = tuple(self._match(selection))
        cache[key] = hit
        while len(cache) > CANDIDATES_CACHE_SIZE:
            try:
                del cache[next(iter(cache))]
            except (KeyError, RuntimeError, StopIteration):
                break
        return list(hit)

    def _match(self, selection: NodeSelection) -> list[GpuNode]:
        allowed = selection_filter(selection)
        return [n for n in self.nodes if allowed(n.labels, n.name)]

    def offering(self, resource: str) -> list[GpuNode]:
        return [n for n in self.nodes if n.offer(resource) is not None]


def _labels(node: Json) -> dict[str, str]:
    meta = node.get("metadata")
    labels = meta.get("labels") if isinstance(meta, dict) else None
    if not isinstance(labels, dict):
        return {}
    return {str(k): str(v) for k, v in labels.items()}


def _int_label(labels: Mapping[str, str], key: str, default: int = 0) -> int:
    value = labels.get(key, "")
    return int(value) if value.isascii() and value.isdigit() else default


def _gpu_resources(node: Json) -> dict[str, int]:
    status = node.get("status")
    if not isinstance(status, dict):
        return {}
    for key in ("allocatable", "capacity"):
        res = status.get(key)
        if isinstance(res, dict) and any(isinstance(k, str) and is_gpu_resource(k) for k in res):
            out = {}
            for name, raw in res.items():
                count = parse_count(raw)
                if isinstance(name, str) and is_gpu_resource(name) and count:
                    out[name] = count
            return out
    return {}


def _resources_from_labels(labels: Mapping[str, str], sharing: str, mig_strategy: str) -> dict[str, int]:
    """Without a status (a nodes file of labels only), GFD's count labels say what the node advertises."""
    out: dict[str, int] = {}
    gpus = _int_label(labels, "nvidia.com/gpu.count")
    replicas = max(_int_label(labels, "nvidia.com/gpu.replicas", 1), 1)
    for key, value in labels.items():
        if key.startswith("nvidia.com/mig-") and key.endswith(".count") and value.isdigit():
            out[key[: -len(".count")]] = int(value)
    if gpus and (mig_strategy != "mixed" or not out):
        out[GPU] = gpus * (replicas if sharing in SHARED_STRATEGIES else 1)
    return out


def node_from_object(node: Json, pools: Sequence[Pool] = ()) -> GpuNode | None:
    """A GpuNode from a Node object, or None for a node with no GPU."""
    labels = _labels(node)
    meta = node.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    name = name if isinstance(name, str) else labels.get(topology.HOSTNAME, "")
    product = labels.get(PRODUCT_LABEL, "")
    info = mig.parse_product(product) if product else _gke_product(labels)
    sharing = labels.get(SHARING_LABEL, "") or gpulabels.gke_sharing(labels)
    if sharing not in ("none", *SHARED_STRATEGIES):
        sharing = (
            "time-slicing" if (info and info.shared) or _int_label(labels, "nvidia.com/gpu.replicas", 1) > 1 else "none"
        )
    mig_strategy = labels.get(MIG_STRATEGY_LABEL, "none")
    if mig_strategy not in ("single", "mixed"):
        mig_strategy = "single" if info and info.mig_profile else "none"
    resources = _gpu_resources(node) or _resources_from_labels(labels, sharing, mig_strategy)
    if not resources and labels.get("nvidia.com/gpu.present") != "true":
        return None
    pool = next((p.name for p in pools if all(labels.get(k) == v for k, v in p.node_selector.items())), None)
    parted = gpulabels.partitioned(labels, info.mig_profile if info else None, resources)
    return _build(name, labels, product, info, sharing, mig_strategy, resources, pool, partitioned=parted)


def _gke_product(labels: Mapping[str, str]) -> mig.ProductInfo | None:
    """GKE nodes carry no GFD product: the accelerator label (and partition size) say the same thing."""
    gfd = gpulabels.GKE_PRODUCTS.get(labels.get(gpulabels.GKE_ACCELERATOR, ""))
    if gfd is None:
        return None
    partition = labels.get(gpulabels.GKE_PARTITION, "")
    return mig.parse_product(f"{gfd}-MIG-{partition}" if partition else gfd)


def _build(
    name: str,
    labels: Mapping[str, str],
    product: str,
    info: mig.ProductInfo | None,
    sharing: str,
    mig_strategy: str,
    resources: Mapping[str, int],
    pool: str | None,
    *,
    partitioned: bool,
    declared: bool = False,
) -> GpuNode:
    # Same nominal reading for whole cards: an H100 80GB reports 81559 MiB but is "the 80 GiB GPU".
    gpu_mem = _int_label(labels, "nvidia.com/gpu.memory") * _MIB
    if info and info.model:
        gpu_mem = max(gpu_mem, mig.memory_bytes(info.model))
    shared = sharing in SHARED_STRATEGIES
    offers: list[Offer] = []
    whole = 0
    for resource, count in sorted(resources.items()):
        parsed = mig.parse_mig_resource(resource)
        if parsed is not None:
            # Nominal size (the `Ngb` of the name read as GiB, see mig.py): GFD's exact per-profile MiB is a
            # little smaller, and matching on it would push a `10Gi` ask past the 10gb slice users mean.
            mem = parsed.memory_gb * 2**30
            kind = "shared" if parsed.shared or shared else "mig"
            offers.append(Offer(resource, count, mem, parsed.compute, kind, parsed.profile))
        elif resource == GPU and mig_strategy == "single" and info and info.mig_profile:
            p = mig.parse_mig_resource(mig.resource_name(info.mig_profile))
            mem = p.memory_gb * 2**30 if p else 0
            offers.append(Offer(resource, count, mem, p.compute if p else 0, "shared" if shared else "mig",
                                info.mig_profile))  # fmt: skip
        elif resource in (GPU, GPU_SHARED):
            kind = "shared" if shared or resource == GPU_SHARED else "whole"
            offers.append(Offer(resource, count, gpu_mem, 0, kind))
            if kind == "whole":
                whole = count
    return GpuNode(
        name=name,
        labels=dict(labels),
        product=product,
        sharing=sharing or "none",
        mig_strategy=mig_strategy,
        whole_gpus=whole,
        memory_bytes=gpu_mem,
        offers=tuple(offers),
        rack=None,
        pool=pool,
        partitioned=partitioned,
        declared=declared,
    )


def _pool_nodes(pool: Pool, rack_key: str) -> list[GpuNode]:
    """Synthesise the nodes a declared pool describes, so sizing rules can use it like live nodes."""
    labels = dict(pool.node_selector)
    if pool.product:
        labels[PRODUCT_LABEL] = pool.product
    if pool.rack:
        labels[rack_key] = pool.rack
    labels[SHARING_LABEL] = pool.sharing
    if pool.mig_strategy != "none":
        labels[MIG_STRATEGY_LABEL] = pool.mig_strategy
    info = mig.parse_product(pool.product) if pool.product else None
    resources: dict[str, int] = {}
    if pool.mig_strategy == "mixed":
        resources = {mig.resource_name(p): n for p, n in pool.mig_profiles.items()}
    elif pool.gpus_per_node:
        resources[GPU] = pool.gpus_per_node * (pool.replicas if pool.sharing != "none" else 1)
    if not labels.get("nvidia.com/gpu.memory") and info and info.model:
        labels["nvidia.com/gpu.memory"] = str(mig.memory_bytes(info.model) // _MIB)
    # A declared pool's migStrategy describes its layout (MIG on), not GFD's naming scheme.
    parted = pool.mig_strategy != "none"
    return [
        _build(
            f"{pool.name}-{i}",
            {**labels, topology.HOSTNAME: f"{pool.name}-{i}"},
            pool.product,
            info,
            pool.sharing,
            pool.mig_strategy,
            resources,
            pool.name,
            partitioned=parted,
            declared=True,
        )
        for i in range(pool.nodes)
    ]


def build(nodes: Iterable[Any], policy: Policy) -> Inventory:
    """The inventory from Node objects (non-GPU nodes are skipped) plus the policy's declared pools."""
    gpu_nodes = [n for obj in nodes if isinstance(obj, dict) for n in [node_from_object(obj, policy.pools)] if n]
    explicit = policy.rack != "auto"
    rack_key_for_pools = policy.rack if explicit else "topology.kubernetes.io/rack"
    for pool in policy.pools:
        if not any(n.pool == pool.name for n in gpu_nodes):
            gpu_nodes.extend(_pool_nodes(pool, rack_key_for_pools))
    warnings: list[str] = []
    if explicit:
        rack_label: str | None = policy.rack
        have = sum(1 for n in gpu_nodes if n.labels.get(policy.rack))
        if gpu_nodes and not have:
            warnings.append(f"no GPU node carries the rack label {policy.rack!r} set in topology.rack")
    else:
        rack_label, have, total = topology.detect_rack_label(n.labels for n in gpu_nodes)
        if rack_label is None and gpu_nodes:
            warnings.append(
                "no GPU node carries a rack label (topology.kubernetes.io/rack, EKS/GKE/OKE/Topograph ones): "
                "training-rack cannot be applied; set topology.rack or label the nodes"
            )
        elif rack_label and have < total:
            warnings.append(f"rack label {rack_label!r} is missing on {total - have} of {total} GPU nodes")
    final = tuple(
        GpuNode(**{**n.__dict__, "rack": n.labels.get(rack_label) if rack_label else None}) for n in gpu_nodes
    )
    live = [n for n in final if not n.declared]
    exprs, problems = gpulabels.whole_card_expressions(
        [n.labels for n in live if n.whole_card],
        [n.labels for n in live if not n.whole_card and n.offer(GPU)],
    )
    unshared, shared_problems = gpulabels.not_shared_expressions(
        [n.labels for n in live if not n.shared and n.offer(GPU)],
        [n.labels for n in live if n.shared and n.offer(GPU)],
    )
    warnings.extend(problems + shared_problems)
    return Inventory(
        nodes=final,
        rack_label=rack_label,
        rack_or_finer=topology.rack_or_finer(rack_label),
        zones=any(topology.ZONE in n.labels for n in final),
        max_whole_gpus=max((n.whole_gpus for n in final if n.whole_card), default=0),
        max_memory_bytes=max((o.memory_bytes for n in final for o in n.offers), default=0),
        warnings=tuple(warnings),
        max_rack_gpus=_largest_rack(final),
        whole_card_expressions=exprs,
        not_shared_expressions=unshared,
    )


def _largest_rack(nodes: tuple[GpuNode, ...]) -> int:
    per_rack: dict[str, int] = {}
    for n in nodes:
        if n.rack and n.whole_card:
            per_rack[n.rack] = per_rack.get(n.rack, 0) + n.whole_gpus
    return max(per_rack.values(), default=0)


def empty(policy: Policy) -> Inventory:
    return build((), policy)
