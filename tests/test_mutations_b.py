"""Mutation-testing gaps of policies/mutations.py (issue #20, session 11, second half of the module): behaviour
the golden cases cannot show, because it needs two reviews against one pod-view snapshot."""

from __future__ import annotations

from tests.test_placement import HELD, _gang_pod, bound_pod, capacity, run


def test_the_only_reserved_gpus_answer_is_kept_per_pod_size_on_one_snapshot() -> None:
    """The server reviews many pods against one pod-view snapshot, and `only_reserved_gpus` memoizes its answer
    there, keyed by what decides it. rack-big has one node with 4 GPUs free: an 8-GPU pod of a gang no rack holds
    could run only on rack-small's GPUs reserved for another gang (held), a 4-GPU pod of the same gang fits on
    that node (let through). The second answer is not the first one's, in either order."""
    half = capacity(*(bound_pod(f"b{i}", f"h100-big-{i}", 8 - 4 * (i == 1)) for i in (1, 2, 3, 4)))
    first = run(_gang_pod("g-1", 8, 32), half, (HELD,))
    assert not first.allowed and [d.rule for d in first.denials] == ["training-same-rack"]
    assert "fits only on GPUs reserved for another job's gang in rack rack-small" in first.denials[0].message
    assert run(_gang_pod("g-2", 4, 32), half, (HELD,)).allowed

    other = capacity(*(bound_pod(f"b{i}", f"h100-big-{i}", 8 - 4 * (i == 1)) for i in (1, 2, 3, 4)))
    assert run(_gang_pod("g-2", 4, 32), other, (HELD,)).allowed
    assert not run(_gang_pod("g-1", 8, 32), other, (HELD,)).allowed
