"""All-reduce cost model: what a placement costs a training job, in milliseconds and as a ratio.

Why this exists: a denial that says "keep this job in one rack" is more convincing, and easier to
overrule knowingly, when it quotes what spreading costs. The seed article's `topology_comm_penalty`
cannot be used for that (it returns `(0.0, 0.0)` for its own example and compares two different
formulas), so this module implements the standard alpha-beta model of shared/reference/comm-model.md and
says what it assumes.

The model (bandwidths per GPU and per direction, sizes in bytes, 1 GB/s = 10^9 bytes/s):
- ring all-reduce of S bytes over n ranks whose slowest link carries B, α per step:
  `t = 2(n−1)·α + 2(n−1)/n · S/B`;
- two-level (hierarchical) all-reduce, g GPUs per node on NVLink (B_node), N nodes on a rail-optimised
  network (one NIC per GPU, B_net each): reduce-scatter in the node, all-reduce of the 1/g shard across
  nodes, all-gather in the node:
  `t = 2(g−1)·α_node + 2(g−1)/g · S/B_node + 2(N−1)·α_net + 2(N−1)/N · S/(g·B_net)`;
- across racks, the inter-node stage crosses the spine: on an oversubscribed fabric under load it gets
  `B_net / oversubscription`, and each of its steps pays `cross_rack_hop_us` more latency.
- nccl-tests' definitions: `algbw = S/t`, and for all-reduce `busbw = algbw · 2(n−1)/n`, which for a
  ring equals the bandwidth of its slowest link whatever n is.

Units: operators quote links in Gb/s (bits), the formulas use GB/s (bytes): 400 Gb/s = 50 GB/s.

Default assumptions (`Bandwidths()`), chosen to reproduce comm-model.md's worked example exactly
(S = 16 MB, g = 8, N = 2 → 0.56 ms in one node, 0.64 ms two-level across two nodes; a flat 16-rank ring
at the network's 25 GB/s would take 1.2 ms):
- NVLink 400 Gb/s (50 GB/s) per GPU per direction: the seed's figure, deliberately conservative; an
  H100's NVLink 4 gives 450 GB/s per direction (3600 Gb/s). Set the real figure per cluster.
- network 200 Gb/s (25 GB/s) per GPU (one NIC per GPU); NDR InfiniBand is 400 Gb/s per NIC, and
  nccl-tests' maintainers expect 46–48 GB/s of measured busbw per NDR NIC (NVIDIA/nccl-tests#290),
  i.e. a few percent below line rate.
- cross-rack oversubscription 2:1 (a loaded 2:1 spine); 1 means a non-blocking fabric.
- α = 0 at every level and no extra hop latency: the bandwidth-bound regime of large gradient
  buckets. With α = 0 all ratios are independent of the message size.
- message size 16 MiB (`DEFAULT_MESSAGE_BYTES`, as in the default policy's `comm.messageSize: 16Mi`):
  the worked example's 16 MB is 16·10^6 bytes, so its 0.56 / 0.64 ms need a size of `16M`; with 16 MiB
  the times are 4.9 % longer (0.587 / 0.671 ms) and every ratio is the same.

Placements compared by `placement_estimate`: intra-node (only when the job fits on one node), intra-rack
(two-level over the fewest nodes that hold the job — at least two, to show what leaving one node costs)
and cross-rack (the same nodes split over two racks). An uneven split (12 GPUs on 2 nodes of 8 → 6+6;
9 → 5+4) is bounded by its fullest node in the NVLink stages and its emptiest node in the network stage.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from policies.quantity import format_bytes

__all__ = [
    "DEFAULT_BANDWIDTHS",
    "DEFAULT_MESSAGE_BYTES",
    "PLACEMENTS",
    "Bandwidths",
    "Estimate",
    "algbw_gbytes_per_s",
    "busbw_gbytes_per_s",
    "gbps_to_gbytes_per_s",
    "hierarchical_allreduce_ms",
    "level_phrase",
    "nvlink_domain_penalty",
    "penalty_phrase",
    "placement_estimate",
    "ring_allreduce_ms",
    "spread_ms",
]

DEFAULT_MESSAGE_BYTES = 16 * 2**20
PLACEMENTS: tuple[str, ...] = ("intra-node", "intra-rack", "cross-rack")


def _check_finite(name: str, value: float, *, minimum: float = 0.0, strict: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if value < minimum or (strict and value == minimum):
        relation = ">" if strict else "≥"
        raise ValueError(f"{name} must be {relation} {minimum:g}, got {value!r}")


def _check_count(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a whole number ≥ 1, got {value!r}")


def gbps_to_gbytes_per_s(gbps: float) -> float:
    """Gb/s (bits, as links are sold and configured) to GB/s (bytes, as the formulas use): 400 → 50."""
    return gbps / 8.0


def _ms(size_bytes: float, gbytes_per_s: float) -> float:
    """Time to move `size_bytes` at `gbytes_per_s`, in milliseconds (bytes / 10^9 B/s · 10^3)."""
    return size_bytes / (gbytes_per_s * 1e6)


def _ring_ms(size_bytes: float, g: int, link_gbytes_per_s: float, alpha_us: float) -> float:
    """Ring all-reduce over g ranks (in a node: reduce-scatter + all-gather), 2(g−1) steps of S/g each."""
    return 2 * (g - 1) * alpha_us / 1e3 + 2 * (g - 1) / g * _ms(size_bytes, link_gbytes_per_s)


def _inter_ms(size_bytes: float, g: int, nodes: int, net_gbytes_per_s: float, alpha_us: float) -> float:
    """Ring all-reduce of the S/g shard each GPU owns across N nodes, one NIC per GPU."""
    return 2 * (nodes - 1) * alpha_us / 1e3 + 2 * (nodes - 1) / nodes * _ms(size_bytes / g, net_gbytes_per_s)


def ring_allreduce_ms(size_bytes: float, ranks: int, link_gbytes_per_s: float, alpha_us: float = 0.0) -> float:
    """Ring all-reduce time in ms: `2(n−1)·α + 2(n−1)/n · S/B`, B the slowest link in GB/s (bytes)."""
    _check_finite("size_bytes", size_bytes)
    _check_count("ranks", ranks)
    _check_finite("link bandwidth", link_gbytes_per_s, strict=True)
    _check_finite("alpha_us", alpha_us)
    return _ring_ms(size_bytes, ranks, link_gbytes_per_s, alpha_us)


def hierarchical_allreduce_ms(
    size_bytes: float,
    gpus_per_node: int,
    nodes: int,
    node_gbytes_per_s: float,
    net_gbytes_per_s: float,
    *,
    alpha_node_us: float = 0.0,
    alpha_net_us: float = 0.0,
    oversubscription: float = 1.0,
) -> float:
    """Two-level all-reduce time in ms: ring inside each node on NVLink, ring across nodes per rail.

    Bandwidths are GB/s (bytes) per GPU; `oversubscription` divides the network bandwidth (≥ 1).
    With one node this is `ring_allreduce_ms` on NVLink; with one GPU per node, a ring on the network.
    """
    _check_finite("size_bytes", size_bytes)
    _check_count("gpus_per_node", gpus_per_node)
    _check_count("nodes", nodes)
    _check_finite("node bandwidth", node_gbytes_per_s, strict=True)
    _check_finite("network bandwidth", net_gbytes_per_s, strict=True)
    _check_finite("alpha_node_us", alpha_node_us)
    _check_finite("alpha_net_us", alpha_net_us)
    _check_finite("oversubscription", oversubscription, minimum=1.0)
    return _ring_ms(size_bytes, gpus_per_node, node_gbytes_per_s, alpha_node_us) + _inter_ms(
        size_bytes, gpus_per_node, nodes, net_gbytes_per_s / oversubscription, alpha_net_us
    )


def algbw_gbytes_per_s(size_bytes: float, time_ms: float) -> float:
    """nccl-tests' algorithm bandwidth `S / t`, in GB/s."""
    _check_finite("time_ms", time_ms, strict=True)
    return size_bytes / (time_ms * 1e6)


def busbw_gbytes_per_s(size_bytes: float, time_ms: float, ranks: int) -> float:
    """nccl-tests' all-reduce bus bandwidth `algbw · 2(n−1)/n`, in GB/s: comparable across rank counts."""
    _check_count("ranks", ranks)
    return algbw_gbytes_per_s(size_bytes, time_ms) * 2 * (ranks - 1) / ranks


@dataclass(frozen=True)
class Bandwidths:
    """Fabric assumptions, in the units operators use (Gb/s, µs); defaults in the module docstring.

    Bandwidths are per GPU and per direction: NVLink inside a node, the GPU's NIC on the network.
    `cross_rack_oversubscription` divides the network bandwidth for traffic that leaves the rack;
    `cross_rack_hop_us` is added to every inter-node step that crosses the spine.
    """

    nvlink_gbps: float = 400.0
    network_gbps: float = 200.0
    cross_rack_oversubscription: float = 2.0
    alpha_nvlink_us: float = 0.0
    alpha_network_us: float = 0.0
    cross_rack_hop_us: float = 0.0

    def __post_init__(self) -> None:
        _check_finite("nvlink_gbps", self.nvlink_gbps, strict=True)
        _check_finite("network_gbps", self.network_gbps, strict=True)
        _check_finite("cross_rack_oversubscription", self.cross_rack_oversubscription, minimum=1.0)
        _check_finite("alpha_nvlink_us", self.alpha_nvlink_us)
        _check_finite("alpha_network_us", self.alpha_network_us)
        _check_finite("cross_rack_hop_us", self.cross_rack_hop_us)


DEFAULT_BANDWIDTHS = Bandwidths()


@dataclass(frozen=True)
class Estimate:
    """Estimated all-reduce time per placement (None where infeasible) and the ratio to the best one.

    `nodes` is how many nodes the intra-rack and cross-rack placements use (over two racks for the
    latter); `best` names the fastest feasible placement; `assumptions` is one line for messages.
    """

    size_bytes: int
    total_gpus: int
    gpus_per_node: int
    nodes: int
    bandwidths: Bandwidths
    intra_node_ms: float | None
    intra_rack_ms: float | None
    cross_rack_ms: float | None
    intra_node_ratio: float | None
    intra_rack_ratio: float | None
    cross_rack_ratio: float | None
    best: str
    assumptions: str

    @property
    def cross_rack_penalty(self) -> float | None:
        """How many times slower across racks than within one rack (None for a 1-GPU job)."""
        if self.cross_rack_ms is None or self.intra_rack_ms is None or self.intra_rack_ms == 0:
            return None
        return self.cross_rack_ms / self.intra_rack_ms


_SIZE_UNITS: tuple[tuple[tuple[str, int], ...], ...] = (
    (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)),
    (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)),
)


def _size_text(size_bytes: int) -> str:
    """`16 MiB`, `16 MB`, `15.26 MiB`: the shorter exact form (binary on a tie), else rounded binary."""
    exact = [
        next((f"{size_bytes // scale} {unit}" for unit, scale in units if size_bytes % scale == 0), None)
        for units in _SIZE_UNITS
    ]
    candidates = [text for text in exact if text is not None]
    if candidates:
        return min(candidates, key=len)
    text = format_bytes(size_bytes)  # e.g. "≈15.26Mi" or "100"
    number = text.rstrip("KMGTPEi")
    return f"{number} {text[len(number) :]}B"


def _assumptions(size_bytes: int, nodes: int, g_max: int, g_min: int, bw: Bandwidths) -> str:
    per_node = f"{g_max}" if g_max == g_min else f"{g_min}–{g_max}"
    spread = f"{nodes} nodes × {per_node} GPUs" if nodes > 1 else "none (1 GPU)"
    over = bw.cross_rack_oversubscription
    fabric = f"{over:g}:1 oversubscribed, loaded" if over > 1 else "non-blocking"
    return (
        f"ring all-reduce of {_size_text(size_bytes)}; spread = {spread}, two-level (ring in node, "
        f"ring across nodes, one NIC per GPU); per GPU per direction NVLink {bw.nvlink_gbps:g} Gb/s, "
        f"network {bw.network_gbps:g} Gb/s; cross-rack = 2 racks, {fabric}, "
        f"+{bw.cross_rack_hop_us:g} µs/step; "
        f"α {bw.alpha_nvlink_us:g} µs NVLink, {bw.alpha_network_us:g} µs network"
    )


def placement_estimate(
    size_bytes: int, total_gpus: int, gpus_per_node: int, bandwidths: Bandwidths = DEFAULT_BANDWIDTHS
) -> Estimate:
    """All-reduce time of a `total_gpus` job in one node, one rack and across two racks.

    Intra-node only if `total_gpus ≤ gpus_per_node`; the spread placements use the fewest nodes that
    hold the job, at least two (a 1-GPU job has nothing to spread and no all-reduce cost).
    """
    if isinstance(size_bytes, bool) or not isinstance(size_bytes, int) or size_bytes < 1:
        raise ValueError(f"message size must be a whole number of bytes ≥ 1, got {size_bytes!r}")
    _check_count("total_gpus", total_gpus)
    _check_count("gpus_per_node", gpus_per_node)
    bw = bandwidths
    node_gbs = gbps_to_gbytes_per_s(bw.nvlink_gbps)
    net_gbs = gbps_to_gbytes_per_s(bw.network_gbps)

    intra_node = _ring_ms(size_bytes, total_gpus, node_gbs, bw.alpha_nvlink_us) if total_gpus <= gpus_per_node else None
    intra_rack = cross_rack = None
    nodes, g_max, g_min = 1, total_gpus, total_gpus
    if total_gpus >= 2:
        nodes = max(2, -(-total_gpus // gpus_per_node))
        g_max, g_min = -(-total_gpus // nodes), total_gpus // nodes
        nvlink_stage = _ring_ms(size_bytes, g_max, node_gbs, bw.alpha_nvlink_us)
        intra_rack = nvlink_stage + _inter_ms(size_bytes, g_min, nodes, net_gbs, bw.alpha_network_us)
        cross_rack = nvlink_stage + _inter_ms(
            size_bytes,
            g_min,
            nodes,
            net_gbs / bw.cross_rack_oversubscription,
            bw.alpha_network_us + bw.cross_rack_hop_us,
        )
    times = dict(zip(PLACEMENTS, (intra_node, intra_rack, cross_rack), strict=True))
    best = min((name for name, t in times.items() if t is not None), key=lambda name: times[name] or 0.0)
    best_ms = times[best] or 0.0

    def ratio(t: float | None) -> float | None:
        if t is None:
            return None
        return t / best_ms if best_ms > 0 else 1.0  # only a 1-GPU job has a zero best time

    return Estimate(
        size_bytes=size_bytes,
        total_gpus=total_gpus,
        gpus_per_node=gpus_per_node,
        nodes=nodes,
        bandwidths=bw,
        intra_node_ms=intra_node,
        intra_rack_ms=intra_rack,
        cross_rack_ms=cross_rack,
        intra_node_ratio=ratio(intra_node),
        intra_rack_ratio=ratio(intra_rack),
        cross_rack_ratio=ratio(cross_rack),
        best=best,
        assumptions=_assumptions(size_bytes, nodes, g_max, g_min, bw),
    )


def spread_ms(
    size_bytes: int, per_node: tuple[int, ...], cross_rack: bool, bandwidths: Bandwidths = DEFAULT_BANDWIDTHS
) -> float:
    """All-reduce time of one actual placement: `per_node` GPUs of the job on each node it uses, over two
    or more racks when `cross_rack`. The model of `placement_estimate` applied to any split (its own
    placements are the fewest-node splits): one node is a ring on NVLink; more are two-level, bounded by
    the fullest node in the NVLink stage and the emptiest in the network stage."""
    if isinstance(size_bytes, bool) or not isinstance(size_bytes, int) or size_bytes < 1:
        raise ValueError(f"message size must be a whole number of bytes ≥ 1, got {size_bytes!r}")
    if not per_node:
        raise ValueError("a placement needs at least one node")
    for gpus in per_node:
        _check_count("GPUs on a node", gpus)
    bw = bandwidths
    node_gbs = gbps_to_gbytes_per_s(bw.nvlink_gbps)
    if len(per_node) == 1:
        return _ring_ms(size_bytes, per_node[0], node_gbs, bw.alpha_nvlink_us)
    net_gbs = gbps_to_gbytes_per_s(bw.network_gbps)
    alpha = bw.alpha_network_us
    if cross_rack:
        net_gbs, alpha = net_gbs / bw.cross_rack_oversubscription, alpha + bw.cross_rack_hop_us
    nvlink_stage = _ring_ms(size_bytes, max(per_node), node_gbs, bw.alpha_nvlink_us)
    return nvlink_stage + _inter_ms(size_bytes, min(per_node), len(per_node), net_gbs, alpha)


def nvlink_domain_penalty(
    size_bytes: int, total_gpus: int, bandwidths: Bandwidths = DEFAULT_BANDWIDTHS
) -> float | None:
    """How many times slower a job's all-reduce is split over two multi-node NVLink domains (cliques) than in
    one. In one clique every GPU reaches every other over NVLink, so NCCL runs one ring at NVLink speed over
    all ranks; across two, NVLink stops at the clique edge and the inter-clique stage goes over the network:
    the two-level model with each clique's share as the "node". None for a 1-GPU job."""
    _check_count("total_gpus", total_gpus)
    if total_gpus < 2:
        return None
    bw = bandwidths
    node_gbs, net_gbs = gbps_to_gbytes_per_s(bw.nvlink_gbps), gbps_to_gbytes_per_s(bw.network_gbps)
    inside = _ring_ms(size_bytes, total_gpus, node_gbs, bw.alpha_nvlink_us)
    across = _ring_ms(size_bytes, -(-total_gpus // 2), node_gbs, bw.alpha_nvlink_us) + _inter_ms(
        size_bytes, total_gpus // 2, 2, net_gbs, bw.alpha_network_us
    )
    return across / inside if inside > 0 else None


def penalty_phrase(estimate: Estimate, across: str = "racks", penalty: float | None = None) -> str:
    """A fragment for a one-line denial (≤ ~90 characters): across two domains vs within one (racks unless
    `across` names another level, whose `penalty` then replaces the cross-rack one).

    e.g. `all-reduce ≈1.1× slower across racks than in one (16 MB, ring, 400/200 Gb/s, 2:1 oversub)`.
    """
    bw = estimate.bandwidths
    context = (
        f"({_size_text(estimate.size_bytes)}, ring, {bw.nvlink_gbps:.4g}/{bw.network_gbps:.4g} Gb/s, "
        f"{bw.cross_rack_oversubscription:.3g}:1 oversub)"
    )
    if penalty is None:
        penalty = estimate.cross_rack_penalty
    if penalty is None:
        return "no all-reduce cost: a 1-GPU job does not communicate"
    if penalty < 1.05:
        return f"all-reduce about as fast across {across} as in one {context}"
    shown = f"{penalty:.1f}" if penalty < 10 else f"{penalty:.0f}"
    return f"all-reduce ≈{shown}× slower across {across} than in one {context}"


def level_phrase(
    kind: str, across: str, size_bytes: int, total_gpus: int, gpus_per_node: int, bandwidths: Bandwidths
) -> str:
    """The penalty of spreading a job over two domains of a topology level: two NVLink cliques (kind
    `nvlink`), or two switch domains (racks and above; zones too), which pay the oversubscribed uplinks."""
    estimate = placement_estimate(size_bytes, total_gpus, gpus_per_node, bandwidths)
    penalty = nvlink_domain_penalty(size_bytes, total_gpus, bandwidths) if kind == "nvlink" else None
    if kind == "nvlink" and penalty is None:
        return penalty_phrase(estimate)
    return penalty_phrase(estimate, across, penalty)
