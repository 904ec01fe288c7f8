"""policies/topology.py, session 11 (issue #20): what the survivors of the mutation run showed no test pinned."""

from __future__ import annotations

from policies import topology


def test_a_level_domain_is_named_by_the_last_part_of_its_key() -> None:
    """Messages name a switch level that is not the rack by its key's name part; an on-prem key without a
    prefix (`spine` beside the `rack` label) is named whole."""
    rack = "topology.kubernetes.io/rack"
    assert topology.domain_text(topology.Level("spine", "switch", 2, 64, 8), rack) == "spine domain"
    assert topology.domains_text(topology.Level("spine", "switch", 2, 64, 8), rack) == "spine domains"
    layer2 = topology.Level("topology.k8s.aws/network-node-layer-2", "switch", 3, 16, 6)
    assert topology.domain_text(layer2, "topology.k8s.aws/network-node-layer-3") == "network-node-layer-2 domain"
    assert topology.domain_text(topology.Level(rack, "switch", 2, 16, 4), rack) == "rack"
