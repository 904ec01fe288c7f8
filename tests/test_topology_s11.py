"""policies/topology.py, session 11 (issue #20): what the survivors of the mutation run showed no test pinned."""

from __future__ import annotations

from policies import topology
from tests.test_topology_levels import build, nodes


def test_a_level_domain_is_named_by_the_last_part_of_its_key() -> None:
    """Messages name a switch level that is not the rack by its key's name part; an on-prem key without a
    prefix (`spine` beside the `rack` label) is named whole."""
    rack = "topology.kubernetes.io/rack"
    assert topology.domain_text(topology.Level("spine", "switch", 2, 64, 8), rack) == "spine domain"
    assert topology.domains_text(topology.Level("spine", "switch", 2, 64, 8), rack) == "spine domains"
    layer2 = topology.Level("topology.k8s.aws/network-node-layer-2", "switch", 3, 16, 6)
    assert topology.domain_text(layer2, "topology.k8s.aws/network-node-layer-3") == "network-node-layer-2 domain"
    assert topology.domain_text(topology.Level(rack, "switch", 2, 16, 4), rack) == "rack"


def test_an_empty_rack_label_is_no_fabric_and_does_not_make_the_zone_a_level() -> None:
    """GPU Operator nodes in one zone whose rack label is written empty (`topology.kubernetes.io/rack: ""`): no
    node is in a rack, so the zone alone is no level and the "no rack label" warning stays, as without the label.
    (The zone used to become the only level: mutants 9 and 13 of auto_keys showed it, session 11.)"""
    plain = build(nodes("gpu-operator-default"))
    objs = nodes("gpu-operator-default")
    for o in objs:
        o["metadata"]["labels"]["topology.kubernetes.io/rack"] = ""
    empty_rack = build(objs)
    assert empty_rack.levels == plain.levels == ()
    assert empty_rack.rack_label is None and plain.rack_label is None
    assert empty_rack.warnings == plain.warnings
    assert len(plain.warnings) == 1 and plain.warnings[0].startswith("no GPU node carries a rack label")
    # The same on GB200 trays whose clique label is empty: no NVLink domain, no level at all.
    gb = nodes("gb200-nvl72")
    for o in gb:
        o["metadata"]["labels"]["nvidia.com/gpu.clique"] = ""
        del o["metadata"]["labels"]["topology.kubernetes.io/rack"]
    assert build(gb).levels == ()


def test_rack_or_finer_takes_the_rack_labels_family_up_to_it_and_no_further() -> None:
    """Topograph's tier-0 is the leaf: tier-1 and above are coarser than a rack. EKS's layer-3 (three-layer
    instances) has layer-4 below it, and layer-2 above."""
    tier = "fabric.topograph.run/tier-"
    keys = topology.rack_or_finer(tier + "0")
    assert tier + "0" in keys and not {tier + "1", tier + "2", tier + "3"} & keys
    eks = "topology.k8s.aws/network-node-layer-"
    keys = topology.rack_or_finer(eks + "3")
    assert {eks + "4", eks + "3"} <= keys and not {eks + "2", eks + "1"} & keys
