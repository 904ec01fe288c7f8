"""Gang-safe placement (issue #11): the pure chooser (policies/placement.py), the engine's use of it through
training-rack and training-same-rack, the pod view (cluster/pods.py) and the server's reservations.

The cluster is examples/placement/racks.yaml: rack-big (4 nodes x 8 H100) and rack-small (2 nodes x 8)."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.pods import PodView
from cluster.reflector import Change
from policies import inventory as inventory_mod
from policies import placement
from policies.document import compile_policy, default_policy
from policies.engine import Placement, Review, ReviewContext, review
from policies.placement import Capacity, Reservation, decide, group, place, shortfall
from policies.subject import pod_facts
from webhook.reservations import Reservations
from webhook.state import capacity_of

ROOT = Path(__file__).resolve().parent.parent
EX = ROOT / "examples" / "placement"
RACK = "topology.kubernetes.io/rack"


def load(name: str) -> list[dict[str, Any]]:
    doc = yaml.safe_load((EX / name).read_text())
    return list(doc["items"]) if doc.get("kind") == "List" else [doc]


NODES = load("racks.yaml")
INV = inventory_mod.build(NODES, default_policy())


def job(name: str, pods: int, gpus: int) -> dict[str, Any]:
    obj = copy.deepcopy(load("job-4x8.yaml")[0])
    obj["metadata"]["name"] = name
    obj["spec"].update(completions=pods, parallelism=pods)
    obj["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = str(gpus)
    return obj


def bound_pod(name: str, node: str, gpus: int, job_name: str | None = None, phase: str = "Running") -> dict[str, Any]:
    labels = {"batch.kubernetes.io/job-name": job_name} if job_name else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml-research", "labels": labels, "resourceVersion": "1"},
        "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": gpus}}}]},
        "status": {"phase": phase},
    }


def capacity(*pods: dict[str, Any]) -> Capacity:
    view = PodView(pod_facts)
    view.load({f"{p['metadata']['namespace']}/{p['metadata']['name']}": p for p in pods})
    return capacity_of(view.snapshot())


def run(obj: dict[str, Any], cap: Capacity | None, reservations: tuple[Reservation, ...] = (), **pol: Any) -> Review:
    policy = compile_policy({**yaml.safe_load(_default_text()), **pol})
    ctx = ReviewContext(namespace="ml-research", capacity=cap, reservations=reservations)
    return review(obj, policy=policy, inventory=INV, ctx=ctx)


def _default_text() -> str:
    return (ROOT / "policies" / "default-policy.yaml").read_text()


def rack_terms(obj: dict[str, Any]) -> dict[str, Any]:
    """The rack-related scheduling terms of the (first) pod template."""
    spec = obj["spec"]["template"]["spec"] if obj["kind"] != "Pod" else obj["spec"]
    aff = spec.get("affinity", {})
    req = aff.get("nodeAffinity", {}).get("requiredDuringSchedulingIgnoredDuringExecution", {})
    exprs = [e for t in req.get("nodeSelectorTerms", []) for e in t["matchExpressions"] if e["key"] == RACK]
    pref = aff.get("nodeAffinity", {}).get("preferredDuringSchedulingIgnoredDuringExecution", [])
    return {
        "required_racks": [v for e in exprs for v in e["values"]],
        "preferred_racks": [v for t in pref for e in t["preference"]["matchExpressions"] for v in e["values"]],
        "pod_affinity_required": bool(aff.get("podAffinity", {}).get("requiredDuringSchedulingIgnoredDuringExecution")),
        "pod_affinity_preferred": bool(
            aff.get("podAffinity", {}).get("preferredDuringSchedulingIgnoredDuringExecution")
        ),
    }


# --- the pure chooser ----------------------------------------------------------------------------------------


def test_place_is_best_fit_decreasing_in_pod_sized_pieces() -> None:
    assert place((8, 8, 8, 8), (8, 8, 8, 8)) == (0, 0, 0, 0)
    assert place((8, 8), (8, 8, 8, 8)) is None
    assert place((4, 4, 4, 4), (8,)) is None  # 16 free GPUs, but no node takes an 8-GPU pod
    assert place((12, 4), (8, 4, 4)) == (0, 0)  # best fit keeps the 12-GPU node for the large pod
    assert placement.pieces((12, 4, 7), 4) == 5
    assert place((8, 8, 8, 8), (4, 4, 4, 4)) == (0, 0, 8, 8)


def test_a_reservation_is_counted_per_node_in_pod_sized_pieces() -> None:
    """rack-big reserved for 4x4-GPU pods: packed like any gang (training-node-pack packs them), they leave two
    whole 8-GPU nodes there, so a 2x8 gang still fits; a third 8-GPU pod would not."""
    cap = capacity(bound_pod("x", "h100-small-1", 1))  # rack-small cannot take 2x8 now
    held = Reservation("ns/j=first", RACK, "rack-big", (4, 4, 4, 4))
    d = decide(group(INV.nodes, RACK, cap), RACK, (8, 8), cap, (held,), "ns/j=second")
    assert d is not None and (d.source, d.domain) == (placement.BEST_FIT, "rack-big")
    d = decide(group(INV.nodes, RACK, cap), RACK, (8, 8, 8), cap, (held,), "ns/j=second")
    assert d is not None and d.source == placement.NONE_FITS_NOW
    rooms = {r.domain: r for r in placement.rooms(group(INV.nodes, RACK, cap), (8,), (held,))}
    assert rooms["rack-big"].fits and (rooms["rack-big"].pieces, rooms["rack-big"].free_gpus) == (2, 16)
    assert placement.after_reservations((8, 8, 2), "r", (Reservation("j", RACK, "r", (8, 8, 8)),)) == (0, 0, 0)


def test_shortfall_counts_the_gpus_that_must_free_up() -> None:
    assert shortfall((4, 4, 4, 4), (8, 8, 8, 8), (8, 8, 8)) == 12  # three nodes each need 4 more
    assert shortfall((0, 8), (8, 8), (8, 8)) == 8
    assert shortfall((8, 8), (8, 8), (8,)) == 0


def test_static_rule_excludes_a_rack_whose_allocatable_cannot_hold_the_gang() -> None:
    nodes = group(INV.nodes, RACK, None)
    d = decide(nodes, RACK, (8, 8, 8, 8), None, (), "ns/j=a")
    assert d is not None and d.source == placement.STATIC and d.eligible == ("rack-big",) and d.domain is None
    d = decide(nodes, RACK, (8, 8), None, (), "ns/j=a")
    assert d is not None and d.eligible == ("rack-big", "rack-small")
    d = decide(nodes, RACK, (8,) * 5, None, (), "ns/j=a")
    assert d is not None and d.source == placement.NEVER_FITS


def test_best_fit_takes_the_rack_with_least_room_that_still_holds_the_gang() -> None:
    cap = capacity()
    d = decide(group(INV.nodes, RACK, cap), RACK, (8, 8), cap, (), "ns/j=a")
    assert d is not None and (d.source, d.domain) == (placement.BEST_FIT, "rack-small")  # 2 pieces < 4
    # rack-small busy: only rack-big holds it now
    cap = capacity(bound_pod("x", "h100-small-1", 1))
    d = decide(group(INV.nodes, RACK, cap), RACK, (8, 8), cap, (), "ns/j=a")
    assert d is not None and d.domain == "rack-big"


def test_ties_are_broken_by_name_deterministically() -> None:
    cap = capacity(bound_pod("a", "h100-big-1", 8), bound_pod("b", "h100-big-2", 8))  # both racks: 2 pieces
    nodes = group(INV.nodes, RACK, cap)
    answers = {decide(nodes, RACK, (8, 8), cap, (), "ns/j=a").domain for _ in range(5)}  # type: ignore[union-attr]
    assert answers == {"rack-big"}


def test_nothing_fits_now_names_the_roomiest_and_the_closest_rack() -> None:
    cap = capacity(*(bound_pod(f"b{i}", f"h100-big-{i}", 4) for i in range(1, 5)))
    d = decide(group(INV.nodes, RACK, cap), RACK, (4,) * 6, cap, (), "ns/j=a")
    assert d is not None and d.source == placement.NONE_FITS_NOW and d.domain is None
    assert d.roomiest == "rack-big"  # 4 pieces of 4 GPUs each rack: tie, first name
    assert (d.closest, d.shortfall) == ("rack-big", 8)  # two more 4-GPU pieces


def test_others_reservations_take_their_gpus_and_the_jobs_own_is_reused() -> None:
    cap = capacity()
    nodes = group(INV.nodes, RACK, cap)
    held = Reservation("ns/j=first", RACK, "rack-big", (8, 8, 8, 8))
    d = decide(nodes, RACK, (8, 8, 8, 8), cap, (held,), "ns/j=second")
    assert d is not None and d.source == placement.NONE_FITS_NOW  # rack-big is promised to the first job
    d = decide(nodes, RACK, (8, 8, 8, 8), cap, (held,), "ns/j=first")
    assert d is not None and (d.source, d.domain) == (placement.RESERVED, "rack-big")


def test_bound_peers_decide_for_pods_of_an_unpinned_job_where_the_rest_still_fits() -> None:
    job_id = "ml-research/batch.kubernetes.io/job-name=j"
    cap = capacity(bound_pod("w0", "h100-small-1", 8, job_name="j"))
    d = decide(group(INV.nodes, RACK, cap), RACK, (), cap, (), job_id)
    assert d is not None and (d.source, d.domain) == (placement.PEERS, "rack-small")
    d = decide(group(INV.nodes, RACK, cap), RACK, (8, 8), cap, (), job_id)
    assert d is not None and (d.source, d.domain) == (placement.PEERS, "rack-small")
    # a job that had to spread: its 3 other pods do not fit next to the first, so they are not pinned there
    d = decide(group(INV.nodes, RACK, cap), RACK, (8, 8, 8, 8), cap, (), job_id)
    assert d is not None and d.source != placement.PEERS


# --- the engine: training-rack and training-same-rack ----------------------------------------------------------


def test_without_a_pod_view_the_mutation_names_the_eligible_racks() -> None:
    r = run(job("j", 4, 8), None)
    assert r.allowed and "training-rack" in r.mutations and r.placement is None
    terms = rack_terms(r.object)
    assert terms["required_racks"] == ["rack-big"] and terms["pod_affinity_required"]


def test_with_a_pod_view_the_gang_is_pinned_to_one_rack_and_reported_for_reservation() -> None:
    r = run(job("j", 2, 8), capacity())
    assert rack_terms(r.object)["required_racks"] == ["rack-small"]
    assert r.placement == Placement("ml-research/batch.kubernetes.io/job-name=j", RACK, "rack-small", (8, 8))


def test_prefer_when_no_rack_fits_now_adds_no_required_term_and_warns() -> None:
    cap = capacity(*(bound_pod(f"b{i}", f"h100-big-{i}", 4) for i in range(1, 5)))
    r = run(job("j", 6, 4), cap)
    terms = rack_terms(r.object)
    assert r.allowed and r.placement is None
    assert terms == {
        "required_racks": [],
        "preferred_racks": ["rack-big"],
        "pod_affinity_required": False,
        "pod_affinity_preferred": True,
    }
    assert any(w.startswith("placement: no rack holds the 24-GPU job now") and "slower" in w for w in r.warnings)
    # validated on its own (the /validate call on the stored template): training-same-rack accepts it
    again = review(r.object, policy=default_policy(), inventory=INV, ctx=ReviewContext(capacity=cap), mutate=False)
    assert again.allowed, again.denials


def test_deny_when_no_rack_fits_now_says_which_rack_would_fit_and_when() -> None:
    cap = capacity(*(bound_pod(f"b{i}", f"h100-big-{i}", 4) for i in range(1, 5)))
    r = run(job("j", 6, 4), cap, placement={"whenNoDomainFits": "deny"})
    assert not r.allowed and [d.rule for d in r.denials] == ["training-same-rack"]
    msg = r.denials[0].message
    assert "no rack (topology.kubernetes.io/rack) has room for the 24-GPU job (6x4 GPUs) now" in msg
    assert "rack-big would once 8 more GPUs free up there" in msg and "\n" not in msg
    assert rack_terms(r.object)["preferred_racks"] == []


def test_prefer_terms_without_the_fallback_condition_are_not_a_rack_constraint() -> None:
    """A user's own preferred affinity is no excuse: with room in a rack, the rule still wants a required term."""
    cap = capacity()
    r = run(job("j", 2, 8), cap, mutations={"training-rack": False})
    assert [d.rule for d in r.denials] == ["training-same-rack"]


def test_a_job_no_rack_can_ever_hold_goes_to_the_zone_and_one_no_level_holds_gets_no_required_term() -> None:
    r = run(job("j", 5, 8), capacity())  # 40 GPUs > rack-big's 32, within the zone's 48 (#12's levels)
    assert "training-rack" in r.mutations and r.allowed
    affinity = r.object["spec"]["template"]["spec"]["affinity"]
    terms = affinity["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert [t["topologyKey"] for t in terms] == ["topology.kubernetes.io/zone"]
    r = run(job("j", 7, 8), capacity())  # 56 GPUs > the zone's 48: a required term would strand it
    assert "training-rack" not in r.mutations and r.allowed


def test_mutated_template_is_stable_under_a_second_pass() -> None:
    cap = capacity()
    first = run(job("j", 4, 8), cap)
    second = run(first.object, cap)
    assert second.patch == () and second.mutations == ()


def test_one_pod_indexed_job_pod_gets_no_same_rack_term() -> None:
    pod = bound_pod("j-0-abc", "", 8, job_name="j")
    pod["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] = "0"
    pod["metadata"]["annotations"] = {"gpu-admission.io/job-gpus": "8"}
    r = review(pod, policy=default_policy(), inventory=INV)
    assert "training-rack" not in r.mutations and r.allowed


def test_bare_pods_of_one_job_all_get_the_rack_chosen_for_the_first() -> None:
    cap = capacity()
    store = Reservations(clock=lambda: 0.0)
    racks = []
    for i in range(2):
        pod = bound_pod(f"w{i}", "", 8, job_name="j")
        pod["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] = str(i)
        pod["metadata"]["annotations"] = {"gpu-admission.io/job-gpus": "16"}
        r = run(pod, cap, store.active())
        if r.placement is not None:
            store.record(r.placement, 60)
        racks.append(rack_terms(r.object)["required_racks"])
    assert racks == [["rack-small"], ["rack-small"]]


def test_a_placement_is_reused_across_heartbeats_and_redone_when_a_rack_changes() -> None:
    """The decision is memoised per topology epoch (a storm of heartbeats makes a version per batch and
    grouping is O(candidates)); a version that moves a node to another rack starts a new epoch."""
    cap, pol = capacity(), default_policy()
    ctx = ReviewContext(namespace="ml-research", capacity=cap)
    first = review(job("j", 2, 8), policy=pol, inventory=INV, ctx=ctx).placement

    def changed(name: str, rack: str) -> inventory_mod.Inventory:
        obj = copy.deepcopy(next(n for n in NODES if n["metadata"]["name"] == name))
        obj["metadata"]["labels"][RACK] = rack
        obj["metadata"]["labels"]["health"] = "ok"  # a label no level reads
        return INV.apply({name: inventory_mod.node_from_object(obj, pol.pools)})

    beat = changed("h100-small-1", "rack-small")
    assert beat.topology_epoch is INV.topology_epoch and beat is not INV
    assert review(job("j", 2, 8), policy=pol, inventory=beat, ctx=ctx).placement == first
    moved = changed("h100-small-1", "rack-big")  # rack-small keeps one node: it can no longer hold 2 x 8
    assert moved.topology_epoch is not INV.topology_epoch
    again = review(job("j", 2, 8), policy=pol, inventory=moved, ctx=ctx).placement
    assert first is not None and again is not None
    assert (first.domain, again.domain) == ("rack-small", "rack-big")


def test_a_pinned_gang_of_pods_smaller_than_a_node_is_packed_as_its_reservation_is_counted() -> None:
    r = run(job("j", 6, 4), capacity())
    assert rack_terms(r.object)["required_racks"] == ["rack-big"] and "training-node-pack" in r.mutations
    pref = r.object["spec"]["template"]["spec"]["affinity"]["podAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    assert [t["podAffinityTerm"]["topologyKey"] for t in pref] == ["kubernetes.io/hostname"]
    # 8-GPU pods fill their nodes anyway, and an unpinned gang (no view) is not asked to pack
    assert "training-node-pack" not in run(job("j", 4, 8), capacity()).mutations
    assert "training-node-pack" not in run(job("j", 6, 4), None).mutations


# --- keeping other pods off reserved GPUs ------------------------------------------------------------------------

HELD = Reservation("ml-research/batch.kubernetes.io/job-name=held", RACK, "rack-small", (8, 8))


def test_keep_off_avoids_a_reserved_rack_only_where_a_pod_could_break_the_reservation() -> None:
    nodes = group(INV.nodes, RACK, capacity())
    k = placement.keep_off(nodes, RACK, (4,), (HELD,), "ns/other")
    assert k == placement.KeepOff(RACK, ("rack-small",), True)
    assert placement.keep_off(nodes, RACK, (4,), (HELD,), HELD.job) is None  # its own job's pods
    # rack-big reserved for 2x8: a 4-GPU pod anywhere there leaves two whole nodes, nothing at risk
    big = Reservation("ns/j=big", RACK, "rack-big", (8, 8))
    assert placement.keep_off(nodes, RACK, (4,), (big,), "ns/other") is None
    # ... but for 4x8, the pod on any node leaves three: rack-big is avoided
    big3 = Reservation("ns/j=big", RACK, "rack-big", (8, 8, 8, 8))
    assert placement.keep_off(nodes, RACK, (4,), (big3,), "ns/other") == placement.KeepOff(RACK, ("rack-big",), True)


def test_keep_off_is_required_only_when_the_pod_and_its_unbound_gang_fit_elsewhere_now() -> None:
    cap = capacity(bound_pod("a", "h100-big-1", 6), *(bound_pod(f"b{i}", f"h100-big-{i}", 8) for i in (2, 3, 4)))
    nodes = group(INV.nodes, RACK, cap)  # rack-big: 2 GPUs free on one node
    assert placement.keep_off(nodes, RACK, (2,), (HELD,), None) == placement.KeepOff(RACK, ("rack-small",), True)
    assert placement.keep_off(nodes, RACK, (2, 2), (HELD,), None) == placement.KeepOff(RACK, ("rack-small",), False)
    assert placement.keep_off(nodes, RACK, (4,), (HELD,), None) is None  # only reserved GPUs could take it


def test_only_reserved_names_the_reserved_racks_when_every_node_with_room_would_break_a_reservation() -> None:
    full_big = capacity(*(bound_pod(f"b{i}", f"h100-big-{i}", 8) for i in (1, 2, 3, 4)))
    nodes = group(INV.nodes, RACK, full_big)  # rack-big full, rack-small empty and reserved for 2x8
    assert placement.only_reserved(nodes, RACK, 8, (HELD,), "ns/g") == ("rack-small",)
    assert placement.only_reserved(nodes, RACK, 1, (HELD,), "ns/g") == ("rack-small",)  # any GPU breaks 2x8
    assert placement.only_reserved(nodes, RACK, 8, (HELD,), HELD.job) == ()  # its own job's pods
    assert placement.only_reserved(nodes, RACK, 8, (), "ns/g") == ()
    assert placement.only_reserved(nodes, RACK, 0, (HELD,), "ns/g") == ()
    one = Reservation(HELD.job, RACK, "rack-small", (8,))  # the other small node takes the pod harmlessly
    assert placement.only_reserved(nodes, RACK, 8, (one,), "ns/g") == ()
    other_key = Reservation(HELD.job, "zone", "rack-small", (8, 8))
    assert placement.only_reserved(nodes, RACK, 8, (other_key,), "ns/g") == ()
    # a node elsewhere with room for the pod: it can run without harm (4 GPUs yes, 8 no)
    room = group(
        INV.nodes, RACK, capacity(*(bound_pod(f"b{i}", f"h100-big-{i}", 8 - 4 * (i == 1)) for i in (1, 2, 3, 4)))
    )
    assert placement.only_reserved(room, RACK, 4, (HELD,), "ns/g") == ()
    assert placement.only_reserved(room, RACK, 8, (HELD,), "ns/g") == ("rack-small",)
    # no node takes the pod at all: it waits anyway, nothing to hold
    assert placement.only_reserved(nodes, RACK, 9, (HELD,), "ns/g") == ()


def _gang_pod(name: str, gpus: int, job_gpus: int) -> dict[str, Any]:
    pod = bound_pod(name, "", gpus, job_name="g")
    pod["metadata"]["annotations"] = {"gpu-admission.io/job-gpus": str(job_gpus)}
    pod["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] = "1"  # an Indexed Job's: training
    return pod


def test_a_pod_of_a_gang_no_rack_holds_is_held_while_only_reserved_gpus_could_take_it() -> None:
    """The partial-gang race of the placement benchmark: a gang no rack holds (the `prefer` fallback) and a
    pinned gang's reservation; the former's pod that could run only on the reserved GPUs is denied (its Job's
    controller retries) instead of leaving both gangs partly placed."""
    full_big = capacity(*(bound_pod(f"b{i}", f"h100-big-{i}", 8) for i in (1, 2, 3, 4)))
    r = run(_gang_pod("g-1", 8, 32), full_big, (HELD,))
    assert not r.allowed and [d.rule for d in r.denials] == ["training-same-rack"]
    assert r.denials[0].message == (
        "training-same-rack: no rack holds the 32-GPU job now, and this 8-GPU pod fits only on GPUs reserved for "
        "another job's gang in rack rack-small: held until that gang binds (at most placement.reservationSeconds, "
        "120 s). Fix: none for a Job's pods (its controller retries creating them); retry shortly otherwise"
    )
    # the same pod without the reservation, or with a node elsewhere that takes it, is let through (prefer)
    assert run(_gang_pod("g-1", 8, 32), full_big, ()).allowed
    half = capacity(*(bound_pod(f"b{i}", f"h100-big-{i}", 8 - 4 * (i == 1)) for i in (1, 2, 3, 4)))
    assert run(_gang_pod("g-1", 4, 32), half, (HELD,)).allowed
    # the reserved job's own pods, a template (its pods are reviewed when created), no synced view: not held
    own = _gang_pod("held-1", 8, 16)
    own["metadata"]["labels"]["batch.kubernetes.io/job-name"] = "held"
    assert run(own, full_big, (HELD,)).allowed
    assert run(job("g", 4, 8), full_big, (HELD,)).allowed
    unsynced = capacity_of(PodView(pod_facts).snapshot())
    assert run(_gang_pod("g-1", 8, 32), unsynced, (HELD,)).allowed
    # deny instead of prefer: the job was refused at admission already; its pods get that rule's denial
    denied = run(_gang_pod("g-1", 8, 32), full_big, (HELD,), placement={"whenNoDomainFits": "deny"})
    assert "no rack (topology.kubernetes.io/rack) has room" in denied.denials[0].message


def test_a_pod_created_during_a_reservation_gets_required_not_in_and_a_second_pass_adds_nothing() -> None:
    pod = bound_pod("p", "", 4)
    r = run(pod, capacity(), (HELD,))
    assert r.mutations == ("reserved-keep-off",)
    req = r.object["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert req["nodeSelectorTerms"] == [
        {"matchExpressions": [{"key": RACK, "operator": "NotIn", "values": ["rack-small"]}]}
    ]
    assert run(r.object, capacity(), (HELD,)).mutations == ()
    # no pod view synced, no reservation, or a template (its pods are reviewed when created): nothing
    assert run(pod, None, (HELD,)).mutations == ()
    assert run(pod, capacity(), ()).mutations == ()
    unsynced = capacity_of(PodView(pod_facts).snapshot())
    assert not unsynced.synced and run(pod, unsynced, (HELD,)).mutations == ()


def test_a_pinned_jobs_later_pod_reserves_the_jobs_unbound_pods_again() -> None:
    """A pod of a job pinned to rack-big, created when the job holds no reservation (expired, or a pod is
    replaced): the job's pods not yet bound are reserved again, so other pods are kept off their GPUs."""
    jid = "ml-research/batch.kubernetes.io/job-name=j"
    cap = capacity(bound_pod("j-0", "h100-big-1", 8, "j"), bound_pod("j-1", "h100-big-2", 8, "j"))
    pod = bound_pod("j-2", "", 8, job_name="j")
    pod["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] = "2"
    pod["metadata"]["annotations"] = {"gpu-admission.io/job-gpus": "32"}
    pin = {"matchExpressions": [{"key": RACK, "operator": "In", "values": ["rack-big"]}]}
    pod["spec"]["affinity"] = {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [pin]}}
    }
    assert run(pod, cap).placement == Placement(jid, RACK, "rack-big", (8, 8), renewed=True)
    assert run(pod, cap, (Reservation(jid, RACK, "rack-big", (8,)),)).placement is None  # still reserved
    assert run(pod, None).placement is None  # no pod view: nothing to count against
    # a bare pod of the job without the pin: training-rack joins its bound peers, and that pin is reserved too
    unpinned = copy.deepcopy(pod)
    del unpinned["spec"]["affinity"]
    r = run(unpinned, cap)
    assert rack_terms(r.object)["required_racks"] == ["rack-big"]
    assert r.placement == Placement(jid, RACK, "rack-big", (8, 8), renewed=True)


# --- the pod view ------------------------------------------------------------------------------------------------


def test_pod_view_counts_bound_gpu_pods_and_frees_them_when_they_end() -> None:
    view = PodView(pod_facts)
    p = bound_pod("a", "h100-big-1", 4, job_name="j")
    view.apply(Change("ADDED", "ml-research/a", None, p))
    assert view.snapshot().used_of("nvidia.com/gpu") == {"h100-big-1": 4}
    assert dict(view.snapshot().jobs) == {"ml-research/batch.kubernetes.io/job-name=j": {"h100-big-1": 1}}
    done = copy.deepcopy(p)
    done["status"]["phase"] = "Succeeded"
    view.apply(Change("MODIFIED", "ml-research/a", p, done))
    assert view.snapshot().used_of("nvidia.com/gpu") == {} and view.snapshot().jobs == {}
    view.apply(Change("MODIFIED", "ml-research/a", done, p))
    view.apply(Change("DELETED", "ml-research/a", p, None))
    assert view.snapshot().used == {} and view.snapshot().pods == 0


def test_pod_view_unbound_pods_hold_nothing_until_bound() -> None:
    view = PodView(pod_facts)
    pending = bound_pod("a", "", 8)
    view.apply(Change("ADDED", "k", None, pending))
    assert view.snapshot().used == {}
    view.apply(Change("MODIFIED", "k", pending, bound_pod("a", "h100-small-2", 8)))
    assert view.snapshot().used_of("nvidia.com/gpu") == {"h100-small-2": 8}


@pytest.mark.parametrize(
    "garbage",
    [
        "not a pod",
        {"metadata": {}, "spec": []},
        {"metadata": {}, "spec": {"nodeName": 7, "containers": [{"resources": {"limits": {"nvidia.com/gpu": 1}}}]}},
        {"metadata": {}, "spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": 1}}}]}, "status": 3},
    ],
)
def test_pod_view_skips_garbage_and_counts_it(garbage: Any) -> None:
    view = PodView(pod_facts)
    view.apply(Change("ADDED", "k", None, bound_pod("a", "h100-big-1", 4)))
    view.apply(Change("MODIFIED", "k", None, garbage))  # the key's earlier entry is forgotten
    view.apply(Change("ADDED", "k2", None, bound_pod("b", "h100-big-2", 2)))
    snap = view.snapshot()
    assert snap.skipped == 1 and snap.used_of("nvidia.com/gpu") == {"h100-big-2": 2}


def test_pod_view_snapshot_is_rebuilt_only_after_a_change() -> None:
    view = PodView(pod_facts)
    view.apply(Change("SYNCED", "", None, None))
    first = view.snapshot()
    assert first.synced and view.snapshot() is first
    view.apply(Change("ADDED", "k", None, bound_pod("a", "h100-big-1", 4)))
    assert view.snapshot() is not first and view.snapshot().version > first.version


def test_a_view_fed_entries_counts_what_a_view_fed_objects_counts() -> None:
    """The Reflector hands the view PodEntries (its transform); `check --pods` and tests hand it objects."""
    pods = [bound_pod("a", "h100-big-1", 4, job_name="j"), bound_pod("b", "", 8), bound_pod("c", "h100-big-2", 2)]
    pods[0]["spec"]["containers"][0]["env"] = [{"name": "X", "value": "y" * 1000}]
    by_object, by_entry = PodView(pod_facts), PodView(pod_facts)
    for p in pods:
        key = f"ml-research/{p['metadata']['name']}"
        by_object.apply(Change("ADDED", key, None, p))
        by_entry.apply(Change("ADDED", key, None, by_entry.transform(p)))
    a, b = by_object.snapshot(), by_entry.snapshot()
    assert (a.used, a.jobs, a.pods) == (b.used, b.jobs, b.pods) and b.pods == 3


# --- reservations ------------------------------------------------------------------------------------------------


def test_reservations_end_when_the_pods_are_seen_bound_or_expire() -> None:
    now = [0.0]
    store = Reservations(clock=lambda: now[0])
    job_id = "ml-research/batch.kubernetes.io/job-name=j"
    view = PodView(pod_facts, on_bound=store.bound)
    store.record(Placement(job_id, RACK, "rack-big", (8, 8)), 60)
    assert [r.sizes for r in store.active()] == [(8, 8)]
    pending = bound_pod("w0", "", 8, job_name="j")
    view.apply(Change("ADDED", "w0", None, pending))
    assert [r.sizes for r in store.active()] == [(8, 8)]  # created, not bound: still to come
    view.apply(Change("MODIFIED", "w0", pending, bound_pod("w0", "h100-big-1", 8, job_name="j")))
    assert [r.sizes for r in store.active()] == [(8,)]  # the bound pod is counted by the view now
    view.apply(Change("ADDED", "w1", None, bound_pod("w1", "h100-big-2", 8, job_name="j")))
    assert store.active() == () and len(store) == 0
    # a job deleted before anything else was reviewed still frees its reservation (seen on the watch)
    store.record(Placement(job_id, RACK, "rack-big", (8, 8)), 60)
    now[0] = 61.0
    assert store.active() == () and store.expired == 1


# --- incremental counts: the same answers as counting from scratch ---------------------------------------------

_NODE = st.tuples(st.sampled_from(("r1", "r2", "r3")), st.sampled_from((4, 8)))
# a pod event: (pod number, node number or None = delete, GPUs)
_EVENT = st.tuples(st.integers(0, 11), st.one_of(st.none(), st.integers(0, 7)), st.integers(1, 8))


def _replay(
    nodes: list[tuple[str, int]], events: list[tuple[int, int | None, int]], every: int
) -> Iterator[tuple[list[Any], Capacity]]:
    """Fake GPU nodes (rack, GPUs), and a pod view's snapshot after every `every`-th pod event (bind or delete),
    so several changes pile up between two reads."""
    from types import SimpleNamespace

    gpu_nodes = [SimpleNamespace(name=f"n{i}", labels={RACK: d}, whole_gpus=g) for i, (d, g) in enumerate(nodes)]
    view = PodView(pod_facts)
    view.load({})
    for i, (pod, node, gpus) in enumerate(events):
        key = f"ns/p{pod}"
        if node is None:
            view.apply(Change("DELETED", key, None, None))
        else:
            view.apply(Change("MODIFIED", key, None, bound_pod(f"p{pod}", f"n{node}", gpus)))
        if i % every == 0:
            yield gpu_nodes, capacity_of(view.snapshot())


@given(st.lists(_NODE, min_size=1, max_size=8), st.lists(_EVENT, max_size=40), st.integers(1, 4))
@settings(max_examples=150, deadline=None)
def test_grouping_kept_per_snapshot_equals_counting_from_scratch(
    nodes: list[tuple[str, int]], events: list[tuple[int, int | None, int]], every: int
) -> None:
    """Per-domain free GPUs updated from the pod view's changed nodes match a full recount after every
    snapshot read."""
    kept: placement.Grouping | None = None
    for gpu_nodes, cap in _replay(nodes, events, every):
        kept = kept or placement.Grouping(gpu_nodes, RACK)
        assert kept.at(cap) == placement.Grouping(gpu_nodes, RACK).at(cap)
        assert kept.at(cap).free_counts() == placement.Grouping(gpu_nodes, RACK).at(cap).free_counts()


@given(
    st.lists(_NODE, min_size=1, max_size=8),
    st.lists(_EVENT, max_size=40),
    st.integers(1, 4),
    st.lists(st.tuples(st.sampled_from(("r1", "r2", "r3")), st.sampled_from(((8,), (4, 4), (8, 8)))), max_size=2),
)
@settings(max_examples=150, deadline=None)
def test_decisions_from_rooms_kept_across_snapshots_equal_deciding_from_scratch(
    nodes: list[tuple[str, int]],
    events: list[tuple[int, int | None, int]],
    every: int,
    held: list[tuple[str, tuple[int, ...]]],
) -> None:
    """Each gang's rooms are brought from snapshot to snapshot by the changed domains only (RoomIndex), the
    counts per free GPUs too: every decision, keep-off and hold, with and without others' reservations, is
    the one a fresh grouping gives."""
    reservations = tuple(Reservation(f"ns/j=r{i}", RACK, d, sizes) for i, (d, sizes) in enumerate(held))
    kept: placement.Grouping | None = None
    for gpu_nodes, cap in _replay(nodes, events, every):
        kept = kept or placement.Grouping(gpu_nodes, RACK)
        now, fresh = kept.at(cap), placement.Grouping(gpu_nodes, RACK).at(cap)
        for gang in ((8, 8), (4, 4, 4), (2,) * 5):
            for res in ((), reservations):
                assert decide(now, RACK, gang, cap, res, "ns/j=x") == decide(fresh, RACK, gang, cap, res, "ns/j=x")
                assert placement.keep_off(now, RACK, gang, res, None) == placement.keep_off(
                    fresh, RACK, gang, res, None
                )
                assert placement.only_reserved(now, RACK, gang[0], res, None) == placement.only_reserved(
                    fresh, RACK, gang[0], res, None
                )


@given(
    st.lists(st.lists(st.integers(0, 8), min_size=1, max_size=4), min_size=1, max_size=4),
    st.lists(st.sampled_from((2, 4, 8)), min_size=1, max_size=5),
)
@settings(max_examples=150, deadline=None)
def test_the_closest_domain_is_the_exact_minimum_of_the_shortfalls(frees: list[list[int]], sizes: list[int]) -> None:
    domains = {f"d{i}": tuple(sorted(f)) for i, f in enumerate(frees)}
    nodes = placement.DomainNodes({d: (8,) * len(f) for d, f in domains.items()}, domains, {})
    all_rooms = placement.rooms(nodes, sizes, ())
    if not any(r.holds for r in all_rooms):
        return
    exact = min(
        (shortfall(nodes.free[r.domain], nodes.allocatable[r.domain], sizes), r.domain) for r in all_rooms if r.holds
    )
    assert nodes.room_index(tuple(sizes)).short[0] == exact
    d = decide(nodes, RACK, sizes, Capacity(used={}, jobs={}), (), "ns/j=x")
    assert d is not None
    if d.source == placement.NONE_FITS_NOW:
        assert (d.shortfall, d.closest) == exact


@given(st.lists(st.integers(0, 8), max_size=12), st.lists(st.integers(1, 8), max_size=6))
@settings(max_examples=300, deadline=None)
def test_placing_on_counts_per_free_gpus_is_placing_on_the_nodes(free: list[int], sizes: list[int]) -> None:
    from collections import Counter

    assert placement.fits_counts(Counter(free), sizes) == (place(free, sizes) is not None)


def test_placing_on_counts_equals_placing_on_nodes_for_every_small_case() -> None:
    """Exhaustive over small shapes (mutmut's fixed examples of the property above left the remainder's
    bookkeeping unchecked): up to 4 nodes of 0-8 free GPUs, up to 5 pods of 2, 4 or 6 — a remainder that equals
    a free count already there ((2, 6) for 4+2+2), several pods on one node's remainders ((4, 6) for 5x2)."""
    import itertools
    from collections import Counter

    for n in range(5):
        for free in itertools.combinations_with_replacement((0, 2, 4, 6, 8), n):
            for k in range(1, 6):
                for sizes in itertools.combinations_with_replacement((2, 4, 6), k):
                    got = placement.fits_counts(Counter(free), sizes)
                    assert got == (place(free, sizes) is not None), (free, sizes)


def test_only_reserved_reads_every_reserved_rack_past_one_without_room() -> None:
    """rack-big is full and reserved (a gang that no longer fits there): it takes no pod, and rack-small,
    reserved for a 2x8 gang, is still named."""
    full_big = capacity(*(bound_pod(f"b{i}", f"h100-big-{i}", 8) for i in (1, 2, 3, 4)))
    nodes = group(INV.nodes, RACK, full_big)
    big = Reservation("ml-research/batch.kubernetes.io/job-name=big", RACK, "rack-big", (8,))
    assert placement.only_reserved(nodes, RACK, 8, (big, HELD), "ns/g") == ("rack-small",)


def test_place_takes_the_node_with_least_room_that_fits_each_pod() -> None:
    # 6 on the 8 leaves 2, and the 2-GPU pod then takes that node, not the 3 (first fit would): 3 stays free
    assert place((3, 8), (6, 2)) == (0, 3)


def test_a_jobs_gpus_are_split_into_pods_of_its_pod_size_the_last_taking_the_remainder() -> None:
    assert placement.gang_sizes(10, 4) == (4, 4, 2)
    assert placement.gang_sizes(4, 1) == (1, 1, 1, 1)
    assert placement.gang_sizes(1, 1) == (1,)
    assert placement.gang_sizes(16, 8) == (8, 8)
    assert placement.gang_sizes(0, 4) == placement.gang_sizes(4, 0) == placement.gang_sizes(-8, 8) == ()


def test_a_gang_of_more_than_max_gang_pods_pods_has_no_sizes_counting_the_remainders_pod() -> None:
    """docs/policy.md "Limits": a gang of more than 1024 pods is not placed. 2,049 GPUs in 2-GPU pods are 1,025
    pods (1,024 full and one of 1 GPU): before, only the full pods were counted against the limit."""
    limit = placement.MAX_GANG_PODS
    assert len(placement.gang_sizes(limit * 8, 8)) == limit
    assert placement.gang_sizes(limit * 8 + 8, 8) == ()
    assert len(placement.gang_sizes(limit * 2 - 1, 2)) == limit  # 1,023 pods of 2 and one of 1
    assert placement.gang_sizes(limit * 2 + 1, 2) == ()


def _two_racks() -> list[Any]:
    from types import SimpleNamespace

    racks = ("r1", "r1", "r2", "r2")
    return [SimpleNamespace(name=f"n{i}", labels={RACK: r}, whole_gpus=8) for i, r in enumerate(racks)]


def _bind(view: PodView, pod: str, node: str, gpus: int) -> Capacity:
    view.apply(Change("MODIFIED", f"ns/{pod}", None, bound_pod(pod, node, gpus)))
    return capacity_of(view.snapshot())


def test_a_gang_shape_not_asked_for_two_snapshots_is_updated_by_every_rack_changed_since() -> None:
    """The property above asks every gang at every snapshot (one step at a time); here (8, 8) is not asked while
    r1 changes, then r2 changes: both racks' rooms must be recounted, not only the last step's."""
    view = PodView(pod_facts)
    view.load({})
    kept = placement.Grouping(_two_racks(), RACK)
    kept.at(capacity_of(view.snapshot())).room_index((8, 8))
    kept.at(_bind(view, "a", "n0", 8))  # r1 changed; (8, 8) not asked
    cap = _bind(view, "b", "n2", 4)  # r2 changed
    fresh = placement.Grouping(_two_racks(), RACK).at(cap).room_index((8, 8))
    assert kept.at(cap).room_index((8, 8)).rooms == fresh.rooms
    assert fresh.fitting == [] and (fresh.rooms["r1"].free_gpus, fresh.rooms["r2"].free_gpus) == (8, 12)


def test_after_pod_events_a_gang_shapes_rooms_are_brought_forward_not_rebuilt(monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/policy.md "Limits": after a pod event only the racks of the nodes whose GPUs changed are recounted —
    also across snapshots at which the shape was not asked."""
    view = PodView(pod_facts)
    view.load({})
    kept = placement.Grouping(_two_racks(), RACK)
    kept.at(capacity_of(view.snapshot())).room_index((8, 8))
    builds: list[tuple[int, ...]] = []
    build = placement.RoomIndex.build.__func__  # type: ignore[attr-defined]
    monkeypatch.setattr(placement.RoomIndex, "build", classmethod(lambda c, n, s: builds.append(s) or build(c, n, s)))
    kept.at(_bind(view, "a", "n0", 8)).room_index((8, 8))
    kept.at(_bind(view, "b", "n1", 8))
    index = kept.at(_bind(view, "c", "n2", 4)).room_index((8, 8))
    assert builds == [] and index.fitting == []


def test_shortfall_of_a_domain_that_can_never_hold_the_gang_is_the_whole_gang() -> None:
    assert shortfall((0,), (4,), (8,)) == 8
    assert shortfall((4, 4), (8, 8), (8, 8, 8)) == 24


def test_keep_off_and_only_reserved_have_nothing_to_say_of_a_pod_without_gpus() -> None:
    """Guards of the pure functions (the engine never asks for a pod without whole GPUs): rack r is reserved for a
    gang that no longer fits there, and r is every node there is."""
    nodes = placement.DomainNodes({"r": (8,)}, {"r": (0,)}, {"n": "r"})
    held = (Reservation("ns/j=other", RACK, "r", (8,)),)
    assert placement.only_reserved(nodes, RACK, 0, held, None) == ()
    assert placement.only_reserved(nodes, RACK, 1, held, None) == ()  # no node takes it
    assert placement.keep_off(nodes, RACK, (), held, None) is None


def test_shortfall_frees_whole_pieces_first_and_never_past_a_nodes_allocatable() -> None:
    """Freeing 2 GPUs on the 7-GPU node (6 free) gives no 8-GPU piece, so the empty 8-GPU node is the one to
    wait for: 8, not 9. With 4 + 2 + 2 to place, the 2-GPU node with 1 free needs 1 more — not 3 (its
    allocatable is 2), and never a node already at its allocatable (nothing frees up there: the search would
    not end)."""
    assert shortfall((6, 0), (7, 8), (8,)) == 8
    assert shortfall((4, 0, 1, 3), (4, 2, 2, 3), (4, 2, 2)) == 1


def test_pieces_are_whole_pods_of_the_size_and_none_of_size_zero() -> None:
    assert placement.pieces((8, 3), 1) == 11
    assert placement.pieces((8, 3), 0) == 0


def test_free_counts_of_domain_nodes_made_without_counts_are_counted_from_the_nodes() -> None:
    nodes = placement.DomainNodes({"r": (8, 8), "s": (8,)}, {"r": (0, 8), "s": (8,)}, {})
    assert nodes.free_counts() == {0: 1, 8: 2}


def test_a_grouping_keeps_the_rooms_of_at_most_indexes_kept_gang_shapes() -> None:
    """docs/policy.md "Limits": 16 shapes per grouping; the 17th starts the store afresh."""
    kept = placement.Grouping(_two_racks(), RACK)
    nodes = kept.at(None)
    for n in range(1, placement.INDEXES_KEPT + 1):
        nodes.room_index((n,))
    assert len(kept._indexes) == placement.INDEXES_KEPT
    nodes.room_index((placement.INDEXES_KEPT + 1,))
    assert list(kept._indexes) == [(placement.INDEXES_KEPT + 1,)]


def test_when_nothing_fits_now_the_roomiest_has_the_most_pieces_then_the_most_free_gpus() -> None:
    """The `prefer` fallback's domain: no rack holds 3 x 8 now; b has two free 8-GPU pieces, a and c one each, and a
    12 free GPUs to c's 10."""
    alloc = (8, 8, 8)
    free = {"a": (0, 4, 8), "b": (0, 8, 8), "c": (0, 2, 8)}
    cap = Capacity(used={}, jobs={})
    d = decide(placement.DomainNodes({k: alloc for k in free}, free, {}), RACK, (8, 8, 8), cap)
    assert d is not None and (d.source, d.roomiest) == (placement.NONE_FITS_NOW, "b")
    del free["b"]
    d = decide(placement.DomainNodes({k: alloc for k in free}, free, {}), RACK, (8, 8, 8), cap)
    assert d is not None and d.roomiest == "a"


def test_a_reservation_at_another_level_takes_nothing_from_a_domain_of_the_same_name() -> None:
    """Domains are named by their label's values, which two levels may share: a zone reservation in zone `a`
    leaves rack `a` to the best fit."""
    alloc = {"a": (8, 8), "b": (8, 8, 8)}
    nodes = placement.DomainNodes(alloc, alloc, {})
    zone = Reservation("ns/j=other", "topology.kubernetes.io/zone", "a", (8, 8))
    d = decide(nodes, RACK, (8, 8), Capacity(used={}, jobs={}), (zone,), "ns/j=x")
    assert d is not None and (d.source, d.domain) == (placement.BEST_FIT, "a")
