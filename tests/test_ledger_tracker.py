"""The server's ledger tracker (webhook/ledger.py): jobs from a stream of pod changes, final once bound or after
the window, bounded state, bounded metric labels, follow-up records under the admission's uid."""

from __future__ import annotations

import gc
import re
import subprocess
import sys
import tracemalloc
from typing import Any

import pytest

from cluster.pods import PodView
from cluster.reflector import Change, Reflector
from policies import ledger as L
from policies.subject import pod_facts
from tests.test_ledger import T0, pod, stamp, topo
from webhook import ledger
from webhook.metrics import Metrics


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def tracker(clock: Clock, **kw: Any) -> tuple[ledger.Tracker, list[L.JobRow], Metrics]:
    t = topo({"a": 4, "b": 4})
    finals: list[L.JobRow] = []
    m = Metrics()
    tr = ledger.Tracker(
        lambda: t, lambda: {n: 8 for n in t.nodes}, clock=clock, metrics=m, on_final=finals.append, **kw
    )
    return tr, finals, m


def add(tr: ledger.Tracker, obj: dict[str, Any]) -> None:
    meta = obj["metadata"]
    tr.apply(Change("ADDED", f"{meta['namespace']}/{meta['name']}", None, ledger.entry(obj)))


def bind(tr: ledger.Tracker, obj: dict[str, Any], node: str, at: float) -> None:
    bound = {**obj, "spec": {**obj["spec"], "nodeName": node}, "status": {**obj["status"]}}
    bound["status"]["conditions"] = [{"type": "PodScheduled", "status": "True", "lastTransitionTime": stamp(at)}]
    meta = obj["metadata"]
    tr.apply(Change("MODIFIED", f"{meta['namespace']}/{meta['name']}", obj, ledger.entry(bound)))


def delete(tr: ledger.Tracker, obj: dict[str, Any]) -> None:
    meta = obj["metadata"]
    tr.apply(Change("DELETED", f"{meta['namespace']}/{meta['name']}", obj, None))


def test_job_is_final_when_every_pod_is_bound_with_its_admission_uid() -> None:
    clock = Clock()
    tr, finals, m = tracker(clock)
    tr.admitted("ml/job-name=j", L.Admission("uid-j", T0, "allow", ("training-rack",)))
    pods = [pod(f"j-{i}", labels={"job-name": "j"}, created=T0 + i) for i in range(2)]
    for p in pods:
        add(tr, p)
    bind(tr, pods[0], "a-1", T0 + 4)
    assert finals == []
    bind(tr, pods[1], "b-1", T0 + 6)
    clock.now += ledger.SETTLE - 0.5
    tr.sweep()
    assert finals == []  # more pods of the job may still come
    clock.now += 0.5
    tr.sweep()
    [row] = finals
    assert (row.outcome, row.pending_s, row.uid, row.placement, row.best) == (
        "spanning",
        6.0,
        "uid-j",
        "cross-rack",
        "intra-rack",
    )
    record = ledger.follow_up(row)
    assert (record["uid"], record["record"], record["rules"], record["commRatio"]) == (
        "uid-j",
        "outcome",
        ["training-rack"],
        row.comm_ratio,
    )
    text = m.render()
    assert 'gpu_admission_ledger_jobs_total{namespace="ml",workload="batch",outcome="spanning"} 1' in text
    assert 'gpu_admission_ledger_pending_seconds_bucket{namespace="ml",workload="batch",le="5"} 0' in text
    assert 'gpu_admission_ledger_pending_seconds_bucket{namespace="ml",workload="batch",le="15"} 1' in text
    assert 'gpu_admission_ledger_comm_ratio_bucket{namespace="ml",workload="batch",le="1.1"} 0' in text
    assert 'gpu_admission_ledger_comm_ratio_bucket{namespace="ml",workload="batch",le="1.25"} 1' in text
    assert tr.sizes["groups"] == 0 and tr.sizes["pods"] == 0
    bind(tr, pods[1], "b-1", T0 + 6)  # a late event of a final job does not start it again
    assert tr.sizes["groups"] == 0 and tr.counts["late"] == 1


def test_a_job_whose_template_names_it_gets_its_admission_uid() -> None:
    """A RayJob whose worker template says gpu-admission.io/job: ppo-atari-run-7: its admission is filed under
    the group its pods carry (`admitted_group`), so the final row carries the admission's uid (before: filed
    under the object's name, the row had no uid and the admission was never matched)."""
    clock = Clock()
    tr, finals, _ = tracker(clock)
    template = {"metadata": {"labels": {"gpu-admission.io/job": "ppo-atari-run-7"}}, "spec": {"containers": []}}
    rayjob = {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": "ppo-atari", "namespace": "ml"},
        "spec": {"rayClusterSpec": {"workerGroupSpecs": [{"groupName": "gpu", "replicas": 2, "template": template}]}},
    }
    tr.admitted(L.admitted_group("RayJob", "ml", "ppo-atari", rayjob) or "", L.Admission("uid-r", T0, "allow"))
    run7 = {"gpu-admission.io/job": "ppo-atari-run-7"}
    pods = [pod(f"w-{i}", labels=run7, owner=("RayCluster", "r")) for i in (0, 1)]
    for p in pods:
        add(tr, p)
    bind(tr, pods[0], "a-1", T0 + 1)
    bind(tr, pods[1], "a-2", T0 + 2)
    clock.now += ledger.SETTLE + 5
    tr.sweep()
    [row] = finals
    assert (row.group, row.uid, row.outcome) == ("ml/gpu-admission.io/job=ppo-atari-run-7", "uid-r", "one-domain")


def test_window_makes_partly_and_never_bound_final_and_partial_gauges_count_them_before() -> None:
    clock = Clock()
    tr, finals, m = tracker(clock, window=60)
    half = [pod(f"h-{i}", labels={"job-name": "h"}) for i in range(3)]
    never = [pod(f"n-{i}", labels={"job-name": "n"}) for i in range(2)]
    for p in (*half, *never):
        add(tr, p)
    bind(tr, half[0], "a-1", T0 + 1)
    bind(tr, half[1], "a-2", T0 + 2)
    text = m.render()
    assert 'gpu_admission_ledger_partial_gangs{namespace="ml",workload="batch"} 1' in text
    assert 'gpu_admission_ledger_partial_gang_gpus{namespace="ml",workload="batch"} 16' in text
    clock.now = T0 + 61
    tr.sweep()
    assert sorted((r.group, r.outcome, r.pending_s) for r in finals) == [
        ("ml/job-name=h", "partly-bound", 61.0),
        ("ml/job-name=n", "never-bound", 61.0),
    ]
    assert "gpu_admission_ledger_partial_gangs{" not in m.render()


def test_denial_is_final_at_once_and_counts_against_nothing() -> None:
    clock = Clock()
    tr, finals, m = tracker(clock)
    tr.admitted("ml/batch.kubernetes.io/job-name=x", L.Admission("uid-x", T0, "allow"))
    tr.admitted("ml/batch.kubernetes.io/job-name=x", L.Admission("uid-y", T0, "deny", ("training-same-rack",)))
    assert finals == []  # queued by the request path, taken in by the next change or sweep
    tr.sweep()
    [row] = finals
    assert (row.outcome, row.uid, row.rules) == ("denied", "uid-y", ("training-same-rack",))
    text = m.render()
    assert 'gpu_admission_ledger_jobs_total{namespace="ml",workload="unclassified",outcome="denied"} 1' in text
    assert "gpu_admission_ledger_jobs_bound_in_window_total{" not in text


class Leader:
    """The leadership test a tracker is given (`Elector.leader` in the server), switched by the test."""

    def __init__(self, leading: bool) -> None:
        self.leading = leading

    def __call__(self) -> bool:
        return self.leading


def standby(clock: Clock) -> tuple[ledger.Tracker, list[L.JobRow], Metrics, Leader]:
    """A tracker that is not the leader (yet): its leadership switched by the test."""
    tr, rows, m = tracker(clock)
    leads = Leader(False)
    tr.attach(leading=leads)
    return tr, rows, m, leads


def finish(clock: Clock, trackers: list[ledger.Tracker], name: str, at: float) -> None:
    """A two-pod job `name` whose pods are created and bound at `at`, final SETTLE seconds later, fed to all."""
    clock.now = at
    pods = [pod(f"{name}-{i}", labels={"job-name": name}, created=at) for i in range(2)]
    for tr in trackers:
        for p in pods:
            add(tr, p)
        for p in pods:
            bind(tr, p, "a-1", at)
    clock.now = at + ledger.SETTLE
    for tr in trackers:
        tr.sweep()


def test_only_the_leader_counts_jobs_and_partial_gangs() -> None:
    clock = Clock()
    (a, a_rows, a_m), (b, b_rows, b_m) = tracker(clock), tracker(clock)
    a.attach(leading=Leader(True))
    b.attach(leading=Leader(False))
    finish(clock, [a, b], "j", T0)
    assert [r.group for r in a_rows] == ["ml/job-name=j"] and b_rows == []
    assert b.counts["standby"] == 1 and b.counts["final"] == 0
    a_text, b_text = a_m.render(), b_m.render()
    assert "gpu_admission_ledger_leader 1" in a_text and "gpu_admission_ledger_leader 0" in b_text
    assert 'gpu_admission_ledger_jobs_total{namespace="ml",workload="batch",outcome="one-domain"} 1' in a_text
    assert "gpu_admission_ledger_jobs_total{" not in b_text
    half = [pod(f"h-{i}", labels={"job-name": "h"}) for i in range(2)]
    for tr in (a, b):
        for p in half:
            add(tr, p)
        bind(tr, half[0], "a-2", clock.now)
    assert 'gpu_admission_ledger_partial_gangs{namespace="ml",workload="batch"} 1' in a_m.render()
    assert "gpu_admission_ledger_partial_gangs{" not in b_m.render()


def test_take_over_counts_each_job_once_across_the_two_replicas() -> None:
    clock = Clock()
    (a, a_rows, _), (b, b_rows, b_m) = tracker(clock), tracker(clock)
    a_leads, b_leads = Leader(True), Leader(False)
    a.attach(leading=a_leads)
    b.attach(leading=b_leads)
    finish(clock, [a, b], "one", T0)  # a counts it
    renewed = T0 + 7  # a's last renewal of the Lease
    finish(clock, [a, b], "two", T0 + 8)  # a counts it too: it ran 1 s past its last renewal, then died
    finish(clock, [b], "three", T0 + 20)  # a is gone; b has not taken over yet
    b_leads.leading = True
    clock.now = T0 + 30
    b.promote(renewed)  # b's standby rows after a's last renewal: "two" (a counted it too) and "three"
    counted = sorted(r.group.split("=")[1] for r in (*a_rows, *b_rows))
    assert counted == ["one", "three", "two", "two"]  # at most the jobs of a's last moments twice, none lost
    finish(clock, [b], "four", T0 + 40)
    assert [r.group.split("=")[1] for r in b_rows] == ["two", "three", "four"]
    assert b.counts["final"] == 3 and 'outcome="one-domain"} 3' in b_m.render()


def test_a_replica_started_later_ends_a_jobs_window_when_the_leader_did() -> None:
    # The leader saw the job from its first pod; the standby started 9 minutes later (a rolling update). Both
    # make it final 10 minutes after its first pod: before the leader hands over, so it is counted once.
    clock = Clock()
    (a, a_rows, _), (b, b_rows, _, b_leads) = tracker(clock), standby(clock)
    stuck = [pod(f"s-{i}", labels={"job-name": "s"}) for i in range(2)]
    for p in stuck:
        add(a, p)
    clock.now = T0 + 540
    for p in stuck:
        add(b, p)
    clock.now = T0 + ledger.DEFAULT_WINDOW
    a.sweep()
    b.sweep()
    assert [r.outcome for r in a_rows] == ["never-bound"] and b.counts["standby"] == 1
    b_leads.leading = True
    b.promote(T0 + ledger.DEFAULT_WINDOW + 1)  # the leader released after that
    clock.now += 600
    b.sweep()
    assert b_rows == []


def test_promotion_after_a_release_or_without_a_previous_leader() -> None:
    clock = Clock()
    tr, rows, _, leads = standby(clock)
    finish(clock, [tr], "early", T0)
    finish(clock, [tr], "late", T0 + 10)
    leads.leading = True
    tr.promote(T0 + ledger.SETTLE)  # the previous leader released at once after "early" was final
    assert [r.group for r in rows] == ["ml/job-name=late"]
    leads.leading = False
    finish(clock, [tr], "alone", T0 + 20)
    leads.leading = True
    tr.promote(None)  # there was no leader before (it created the Lease): everything kept is ours to count
    assert [r.group for r in rows] == ["ml/job-name=late", "ml/job-name=alone"]
    tr.promote(None)  # nothing twice
    assert len(rows) == 2


def test_a_standby_keeps_its_rows_for_a_minute_only_and_counts_its_own_denials() -> None:
    clock = Clock()
    tr, rows, m, leads = standby(clock)
    finish(clock, [tr], "old", T0)
    finish(clock, [tr], "new", T0 + ledger.STANDBY_KEEP + 10)  # "old" is dropped from the standby rows
    tr.admitted("ml/job-name=x", L.Admission("uid-x", clock.now, "deny", ("training-same-rack",)))
    tr.sweep()  # a denial only this replica saw: counted by it, leader or not
    assert [(r.group, r.outcome) for r in rows] == [("ml/job-name=x", "denied")]
    leads.leading = True
    tr.promote(None)
    assert [r.group for r in rows] == ["ml/job-name=x", "ml/job-name=new"]
    assert 'outcome="denied"} 1' in m.render()


def test_pods_deleted_before_binding_unowned_pods_and_unknown_nodes_are_counted() -> None:
    clock = Clock()
    tr, finals, _ = tracker(clock, window=30)
    gang = [pod(f"g-{i}", labels={"job-name": "g"}) for i in range(2)]
    for p in gang:
        add(tr, p)
    delete(tr, gang[1])  # deleted mid-way, never bound
    bind(tr, gang[0], "a-1", T0 + 1)
    lonely = pod("lonely", labels={}, owner=None)
    add(tr, lonely)
    bind(tr, lonely, "nowhere", T0 + 2)  # a node the inventory does not know
    far = [pod(f"f-{i}", labels={"job-name": "f"}) for i in range(2)]
    for p, node in zip(far, ("a-1", "ghost"), strict=True):
        add(tr, p)
        bind(tr, p, node, T0 + 3)
    tr.apply(Change("ADDED", "ml/garbage", None, {"metadata": "x", "spec": {}}))
    clock.now = T0 + 31
    tr.sweep()
    by_group = {r.group: r for r in finals}
    assert (by_group["ml/job-name=g"].outcome, by_group["ml/job-name=g"].deleted) == ("partly-bound", 1)
    assert (by_group["ml/pod=lonely"].outcome, by_group["ml/pod=lonely"].unowned) == ("one-domain", True)
    assert by_group["ml/job-name=f"].outcome == "unknown-topology"
    assert (tr.counts["skipped"], tr.counts["unowned"], tr.counts["deleted"]) == (1, 1, 1)


def test_inference_replicas_are_spread_rows_until_deleted() -> None:
    clock = Clock()
    tr, finals, _ = tracker(clock, window=5)
    rs = {"labels": {"pod-template-hash": "h"}, "owner": ("ReplicaSet", "web-h"), "gpus": 1}
    web = [pod(f"web-h-{i}", **rs) for i in range(3)]  # type: ignore[arg-type]
    for p, node in zip(web, ("a-1", "a-1", "b-2"), strict=True):
        add(tr, p)
        bind(tr, p, node, T0 + 1)
    clock.now += 60
    tr.sweep()
    jobs, inference = tr.rows()
    assert finals == [] and jobs == []  # an inference workload is never final: it runs
    [row] = inference
    assert (row.group, row.bound, row.per_node, row.per_zone) == (
        "ml/Deployment/web",
        3,
        (("a-1", 2), ("b-2", 1)),
        (("z1", 3),),
    )
    for p in web:
        delete(tr, p)  # scaled to zero: nothing kept
    assert tr.rows() == ([], []) and tr.sizes["pods"] == 0


def test_oldest_jobs_are_evicted_past_the_limits() -> None:
    clock = Clock()
    tr, finals, _ = tracker(clock, max_groups=100, max_pods=150)
    for i in range(300):
        add(tr, pod(f"p-{i}", labels={"job-name": f"j{i}"}))
        assert tr.sizes["groups"] <= 100 and tr.sizes["pods"] <= 150
    assert tr.counts["evicted"] == 200 and [r.group for r in finals[:2]] == ["ml/job-name=j0", "ml/job-name=j1"]
    assert {r.outcome for r in finals} == {"never-bound"}
    rs = {"labels": {"pod-template-hash": "h"}, "owner": ("ReplicaSet", "web-h"), "gpus": 1}
    add(tr, pod("web-h-0", **rs))  # type: ignore[arg-type]
    for i in range(300, 400):
        add(tr, pod(f"p-{i}", labels={"job-name": f"j{i}"}))
    assert tr.counts["evicted"] == 301 and len(finals) == 300  # the Deployment was forgotten, not final
    assert all(r.workload != "inference" for r in finals)


def _series(text: str, name: str) -> set[str]:
    return {line.split(" ")[0] for line in text.splitlines() if re.match(rf"{name}[{{ ]", line)}


def test_ten_thousand_jobs_in_ten_thousand_namespaces_keep_the_label_sets_bounded() -> None:
    clock = Clock()
    tr, finals, m = tracker(clock, window=30)
    outcomes = []
    for i in range(10_000):
        ns = f"team-{i}"
        kind = i % 4
        pods = [pod(f"p-{i}-{k}", ns=ns, labels={"job-name": "j"}, created=clock.now) for k in range(2)]
        for p in pods:
            add(tr, p)
        at = clock.now + 1
        if kind == 0:  # one rack
            bind(tr, pods[0], "a-1", at)
            bind(tr, pods[1], "a-2", at)
        elif kind == 1:  # two racks
            bind(tr, pods[0], "a-1", at)
            bind(tr, pods[1], "b-1", at)
        elif kind == 2:  # half
            bind(tr, pods[0], "a-3", at)
        outcomes.append(kind)
        clock.now += 0.01
    clock.now += 31
    tr.sweep()
    assert len(finals) == 10_000
    text = m.render()
    limit = ledger.MAX_NAMESPACE_LABELS + 1  # 50 namespaces and _other
    jobs = _series(text, "gpu_admission_ledger_jobs_total")
    assert len(jobs) <= limit * len(L.CLASSES) * len(L.OUTCOMES)
    assert len(jobs) == 50 * 1 + 4  # each of the first 50 namespaces has one outcome; _other has 4
    pending = _series(text, "gpu_admission_ledger_pending_seconds_bucket")
    assert len(pending) <= limit * len(L.CLASSES) * (len(ledger.PENDING_BOUNDS) + 1)
    assert len(set(re.findall(r'namespace="([^"]+)"', text))) == limit
    samples = [line.rsplit(" ", 1) for line in text.splitlines() if line.startswith("gpu_admission_ledger_jobs_total{")]
    assert sum(float(v) for _, v in samples) == 10_000
    by_outcome = {o: sum(float(v) for k, v in samples if f'outcome="{o}"' in k) for o in L.OUTCOMES}
    assert by_outcome == {
        "one-domain": 2500,
        "spanning": 2500,
        "unknown-topology": 0,
        "partly-bound": 2500,
        "never-bound": 2500,
        "denied": 0,
    }


def test_a_long_watch_stream_through_the_pod_view_keeps_memory_flat() -> None:
    """The server's path: watch events through the pod Reflector (its transform is the view's, with the
    ledger's note), the view and the tracker fed by its changes. 24,000 jobs in 6 quarters (a quarter of them
    bare pods with no owner, some bound to nodes the inventory does not know, some with a pod deleted before
    it was bound, unreadable objects); each quarter's pods end when it is over (DELETED, as the API server
    tells a watch whose field selector they left). Nothing raises; once the bounded memories are full (after
    the third quarter) the cache, view and tracker hold what they held after the third."""
    clock = Clock()
    tr, finals, m = tracker(clock, window=5, max_groups=1_000, max_pods=2_000, max_done=2_000)
    view = PodView(pod_facts, note=L.pod_note)

    def changed(change: Change) -> None:
        view.apply(change)
        tr.apply(change)

    refl = Reflector(None, "/api/v1/pods", on_change=changed, transform=view.transform,  # type: ignore[arg-type]
                     key_of=lambda e: e.key, version_of=lambda e: e.version)  # fmt: skip
    final = 0
    rv = 0

    def event(kind: str, obj: dict[str, Any]) -> None:
        nonlocal rv
        rv += 1
        obj["metadata"]["resourceVersion"] = str(rv)
        refl._apply({"type": kind, "object": obj})

    def job(i: int) -> list[dict[str, Any]]:
        ns = f"ns-{i % 97}"
        labels = {} if i % 4 == 3 else {"job-name": f"j{i}"}
        owner = None if i % 4 == 3 else ("Job", f"j{i}")
        pods = [
            pod(f"p{i}-{k}", ns=ns, labels=labels, owner=owner, created=clock.now) for k in range(2 if labels else 1)
        ]
        for p in pods:
            event("ADDED", p)
        if i % 5 == 0 and len(pods) > 1:
            event("DELETED", pods.pop())
        if i % 7 == 0:
            event("ADDED", {"metadata": {"name": f"junk{i}", "namespace": ns}, "spec": []})
        node = "ghost" if i % 11 == 0 else "a-1"
        bound = {**pods[0], "spec": {**pods[0]["spec"], "nodeName": node}, "status": {"phase": "Running"}}
        scheduled = {"type": "PodScheduled", "status": "True", "lastTransitionTime": stamp(clock.now)}
        bound["status"]["conditions"] = [scheduled]
        bound["metadata"] = {**pods[0]["metadata"]}
        event("MODIFIED", bound)
        clock.now += 0.001
        return pods

    def quarter(start: int) -> int:
        nonlocal final
        live = [p for i in range(start, start + 4_000) for p in job(i)]
        clock.now += 6
        tr.sweep()
        for p in live:
            event("DELETED", p)
        del live
        final += len(finals)
        finals.clear()
        gc.collect()
        return tracemalloc.get_traced_memory()[0]

    tracemalloc.start()
    try:
        # Three quarters to warm up: the pod view's layered counts keep up to COMPACT_AT removed keys beside
        # their base, and the interpreter's interned-string table grows once to the peak of live job names
        # (a one-time resize of ~2 MB, not ours to bound). A leak of one small object per job (~60 bytes,
        # cluster/layered.py's delta when it was compacted only on read) grows 240 KB a quarter and fails here.
        memory = [quarter(start) for start in range(0, 24_000, 4_000)]
    finally:
        tracemalloc.stop()
    first, last = memory[2], memory[-1]
    assert final == 24_000
    assert last <= first * 1.05 + 64 * 1024, memory
    assert len(refl) == 0 and view.snapshot().pods == 0 and view.snapshot().used == {}
    assert tr.sizes == {"groups": 0, "pods": 0, "done": 2_000, "admissions": 0}
    assert view.snapshot().skipped == len(range(0, 24_000, 7)) and tr.counts["unowned"] == 6_000
    assert tr.counts["deleted"] == len([i for i in range(0, 24_000, 5) if i % 4 != 3])
    assert m.render().count("gpu_admission_ledger_jobs_total{") <= 51 * 4 * 6


def test_follow_up_of_a_job_another_replica_admitted_carries_the_jobs_uid() -> None:
    clock = Clock()
    tr, rows, _ = tracker(clock)
    pods = [pod(f"o-{i}", labels={"job-name": "o"}) for i in range(2)]
    for p in pods:
        p["metadata"]["ownerReferences"][0]["uid"] = "job-uid-o"
        add(tr, p)
        bind(tr, p, "a-1", T0 + 1)
    clock.now = T0 + ledger.SETTLE + 1
    tr.sweep()
    [row] = rows
    record = ledger.follow_up(row)
    assert (record["uid"], record["admissionUid"], record["jobUid"]) == ("job-uid-o", None, "job-uid-o")
    tr.admitted("ml/job-name=k", L.Admission("uid-k", T0, "allow"))  # seen here: the admission's uid first
    for p in [pod(f"k-{i}", labels={"job-name": "k"}) for i in range(2)]:
        p["metadata"]["ownerReferences"][0]["uid"] = "job-uid-k"
        add(tr, p)
        bind(tr, p, "a-2", clock.now)
    clock.now += ledger.SETTLE
    tr.sweep()
    record = ledger.follow_up(rows[-1])
    assert (record["uid"], record["admissionUid"], record["jobUid"]) == ("uid-k", "uid-k", "job-uid-k")


@pytest.mark.parametrize("value", ["a/b/c", "ns/", "/name"])
def test_serve_refuses_a_bad_lease_name_in_one_line(value: str) -> None:
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "webhook",
            "serve",
            "--no-kube",
            "--tls-cert",
            "x",
            "--tls-key",
            "y",
            "--ledger-lease",
            value,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "expected NAME or NAMESPACE/NAME" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
