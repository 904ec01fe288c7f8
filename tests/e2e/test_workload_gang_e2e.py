"""Kubernetes' own gang scheduling (Workload / PodGroup, scheduling.k8s.io/v1beta1 in 1.37) on the real control
plane: with `placement.gangSchedulers.workload`, a multi-pod Indexed Job gets `spec.scheduling` (gang + a
topology constraint on the rack) instead of podAffinity; the Job controller makes its Workload and PodGroup
(WorkloadWithJob, switched on for this module's own control plane only) and kube-scheduler places the gang in
one rack."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.e2e import placement as pl
from tests.e2e.cluster import LATEST, ControlPlane, ControlPlaneError, build_binaries
from tests.e2e.webhook import NAMESPACE, POLICY_CONFIGMAP, Webhook

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def gang_cp() -> Iterator[ControlPlane]:
    cp = ControlPlane(build_binaries(release=LATEST), feature_gates="WorkloadWithJob=true")
    if cp.minor < 37:
        pytest.fail(f"the Workload API's Job integration needs Kubernetes >= 1.37, the binaries are 1.{cp.minor}")
    try:
        cp.start()
        cp.create_nodes(pl.layout({"rack-a": 2, "rack-b": 2}))
    except ControlPlaneError:
        cp.stop()
        raise
    try:
        yield cp
    finally:
        cp.stop()


@pytest.fixture(scope="module")
def gang_webhook(gang_cp: ControlPlane) -> Iterator[Webhook]:
    wh = Webhook(gang_cp)
    original = gang_cp.get_json("configmap", POLICY_CONFIGMAP, "-n", NAMESPACE)["data"]["policy.yaml"]
    policy = original.replace("    workload: false", "    workload: true")
    assert policy != original
    patch = json.dumps({"data": {"policy.yaml": policy}})
    gang_cp.kubectl("patch", "configmap", POLICY_CONFIGMAP, "-n", NAMESPACE, "--type=merge", "-p", patch)
    try:
        yield wh
    finally:
        wh.close()


def test_indexed_job_gets_a_gang_in_one_rack_through_the_workload_api(
    gang_cp: ControlPlane, gang_webhook: Webhook
) -> None:
    cp = gang_cp
    ns = pl.new_namespace(cp, "gang")
    job = pl.indexed_job("llm", 2, 8)
    for _ in range(50):  # until the policy reload reached the webhook (well under 2 s, docs/benchmarks.md)
        r = cp.kubectl("create", "--dry-run=server", "-n", ns, "-o", "json", "-f", "-", input=job, check=False)
        assert r.returncode == 0, r.stderr
        if "schedulingConstraints" in r.stdout:
            break
    r = cp.kubectl("apply", "-n", ns, "-f", "-", input=job, check=False)
    assert r.returncode == 0, r.stderr
    stored = cp.get_json("job", "llm", "-n", ns)["spec"]
    assert stored["scheduling"]["schedulingPolicy"] == {"gang": {"minCount": 2}}, stored.get("scheduling")
    assert stored["scheduling"]["schedulingConstraints"] == {"topology": [{"key": pl.RACK}]}
    assert "podAffinity" not in json.dumps(stored["template"]), "podAffinity beside a PodGroup"
    placed = pl.wait_placed(cp, ns, "llm", 2, timeout=120)
    racks = pl.node_racks(cp)
    print("gang placed:", placed)
    assert placed["pending"] == 0, placed
    assert len({racks[node] for node in placed["bound"].values()}) == 1, placed
    groups = cp.get_json("podgroups.scheduling.k8s.io", "-n", ns)["items"]
    assert groups and groups[0]["spec"]["schedulingConstraints"]["topology"] == [{"key": pl.RACK}], groups
    for pod in pl.job_pods(cp, ns, "llm"):
        assert pod["spec"].get("schedulingGroup", {}).get("podGroupName") == groups[0]["metadata"]["name"]
        assert "podAffinity" not in json.dumps(pod["spec"].get("affinity", {}))
