"""The all-reduce model's argument checks, `spread_ms`, `nvlink_domain_penalty` and `level_phrase` (session 11's
mutation survivors, issue #20). `tests/test_comm.py` pins the model itself; these pin what it refuses (a bool is
no number, a fraction of a byte no size), odd GPU counts split over two cliques, and the bandwidths each phrase
is computed with."""

from __future__ import annotations

import pytest

from policies.comm import (
    Bandwidths,
    level_phrase,
    nvlink_domain_penalty,
    placement_estimate,
    ring_allreduce_ms,
    spread_ms,
)

S = 16 * 10**6  # 16 MB: 16/50 GB/s = 0.32 ms


# --- what the checks refuse ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "message"),
    [
        # a bool is an int in Python, and no number here: refused before any bound is looked at
        (lambda: ring_allreduce_ms(True, 8, 50.0), "size_bytes must be a finite number, got True"),
        (lambda: ring_allreduce_ms(1, 8, 50.0, alpha_us=False), "alpha_us must be a finite number, got False"),
        (lambda: ring_allreduce_ms("1", 8, 50.0), "size_bytes must be a finite number, got '1'"),  # type: ignore[arg-type]
        (lambda: ring_allreduce_ms(1, True, 50.0), "ranks must be a whole number ≥ 1, got True"),
        (lambda: ring_allreduce_ms(1, 8.0, 50.0), "ranks must be a whole number ≥ 1, got 8.0"),  # type: ignore[arg-type]
        (lambda: ring_allreduce_ms(1, "8", 50.0), "ranks must be a whole number ≥ 1, got '8'"),  # type: ignore[arg-type]
        (lambda: spread_ms(0, (8,), False), "message size must be a whole number of bytes ≥ 1, got 0"),
        (lambda: spread_ms(True, (8,), False), "message size must be a whole number of bytes ≥ 1, got True"),
        (lambda: spread_ms(1.5, (8,), False), "message size must be a whole number of bytes ≥ 1, got 1.5"),  # type: ignore[arg-type]
        (lambda: spread_ms(1, (), False), "a placement needs at least one node"),
        (lambda: spread_ms(1, (8, 0), False), "GPUs on a node must be a whole number ≥ 1, got 0"),
        (lambda: nvlink_domain_penalty(S, 0), "total_gpus must be a whole number ≥ 1, got 0"),
    ],
)
def test_bad_inputs_are_refused_by_name(call: object, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        call()  # type: ignore[operator]
    assert str(caught.value) == message


def test_one_byte_is_a_message() -> None:
    """The smallest size spread_ms takes: 1 byte over one node of 2 GPUs, 2·1/2·1 B / 50 GB/s."""
    assert spread_ms(1, (2,), False) == pytest.approx(1 / 50e6)


# --- spread_ms ------------------------------------------------------------------------------------------------


def test_spread_ms_across_racks_pays_the_hop_latency_per_inter_node_step() -> None:
    """4 nodes: 2·3 inter-node steps, each 3 µs more across racks; non-blocking, so nothing else differs."""
    bw = Bandwidths(cross_rack_oversubscription=1.0, cross_rack_hop_us=3.0)
    inside = spread_ms(S, (8, 8, 8, 8), False, bw)
    across = spread_ms(S, (8, 8, 8, 8), True, bw)
    assert across - inside == pytest.approx(2 * 3 * 3.0 / 1e3)
    assert inside == pytest.approx(placement_estimate(S, 32, 8, bw).intra_rack_ms)
    assert across == pytest.approx(placement_estimate(S, 32, 8, bw).cross_rack_ms)


# --- nvlink_domain_penalty --------------------------------------------------------------------------------------


def test_an_odd_job_over_two_cliques_rounds_the_fuller_half_up_and_the_emptier_down() -> None:
    """3 ranks: in one clique a ring of 3 on NVLink, 2·2/3·S/50; over two cliques the fuller clique's 2 on NVLink
    (2·1/2·S/50) and the emptier clique's 1-GPU shard across the two (2·1/2·S/(1·25)): (S/50 + S/25) / (4/3·S/50)
    = 3/50 / (4/150) = 2.25×. Halves taken as 1.5 GPUs would give another figure."""
    assert nvlink_domain_penalty(S, 3) == pytest.approx(2.25)
    # 5 ranks: 2·4/5·S/50 in one; 2·2/3·S/50 + 2·1/2·S/(2·25) over two: (4/150 + 1/50) / (8/250)
    assert nvlink_domain_penalty(S, 5) == pytest.approx((4 / 150 + 1 / 50) / (8 / 250))


def test_an_empty_message_has_no_penalty() -> None:
    """Nothing to move and no latency: no time in one clique, no ratio to give (not a division by zero)."""
    assert nvlink_domain_penalty(0, 8) is None


# --- level_phrase ---------------------------------------------------------------------------------------------


def test_level_phrase_quotes_the_given_bandwidths_for_a_switch_level() -> None:
    """2 nodes of 8 at NVLink 100 GB/s and network 12.5 GB/s: in one rack 2·7/8·S/100 + S/8/12.5 = 0.0275·S; across
    racks the network gets 12.5/4: 0.0175·S + S/8/3.125 = 0.0575·S, 2.09× (the defaults give 1.1×)."""
    bw = Bandwidths(nvlink_gbps=800, network_gbps=100, cross_rack_oversubscription=4.0)
    assert level_phrase("switch", "racks", S, 16, 8, bw) == (
        "all-reduce ≈2.1× slower across racks than in one (16 MB, ring, 800/100 Gb/s, 4:1 oversub)"
    )


def test_level_phrase_computes_the_clique_penalty_with_the_given_bandwidths() -> None:
    """16 GPUs on GB200's NVLink 5 (7200 Gb/s): 3.3× over two cliques (test_comm's by-hand figure), 1.1× at the
    default 400 Gb/s."""
    bw = Bandwidths(nvlink_gbps=7200)
    assert level_phrase("nvlink", "NVLink cliques", S, 16, 4, bw) == (
        "all-reduce ≈3.3× slower across NVLink cliques than in one (16 MB, ring, 7200/200 Gb/s, 2:1 oversub)"
    )


@pytest.mark.parametrize("kind", ["nvlink", "switch"])
def test_a_one_gpu_job_has_no_cost_at_any_level(kind: str) -> None:
    assert level_phrase(kind, "NVLink cliques", S, 1, 4, Bandwidths()) == (
        "no all-reduce cost: a 1-GPU job does not communicate"
    )
