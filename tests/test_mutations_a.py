"""Unit tests of `policies/mutations.py` helpers whose every branch the golden cases do not reach (issue #20).

`_level_factor` is the all-reduce factor the prefer fallback's warning quotes ("all-reduce ≈1.4× slower split").
The golden cases pin it at one job size on 8-GPU nodes; these pin what it reads: the level's kind, the job's
GPUs (at least two), the GPUs a node has (8 when no node has whole cards) and the policy's bandwidths.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import yaml

from policies import comm
from policies import inventory as inventory_mod
from policies.document import Policy, compile_policy, default_policy_text
from policies.engine import ReviewContext, review
from policies.mutations import _level_factor, domain_level
from policies.placement import Capacity
from policies.topology import Level

RACK = Level("topology.kubernetes.io/rack", "switch", 2, 32, 4)
ZONE = Level("topology.kubernetes.io/zone", "zone", 2, 64, 8)
CLIQUE = Level("nvidia.com/gpu.clique", "nvlink", 2, 32, 4)


def _policy(network_gbps: int = 50) -> Policy:
    doc = yaml.safe_load(default_policy_text())
    doc["comm"]["networkGbps"] = network_gbps
    return compile_policy(doc)


def _subject(gpus: int, per_node: int, policy: Policy) -> Any:
    """What `_level_factor` reads of a Subject: the policy, the job's GPUs, the largest whole-card node."""
    job, inventory = SimpleNamespace(gpus=gpus), SimpleNamespace(max_whole_gpus=per_node)
    return SimpleNamespace(policy=policy, job=job, inventory=inventory)


def _cross_rack(policy: Policy, gpus: int, per_node: int) -> float:
    c = policy.comm
    penalty = comm.placement_estimate(c.message_bytes, gpus, per_node, c.bandwidths()).cross_rack_penalty
    assert penalty is not None
    return penalty


def _two_cliques(policy: Policy, gpus: int) -> float:
    c = policy.comm
    penalty = comm.nvlink_domain_penalty(c.message_bytes, gpus, c.bandwidths())
    assert penalty is not None
    return penalty


def test_over_two_racks_or_zones_the_factor_is_the_cross_rack_penalty_at_the_policys_network_and_node_size() -> None:
    policy = _policy(50)
    want = _cross_rack(policy, 12, 4)
    for level in (RACK, ZONE):
        assert _level_factor(_subject(12, 4, policy), level) == want
    # The three inputs each change the figure here, so reading any of them wrong shows.
    assert want != _cross_rack(policy, 12, 8)  # the node size read (not always 8)
    assert want != _cross_rack(_policy(200), 12, 4)  # the policy's network (not the default bandwidths)
    assert want != _two_cliques(policy, 12)  # a rack is no NVLink domain


def test_over_two_nvlink_cliques_the_factor_is_the_nvlink_domain_penalty_at_the_policys_network() -> None:
    policy = _policy(50)
    want = _two_cliques(policy, 16)
    assert _level_factor(_subject(16, 8, policy), CLIQUE) == want
    # The NVLink key a ComputeDomain job is kept at where cliques are no level (job_domain) reads as an NVLink
    # level of unknown size; no key is no level, costed as racks.
    s = _subject(16, 8, policy)
    s.inventory.levels = (RACK,)
    stand_in = domain_level(s, CLIQUE.key)
    assert stand_in is not None and (stand_in.key, stand_in.kind) == (CLIQUE.key, "nvlink")
    assert _level_factor(s, stand_in) == want
    assert domain_level(s, RACK.key) is RACK
    assert domain_level(s, None) is None and _level_factor(s, None) == _cross_rack(policy, 16, 8)
    assert want != _two_cliques(_policy(200), 16)
    assert want != _cross_rack(policy, 16, 8)


def test_a_job_of_fewer_than_two_known_gpus_is_costed_as_two() -> None:
    policy = _policy(50)
    for gpus in (0, 1, 2):
        assert _level_factor(_subject(gpus, 8, policy), RACK) == _cross_rack(policy, 2, 8)
        assert _level_factor(_subject(gpus, 8, policy), CLIQUE) == _two_cliques(policy, 2)
    assert _cross_rack(policy, 2, 8) != _cross_rack(policy, 3, 8)
    assert _two_cliques(policy, 2) != _two_cliques(policy, 3)


def test_with_no_whole_card_node_a_node_is_taken_to_have_8_gpus() -> None:
    policy = _policy(50)
    # 17 GPUs: three 8-GPU nodes, but two 9-GPU ones.
    assert _level_factor(_subject(17, 0, policy), RACK) == _cross_rack(policy, 17, 8)
    assert _cross_rack(policy, 17, 8) != _cross_rack(policy, 17, 9)


def test_a_rack_chosen_before_the_pod_view_synced_is_said_to_be_by_allocatable_only() -> None:
    """training-rack with a pod view that has not synced yet (the server just started): the domain is chosen by
    allocatable only, and the warning says so in these words."""
    root = Path(__file__).resolve().parent.parent
    nodes = yaml.safe_load((root / "examples" / "placement" / "racks.yaml").read_text())["items"]
    policy = compile_policy(yaml.safe_load(default_policy_text()))
    job = yaml.safe_load((root / "examples" / "placement" / "job-4x8.yaml").read_text())
    ctx = ReviewContext(namespace="ml-research", capacity=Capacity({}, {}, synced=False))
    r = review(job, policy=policy, inventory=inventory_mod.build(nodes, policy), ctx=ctx)
    assert r.allowed and "training-rack" in r.mutations
    note = "placement: pod view not synced yet: domain chosen by allocatable only, not free GPUs"
    assert note in r.warnings, r.warnings
