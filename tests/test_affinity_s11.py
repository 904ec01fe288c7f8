"""policies/affinity.py in process, for its mutants (session 11, issue #20): which label keys `expressions`
reads, so that `same_inputs` can tell an unchanged answer from a changed one."""

from __future__ import annotations

from policies.affinity import reads
from policies.gpulabels import (
    GKE_PARTITION,
    GKE_SHARING,
    MIG_LABEL_PREFIX,
    MIG_STRATEGY,
    PRODUCT,
    SHARING,
    SLICES_PREFIX,
)
from policies.topology import HOSTNAME


def test_the_label_keys_expressions_reads() -> None:
    for key in (SHARING, PRODUCT, MIG_STRATEGY, GKE_PARTITION, GKE_SHARING, HOSTNAME):
        assert reads(key), key
    assert reads(f"{MIG_LABEL_PREFIX}1g.10gb.count")
    assert reads(f"{SLICES_PREFIX}x")
    for key in ("app", "topology.kubernetes.io/zone", "nvidia.com/gpu.count", f"x{MIG_LABEL_PREFIX}1g.10gb.count"):
        assert not reads(key), key
