"""The all-reduce model of shared/reference/comm-model.md: hand-computed cases, nccl-tests, the seed's bug."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.comm import (
    DEFAULT_BANDWIDTHS,
    DEFAULT_MESSAGE_BYTES,
    Bandwidths,
    algbw_gbytes_per_s,
    busbw_gbytes_per_s,
    gbps_to_gbytes_per_s,
    hierarchical_allreduce_ms,
    penalty_phrase,
    placement_estimate,
    ring_allreduce_ms,
)

EXACT = 1e-9
S_16MB = 16_000_000  # the worked example's "16 MB" (16/50 = 0.32 ms only with decimal megabytes)


# --- comm-model.md's worked example: S = 16 MB, g = 8, N = 2, B_node = 50 GB/s, B_net = 25 GB/s, α = 0 ---


def test_units_400_gbps_is_50_gbytes() -> None:
    assert gbps_to_gbytes_per_s(400) == 50.0
    assert gbps_to_gbytes_per_s(200) == 25.0


def test_worked_example_one_node_ring() -> None:
    # 2·7/8·16/50 = 0.56 ms
    assert ring_allreduce_ms(S_16MB, 8, 50.0) == pytest.approx(0.56, abs=EXACT)


def test_worked_example_flat_ring_on_the_network() -> None:
    # 2·15/16·16/25 = 1.2 ms, ≈ 2.1× the one-node ring
    flat = ring_allreduce_ms(S_16MB, 16, 25.0)
    assert flat == pytest.approx(1.2, abs=EXACT)
    assert flat / ring_allreduce_ms(S_16MB, 8, 50.0) == pytest.approx(1.2 / 0.56, abs=EXACT)
    assert round(flat / 0.56, 1) == 2.1


def test_worked_example_hierarchical_two_nodes() -> None:
    # 0.56 + 2·1/2·16/(8·25) = 0.64 ms, ≈ 1.14× the one-node ring
    t = hierarchical_allreduce_ms(S_16MB, 8, 2, 50.0, 25.0)
    assert t == pytest.approx(0.64, abs=EXACT)
    assert round(t / 0.56, 2) == 1.14


def test_defaults_reproduce_the_worked_example() -> None:
    assert Bandwidths(400.0, 200.0, 2.0, 0.0, 0.0, 0.0) == DEFAULT_BANDWIDTHS
    one_node = placement_estimate(S_16MB, 8, 8)
    assert one_node.intra_node_ms == pytest.approx(0.56, abs=EXACT)
    two_nodes = placement_estimate(S_16MB, 16, 8)
    assert two_nodes.intra_node_ms is None
    assert two_nodes.nodes == 2
    assert two_nodes.intra_rack_ms == pytest.approx(0.64, abs=EXACT)
    # across racks, 2:1 oversubscription halves B_net for the inter-node stage: 0.56 + 16/(8·12.5)
    assert two_nodes.cross_rack_ms == pytest.approx(0.72, abs=EXACT)
    assert two_nodes.best == "intra-rack"
    assert two_nodes.intra_rack_ratio == 1.0
    assert two_nodes.cross_rack_ratio == pytest.approx(0.72 / 0.64, abs=EXACT)


def test_default_message_is_the_default_policys_16_mib() -> None:
    assert DEFAULT_MESSAGE_BYTES == 16 * 2**20
    est = placement_estimate(DEFAULT_MESSAGE_BYTES, 8, 8)
    assert est.intra_node_ms == pytest.approx(0.56 * 16 * 2**20 / S_16MB, abs=EXACT)


# --- the seed's function, re-implemented inline to document why the project does not use it ---


def test_seed_snippet_returns_zeros_for_its_own_example() -> None:
    # topology_comm_penalty(8, 2, 400, 200, 16) from shared/seed/, arithmetic as published:
    n_gpus_per_node, n_nodes, bw_nvlink_gbps, bw_net_gbps, msg_mb = 8, 2, 400, 200, 16
    intra = msg_mb * (n_gpus_per_node - 1) / (bw_nvlink_gbps / 8) / 1e3
    inter = msg_mb * (n_nodes - 1) / (bw_net_gbps / 8) / 1e3
    assert (round(intra, 2), round(inter, 2)) == (0.0, 0.0)  # not the "0.28 ms vs 1.2 ms" it claims
    # MB / (GB/s) is already milliseconds: without the extra /1e3 the figures are 2.24 and 0.64.
    assert intra * 1e3 == pytest.approx(2.24) and inter * 1e3 == pytest.approx(0.64)
    # Its two quoted figures come from two different formulas (comm-model.md), so 4.3× is not a ratio
    # of like with like: 0.28 is half of a one-node ring, 1.2 a full flat ring over 16 ranks.
    half_ring_in_node = 7 / 8 * 16 / 50
    assert half_ring_in_node == pytest.approx(0.28)
    assert half_ring_in_node == pytest.approx(ring_allreduce_ms(S_16MB, 8, 50.0) / 2)
    assert ring_allreduce_ms(S_16MB, 16, 25.0) / half_ring_in_node == pytest.approx(4.29, abs=0.01)


# --- nccl-tests' definitions and published results ---


@given(
    size=st.integers(min_value=1, max_value=2**34),
    ranks=st.integers(min_value=2, max_value=4096),
    link=st.floats(min_value=0.1, max_value=2000.0),
)
def test_busbw_of_a_ring_is_its_link_bandwidth(size: int, ranks: int, link: float) -> None:
    # nccl-tests PERFORMANCE.md: for all-reduce busbw = algbw·2(n−1)/n, chosen so that it equals the
    # bandwidth of the slowest link a ring crosses, whatever n. The model must satisfy that identity.
    t = ring_allreduce_ms(size, ranks, link)
    assert busbw_gbytes_per_s(size, t, ranks) == pytest.approx(link, rel=1e-9)
    assert algbw_gbytes_per_s(size, t) == pytest.approx(link * ranks / (2 * (ranks - 1)), rel=1e-9)


# Rows of all_reduce_perf output published in GitHub issues (size B, ranks, out-of-place time µs,
# algbw GB/s, busbw GB/s as printed, two decimals). They test our definitions against the tool's own
# arithmetic, not the fabrics (the first was a performance complaint).
PUBLISHED = [
    # NVIDIA/nccl issue #1453 "Poor NCCL allreduce performance": 3 nodes × 8 H100, log shows
    # "nRanks 24 nNodes 3 localRanks 8"; row for 16777216 B.
    pytest.param(16777216, 24, 1334.9, 12.57, 24.09, id="nccl#1453-3x8-H100"),
    # NVIDIA/nccl issue #1244 "2 node 16 H20 GPU allreduce performance ...": 16 ranks; row for 16777216 B.
    pytest.param(16777216, 16, 203.0, 82.64, 154.95, id="nccl#1244-2x8-H20"),
]


@pytest.mark.parametrize(("size", "ranks", "time_us", "algbw", "busbw"), PUBLISHED)
def test_published_nccl_tests_rows(size: int, ranks: int, time_us: float, algbw: float, busbw: float) -> None:
    t_ms = time_us / 1e3

    # The table prints time to 0.1 µs and bandwidths to 0.01 GB/s: allow both roundings.
    def slack(value: float) -> float:
        return 0.005 + value * 0.05 / time_us

    assert algbw_gbytes_per_s(size, t_ms) == pytest.approx(algbw, abs=slack(algbw))
    assert busbw_gbytes_per_s(size, t_ms, ranks) == pytest.approx(busbw, abs=slack(busbw))
    # The printed columns themselves obey busbw = algbw·2(n−1)/n, to their rounding.
    assert busbw == pytest.approx(algbw * 2 * (ranks - 1) / ranks, abs=0.01)
    # A ring whose slowest link runs at the measured busbw takes the measured time (α folded in).
    exact_busbw = busbw_gbytes_per_s(size, t_ms, ranks)
    assert ring_allreduce_ms(size, ranks, exact_busbw) == pytest.approx(t_ms, rel=1e-12)
    # And from the printed, rounded busbw, within the rounding of the table.
    assert ring_allreduce_ms(size, ranks, busbw) == pytest.approx(t_ms, rel=5e-4)


def test_busbw_from_the_definition_for_8_ranks() -> None:
    # Derived from the PERFORMANCE.md definition (no published figure): 8 ranks, 1 GB in 10 ms →
    # algbw 100 GB/s, busbw 100·2·7/8 = 175 GB/s.
    assert algbw_gbytes_per_s(10**9, 10.0) == pytest.approx(100.0)
    assert busbw_gbytes_per_s(10**9, 10.0, 8) == pytest.approx(175.0)
    assert ring_allreduce_ms(10**9, 8, 175.0) == pytest.approx(10.0)


# --- structure of the model ---


def test_latency_terms() -> None:
    assert ring_allreduce_ms(0, 8, 50.0, alpha_us=5.0) == pytest.approx(2 * 7 * 5.0 / 1e3)
    assert ring_allreduce_ms(1, 1, 50.0, alpha_us=5.0) == 0.0  # one rank: nothing to do
    t = hierarchical_allreduce_ms(0, 8, 4, 50.0, 25.0, alpha_node_us=2.0, alpha_net_us=10.0)
    assert t == pytest.approx((2 * 7 * 2.0 + 2 * 3 * 10.0) / 1e3)


@given(
    size=st.integers(min_value=0, max_value=2**32),
    g=st.integers(min_value=1, max_value=16),
    nodes=st.integers(min_value=1, max_value=64),
    node_bw=st.floats(min_value=1.0, max_value=1000.0),
    net_bw=st.floats(min_value=1.0, max_value=1000.0),
)
def test_hierarchical_reduces_to_rings(size: int, g: int, nodes: int, node_bw: float, net_bw: float) -> None:
    assert hierarchical_allreduce_ms(size, g, 1, node_bw, net_bw) == pytest.approx(
        ring_allreduce_ms(size, g, node_bw), rel=1e-12
    )
    assert hierarchical_allreduce_ms(size, 1, nodes, node_bw, net_bw) == pytest.approx(
        ring_allreduce_ms(size, nodes, net_bw), rel=1e-12
    )
    # Oversubscription k is the same as a k times slower network.
    assert hierarchical_allreduce_ms(size, g, nodes, node_bw, net_bw, oversubscription=2.0) == pytest.approx(
        hierarchical_allreduce_ms(size, g, nodes, node_bw, net_bw / 2), rel=1e-12
    )


def test_uneven_split_fullest_node_for_nvlink_emptiest_for_network() -> None:
    est = placement_estimate(S_16MB, 9, 8)  # 2 nodes: 5 + 4 GPUs
    assert est.nodes == 2
    assert est.intra_rack_ms == pytest.approx(2 * 4 / 5 * 0.32 + 16 / (4 * 25), abs=EXACT)
    assert "2 nodes × 4–5 GPUs" in est.assumptions


@pytest.mark.parametrize(
    ("gpus", "nodes", "spread"),
    [
        (16, 2, "2 nodes × 8 GPUs"),  # exactly two nodes' worth
        (17, 3, "3 nodes × 5–6 GPUs"),  # one GPU more needs a third node (ceil, not floor)
        (24, 3, "3 nodes × 8 GPUs"),
        (25, 4, "4 nodes × 6–7 GPUs"),
    ],
)
def test_spread_uses_the_fewest_nodes_that_hold_the_job(gpus: int, nodes: int, spread: str) -> None:
    est = placement_estimate(S_16MB, gpus, 8)
    assert est.nodes == nodes
    assert f"spread = {spread}," in est.assumptions


def test_job_that_fits_one_node_spreads_over_two_for_comparison() -> None:
    est = placement_estimate(S_16MB, 2, 8)
    assert est.best == "intra-node"
    assert est.intra_node_ms == pytest.approx(0.32, abs=EXACT)
    assert est.intra_rack_ms == pytest.approx(16 / 25, abs=EXACT)  # 1 + 1 GPUs: all traffic on the NIC
    assert est.intra_rack_ratio == pytest.approx(2.0, abs=EXACT)


def test_hop_latency_is_added_per_cross_rack_step() -> None:
    bw = Bandwidths(cross_rack_oversubscription=1.0, cross_rack_hop_us=3.0)
    est = placement_estimate(S_16MB, 32, 8, bw)  # 4 nodes → 2·3 inter-node steps
    assert est.intra_rack_ms is not None and est.cross_rack_ms is not None
    assert est.cross_rack_ms - est.intra_rack_ms == pytest.approx(2 * 3 * 3.0 / 1e3, abs=EXACT)


def test_one_gpu_has_nothing_to_estimate() -> None:
    est = placement_estimate(S_16MB, 1, 8)
    assert (est.intra_node_ms, est.intra_rack_ms, est.cross_rack_ms) == (0.0, None, None)
    assert (est.intra_node_ratio, est.best, est.cross_rack_penalty) == (1.0, "intra-node", None)
    assert penalty_phrase(est) == "no all-reduce cost: a 1-GPU job does not communicate"
    assert "spread = none (1 GPU)," in est.assumptions


@pytest.mark.parametrize(
    ("oversubscription", "fabric"),
    [(1.0, "cross-rack = 2 racks, non-blocking,"), (2.0, "cross-rack = 2 racks, 2:1 oversubscribed, loaded,")],
)
def test_assumptions_name_the_fabric(oversubscription: float, fabric: str) -> None:
    est = placement_estimate(S_16MB, 16, 8, Bandwidths(cross_rack_oversubscription=oversubscription))
    assert fabric in est.assumptions


@given(
    size=st.integers(min_value=1, max_value=2**34),
    gpus=st.integers(min_value=1, max_value=1024),
    per_node=st.integers(min_value=1, max_value=16),
    nvlink=st.floats(min_value=1.0, max_value=8000.0),
    network=st.floats(min_value=1.0, max_value=1600.0),
    over=st.floats(min_value=1.0, max_value=8.0),
    alpha=st.floats(min_value=0.0, max_value=50.0),
    hop=st.floats(min_value=0.0, max_value=50.0),
)
def test_estimate_invariants(
    size: int, gpus: int, per_node: int, nvlink: float, network: float, over: float, alpha: float, hop: float
) -> None:
    bw = Bandwidths(nvlink, network, over, alpha, alpha, hop)
    est = placement_estimate(size, gpus, per_node, bw)
    assert (est.intra_node_ms is None) == (gpus > per_node)
    times = [t for t in (est.intra_node_ms, est.intra_rack_ms, est.cross_rack_ms) if t is not None]
    ratios = [r for r in (est.intra_node_ratio, est.intra_rack_ratio, est.cross_rack_ratio) if r is not None]
    assert len(times) == len(ratios) >= 1
    assert all(math.isfinite(t) and t >= 0 for t in times)
    assert min(ratios) == 1.0 and all(r >= 1.0 for r in ratios)
    if est.cross_rack_ms is not None and est.intra_rack_ms is not None:
        assert est.cross_rack_ms >= est.intra_rack_ms
    if gpus >= 2:  # the fewest nodes that hold the job, at least two
        assert est.nodes * per_node >= gpus
        assert est.nodes == 2 or (est.nodes - 1) * per_node < gpus
    assert "\n" not in est.assumptions
    phrase = penalty_phrase(est)
    assert "\n" not in phrase and len(phrase) <= 110


@given(size=st.integers(min_value=1, max_value=2**34), gpus=st.integers(min_value=2, max_value=512))
def test_without_latency_ratios_do_not_depend_on_size(size: int, gpus: int) -> None:
    a = placement_estimate(size, gpus, 8)
    b = placement_estimate(S_16MB, gpus, 8)
    assert a.cross_rack_ratio == pytest.approx(b.cross_rack_ratio, rel=1e-9)


def test_penalty_phrase() -> None:
    est = placement_estimate(16 * 2**20, 16, 8)
    phrase = penalty_phrase(est)
    expected = "all-reduce ≈1.1× slower across racks than in one (16 MiB, ring, 400/200 Gb/s, 2:1 oversub)"
    assert phrase == expected
    assert len(phrase) <= 90
    est = placement_estimate(S_16MB, 2, 8, Bandwidths(cross_rack_oversubscription=4))
    assert penalty_phrase(est).startswith("all-reduce ≈4.0× slower across racks")
    assert "(16 MB," in penalty_phrase(est)
    tiny = placement_estimate(12_000, 16, 8, Bandwidths(cross_rack_hop_us=50))  # latency-bound
    # 0.1 ms of hops against 0.00048 ms of transfer: ≈209×, shown without decimals
    expected_ratio = (0.1 + 0.00042 + 12_000 / 8 / 12.5e6) / (0.00042 + 12_000 / 8 / 25e6)
    assert round(expected_ratio) == 209
    assert penalty_phrase(tiny).startswith("all-reduce ≈209× slower across racks than in one (12 kB,")
    odd = placement_estimate(11_986, 16, 8, Bandwidths(1000.75, 1000.75, 1.46875))
    assert "(≈11.71 KiB, ring, 1001/1001 Gb/s, 1.47:1 oversub)" in penalty_phrase(odd)
    even = placement_estimate(S_16MB, 16, 8, Bandwidths(cross_rack_oversubscription=1))
    assert penalty_phrase(even).startswith("all-reduce about as fast across racks")


# The display bounds, both sides: below 1.05× is "about as fast"; from 10× on, no decimal (≈10×, not ≈10.0×).
@pytest.mark.parametrize(
    ("penalty", "shown"),
    [
        (1.0499, "all-reduce about as fast across cliques as in one"),
        (1.05, "all-reduce ≈1.1× slower across cliques than in one"),
        (9.94, "all-reduce ≈9.9× slower across cliques than in one"),
        (10.0, "all-reduce ≈10× slower across cliques than in one"),
        (12.4, "all-reduce ≈12× slower across cliques than in one"),
    ],
)
def test_penalty_phrase_display_bounds(penalty: float, shown: str) -> None:
    est = placement_estimate(16 * 2**20, 16, 8)
    context = " (16 MiB, ring, 400/200 Gb/s, 2:1 oversub)"
    assert penalty_phrase(est, "cliques", penalty) == shown + context


def test_estimate_reports_its_job_and_picks_the_fastest_placement() -> None:
    est = placement_estimate(S_16MB, 8, 8)
    assert (est.total_gpus, est.gpus_per_node, est.nodes, est.best) == (8, 8, 2, "intra-node")
    # Without NVLink (PCIe at 100 Gb/s) beside an 800 Gb/s network, two nodes beat one: "best" is the fastest
    # time, not the first placement that exists.
    slow_links = placement_estimate(16 * 2**20, 8, 8, Bandwidths(nvlink_gbps=100, network_gbps=800))
    assert slow_links.best == "intra-rack"
    assert slow_links.intra_rack_ratio == 1.0
    assert slow_links.intra_node_ms is not None and slow_links.intra_rack_ms is not None
    assert slow_links.intra_node_ratio == pytest.approx(slow_links.intra_node_ms / slow_links.intra_rack_ms)
    assert slow_links.intra_node_ratio > 1


def _hier(**kw: float) -> float:
    args: dict[str, float] = {"size_bytes": 1, "gpus_per_node": 8, "nodes": 2, "node_gbytes_per_s": 50.0,
                              "net_gbytes_per_s": 25.0}  # fmt: skip
    return hierarchical_allreduce_ms(**{**args, **kw})  # type: ignore[arg-type]


# Each check names the argument it refused; strict bounds refuse the bound itself (0 GB/s is no link).
@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: ring_allreduce_ms(1, 0, 50.0), "ranks must be a whole number ≥ 1, got 0"),
        (lambda: ring_allreduce_ms(-1, 8, 50.0), "size_bytes must be ≥ 0, got -1"),
        (lambda: ring_allreduce_ms(1, 8, 0.0), "link bandwidth must be > 0, got 0.0"),
        (lambda: ring_allreduce_ms(1, 8, math.nan), "link bandwidth must be a finite number, got nan"),
        (lambda: ring_allreduce_ms(1, 8, 50.0, alpha_us=-1), "alpha_us must be ≥ 0, got -1"),
        (lambda: _hier(size_bytes=-1), "size_bytes must be ≥ 0, got -1"),
        (lambda: _hier(gpus_per_node=0), "gpus_per_node must be a whole number ≥ 1, got 0"),
        (lambda: _hier(nodes=0), "nodes must be a whole number ≥ 1, got 0"),
        (lambda: _hier(node_gbytes_per_s=0.0), "node bandwidth must be > 0, got 0.0"),
        (lambda: _hier(net_gbytes_per_s=0.0), "network bandwidth must be > 0, got 0.0"),
        (lambda: _hier(alpha_node_us=-1), "alpha_node_us must be ≥ 0, got -1"),
        (lambda: _hier(alpha_net_us=-1), "alpha_net_us must be ≥ 0, got -1"),
        (lambda: _hier(oversubscription=0.5), "oversubscription must be ≥ 1, got 0.5"),
        (lambda: Bandwidths(nvlink_gbps=0), "nvlink_gbps must be > 0, got 0"),
        (lambda: Bandwidths(network_gbps=0), "network_gbps must be > 0, got 0"),
        (lambda: Bandwidths(cross_rack_oversubscription=0.9), "cross_rack_oversubscription must be ≥ 1, got 0.9"),
        (lambda: Bandwidths(alpha_nvlink_us=-1), "alpha_nvlink_us must be ≥ 0, got -1"),
        (lambda: Bandwidths(alpha_network_us=-1), "alpha_network_us must be ≥ 0, got -1"),
        (lambda: Bandwidths(cross_rack_hop_us=math.inf), "cross_rack_hop_us must be a finite number, got inf"),
        (lambda: placement_estimate(0, 8, 8), "message size must be a whole number of bytes ≥ 1, got 0"),
        (lambda: placement_estimate(True, 8, 8), "message size must be a whole number of bytes ≥ 1, got True"),
        (lambda: placement_estimate(1.5, 8, 8), "message size must be a whole number of bytes ≥ 1, got 1.5"),
        (lambda: placement_estimate(1, 0, 8), "total_gpus must be a whole number ≥ 1, got 0"),
        (lambda: placement_estimate(1, 8, 0), "gpus_per_node must be a whole number ≥ 1, got 0"),
        (lambda: algbw_gbytes_per_s(1, 0.0), "time_ms must be > 0, got 0.0"),
        (lambda: busbw_gbytes_per_s(1, 1.0, 0), "ranks must be a whole number ≥ 1, got 0"),
    ],
)
def test_bad_inputs_raise_value_error_naming_the_argument(call: object, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        call()  # type: ignore[operator]
    assert str(caught.value) == message


def test_nvlink_domain_penalty_by_hand() -> None:
    """16 ranks, NVLink 400 Gb/s (50 GB/s) and network 200 Gb/s (25 GB/s): in one clique a ring over all 16 on
    NVLink, 2·15/16·S/50 = 0.0375·S; over two cliques 2·7/8·S/50 + 2·1/2·S/(8·25) = 0.035·S + 0.005·S = 0.04·S:
    1.0667×. With GB200's NVLink 5 (7200 Gb/s = 900 GB/s): 1.875·S/900 vs 1.75·S/900 + S/200, 3.333×."""
    from policies.comm import Bandwidths, nvlink_domain_penalty

    size = 16 * 10**6
    assert nvlink_domain_penalty(size, 16) == pytest.approx(0.04 / 0.0375)
    assert nvlink_domain_penalty(size, 16, Bandwidths(nvlink_gbps=7200)) == pytest.approx(
        (1.75 / 900 + 1 / 200) / (1.875 / 900)
    )
    assert nvlink_domain_penalty(size, 2) == pytest.approx(2.0)  # one rank each side: NVLink vs the network
    assert nvlink_domain_penalty(size, 1) is None
