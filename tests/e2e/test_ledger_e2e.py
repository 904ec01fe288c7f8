"""Issue #18 on the real control plane: the ledger agrees with what the API server shows.

Its own cluster (racks of 2 and 2 nodes x 8 H100), the real Job controller and kube-scheduler, and `gpu-admission
serve` (deploy/'s registration, its pod watch feeding the ledger, an audit file). A stream of Indexed Jobs runs
in a namespace where the webhook is off and in one where it enforces: whole jobs, a job left partly bound, a job
never bound, a job the webhook denies. For every job the ledger's outcome, pending time, placement and comm ratio
are checked against the pods' real `PodScheduled` conditions and nodes and against `gpu-admission estimate`:
both the server's follow-up audit records (under the uid of the job's admission) and `gpu-admission placement`
read live from the cluster."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from policies.ledger import parse_time
from tests.e2e import placement as pl
from tests.e2e.cluster import ControlPlane
from tests.e2e.webhook import Webhook

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
WINDOW = 20  # the server's --ledger-window: jobs not fully bound are final this long after their first pod


@pytest.fixture(scope="module")
def cp() -> Iterator[ControlPlane]:
    with pl.racks({"rack-a": 2, "rack-b": 2}) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def wh(cp: ControlPlane) -> Iterator[Webhook]:
    hook = Webhook(cp, "--ledger-window", str(WINDOW))
    try:
        yield hook
    finally:
        hook.close()


def cli(*args: str) -> Any:
    r = subprocess.run(
        [sys.executable, "-m", "webhook", *args, "-o", "json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def scheduled_at(p: dict[str, Any]) -> float | None:
    for c in p.get("status", {}).get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "True":
            return parse_time(c["lastTransitionTime"])
    return None


def expected(pods: list[dict[str, Any]], held_before: set[str], racks: dict[str, str]) -> dict[str, Any]:
    """What the API server says of one job (8-GPU pods: one per node), and the estimator's ratio for it."""
    bound = {p["spec"]["nodeName"]: scheduled_at(p) for p in pods if p["spec"].get("nodeName")}
    assert all(t is not None for t in bound.values())
    unbound = [p for p in pods if not p["spec"].get("nodeName")]
    for p in unbound:  # the scheduler said why: PodScheduled=False
        assert any(c["type"] == "PodScheduled" and c["status"] == "False" for c in p["status"]["conditions"])
    created = min(parse_time(p["metadata"]["creationTimestamp"]) or 0.0 for p in pods)
    out: dict[str, Any] = {"bound": len(bound), "pods": len(pods)}
    if unbound:
        out["outcome"] = "partly-bound" if bound else "never-bound"
        return out
    used = {racks[n] for n in bound}
    out["outcome"] = "one-domain" if len(used) == 1 or len(bound) == 1 else "spanning"
    out["pending"] = max(t for t in bound.values() if t is not None) - created
    out["placement"] = "intra-node" if len(bound) == 1 else ("intra-rack" if len(used) == 1 else "cross-rack")
    # The best the free nodes allowed when the job's first pod was created: nodes held by earlier jobs are taken.
    free_per_rack: dict[str, int] = {}
    for node, rack in racks.items():
        if node not in held_before:
            free_per_rack[rack] = free_per_rack.get(rack, 0) + 1
    n = len(pods)
    out["best"] = "intra-node" if n == 1 else ("intra-rack" if max(free_per_rack.values()) >= n else "cross-rack")
    estimate = cli("estimate", "--gpus", str(8 * n), "--gpus-per-node", "8")
    ms = {p["placement"]: p["ms"] for p in estimate["placements"]}
    out["ratio"] = ms[out["placement"]] / ms[out["best"]]
    return out


def held_nodes(cp: ControlPlane) -> set[str]:
    return {p["spec"]["nodeName"] for p in cp.get_json("pods", "-A")["items"] if p["spec"].get("nodeName")}


def submit(cp: ControlPlane, ns: str, name: str, pods: int) -> subprocess.CompletedProcess[str]:
    return cp.kubectl("apply", "-n", ns, "-f", "-", input=pl.indexed_job(name, pods, 8), check=False)


def follow_ups(wh: Webhook, groups: set[str], timeout: float) -> dict[str, dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        found = {r["group"]: r for r in wh.audit_records() if r.get("record") == "outcome" and r["group"] in groups}
        if set(found) == groups or time.monotonic() > deadline:
            return found
        time.sleep(0.5)


def metric_sum(wh: Webhook, name: str, **labels: str) -> float:
    assert wh.server is not None
    with wh.server.client() as c:
        text = c.get("/metrics").text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_stream_of_jobs_with_and_without_the_webhook(cp: ControlPlane, wh: Webhook) -> None:
    racks = pl.node_racks(cp)
    off = pl.new_namespace(cp, "ledger-off", {"gpu-admission.io/enforcement": "off"})
    on = pl.new_namespace(cp, "ledger-on")
    # (namespace, job, pods): each submitted after the previous one settled, so the free nodes at its admission
    # are the nodes the earlier jobs' pods hold. Four nodes of 8 GPUs.
    stream = [
        (off, "off-a", 2),  # empty cluster: the scheduler picks any two nodes
        (off, "off-b", 3),  # two nodes left: two pods bound, one never (partly bound)
        (on, "on-c", 1),  # cluster full: never bound
    ]
    truth: dict[str, dict[str, Any]] = {}
    for ns, name, n in stream:
        before = held_nodes(cp)
        r = submit(cp, ns, name, n)
        assert r.returncode == 0, r.stderr
        pl.wait_placed(cp, ns, name, n)
        truth[f"{ns}/batch.kubernetes.io/job-name={name}"] = {"ns": ns, "name": name, "n": n, "before": before}
    live_first = {j["job"]: j for j in cli("placement", "--kubeconfig", str(cp.kubeconfig))["jobs"]}
    snapshots = {g: pl.job_pods(cp, t["ns"], t["name"]) for g, t in truth.items()}
    for t in truth.values():  # unbound pods first: else freed nodes would bind them between snapshot and end
        cp.kubectl("delete", "job", t["name"], "-n", t["ns"], "--cascade=orphan", "--wait=false", check=False)
        cp.kubectl(
            "delete", "pods", "-n", t["ns"], "-l", f"batch.kubernetes.io/job-name={t['name']}",
            "--field-selector", "spec.nodeName=", "--grace-period=0", "--force", "--wait=false", check=False,
        )  # fmt: skip
    for t in truth.values():
        pl.delete_job(cp, t["ns"], t["name"])
    pl.wait_pod_view(wh, cp)

    # The webhook enforcing: jobs pinned to one rack, back to back, then one it denies.
    for name in ("on-d", "on-e"):
        before = held_nodes(cp)
        r = submit(cp, on, name, 2)
        assert r.returncode == 0, r.stderr
        pl.wait_placed(cp, on, name, 2)
        truth[f"{on}/batch.kubernetes.io/job-name={name}"] = {"ns": on, "name": name, "n": 2, "before": before}
    denied = submit(cp, on, "on-f", 5)  # 40 GPUs: no rack, no zone of this cluster holds it
    print("on-f:", denied.returncode, denied.stderr.strip())
    live_second = {j["job"]: j for j in cli("placement", "--kubeconfig", str(cp.kubeconfig))["jobs"]}
    for name in ("on-d", "on-e"):
        snapshots[f"{on}/batch.kubernetes.io/job-name={name}"] = pl.job_pods(cp, on, name)

    want = {g: expected(snapshots[g], t["before"], racks) for g, t in truth.items()}
    print("expected:", json.dumps(want, indent=1))
    records = follow_ups(wh, set(want), timeout=WINDOW + 30)
    assert set(records) == set(want), sorted(records)
    live = {**live_first, **live_second}
    for group, w in want.items():
        for source, got in (("audit", records[group]), ("live", live[group])):
            pending = got["pendingSeconds"]
            ratio = got["commRatio"]
            assert (got["outcome"], got["bound"], got["pods"]) == (w["outcome"], w["bound"], w["pods"]), (source, group)
            if "pending" in w:
                assert pending == w["pending"], (source, group, pending, w)
                assert (got["placement"], got["best"]) == (w["placement"], w["best"]), (source, group, got)
                assert ratio == pytest.approx(w["ratio"], rel=1e-9), (source, group)
    outcomes = {g: w["outcome"] for g, w in want.items()}
    assert outcomes[f"{off}/batch.kubernetes.io/job-name=off-b"] == "partly-bound"
    assert outcomes[f"{on}/batch.kubernetes.io/job-name=on-c"] == "never-bound"
    assert outcomes[f"{on}/batch.kubernetes.io/job-name=on-d"] == "one-domain"
    assert outcomes[f"{on}/batch.kubernetes.io/job-name=on-e"] == "one-domain"

    # Follow-up records carry the uid of the job's admission record (the same group), when the webhook decided.
    decisions = [r for r in wh.audit_records() if "verdict" in r and r.get("group")]
    for group in (f"{on}/batch.kubernetes.io/job-name={n}" for n in ("on-d", "on-e")):
        uids = {r["uid"] for r in decisions if r["group"] == group}
        assert records[group]["uid"] in uids, (group, records[group]["uid"], uids)
    group = f"{on}/batch.kubernetes.io/job-name=on-f"
    record = follow_ups(wh, {group}, timeout=WINDOW + 30)[group]
    if denied.returncode != 0:
        assert (record["outcome"], record["pods"]) == ("denied", 0)
        assert record["uid"] in {r["uid"] for r in decisions if r["group"] == group and r["verdict"] == "deny"}
    else:  # admitted (with a warning): its pods never bind
        assert (record["outcome"], record["bound"]) == ("never-bound", 0)
    want[group] = {"outcome": record["outcome"]}

    # The metrics count the same outcomes (namespaces are among the first 50 the server saw).
    for group, w in want.items():
        ns = group.split("/", 1)[0]
        assert metric_sum(wh, "gpu_admission_ledger_jobs_total", namespace=ns, outcome=w["outcome"]) >= 1
    total = sum(metric_sum(wh, "gpu_admission_ledger_jobs_total", namespace=ns) for ns in (off, on))
    assert total == len(want)
    assert re.search(r"gpu_admission_ledger_tracker\{what=\"skipped\"\} 0", _metrics(wh))


def _metrics(wh: Webhook) -> str:
    assert wh.server is not None
    with wh.server.client() as c:
        return c.get("/metrics").text
