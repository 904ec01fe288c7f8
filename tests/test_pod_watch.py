"""The pod view fed by a real list + watch (over HTTPS from tests/test_kubeclient's scripted API server) as
`serve` runs it: the Reflector caches one small PodEntry per GPU pod and nothing of pods without GPUs,
garbage is counted and forgotten, and the view's counts follow binds, ends and deletions."""

from __future__ import annotations

import contextlib
import copy
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cluster.pods import PodEntry, PodView
from cluster.reflector import Reflector
from policies import ledger as L
from policies.subject import pod_facts
from tests.test_kubeclient import KubeTestServer, Recorded, Reply, Stream, api, client_for, event_line, node, tls_dir  # noqa: F401  (the scripted API server's fixtures)
from tests.test_ledger import stamp
from tests.test_node_watch import wait_for
from tests.test_placement import bound_pod
from webhook import ledger
from webhook import state as state_mod
from webhook.state import State


def pod(name: str, node: str, gpus: int, rv: str, job: str | None = None) -> dict[str, Any]:
    p = bound_pod(name, node, gpus, job_name=job)
    p["metadata"]["resourceVersion"] = rv
    p["spec"]["containers"][0]["env"] = [{"name": "X", "value": "y" * 1000}]  # what the cache must not keep
    if not gpus:
        p["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1"}}
    return p


LISTED = [
    pod("w0", "h100-1", 8, "5", job="j"),
    pod("w1", "", 8, "6", job="j"),  # pending
    pod("cpu", "h100-1", 0, "7"),
    {"metadata": {"name": "bad", "namespace": "ml-research"}, "spec": "garbage"},
]


class Script:
    def __init__(self, events: list[tuple[str, dict[str, Any]]]) -> None:
        self.events, self.watched = events, 0

    def __call__(self, r: Recorded) -> Reply | Stream | None:
        if r.path != "/api/v1/pods":
            return None
        if r.query.get("watch") != "true":
            return Reply(200, {"kind": "PodList", "items": LISTED, "metadata": {"resourceVersion": "10"}})
        self.watched += 1
        if self.watched == 1:
            return Stream([0.2, *(event_line(kind, obj) for kind, obj in self.events)], hold_open=True)
        return Stream([], hold_open=True)


def test_the_pod_cache_keeps_entries_of_gpu_pods_only_and_the_view_follows_the_watch(
    api: KubeTestServer,  # noqa: F811
    tls_dir: Path,  # noqa: F811
) -> None:
    bound = pod("w1", "h100-2", 8, "11", job="j")
    done = copy.deepcopy(LISTED[0])
    done["status"]["phase"], done["metadata"]["resourceVersion"] = "Succeeded", "12"
    events = [("MODIFIED", bound), ("ADDED", pod("cpu2", "h100-2", 0, "13")), ("MODIFIED", done)]
    api.route(Script(events))
    state = State()
    with client_for(api, tls_dir) as client:
        refl = state.watch_pods(client)
        try:
            assert refl.wait_synced(20)
            view = state.pods
            assert view is not None
            cached = refl.snapshot()
            assert sorted(cached) == ["ml-research/w0", "ml-research/w1"]  # no CPU pod, no garbage
            w0 = cached["ml-research/w0"]
            assert w0 == PodEntry("h100-1", (("nvidia.com/gpu", 8),), "ml-research/batch.kubernetes.io/job-name=j",
                                  "Running", "ml-research/w0", "5")  # fmt: skip
            assert w0.gpus is cached["ml-research/w1"].gpus  # one tuple per distinct request
            assert w0.job is sys.intern(str(w0.job)) and w0.node is sys.intern("h100-1")
            wait_for(lambda: view.snapshot().used_of("nvidia.com/gpu") == {"h100-2": 8})  # w0 ended, w1 bound
            snap = view.snapshot()
            assert snap.pods == 2 and snap.skipped == 1
            assert dict(snap.jobs) == {"ml-research/batch.kubernetes.io/job-name=j": {"h100-2": 1}}
        finally:
            state.stop()


def test_transform_counts_garbage_and_skips_pods_without_gpus() -> None:
    view = PodView(pod_facts)
    assert view.transform(pod("cpu", "n", 0, "1")) is None and view.snapshot().skipped == 0
    assert view.transform("not a pod") is None and view.snapshot().skipped == 1
    e = view.transform(pod("a", "n", 2, "9"))
    assert e is not None and (e.key, e.version, e.gpus, e.holding) == (
        "ml-research/a",
        "9",
        (("nvidia.com/gpu", 2),),
        True,
    )


def _job_pod(name: str, node: str, rv: str, created: float, scheduled: float | None, job: str | None) -> dict[str, Any]:
    p = pod(name, node, 8, rv, job=job)
    p["metadata"]["creationTimestamp"] = stamp(created)
    if scheduled is not None:
        p["status"]["conditions"] = [{"type": "PodScheduled", "status": "True", "lastTransitionTime": stamp(scheduled)}]
    return p


def test_one_pod_watch_feeds_the_view_and_the_ledger_with_entries_only(
    api: KubeTestServer,  # noqa: F811
    tls_dir: Path,  # noqa: F811
) -> None:
    """With the ledger on, the cache still holds one PodEntry per GPU pod and no note (no pod object, none of the
    ledger's fields), the tracker gets its facts from the notes of the view's changes, and the pods are listed
    and watched once."""
    now = float(int(time.time()))
    w0 = _job_pod("w0", "h100-1", "5", now - 3, now - 2, "j")
    w1 = _job_pod("w1", "", "6", now - 3, None, "j")
    old = _job_pod("old", "h100-2", "7", now - 700, now - 690, "o")  # started before the server: not its job
    listed = [w0, w1, old, LISTED[2], LISTED[3]]
    events = [
        ("MODIFIED", _job_pod("w1", "h100-1", "11", now - 3, now - 2, "j")),  # bound in w0's second
        ("ADDED", _job_pod("gone", "", "12", now - 1, None, "k")),
        ("DELETED", _job_pod("gone", "", "13", now - 1, None, "k")),  # deleted mid-way, never bound
        ("ADDED", _job_pod("bare", "h100-2", "14", now - 1, now, None)),  # no owner, no job label
    ]
    api.route(ListedScript(listed, events))
    state = State()
    rows: list[L.JobRow] = []
    state.ledger = ledger.for_state(state, window=600)
    state.ledger.settle = 0.5  # the list's pods of a job come within it
    state.ledger.attach(on_final=rows.append)
    with client_for(api, tls_dir) as client:
        refl = state.watch_pods(client)
        try:
            assert refl.wait_synced(20)
            wait_for(lambda: len(rows) == 2 and state.ledger.sizes["groups"] == 1)
            cached = refl.snapshot()
            assert sorted(cached) == ["ml-research/bare", "ml-research/old", "ml-research/w0", "ml-research/w1"]
            assert all(isinstance(e, PodEntry) and e.note is None for e in cached.values())  # the changes had them
            by_group = {r.group: r for r in rows}
            j = by_group["ml-research/batch.kubernetes.io/job-name=j"]
            assert (j.outcome, j.pods, j.bound, j.pending_s) == ("one-domain", 2, 2, 1.0)
            bare = by_group["ml-research/pod=bare"]
            assert (bare.unowned, bare.bound, bare.pending_s) == (True, 1, 1.0)
            assert state.ledger.counts["late"] == 1 and state.ledger.counts["deleted"] == 1
            assert state.ledger.sizes["groups"] == 1  # job k: its only pod deleted before bound, until the window
            assert state.pods is not None and state.pods.snapshot().used_of("nvidia.com/gpu") == {
                "h100-1": 16,
                "h100-2": 16,
            }
            pod_requests = [r for r in api.requests if r.path == "/api/v1/pods"]
            assert [r.query.get("watch") == "true" for r in pod_requests] == [False, True]  # one list, one watch
        finally:
            state.stop()


class ListedScript(Script):
    def __init__(self, listed: list[dict[str, Any]], events: list[tuple[str, dict[str, Any]]]) -> None:
        super().__init__(events)
        self.listed = listed

    def __call__(self, r: Recorded) -> Reply | Stream | None:
        if r.path == "/api/v1/pods" and r.query.get("watch") != "true":
            return Reply(200, {"kind": "PodList", "items": self.listed, "metadata": {"resourceVersion": "10"}})
        return super().__call__(r)


class SlowNodes:
    """The Node list answered once `release` is set (or an error `status` at once); the watch held open."""

    def __init__(self, status: int = 200) -> None:
        self.release, self.status = threading.Event(), status

    def __call__(self, r: Recorded) -> Reply | Stream | None:
        if r.path != "/api/v1/nodes":
            return None
        if r.query.get("watch") == "true":
            return Stream([], hold_open=True)
        if self.status != 200:
            return Reply(self.status, {"kind": "Status", "code": self.status, "reason": "Forbidden"})
        self.release.wait(20)
        return Reply(200, {"kind": "NodeList", "items": [node("h100-1", "1")], "metadata": {"resourceVersion": "2"}})


@contextlib.contextmanager
def nodes_then_pods(api: KubeTestServer, tls_dir: Path, nodes: SlowNodes) -> Iterator[tuple[State, Reflector]]:  # noqa: F811
    """A State watching Nodes (answered by `nodes`) and pods (LISTED), as `serve` starts them; stopped after."""
    api.route(nodes)
    api.route(Script([]))
    state = State()
    with client_for(api, tls_dir) as client:
        state.watch_nodes(client)
        try:
            yield state, state.watch_pods(client)
        finally:
            state.stop()


def test_the_pod_watch_starts_once_the_first_node_list_is_built(
    api: KubeTestServer,  # noqa: F811
    tls_dir: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Both first lists at once fragment the heap (docs/benchmarks.md §4): the pods are listed only after the
    Node inventory is built, /readyz saying why meanwhile; glibc's mmap threshold is fixed from then on."""
    mallopts: list[tuple[int, int]] = []
    monkeypatch.setattr(state_mod, "_mallopt", lambda *a: mallopts.append(a))
    nodes = SlowNodes()
    with nodes_then_pods(api, tls_dir, nodes) as (state, refl):
        wait_for(lambda: api.requests_to("/api/v1/nodes"))
        time.sleep(0.5)
        assert api.requests_to("/api/v1/pods") == [] and state.pods_waiting and mallopts == []
        ready, details = state.ready()
        assert not ready and details["podView"]["note"].startswith("pod watch starts once the Node inventory")
        nodes.release.set()
        assert refl.wait_synced(20)
        assert mallopts == [(-3, state_mod.POD_LIST_MMAP_THRESHOLD)]  # M_MMAP_THRESHOLD
        assert state.status.inventory_synced and not state.pods_waiting
        assert state.ready()[0] and state.pods is not None and state.pods.snapshot().pods == 2


def test_a_failing_node_list_does_not_hold_the_pod_watch(
    api: KubeTestServer,  # noqa: F811
    tls_dir: Path,  # noqa: F811
) -> None:
    with nodes_then_pods(api, tls_dir, SlowNodes(status=403)) as (state, refl):
        assert refl.wait_synced(20)
        assert not state.status.inventory_synced and not state.pods_waiting


def test_a_stop_while_the_pod_watch_waits_never_starts_it(
    api: KubeTestServer,  # noqa: F811
    tls_dir: Path,  # noqa: F811
) -> None:
    nodes = SlowNodes()
    with nodes_then_pods(api, tls_dir, nodes) as (state, refl):
        wait_for(lambda: api.requests_to("/api/v1/nodes"))
        state.stop()
        nodes.release.set()
        time.sleep(0.5)
        assert not refl.running and api.requests_to("/api/v1/pods") == []
