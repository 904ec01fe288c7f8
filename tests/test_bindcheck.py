"""The bind check (`reserved-bind`, issue #11): a pod's Binding that takes GPUs reserved for another job's gang
is refused; every other bind passes. The pure decision (placement.bind_harm, policies/bindcheck.py) and the
server's answer to a pods/binding AdmissionReview (webhook/app.py).

The cluster is examples/placement/racks.yaml: rack-big (h100-big-1..4) and rack-small (h100-small-1..2), 8
H100 each."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies import bindcheck, placement
from policies.placement import Reservation, group
from tests.test_placement import INV, NODES, RACK, bound_pod, capacity
from webhook.app import ServerConfig, create_app
from webhook.metrics import Metrics
from webhook.state import State

GANG = "ml-research/batch.kubernetes.io/job-name=gang"
LATE = "ml-research/batch.kubernetes.io/job-name=late"
HELD = Reservation(GANG, RACK, "rack-small", (8, 8))
FULL_BIG = tuple(bound_pod(f"b{i}", f"h100-big-{i}", 8) for i in (1, 2, 3, 4))


def harm(node: str, size: int, *pods: dict[str, Any], held: tuple[Reservation, ...] = (HELD,), job: str | None = LATE):
    cap = capacity(*pods)
    return placement.bind_harm(group(INV.nodes, RACK, cap), RACK, node, size, cap.used, held, job)


def test_a_bind_onto_gpus_a_reserved_gang_needs_is_refused_naming_the_job_and_rack() -> None:
    got = harm("h100-small-1", 8, *FULL_BIG)
    assert got == placement.BindHarm(RACK, "rack-small", (GANG,), 8)
    assert harm("h100-small-2", 1, *FULL_BIG) is not None  # one GPU is enough to break a 2x8 gang


def test_binds_that_harm_no_reservation_pass() -> None:
    assert harm("h100-big-1", 8) is None  # outside the reserved rack
    assert harm("h100-small-1", 8, job=GANG) is None  # the reserved job's own pod
    assert harm("h100-small-1", 8, held=()) is None
    assert harm("h100-small-1", 0) is None  # no whole GPU
    assert harm("no-such-node", 8) is None
    assert harm("h100-small-1", 8, held=(Reservation(GANG, "zone", "rack-small", (8, 8)),)) is None  # other key
    # a node of the rack the gang does not need: a 1x8 reservation leaves the other small node free
    assert harm("h100-small-1", 8, held=(Reservation(GANG, RACK, "rack-small", (8,)),)) is None
    # 4 GPUs of a node the gang needs whole: refused; the same 4 where it fits beside the pod: passes
    assert harm("h100-small-1", 4) is not None
    assert harm("h100-small-1", 4, held=(Reservation(GANG, RACK, "rack-small", (8, 4)),)) is None


def test_a_bind_the_view_says_does_not_fit_or_a_reservation_already_broken_passes() -> None:
    half = bound_pod("x", "h100-small-1", 4)
    assert harm("h100-small-1", 8, half) is None  # 4 free: the view is behind the cluster, the kubelet judges
    assert harm("h100-small-2", 8, half) is None  # the 2x8 gang no longer fits anyway: refusing keeps nothing
    # two reservations, one already broken: a bind that breaks the other is still refused
    held = (HELD, Reservation("ml-research/batch.kubernetes.io/job-name=small", RACK, "rack-small", (4,)))
    assert harm("h100-small-2", 4, held=held) is not None  # 2x8 fits, 4 does not: the 2x8 is kept
    got = harm("h100-small-2", 8, held=held)
    assert got is not None and got.jobs == (GANG,)


@given(
    st.lists(st.integers(0, 8), min_size=1, max_size=6),
    st.integers(1, 8),
    st.integers(1, 4),
    st.integers(0, 5),
    st.integers(1, 8),
)
@settings(max_examples=300, deadline=None)
def test_with_one_gang_of_equal_pods_a_bind_is_refused_exactly_when_it_costs_the_gang_a_needed_piece(
    free: list[int], per_pod: int, pods: int, at: int, size: int
) -> None:
    """An oracle that does not place anything: equal pods fit iff the domain has as many pod-sized pieces."""
    names = [f"n{i}" for i in range(len(free))]
    node = names[at % len(names)]
    nodes = placement.DomainNodes(
        {"d": (8,) * len(free)},
        {"d": tuple(sorted(free))},
        dict.fromkeys(names, "d"),
        node_gpus=dict.fromkeys(names, 8),
    )
    used = {n: 8 - f for n, f in zip(names, free, strict=True)}
    held = (Reservation("j", "k", "d", (per_pod,) * pods),)
    got = placement.bind_harm(nodes, "k", node, size, used, held, "other")
    mine = free[names.index(node)]
    before = sum(f // per_pod for f in free)
    after = before - mine // per_pod + (mine - size) // per_pod
    assert (got is not None) == (mine >= size and before >= pods > after)
    assert placement.bind_harm(nodes, "k", node, size, used, held, "j") is None  # never the gang's own pod


def _binding(node: str = "h100-small-1", kind: str = "Node") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "late-0", "namespace": "ml-research"},
            "target": {"apiVersion": "v1", "kind": kind, "name": node}}  # fmt: skip


def test_check_refuses_with_one_line_and_allows_what_it_cannot_judge() -> None:
    cap = capacity(*FULL_BIG)
    pod = bindcheck.BoundPod("ml-research", "late-0", 8, LATE)
    v = bindcheck.check(_binding(), pod, INV, cap, (HELD,), 120)
    assert not v.allowed and v.reason == bindcheck.HARMS
    assert v.message == (
        "reserved-bind: binding pod ml-research/late-0 (8 GPUs) to node h100-small-1 (8 free) would take GPUs "
        "reserved for the gang of job ml-research/gang in rack rack-small: refused until the reservation ends (its "
        "pods bind, at most placement.reservationSeconds, 120 s); the scheduler retries the pod"
    )
    assert v.allowed is False
    verdicts = [
        bindcheck.check(_binding(), pod, INV, cap, (), 120),
        bindcheck.check(_binding(kind="Scheduler"), pod, INV, cap, (HELD,), 120),
        bindcheck.check({"target": "x"}, pod, INV, cap, (HELD,), 120),
        bindcheck.check(_binding(), None, INV, cap, (HELD,), 120),
        bindcheck.check(_binding(), bindcheck.BoundPod("ml-research", "late-0", 0, LATE), INV, cap, (HELD,), 120),
        bindcheck.check(_binding(), pod, INV, None, (HELD,), 120),
        bindcheck.check(_binding(), pod, INV, placement.Capacity({}, {}, synced=False), (HELD,), 120),
        bindcheck.check(_binding("h100-big-1"), pod, INV, capacity(), (HELD,), 120),
        bindcheck.check(_binding(), bindcheck.BoundPod("ml-research", "gang-0", 8, GANG), INV, cap, (HELD,), 120),
    ]
    assert all(v.allowed is True for v in verdicts)
    assert [v.reason for v in verdicts] == [
        bindcheck.NO_RESERVATION,
        bindcheck.NO_TARGET,
        bindcheck.NO_TARGET,
        bindcheck.UNKNOWN_POD,
        bindcheck.NOT_WHOLE_GPUS,
        bindcheck.NO_VIEW,
        bindcheck.NO_VIEW,
        bindcheck.HARMLESS,
        bindcheck.HARMLESS,  # the reserved job's own pod
    ]


def test_check_counts_the_free_gpus_of_the_view_and_names_every_job_it_would_strand() -> None:
    """The rack's GPUs in use count: with 4 taken on one small node, a 1x8 reservation needs the other whole,
    and a 1-GPU pod there breaks it; two reservations broken at once are both named."""
    cap = capacity(*FULL_BIG, bound_pod("x", "h100-small-1", 4))
    one = (Reservation(GANG, RACK, "rack-small", (8,)),)
    small = bindcheck.BoundPod("ml-research", "late-0", 1, LATE)
    v = bindcheck.check(_binding("h100-small-2"), small, INV, cap, one, 120)
    assert v.allowed is False and "(1 GPUs) to node h100-small-2 (8 free)" in v.message
    two = (Reservation(GANG, RACK, "rack-small", (4,)), Reservation(LATE, RACK, "rack-small", (4,)))
    other = bindcheck.BoundPod("ml-research", "other-0", 8, None)
    one_node = capacity(*FULL_BIG, bound_pod("x", "h100-small-1", 8))  # both 1x4 gangs need h100-small-2
    v = bindcheck.check(_binding("h100-small-2"), other, INV, one_node, two, 120)
    assert "reserved for the gangs of jobs ml-research/gang, ml-research/late in rack" in v.message


def test_a_full_node_is_not_judged_in_place_of_another() -> None:
    """The view says h100-small-1 is full: a 1-GPU bind there is the kubelet's to refuse, even though the 1
    free GPU of h100-small-2 is reserved."""
    pods = (*FULL_BIG, bound_pod("x", "h100-small-1", 8), bound_pod("y", "h100-small-2", 7))
    held = (Reservation(GANG, RACK, "rack-small", (1,)),)
    assert harm("h100-small-1", 1, *pods, held=held) is None
    assert harm("h100-small-2", 1, *pods, held=held) is not None


def test_pod_of_reads_whole_gpus_of_the_resource_and_keeps_the_job() -> None:
    assert bindcheck.pod_of("ns", "p", {"nvidia.com/gpu": 4}, "j", "nvidia.com/gpu").whole_gpus == 4
    assert bindcheck.pod_of("ns", "p", {"nvidia.com/mig-1g.10gb": 2}, "j", "nvidia.com/gpu").whole_gpus == 0
    assert bindcheck.pod_of("ns", "p", {}, "j", "nvidia.com/gpu") == bindcheck.BoundPod("ns", "p", 0, "j")


def test_target_node_reads_only_a_node_target() -> None:
    assert bindcheck.target_node(_binding()) == "h100-small-1"
    assert bindcheck.target_node({"target": {"name": "n"}}) == "n"  # kind unset: a node
    assert bindcheck.target_node({"target": {"kind": "", "name": "n"}}) == "n"
    for bad in (None, [], {}, {"target": None}, {"target": {"kind": "Node"}}, {"target": {"name": 3}},
                {"target": {"kind": "Node", "name": ""}}, _binding(kind="Scheduler")):  # fmt: skip
        assert bindcheck.target_node(bad) is None


# -- the server: a pods/binding AdmissionReview ------------------------------------------------------------


def _review(binding: dict[str, Any], uid: str = "u1") -> bytes:
    meta = binding.get("metadata", {})
    return orjson.dumps({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid, "operation": "CREATE", "kind": {"group": "", "version": "v1", "kind": "Binding"},
            "resource": {"group": "", "version": "v1", "resource": "pods"}, "subResource": "binding",
            "name": meta.get("name", ""), "namespace": meta.get("namespace", ""), "object": binding,
            "userInfo": {"username": "system:kube-scheduler"},
        },
    })  # fmt: skip


def _pending(name: str, gpus: int, job: str) -> dict[str, Any]:
    pod = bound_pod(name, "", gpus, job)
    pod["status"] = {"phase": "Pending"}
    return pod


class Server:
    def __init__(self, namespace_labels: dict[str, str] | None = None) -> None:
        self.state = State()
        self.state.set_nodes(NODES, "file")
        self.state.set_namespaces({"ml-research": namespace_labels or {}})
        self.state.load_pods([*FULL_BIG, _pending("late-0", 8, "late"), _pending("cpu", 0, "late")], "file")
        self.metrics = Metrics()
        self.audit: list[dict[str, Any]] = []
        recorder = type("Audit", (), {"record": lambda _, r: self.audit.append(r), "stats": lambda _: {}})()
        self.handler = create_app(
            self.state, metrics=self.metrics, audit=recorder, config=ServerConfig()
        ).state.review_bytes

    def bind(self, binding: dict[str, Any]) -> dict[str, Any]:
        status, payload = asyncio.run(self.handler(_review(binding), "bind", None))
        assert status == 200, payload
        response: dict[str, Any] = orjson.loads(payload)["response"]
        return response


def _reserve(s: Server) -> None:
    s.state.reservations.record(placement_of(HELD), 120)


def placement_of(r: Reservation) -> Any:
    from policies.engine import Placement

    return Placement(r.job, r.key, r.domain, r.sizes)


def test_the_server_refuses_a_harmful_bind_with_403_audits_it_and_counts_it() -> None:
    s = Server()
    assert s.bind(_binding())["allowed"] is True  # no reservation yet
    _reserve(s)
    r = s.bind(_binding())
    assert r["allowed"] is False and r["status"]["code"] == 403
    assert r["status"]["message"].startswith(
        "reserved-bind: binding pod ml-research/late-0 (8 GPUs) to node h100-small-1"
    )
    assert s.bind(_binding("h100-big-1"))["allowed"] is True  # (the view says full: not judged)
    assert s.audit[-1]["rules"][0]["rule"] == "reserved-bind" and s.audit[-1]["kind"] == "Binding"
    assert len(s.audit) == 1  # allowed binds are not audited: every pod of the cluster is bound once
    text = s.metrics.render()
    assert 'gpu_admission_bind_checks_total{outcome="deny",reason="harms-reservation"} 1' in text
    assert 'gpu_admission_bind_checks_total{outcome="pass",reason="no-reservation"} 1' in text
    other = _binding()
    other["metadata"]["name"] = "not-in-the-view"
    assert s.bind(other)["allowed"] is True
    assert 'reason="unknown-pod"} 1' in s.metrics.render()


def test_the_reservations_gauge_counts_only_live_reservations() -> None:
    """An ended reservation is dropped when it is next read; the gauge reads, so it never counts one that
    ended while no review came (the placement benchmark waits on it between plays)."""
    s = Server()
    s.state.reservations.record(placement_of(HELD), 0.05)
    assert "gpu_admission_placement_reservations 1" in s.metrics.render()
    time.sleep(0.1)
    assert "gpu_admission_placement_reservations 0" in s.metrics.render()


def test_the_server_does_not_judge_binds_in_a_namespace_whose_enforcement_is_off() -> None:
    for mode in ("off", "warn", "audit"):
        s = Server({"gpu-admission.io/enforcement": mode})
        _reserve(s)
        assert s.bind(_binding())["allowed"] is True, mode


def _late_binding(name: str, node: str = "h100-small-1") -> dict[str, Any]:
    binding = _binding(node)
    binding["metadata"]["name"] = name
    return binding


def test_a_bind_of_a_pod_the_view_has_not_seen_yet_waits_for_it_briefly_and_is_then_judged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The scheduler can bind a pod a moment before the webhook's pod watch delivers it: a bind onto a reserved
    rack waits up to BIND_VIEW_WAIT for the view, so the harmful bind is refused instead of passed unseen."""
    from cluster.reflector import Change
    from webhook import app as app_mod

    s = Server()
    _reserve(s)
    view = s.state.pods
    assert view is not None
    # A wide window for the delivery below: the wait ends as soon as the view has the pod, so this costs nothing
    # on an idle machine, and on a busy one the 0.05 s sleep cannot outlast the real 0.3 s window.
    monkeypatch.setattr(app_mod, "BIND_VIEW_WAIT", 30.0)

    async def bind_while_the_watch_delivers() -> tuple[int, bytes]:
        answer = asyncio.ensure_future(s.handler(_review(_late_binding("fresh-0")), "bind", None))
        await asyncio.sleep(0.05)
        view.apply(Change("ADDED", "ml-research/fresh-0", None, _pending("fresh-0", 8, "late")))
        return await answer

    status, payload = asyncio.run(bind_while_the_watch_delivers())
    response = orjson.loads(payload)["response"]
    assert status == 200 and response["allowed"] is False, response
    assert "binding pod ml-research/fresh-0 (8 GPUs)" in response["status"]["message"]
    assert 'gpu_admission_bind_view_waits_total{result="seen"} 1' in s.metrics.render()
    # never seen (a pod with no GPU, or a watch further behind): allowed after the real wait. Only its lower bound
    # is asserted: how long past it a busy machine takes is no property of the code (timings are benchmarks').
    monkeypatch.setattr(app_mod, "BIND_VIEW_WAIT", 0.3)
    t0 = time.monotonic()
    assert s.bind(_late_binding("cpu-pod"))["allowed"] is True
    assert time.monotonic() - t0 >= app_mod.BIND_VIEW_WAIT
    assert 'gpu_admission_bind_view_waits_total{result="not-seen"} 1' in s.metrics.render()


class _Pods:
    """The API server's side of `pod_fetcher` for the in-process server: GET of a pod by path (the real one is
    read in tests/e2e/test_placement_e2e.py)."""

    def __init__(self, pods: dict[str, dict[str, Any]], delay: float = 0.0) -> None:
        self.pods, self.delay, self.paths = pods, delay, []

    def get(self, path: str) -> dict[str, Any]:
        from cluster.kubeclient import KubeError

        self.paths.append(path)
        time.sleep(self.delay)
        name = path.rsplit("/", 1)[1]
        if name not in self.pods:
            raise KubeError(404, "NotFound", f"GET {path}: pods {name!r} not found")
        return self.pods[name]


def test_a_bind_of_a_pod_the_watch_has_not_delivered_after_the_wait_is_judged_from_the_api_server() -> None:
    """A loaded watch can lag the scheduler by more than the wait: the pod is then read from the API server
    (one GET, at most BIND_FETCH_TIMEOUT) and judged; a pod that cannot be read is allowed, as before."""
    from webhook import app as app_mod
    from webhook.state import pod_fetcher

    s = Server()
    _reserve(s)
    api = _Pods({"lagging-0": _pending("lagging-0", 8, "late"), "cpu-pod": _pending("cpu-pod", 0, "late")})
    s.state.fetch_pod = pod_fetcher(api)
    response = s.bind(_late_binding("lagging-0"))
    assert response["allowed"] is False, response
    assert "binding pod ml-research/lagging-0 (8 GPUs)" in response["status"]["message"]
    assert api.paths == ["/api/v1/namespaces/ml-research/pods/lagging-0"]
    assert s.bind(_late_binding("cpu-pod"))["allowed"] is True  # read: no GPUs
    assert s.bind(_late_binding("gone"))["allowed"] is True  # 404: not judged
    text = s.metrics.render()
    for result in ("fetched", "not-seen", "fetch-failed"):
        assert f'gpu_admission_bind_view_waits_total{{result="{result}"}} 1' in text, result
    slow = Server()
    _reserve(slow)
    slow.state.fetch_pod = pod_fetcher(_Pods({"lagging-0": _pending("lagging-0", 8, "late")}, delay=3.0))
    t0 = time.monotonic()
    assert slow.bind(_late_binding("lagging-0"))["allowed"] is True  # the read took too long: not judged
    assert time.monotonic() - t0 >= app_mod.BIND_VIEW_WAIT + app_mod.BIND_FETCH_TIMEOUT
    assert 'gpu_admission_bind_view_waits_total{result="fetch-failed"} 1' in slow.metrics.render()


def test_a_bind_of_an_unseen_pod_outside_every_reserved_rack_does_not_wait() -> None:
    s = Server()
    _reserve(s)
    t0 = time.monotonic()
    assert s.bind(_late_binding("cpu-pod", node="h100-big-1"))["allowed"] is True
    assert s.bind(_late_binding("cpu-pod", node="no-such-node"))["allowed"] is True
    assert time.monotonic() - t0 < 0.25
    assert "gpu_admission_bind_view_waits_total" not in s.metrics.render()
    assert bindcheck.at_stake(_binding("h100-small-2"), INV, (HELD,))
    assert not bindcheck.at_stake(_binding("h100-big-2"), INV, (HELD,))
    assert not bindcheck.at_stake(_binding("h100-small-2", kind="Pod"), INV, (HELD,))
    assert not bindcheck.at_stake(_binding("h100-small-2"), INV, (Reservation(GANG, "zone", "rack-small", (8,)),))
