"""What a node's labels say about its GPUs: partitioned (MIG) or not, shared or not, as GFD and GKE write them.

Why this exists: `nvidia.com/mig.strategy` is not "MIG is on". GFD writes it on every GPU node whenever the
device plugin's strategy is not `none`, MIG enabled or not (NVIDIA/k8s-device-plugin internal/lm/
mig-strategy.go: `migStrategyLabeler` is merged unconditionally; its test "single non-mig device returns
non-mig (none) labels" expects `nvidia.com/mig.strategy: single`), and the GPU Operator's default strategy is
`single` (gpu-operator deployments/gpu-operator/values.yaml). What does say MIG is on:
- single strategy: the product gets `-MIG-<profile>` (or `-MIG-INVALID`) and the MIG attribute labels
  `nvidia.com/gpu.slices.gi` / `.ci`, `nvidia.com/gpu.engines.*` appear (internal/lm/resource.go);
- mixed strategy: `nvidia.com/mig-<profile>.count` and its siblings, one set per profile in use;
- GKE (its own device plugin, no GFD): `cloud.google.com/gke-gpu-partition-size: <profile>`;
- any `nvidia.com/mig-*` resource in the node's allocatable.
Sharing: `nvidia.com/gpu.sharing-strategy` (time-slicing | mps), a `-SHARED` product (time-slicing without
renameByDefault), or GKE's `cloud.google.com/gke-gpu-sharing-strategy` (time-sharing | mps) with
`cloud.google.com/gke-max-shared-clients-per-gpu`.

`whole_card_expressions` turns that into node-affinity expressions real labels satisfy: they admit every
whole-card GPU node of the inventory and exclude every MIG or shared one that labels can tell apart.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from policies.workloads import Json

PRODUCT = "nvidia.com/gpu.product"
SHARING = "nvidia.com/gpu.sharing-strategy"
MIG_STRATEGY = "nvidia.com/mig.strategy"
SLICES_GI = "nvidia.com/gpu.slices.gi"
SLICES_PREFIX = "nvidia.com/gpu.slices."
MIG_LABEL_PREFIX = "nvidia.com/mig-"
SHARED_STRATEGIES = ("time-slicing", "mps")

GKE_ACCELERATOR = "cloud.google.com/gke-accelerator"
GKE_PARTITION = "cloud.google.com/gke-gpu-partition-size"
GKE_SHARING = "cloud.google.com/gke-gpu-sharing-strategy"
GKE_MAX_CLIENTS = "cloud.google.com/gke-max-shared-clients-per-gpu"
# GKE's sharing values, in GFD's words.
GKE_SHARING_VALUES = {"time-sharing": "time-slicing", "mps": "mps"}
# GKE accelerator names -> the GFD product of the same GPU, so the MIG catalogue and memory apply. Only
# models whose GFD product the catalogue knows; others keep no product (sizes then come from GFD labels).
GKE_PRODUCTS = {
    "nvidia-tesla-a100": "NVIDIA-A100-SXM4-40GB",
    "nvidia-a100-80gb": "NVIDIA-A100-SXM4-80GB",
    "nvidia-h100-80gb": "NVIDIA-H100-80GB-HBM3",
    "nvidia-h100-mega-80gb": "NVIDIA-H100-80GB-HBM3",
    "nvidia-h200-141gb": "NVIDIA-H200",
    "nvidia-b200": "NVIDIA-B200",
}

# Always part of the whole-card selection: correct on any GFD cluster, and they keep a node that turns MIG
# or sharing on later out without waiting for a new inventory.
BASE_EXPRESSIONS: tuple[Json, ...] = (
    {"key": SHARING, "operator": "NotIn", "values": sorted(SHARED_STRATEGIES)},
    {"key": SLICES_GI, "operator": "DoesNotExist"},
)


def mig_count_profiles(labels: Mapping[str, str]) -> list[str]:
    """Profiles a mixed-strategy node has slices of (`nvidia.com/mig-1g.10gb.count: "14"` -> 1g.10gb)."""
    # The key is tested first: every node's every label passes here at each build (50,000 nodes: ~1M labels).
    return [
        key[len(MIG_LABEL_PREFIX) : -len(".count")]
        for key, value in labels.items()
        if key.startswith(MIG_LABEL_PREFIX) and key.endswith(".count") and _positive(value)
    ]


def _positive(value: str) -> bool:
    return value.isascii() and value.isdigit() and int(value) > 0


_PARTITION_PREFIXES = (SLICES_PREFIX, MIG_LABEL_PREFIX)


def partitioned(labels: Mapping[str, str], mig_profile: str | None, resources: Iterable[str]) -> bool:
    """MIG is on for some GPU of the node, by what actually says so (module docstring)."""
    if mig_profile or "-MIG-" in labels.get(PRODUCT, "") or labels.get(GKE_PARTITION):
        return True
    for key, value in labels.items():  # a slices label, or a positive MIG count label (mig_count_profiles)
        if key.startswith(_PARTITION_PREFIXES) and (
            key.startswith(SLICES_PREFIX) or (key.endswith(".count") and _positive(value))
        ):
            return True
    return any(r.startswith(MIG_LABEL_PREFIX) for r in resources)


def gke_sharing(labels: Mapping[str, str]) -> str:
    """GKE's sharing strategy in GFD's words, or "" when GKE says nothing."""
    return GKE_SHARING_VALUES.get(labels.get(GKE_SHARING, ""), "")


def _mixed_expressions(whole: list[Mapping[str, str]], parted: list[Mapping[str, str]]) -> list[Json]:
    """Mixed-strategy MIG nodes: one short expression when no whole-card node is labelled mixed (the usual
    per-node config), else one DoesNotExist per profile in use (a cluster-wide mixed strategy)."""
    mixed = [lab for lab in parted if mig_count_profiles(lab)]
    if not mixed:
        return []
    if all(lab.get(MIG_STRATEGY) == "mixed" for lab in mixed) and not any(
        lab.get(MIG_STRATEGY) == "mixed" for lab in whole
    ):
        return [{"key": MIG_STRATEGY, "operator": "NotIn", "values": ["mixed"]}]
    profiles = sorted({p for lab in mixed for p in mig_count_profiles(lab)})
    return [{"key": f"{MIG_LABEL_PREFIX}{p}.count", "operator": "DoesNotExist"} for p in profiles]


def _sharing_expressions(shared: list[Mapping[str, str]]) -> list[Json]:
    extra: list[Json] = []
    if any(lab.get(GKE_SHARING) for lab in shared):
        extra.append({"key": GKE_SHARING, "operator": "DoesNotExist"})
    # A -SHARED product without the sharing-strategy label (GFD before that label existed).
    products = sorted(
        {lab[PRODUCT] for lab in shared if lab.get(PRODUCT, "").endswith("-SHARED") and SHARING not in lab}
    )
    if products:
        extra.append({"key": PRODUCT, "operator": "NotIn", "values": products})
    return extra


def _selection(
    exprs: list[Json], admit: list[Mapping[str, str]], exclude: list[Mapping[str, str]], what: str
) -> tuple[tuple[Json, ...], list[str]]:
    """`exprs` less any that would shut out a node to admit, and a problem line for nodes it lets through."""
    from policies.selectors import expression_matches

    kept = [e for e in exprs if e in BASE_EXPRESSIONS or all(expression_matches(e, lab) for lab in admit)]
    leaking = [lab for lab in exclude if all(expression_matches(e, lab) for e in kept)]
    problems = []
    if leaking:
        names = ", ".join(sorted(lab.get("kubernetes.io/hostname", "?") for lab in leaking)[:3])
        problems.append(f"{len(leaking)} {what} GPU node(s) ({names}) carry no label that tells them apart")
    return tuple(kept), problems


def whole_card_expressions(
    whole: list[Mapping[str, str]], not_whole: list[Mapping[str, str]]
) -> tuple[tuple[Json, ...], list[str]]:
    """Expressions (ANDed) that admit the `whole` nodes' labels and exclude the `not_whole` ones (MIG or
    shared GPU nodes offering nvidia.com/gpu), plus one-line problems. Once per inventory, not per review."""
    exprs = [*BASE_EXPRESSIONS, *_mixed_expressions(whole, not_whole)]
    if any(lab.get(GKE_PARTITION) for lab in not_whole):
        exprs.append({"key": GKE_PARTITION, "operator": "DoesNotExist"})
    exprs += _sharing_expressions(not_whole)
    return _selection(exprs, whole, not_whole, "MIG or shared")


def not_shared_expressions(
    exclusive: list[Mapping[str, str]], shared: list[Mapping[str, str]]
) -> tuple[tuple[Json, ...], list[str]]:
    """Expressions that keep a pod off time-sliced and MPS nodes (online-exclusive), likewise."""
    exprs = [BASE_EXPRESSIONS[0], *_sharing_expressions(shared)]
    return _selection(exprs, exclusive, shared, "time-sliced or MPS")
