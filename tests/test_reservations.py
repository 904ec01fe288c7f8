"""Reservations end early when their gang will not bind soon (issue #11): the real pod view, fed pod objects as
the watch delivers them, tells the store why each unbound pod of a job waits; a deterministic clock stands in
for time. The engine reserves nothing for a suspended workload; the policy's graces are validated."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.pods import PodView
from cluster.reflector import Change
from policies.document import PolicyError, compile_policy, default_policy
from policies.engine import Placement
from policies.subject import pod_facts
from tests.test_placement import RACK, _default_text, bound_pod, capacity, job, rack_terms, run
from webhook import reservations as R
from webhook.app import graces
from webhook.reservations import Graces, Reservations

JOB = "ml-research/batch.kubernetes.io/job-name=gang"
OTHER = "ml-research/batch.kubernetes.io/job-name=other"
PIN = Placement(JOB, RACK, "rack-small", (8, 8))
GRACES = Graces(no_pods=15, waiting=30)


class Cluster:
    """A store of reservations fed by a pod view, and the clock they both read."""

    def __init__(self) -> None:
        self.now = 0.0
        self.store = Reservations(clock=lambda: self.now)
        self.view = PodView(pod_facts, on_bound=self.store.bound, on_pending=self.store.pending)

    def reserve(self, pin: Placement = PIN, seconds: float = 120) -> None:
        self.store.record(pin, seconds, GRACES)

    def pod(self, name: str, node: str = "", job_name: str = "gang", **status: Any) -> None:
        p = bound_pod(name, node, 8, job_name=job_name, phase="Running" if node else "Pending")
        p["status"].update(status)
        self.view.apply(Change("MODIFIED", f"ml-research/{name}", None, p))

    def gated(self, name: str) -> None:
        p = bound_pod(name, "", 8, job_name="gang", phase="Pending")
        p["spec"]["schedulingGates"] = [{"name": "example.com/hold"}]
        self.view.apply(Change("MODIFIED", f"ml-research/{name}", None, p))

    def held(self) -> list[tuple[int, ...]]:
        return [r.sizes for r in self.store.active() if r.job == JOB]

    def at(self, t: float) -> list[tuple[int, ...]]:
        self.now = t
        return self.held()


def unschedulable(nominated: str | None = None, message: str | None = None) -> dict[str, Any]:
    condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
    if message is not None:
        condition["message"] = message
    status: dict[str, Any] = {"conditions": [condition]}
    if nominated:
        status["nominatedNodeName"] = nominated
    return status


# kube-scheduler's messages when only the pinned rack could take the pod and its GPUs are counted taken (for
# instance by another pod the scheduler assumed there, whose bind the bind check refuses), and when a CPU
# request no node has is short too.
GPUS_SHORT = ("0/10 nodes are available: 2 Insufficient nvidia.com/gpu, 8 node(s) didn't match Pod's node "
              "affinity/selector. preemption: 0/10 nodes are available: 2 No preemption victims found for "
              "incoming pod, 8 Preemption is not helpful for scheduling.")  # fmt: skip
CPU_SHORT = ("0/10 nodes are available: 2 Insufficient cpu, 2 Insufficient nvidia.com/gpu, 8 node(s) didn't "
             "match Pod's node affinity/selector. preemption: 0/10 nodes are available: 10 Preemption is not "
             "helpful for scheduling.")  # fmt: skip


def test_a_pod_seen_unschedulable_ends_the_reservation_at_once_and_it_is_counted() -> None:
    c = Cluster()
    c.reserve()
    c.pod("g-0")  # created: nobody has tried it yet
    assert c.at(1) == [(8, 8)]
    c.pod("g-0", **unschedulable())
    assert c.held() == [] and c.store.ended == {R.UNSCHEDULABLE: 1} and len(c.store) == 0


def test_a_pod_short_of_gpus_only_keeps_the_reservation_for_the_waiting_grace() -> None:
    """Session 8's stranded gang: job-14 pinned to rack-a, one of its pods marked Unschedulable while the
    scheduler counted job-13's pod assumed on rack-a, whose bind the bind check then refused. Ending the
    reservation at once let job-13's retried pod take the rack. GPUs short and nothing else: the gang gets the
    waiting grace (and binds meanwhile when the refused bind frees them); anything else short ends it at once."""
    c = Cluster()
    c.reserve()
    c.now = 1
    c.pod("g-0", **unschedulable(message=GPUS_SHORT))
    assert c.at(30.9) == [(8, 8)]
    c.pod("g-0", node="h100-small-1")  # the refused bind freed the GPUs: the gang binds, the grace restarts
    assert c.at(60.8) == [(8,)]
    assert c.at(60.9) == [] and c.store.ended == {R.GPU_BUSY: 1}
    c = Cluster()
    c.reserve()
    c.pod("g-0", **unschedulable(message=GPUS_SHORT))
    c.pod("g-1", **unschedulable(message=CPU_SHORT))
    assert c.held() == [] and c.store.ended == {R.UNSCHEDULABLE: 1}


def test_a_pod_the_scheduler_preempts_for_keeps_the_reservation() -> None:
    c = Cluster()
    c.reserve()
    c.pod("g-0", **unschedulable(nominated="h100-small-1"))  # victims on their way out
    assert c.at(29) == [(8, 8)] and c.at(119) == [(8, 8)]  # a scheduler is on it: no waiting grace either


def test_gated_pods_end_the_reservation_after_the_waiting_grace_and_each_bind_restarts_it() -> None:
    c = Cluster()
    c.reserve()
    c.now = 2
    c.gated("g-0")
    c.gated("g-1")
    assert c.at(31.9) == [(8, 8)]
    c.pod("g-0", node="h100-small-1")  # one bound at 31.9: the one still gated gets another 30 s
    assert c.at(61.8) == [(8,)]
    assert c.at(61.9) == [] and c.store.ended == {R.GATED: 1}


def test_pods_no_scheduler_tries_end_the_reservation_after_the_waiting_grace() -> None:
    c = Cluster()
    c.reserve()
    c.now = 5
    c.pod("g-0")
    c.pod("g-1")
    c.now = 20
    c.pod("g-1")  # another event of the same untried pod does not restart the grace
    assert c.at(34.9) == [(8, 8)]
    assert c.at(35) == [] and c.store.ended == {R.UNSCHEDULED: 1}


def test_a_scheduler_taking_a_pod_up_stops_the_waiting_grace() -> None:
    c = Cluster()
    c.reserve()
    c.pod("g-0")
    trying = {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "SchedulerError"}]}
    c.pod("g-0", **trying)
    assert c.at(100) == [(8, 8)]  # (it ends at reservationSeconds at the latest)
    assert c.at(120) == [] and c.store.ended == {R.EXPIRED: 1} and c.store.expired == 1


def test_no_pod_seen_within_the_grace_ends_the_reservation_and_any_pod_seen_keeps_it() -> None:
    c = Cluster()
    c.reserve()
    assert c.at(14.9) == [(8, 8)]
    assert c.at(15) == [] and c.store.ended == {R.NO_PODS: 1}
    c.reserve(Placement(OTHER, RACK, "rack-big", (8,)))
    c.pod("o-0", job_name="other")
    c.pod("o-0", job_name="other", conditions=[{"type": "PodScheduled", "status": "True"}])
    assert [r.job for r in c.store.active()] == [OTHER]
    c.now = 100
    assert [r.job for r in c.store.active()] == [OTHER]  # a pod was seen, and a scheduler is on it


def test_other_jobs_pods_and_pods_of_no_job_change_nothing() -> None:
    c = Cluster()
    c.reserve()
    c.pod("g-0")
    c.pod("x-0", job_name="other", **unschedulable())
    c.pod("solo", job_name="", **unschedulable())
    assert c.at(29) == [(8, 8)] and c.store.ended == {}


def test_the_pods_of_a_stalled_job_do_not_renew_its_reservation_but_a_new_pin_does() -> None:
    c = Cluster()
    renewed = Placement(JOB, RACK, "rack-small", (8,), renewed=True)
    c.reserve()
    c.pod("g-0", **unschedulable())
    c.reserve(renewed)  # its next pod, created pinned: reserves nothing
    assert c.held() == [] and c.store.recorded == 1
    c.now = 119
    c.reserve(renewed)
    assert c.held() == []
    c.now = 120  # reservationSeconds after the end: it may hold again
    c.reserve(renewed)
    assert c.held() == [(8,)]
    c.pod("g-1", **unschedulable())
    c.reserve()  # a fresh pin (the job's template admitted anew) always reserves
    assert c.held() == [(8, 8)] and c.store.ended == {R.UNSCHEDULABLE: 2}


def test_bound_expired_and_replaced_reservations_are_counted_apart() -> None:
    c = Cluster()
    c.reserve()
    c.reserve()  # the job pinned again: the earlier one is replaced
    c.pod("g-0", node="h100-small-1")
    c.pod("g-1", node="h100-small-2")
    c.reserve(Placement(OTHER, RACK, "rack-big", (8,)), seconds=10)
    c.pod("o-0", job_name="other")
    c.now = 10
    assert c.store.active() == ()
    assert c.store.ended == {R.REPLACED: 1, R.BOUND: 1, R.EXPIRED: 1}


def test_past_the_bound_the_oldest_reservations_are_dropped_and_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(R, "MAX_RESERVATIONS", 2)
    c = Cluster()
    for k in range(3):
        c.reserve(Placement(f"ns/j={k}", RACK, "rack-big", (8,)))
    assert [r.job for r in c.store.active()] == ["ns/j=1", "ns/j=2"] and c.store.ended == {R.DROPPED: 1}


# events: ("pend", pod, why) | ("bind", pod) | ("tick", seconds) | ("pin", renewed)
_EVENTS = st.lists(
    st.one_of(
        st.tuples(st.just("pend"), st.integers(0, 3), st.sampled_from(("gated", "unsched", "new", "trying"))),
        st.tuples(st.just("bind"), st.integers(0, 3)),
        st.tuples(st.just("tick"), st.floats(0, 40)),
        st.tuples(st.just("pin"), st.booleans()),
    ),
    max_size=30,
)
_STATUS = {
    "gated": None,
    "unsched": unschedulable(),
    "new": {},
    "trying": {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "SchedulerError"}]},
}


@given(_EVENTS)
@settings(max_examples=200, deadline=None)
def test_a_reservation_only_ever_shrinks_and_every_end_is_counted_once(events: list[tuple[Any, ...]]) -> None:
    """Whatever the pod view says, in whatever order: a reservation never holds more than its gang's unbound
    pods nor outlives reservationSeconds; each one recorded is either live or counted as ended, once."""
    c = Cluster()
    made = None
    for event in events:
        if event[0] == "pin":
            before = c.store.recorded
            c.reserve(Placement(JOB, RACK, "rack-small", (8, 8, 8, 8), renewed=event[1]))
            made = c.now if c.store.recorded > before else made
        elif event[0] == "tick":
            c.now += event[1]
        elif event[0] == "bind":
            c.pod(f"g-{event[1]}", node="h100-big-1")
        elif _STATUS[event[2]] is None:
            c.gated(f"g-{event[1]}")
        else:
            c.pod(f"g-{event[1]}", **copy.deepcopy(_STATUS[event[2]]))
        held = c.held()
        assert len(held) <= 1 and all(len(sizes) <= 4 for sizes in held)
        if held:
            assert made is not None and c.now - made < 120
        assert c.store.recorded == len(c.store) + sum(c.store.ended.values())


# --- the engine: suspended workloads reserve nothing; renewed pins are marked -------------------------------------


@pytest.mark.parametrize("where", [("spec", "suspend"), ("spec", "runPolicy", "suspend")])
def test_a_suspended_workload_is_pinned_but_reserves_nothing_until_its_pods_exist(where: tuple[str, ...]) -> None:
    obj = job("j", 2, 8)
    node = obj
    for key in where[:-1]:
        node = node.setdefault(key, {})
    node[where[-1]] = True
    r = run(obj, capacity())
    assert rack_terms(r.object)["required_racks"] == ["rack-small"]  # pinned all the same
    assert r.placement is None
    node[where[-1]] = False
    assert run(obj, capacity()).placement == Placement(
        "ml-research/batch.kubernetes.io/job-name=j", RACK, "rack-small", (8, 8)
    )


def test_a_suspended_pod_spec_field_means_nothing_on_a_pod() -> None:
    from policies.workloads import suspended

    assert not suspended({"kind": "Pod", "spec": {"suspend": True}})
    assert suspended({"kind": "JobSet", "spec": {"suspend": True}})
    assert not suspended({"kind": "Job", "spec": {"suspend": "true"}})  # not a boolean: the API refuses it
    assert not suspended({"kind": "Job", "spec": "garbage"})
    assert not suspended({"kind": "PyTorchJob", "spec": {"runPolicy": "garbage"}})


# --- the policy's graces ------------------------------------------------------------------------------------------


def _with_placement(**fields: Any) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(_default_text())
    doc["placement"].update(fields)
    return doc


def test_the_graces_are_in_the_policy_with_their_ranges() -> None:
    p = default_policy()
    assert (p.no_pods_grace_seconds, p.waiting_grace_seconds) == (15.0, 30.0)
    p = compile_policy(_with_placement(noPodsGraceSeconds=5, waitingGraceSeconds=600))
    assert (p.no_pods_grace_seconds, p.waiting_grace_seconds) == (5.0, 600.0)
    assert graces(p) == Graces(no_pods=5, waiting=600)
    for key in ("noPodsGraceSeconds", "waitingGraceSeconds"):
        for bad in (0, 86_401, 1.5, "10"):
            with pytest.raises(PolicyError) as exc:
                compile_policy(_with_placement(**{key: bad}))
            assert len(exc.value.errors) == 1 and exc.value.errors[0].startswith(f"placement.{key}"), exc.value.errors


def test_the_server_wires_the_pod_view_to_its_reservations_and_counts_their_ends_per_reason() -> None:
    from tests.test_bindcheck import Server

    s = Server()
    s.state.reservations.record(PIN, 120, GRACES)
    view = s.state.pods
    assert view is not None
    p = bound_pod("g-0", "", 8, job_name="gang", phase="Pending")
    p["status"].update(unschedulable())
    view.apply(Change("ADDED", "ml-research/g-0", None, p))
    assert s.state.reservations.active() == ()
    assert 'gpu_admission_placement_reservations_ended_total{reason="unschedulable"} 1' in s.metrics.render()


def test_a_golden_case_says_what_is_reserved_and_a_wrong_expectation_is_named() -> None:
    from webhook import suite

    def compare(expect: dict[str, Any], r: Any) -> list[str]:
        return [p for p in suite.compare(expect, r) if p.startswith("reserves")]

    r = run(job("j", 2, 8), capacity())
    base = {"allowed": True}
    assert compare({**base, "reserves": {"domain": "rack-small", "sizes": [8, 8]}}, r) == []
    assert compare({**base, "reserves": {"domain": "rack-small"}}, r) == []
    assert compare({**base, "reserves": {"domain": "rack-big"}}, r) == [
        "reserves: expected {'domain': 'rack-big'}, got {'domain': 'rack-small', 'sizes': [8, 8]}"
    ]
    assert compare({**base, "reserves": None}, r) == [
        "reserves: expected None, got {'domain': 'rack-small', 'sizes': [8, 8]}"
    ]
    assert compare({**base, "reserves": None}, run(job("j", 2, 8), None)) == []  # no pod view: nothing pinned
