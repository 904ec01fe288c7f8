"""Why an unbound GPU pod of a job waits (`cluster.pods.waiting`), told to the pod view's `on_pending` hook on
every event, with nothing kept per pod: what ends placement reservations of gangs that will not bind soon."""

from __future__ import annotations

from typing import Any

import pytest

from cluster import pods as P
from cluster.pods import PodView
from cluster.reflector import Change
from policies.subject import pod_facts
from tests.test_placement import bound_pod

JOB = "ml-research/batch.kubernetes.io/job-name=gang"


def pending(name: str = "p0", job: str | None = "gang", **status: Any) -> dict[str, Any]:
    p = bound_pod(name, "", 8, job_name=job, phase="Pending")
    p["status"].update(status)
    return p


def scheduled(status: str, reason: str | None, message: Any = None) -> list[dict[str, Any]]:
    c = {"type": "PodScheduled", "status": status}
    if reason is not None:
        c["reason"] = reason
    if message is not None:
        c["message"] = message
    return [{"type": "Initialized", "status": "True"}, c]


SHORT = "0/6 nodes are available: 2 Insufficient {}, 4 node(s) didn't match Pod's node affinity/selector."


@pytest.mark.parametrize(
    ("status", "gates", "why"),
    [
        ({}, None, P.UNSCHEDULED),  # just created, or no scheduler serves it
        ({"conditions": scheduled("False", "Unschedulable")}, None, P.UNSCHEDULABLE),
        ({"conditions": scheduled("False", "Unschedulable"), "nominatedNodeName": "n1"}, None, P.SCHEDULING),
        ({"conditions": scheduled("False", "SchedulingGated")}, None, P.GATED),
        ({}, [{"name": "kueue.x-k8s.io/topology"}], P.GATED),
        ({"conditions": scheduled("False", "Unschedulable")}, [{"name": "x"}], P.GATED),  # gates first
        ({"conditions": scheduled("False", "NotReadyForScheduling")}, None, P.UNSCHEDULED),
        ({"conditions": scheduled("False", "SchedulerError")}, None, P.SCHEDULING),
        ({"conditions": scheduled("True", None)}, None, P.SCHEDULING),
        ({"conditions": scheduled("Unknown", "Unschedulable")}, None, P.SCHEDULING),
        ({"conditions": [{"type": "Ready", "status": "False", "reason": "Unschedulable"}]}, None, P.UNSCHEDULED),
        ({"conditions": "garbage"}, None, P.UNSCHEDULED),
        ({"conditions": ["garbage", {"type": "PodScheduled", "status": "False", "reason": 7}]}, None, P.SCHEDULING),
        ({"conditions": scheduled("False", "Unschedulable")}, [], P.UNSCHEDULABLE),  # no gate left
        ({"conditions": scheduled("False", "Unschedulable", SHORT.format("nvidia.com/gpu"))}, None, P.GPU_BUSY),
        ({"conditions": scheduled("False", "Unschedulable", SHORT.format("nvidia.com/mig-1g.10gb"))}, None, P.GPU_BUSY),
        ({"conditions": scheduled("False", "Unschedulable", SHORT.format("cpu"))}, None, P.UNSCHEDULABLE),
        (
            {"conditions": scheduled("False", "Unschedulable", SHORT.format("nvidia.com/gpu, 1 Insufficient memory"))},
            None,
            P.UNSCHEDULABLE,
        ),
        # only what comes before the preemption summary counts; no Insufficient at all is not GPUs short
        (
            {
                "conditions": scheduled(
                    "False",
                    "Unschedulable",
                    "0/6 nodes are available: 6 node(s) had untolerated "
                    "taint. preemption: 2 Insufficient nvidia.com/gpu",
                )
            },
            None,
            P.UNSCHEDULABLE,
        ),
        ({"conditions": scheduled("False", "Unschedulable", 7)}, None, P.UNSCHEDULABLE),
    ],
)
def test_waiting_reads_why_a_pod_is_not_bound(status: dict[str, Any], gates: Any, why: str) -> None:
    p = pending(**status)
    if gates is not None:
        p["spec"]["schedulingGates"] = gates
    assert P.waiting(p) == why


def test_waiting_never_raises_on_odd_objects() -> None:
    assert P.waiting({}) == P.UNSCHEDULED
    assert P.waiting({"spec": "x", "status": "y"}) == P.UNSCHEDULED


def test_the_view_tells_why_each_unbound_pod_of_a_job_waits_and_keeps_nothing_of_it() -> None:
    told: list[tuple[str, str]] = []
    view = PodView(pod_facts, on_pending=lambda job, why: told.append((job, why)))
    view.apply(Change("ADDED", "ml-research/p0", None, pending()))
    view.apply(Change("MODIFIED", "ml-research/p0", None, pending(conditions=scheduled("False", "Unschedulable"))))
    assert told == [(JOB, P.UNSCHEDULED), (JOB, P.UNSCHEDULABLE)]
    entry = view.get("ml-research/p0")
    assert entry is not None and entry == view.transform(pending())  # the reason is not in the entry
    told.clear()
    view.apply(Change("MODIFIED", "ml-research/p0", None, bound_pod("p0", "n1", 8, job_name="gang")))  # bound
    view.apply(Change("ADDED", "ml-research/solo", None, pending("solo", job=None)))  # no job
    view.apply(Change("ADDED", "ml-research/done", None, bound_pod("done", "", 8, job_name="gang", phase="Failed")))
    cpu = pending("cpu")
    cpu["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1"}}
    view.apply(Change("ADDED", "ml-research/cpu", None, cpu))  # no GPU: not in the view at all
    view.apply(Change("ADDED", "ml-research/bad", None, {"spec": "garbage"}))
    assert told == []


def test_a_view_without_the_hook_reads_no_condition() -> None:
    view = PodView(pod_facts)
    assert view.transform(pending(conditions="garbage")) is not None
