"""Topology levels on the real control plane: fake nodes with EKS network-node layers and with NVLink clique
labels, the webhook mutating what the API server stores, the real kube-scheduler placing it.

This module swaps the cluster's nodes for its own while it runs and puts examples/cluster/nodes.yaml back
afterwards, so the other modules keep their cluster."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.e2e.cluster import DEFAULT_NODES_FILE, ControlPlane
from tests.e2e.test_webhook import apply, training_pods
from tests.e2e.webhook import Webhook
from tests.serverproc import ROOT

pytestmark = pytest.mark.e2e

EKS_FIXTURE = ROOT / "tests" / "fixtures" / "clusters" / "eks-p5-p6.yaml"
LAYER2 = "topology.k8s.aws/network-node-layer-2"
LAYER3 = "topology.k8s.aws/network-node-layer-3"
CLIQUE = "nvidia.com/gpu.clique"


def clique_nodes() -> list[dict[str, Any]]:
    """Four 8-GPU nodes in one rack, two NVLink cliques of two nodes each (an NVLink-switch system; the
    GB200 fixture's 4-GPU trays could not hold a pod of 8)."""
    out = []
    for i, clique in enumerate(["a", "a", "b", "b"]):
        name = f"nvl-{i}"
        out.append(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "labels": {
                        "kubernetes.io/hostname": name,
                        "topology.kubernetes.io/rack": "nvl-rack-1",
                        "topology.kubernetes.io/zone": "zone-1",
                        "nvidia.com/gpu.present": "true",
                        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                        "nvidia.com/gpu.sharing-strategy": "none",
                        "nvidia.com/mig.strategy": "single",
                        CLIQUE: f"0f3c2e1d-5b6a-4c7d-8e9f-a0b1c2d3e4f5.{clique}",
                    },
                },
                "status": {"allocatable": {"cpu": "200", "memory": "1800Gi", "pods": "110", "nvidia.com/gpu": "8"}},
            }
        )
    return out


def swap_nodes(cp: ControlPlane, nodes: list[dict[str, Any]]) -> None:
    names = [n["metadata"]["name"] for n in cp.get_json("nodes")["items"]]
    if names:
        cp.kubectl("delete", "nodes", *names, "--wait=true")
    cp.create_nodes(nodes)


def wait_levels(wh: Webhook, keys: list[str], timeout: float = 30.0) -> None:
    """Until the webhook's inventory (a watch on Nodes) shows these levels in /readyz."""
    assert wh.server is not None
    deadline = time.monotonic() + timeout
    got: Any = None
    with wh.server.client() as c:
        while time.monotonic() < deadline:
            got = [lv["key"] for lv in c.get("/readyz").json()["inventory"]["levels"]]
            if got == keys:
                return
            time.sleep(0.2)
    raise AssertionError(f"webhook levels {got}, wanted {keys}")


@pytest.fixture(scope="module")
def cluster(control_plane: ControlPlane) -> Iterator[ControlPlane]:
    try:
        yield control_plane
    finally:
        swap_nodes(control_plane, list(yaml.safe_load(DEFAULT_NODES_FILE.read_text())["items"]))


def domains(cp: ControlPlane, ns: str, pods: list[str], key: str) -> dict[str, str]:
    labels = {n["metadata"]["name"]: n["metadata"]["labels"] for n in cp.get_json("nodes")["items"]}
    return {p: labels[cp.wait_for_scheduled(ns, p, timeout=60)].get(key, "?") for p in pods}


def stored_topology_key(cp: ControlPlane, ns: str, pod: str) -> str:
    spec = cp.get_json("pod", pod, "-n", ns)["spec"]
    key: str = spec["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]["topologyKey"]
    return key


def test_eks_2x8_job_lands_in_one_layer_2_domain(cluster: ControlPlane, webhook: Webhook, namespace: str) -> None:
    """Every layer-3 network node holds one 8-GPU instance: a 2x8 job fits none, so it is kept in one layer-2
    domain (two instances each). Three jobs in a row fill the three layer-2 domains: each job whole in one."""
    cp = cluster
    swap_nodes(cp, list(yaml.safe_load(EKS_FIXTURE.read_text())["items"]))
    wait_levels(webhook, [LAYER3, LAYER2, "topology.k8s.aws/network-node-layer-1", "topology.kubernetes.io/zone"])
    placed = {}
    for job in ("sft-a", "sft-b", "sft-c"):
        r = apply(cp, namespace, training_pods(job, 2, 8))
        assert r.returncode == 0, r.stderr
        assert stored_topology_key(cp, namespace, f"{job}-worker-0") == LAYER2
        got = domains(cp, namespace, [f"{job}-worker-{i}" for i in range(2)], LAYER2)
        assert len(set(got.values())) == 1, f"{job} crossed layer-2 domains: {got}"
        placed[job] = next(iter(got.values()))
    print("layer-2 domain per job:", placed)
    assert sorted(placed.values()) == ["nn-2a", "nn-2b", "nn-2c"]


def test_2x8_job_lands_in_one_nvlink_clique(cluster: ControlPlane, webhook: Webhook, namespace: str) -> None:
    """Two cliques of two 8-GPU nodes in one rack: a 2x8 job fits one clique, the narrowest level, so both
    pods share a clique (the rack alone would allow one pod in each)."""
    cp = cluster
    swap_nodes(cp, clique_nodes())
    wait_levels(webhook, [CLIQUE, "topology.kubernetes.io/rack", "topology.kubernetes.io/zone"])
    # Two jobs in a row: each must be whole in one clique, so together they fill both. A scheduler that only
    # knew the rack would place each pod on any empty node (one job whole in a clique one time in three).
    placed = {}
    for job in ("moe-a", "moe-b"):
        r = apply(cp, namespace, training_pods(job, 2, 8))
        assert r.returncode == 0, r.stderr
        assert stored_topology_key(cp, namespace, f"{job}-worker-0") == CLIQUE
        got = domains(cp, namespace, [f"{job}-worker-0", f"{job}-worker-1"], CLIQUE)
        assert len(set(got.values())) == 1, f"{job} crossed NVLink cliques: {got}"
        placed[job] = next(iter(got.values()))
    print("clique per job:", placed)
    assert len(set(placed.values())) == 2
