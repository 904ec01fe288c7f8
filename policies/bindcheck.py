"""The bind check (`reserved-bind`): refuse a pod's Binding that takes GPUs reserved for another job's gang.

Reservations (docs/policy.md "Placement") are the webhook's promise to a pinned gang; the scheduler does not
know them. Pods created after a pin are kept off the reserved GPUs when they are admitted (reserved-keep-off,
the hold of training-same-rack), but a pod created *before* the pin and still pending is reviewed no more:
the scheduler may bind it onto GPUs the pinned gang counts on, and then both gangs are partly placed (the
placement benchmark's last race). The API server sends every bind (CREATE of `pods/binding`) to a validating
webhook; this judges it: the node of the Binding, the pod's whole GPUs and job (from the pod view: a Binding
carries only the pod's name, namespace and uid), the reservations. A refused bind is the scheduler's to retry
(it puts the pod back in its queue and tries again, elsewhere or later), so a pod is only ever delayed while
the reservation lasts: at most until its gang binds or `placement.reservationSeconds`.

Pure: plain JSON and immutable views in, a `BindVerdict` out. Nothing here walks the nodes: the domains of a
topology key are grouped once per topology epoch and brought to each pod-view snapshot by the changed nodes
only (subject.grouping), and only the reserved domain of the Binding's node is counted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from policies import placement
from policies.inventory import Inventory
from policies.subject import grouping
from policies.topology import domain_text

RULE = "reserved-bind"

# BindVerdict.reason values (the metric's label): why a bind was allowed, or HARMS when refused.
HARMS = "harms-reservation"
NO_RESERVATION = "no-reservation"  # no live reservation: nothing to protect (the common case)
NO_TARGET = "no-target"  # not a Binding to a node: not ours to judge
NOT_WHOLE_GPUS = "no-whole-gpus"  # the pod holds no whole GPU (reservations count only those)
UNKNOWN_POD = "unknown-pod"  # not in the pod view (yet): allowed, the view cannot say what it takes
NO_VIEW = "no-view"  # no synced pod view: free GPUs unknown
HARMLESS = "harmless"


@dataclass(frozen=True)
class BindVerdict:
    allowed: bool
    reason: str
    message: str = ""


@dataclass(frozen=True)
class BoundPod:
    """What the pod view knows of the pod being bound: its whole GPUs and its job (placement.job_id)."""

    namespace: str
    name: str
    whole_gpus: int
    job: str | None


def target_node(binding: Any) -> str | None:
    """The node a Binding names (`target.name`, kind Node or unset); None for anything else."""
    target = binding.get("target") if isinstance(binding, dict) else None
    if not isinstance(target, dict) or target.get("kind", "Node") not in ("Node", ""):
        return None
    name = target.get("name")
    return name if isinstance(name, str) and name else None


def check(
    binding: Any,
    pod: BoundPod | None,
    inventory: Inventory,
    capacity: placement.Capacity | None,
    reservations: Sequence[placement.Reservation],
    reservation_seconds: float,
) -> BindVerdict:
    """Allow the bind unless, with the pod on the Binding's node, a reserved gang of another job no longer
    fits that node's domain of the reservation's topology key (placement.bind_harm)."""
    if not reservations:
        return BindVerdict(True, NO_RESERVATION)
    node = target_node(binding)
    if node is None:
        return BindVerdict(True, NO_TARGET)
    if pod is None:
        return BindVerdict(True, UNKNOWN_POD)
    if pod.whole_gpus <= 0:
        return BindVerdict(True, NOT_WHOLE_GPUS)
    if capacity is None or not capacity.synced:
        return BindVerdict(True, NO_VIEW)
    for key in sorted({r.key for r in reservations}):
        nodes = grouping(inventory, inventory.all, key).at(capacity)
        harm = placement.bind_harm(nodes, key, node, pod.whole_gpus, capacity.used, reservations, pod.job)
        if harm is not None:
            return BindVerdict(False, HARMS, _message(inventory, pod, node, harm, reservation_seconds))
    return BindVerdict(True, HARMLESS)


def at_stake(binding: Any, inventory: Inventory, reservations: Sequence[placement.Reservation]) -> bool:
    """Whether the Binding's node is in a domain some job holds reserved (of the reservation's topology key):
    only a bind there could be refused, so only there is it worth waiting for the pod view to see the pod."""
    node = target_node(binding)
    if node is None:
        return False
    for key in {r.key for r in reservations}:
        domain = grouping(inventory, inventory.all, key).static.node_domain.get(node)
        if domain is not None and any(r.key == key and r.domain == domain for r in reservations):
            return True
    return False


def _message(inv: Inventory, pod: BoundPod, node: str, harm: placement.BindHarm, seconds: float) -> str:
    level = next((lv for lv in inv.levels if lv.key == harm.key), None)
    noun = domain_text(level, inv.rack_label) if level is not None else harm.key
    whose = ("the gang of job " if len(harm.jobs) == 1 else "the gangs of jobs ") + ", ".join(_job_names(harm.jobs))
    return (
        f"{RULE}: binding pod {pod.namespace}/{pod.name} ({pod.whole_gpus} GPUs) to node {node} ({harm.free} "
        f"free) would take GPUs reserved for {whose} in {noun} {harm.domain}: refused until the reservation ends "
        f"(its pods bind, at most placement.reservationSeconds, {seconds:g} s); the scheduler retries the pod"
    )


def _job_names(jobs: Sequence[str]) -> list[str]:
    """`ns/label=value` job ids (placement.job_id) as `ns/value`: the message names the job, not its label."""
    return [f"{job.partition('/')[0]}/{job.rpartition('=')[2]}" for job in jobs]


def pod_of(namespace: str, name: str, gpus: Mapping[str, int], job: str | None, resource: str) -> BoundPod:
    """A BoundPod from the pod view's entry (GPU units per resource): whole GPUs are `resource`'s units."""
    return BoundPod(namespace, name, int(gpus.get(resource, 0)), job)
