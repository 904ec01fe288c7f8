"""The fake GPU nodes of examples/cluster/nodes.yaml, kept alive in a kind cluster.

No kubelet runs behind these Node objects. A kind cluster runs the full kube-controller-manager, so unlike the
local control plane of tests/e2e it has the node-lifecycle controller and the TaintNodesByCondition admission
plugin:

- every new Node gets the taint `node.kubernetes.io/not-ready:NoSchedule`, which the controller removes only
  once the Node reports `Ready=True`;
- a Node whose heartbeat stops for the node-monitor grace period (40-50 s) is marked `Ready=Unknown` and
  tainted `node.kubernetes.io/unreachable` (`NoSchedule` and `NoExecute`).

So `create` applies the Nodes and writes their status (capacity, allocatable and a `Ready=True` condition)
through the `/status` subresource, and `heartbeat` renews one Lease per node in `kube-node-lease` every few
seconds, as the kubelet does. The controller counts a renewed Lease as a heartbeat. The Nodes then stay
Ready and untainted for as long as the heartbeat runs.

    python -m tests.kind.nodes create    --kubeconfig KUBECONFIG [--file examples/cluster/nodes.yaml]
    python -m tests.kind.nodes heartbeat --kubeconfig KUBECONFIG [--interval 10] [--until-pid PID]
    python -m tests.kind.nodes delete    --kubeconfig KUBECONFIG

Only kubectl is used (`$KUBECTL`, default `kubectl`). scripts/kind-e2e.sh runs them; `heartbeat` runs in the
background until the script ends. The Nodes get no addresses, so kindnet (kind's CNI) sets up no routes to
them, and they are created only after the webhook's own pods are running, which therefore never land there.
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
NODES_FILE = ROOT / "examples" / "cluster" / "nodes.yaml"
LEASE_NAMESPACE = "kube-node-lease"
LEASE_SECONDS = 40
#: Taints the node-lifecycle controller or the TaintNodesByCondition plugin put on a Node that is not Ready.
NOT_READY_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")


def load_nodes(path: Path = NODES_FILE) -> list[dict[str, Any]]:
    """The Node objects of a YAML file (one or many documents, `kind: List` allowed)."""
    out: list[dict[str, Any]] = []
    for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
        if not isinstance(doc, dict):
            continue
        items = doc.get("items", []) if doc.get("kind") == "List" else [doc]
        out.extend(copy.deepcopy(i) for i in items if isinstance(i, dict) and i.get("kind") == "Node")
    return out


def node_names(path: Path = NODES_FILE) -> list[str]:
    return [str(n["metadata"]["name"]) for n in load_nodes(path)]


def _time(now: dt.datetime) -> str:
    return now.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _micro_time(now: dt.datetime) -> str:
    return now.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def ready_status(node: dict[str, Any], now: dt.datetime) -> dict[str, Any]:
    """The node's `status` from the file, plus a fresh `Ready=True` condition (no kubelet reports one)."""
    status = copy.deepcopy(node.get("status") or {})
    stamp = _time(now)
    status["conditions"] = [
        {
            "type": "Ready",
            "status": "True",
            "reason": "KubeletReady",
            "message": "fake GPU node (no kubelet); its Lease is renewed by python -m tests.kind.nodes heartbeat",
            "lastHeartbeatTime": stamp,
            "lastTransitionTime": stamp,
        }
    ]
    return status


def node_manifests(nodes: Sequence[dict[str, Any]], now: dt.datetime) -> dict[str, Any]:
    """A List of the Nodes with their Ready status, for `kubectl apply` (a create keeps `status`)."""
    items = []
    for n in nodes:
        n = copy.deepcopy(n)
        n.setdefault("apiVersion", "v1")
        n["status"] = ready_status(n, now)
        items.append(n)
    return {"apiVersion": "v1", "kind": "List", "items": items}


def leases(names: Sequence[str], now: dt.datetime) -> dict[str, Any]:
    """One renewed node Lease per name, as the kubelet keeps them in kube-node-lease."""
    return {
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": name, "namespace": LEASE_NAMESPACE},
                "spec": {
                    "holderIdentity": name,
                    "leaseDurationSeconds": LEASE_SECONDS,
                    "renewTime": _micro_time(now),
                },
            }
            for name in names
        ],
    }


class Kubectl:
    def __init__(self, kubeconfig: str) -> None:
        self.base = [os.environ.get("KUBECTL", "kubectl"), f"--kubeconfig={kubeconfig}"]

    def __call__(
        self, *args: str, input: Any = None, check: bool = True, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        stdin = input if isinstance(input, str) or input is None else json.dumps(input)
        r = subprocess.run(
            [*self.base, *args], input=stdin, capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and r.returncode != 0:
            raise SystemExit(f"kubectl {' '.join(args)} failed ({r.returncode}): {r.stderr.strip()}")
        return r


def _tainted(kubectl: Kubectl, names: Sequence[str]) -> dict[str, list[str]]:
    got = json.loads(kubectl("get", "nodes", *names, "-o", "json").stdout)
    out = {}
    for n in got.get("items", []):
        keys = [t.get("key", "") for t in (n.get("spec") or {}).get("taints") or [] if t.get("key") in NOT_READY_TAINTS]
        if keys:
            out[n["metadata"]["name"]] = keys
    return out


def create(kubectl: Kubectl, path: Path, wait: float) -> list[str]:
    """Apply the Nodes, write their status through /status, renew their Leases once, then wait (up to `wait`
    seconds) until the node-lifecycle controller has lifted the not-ready taints."""
    nodes = load_nodes(path)
    if not nodes:
        raise SystemExit(f"no Node objects in {path}")
    now = dt.datetime.now(dt.UTC)
    kubectl("apply", "-f", "-", input=node_manifests(nodes, now))
    names = [str(n["metadata"]["name"]) for n in nodes]
    # A create keeps the status of the request, an update of an existing Node does not: write it through the
    # status subresource either way (this also revives Nodes left NotReady by an earlier run).
    for n in nodes:
        patch = {"status": ready_status(n, now)}
        kubectl("patch", "node", n["metadata"]["name"], "--subresource=status", "--type=merge", "-p", json.dumps(patch))
    kubectl("apply", "-f", "-", input=leases(names, now))
    print(f"fake GPU nodes: {', '.join(names)}", flush=True)
    deadline = time.monotonic() + wait
    while True:
        left = _tainted(kubectl, names)
        if not left:
            return names
        if time.monotonic() > deadline:
            print(f"warning: still tainted after {wait:.0f}s: {left}", file=sys.stderr, flush=True)
            return names
        time.sleep(1)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def heartbeat(kubectl: Kubectl, names: Sequence[str], interval: float, until_pid: int | None) -> int:
    """Renew the Leases every `interval` seconds until SIGTERM/SIGINT, or until process `until_pid` is gone."""
    stop = False

    def _stop(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    failures = 0
    while not stop and (until_pid is None or _alive(until_pid)):
        r = kubectl("apply", "-f", "-", input=leases(names, dt.datetime.now(dt.UTC)), check=False, timeout=30)
        if r.returncode != 0:
            failures += 1
            print(f"heartbeat: renewing the node Leases failed: {r.stderr.strip()}", file=sys.stderr, flush=True)
        slept = 0.0
        while not stop and slept < interval:
            time.sleep(0.5)
            slept += 0.5
    return 0 if failures == 0 else 1


def delete(kubectl: Kubectl, names: Sequence[str]) -> None:
    """Delete the Nodes and their Leases (a reused cluster gets them afresh after the webhook rolled out)."""
    kubectl("delete", "node", *names, "--ignore-not-found", "--wait=false")
    kubectl("delete", "lease", *names, "-n", LEASE_NAMESPACE, "--ignore-not-found", "--wait=false")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.kind.nodes", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("create", "heartbeat", "delete"))
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--file", type=Path, default=NODES_FILE, help="Node objects (default: %(default)s)")
    parser.add_argument("--interval", type=float, default=10.0, help="heartbeat: seconds between renewals")
    parser.add_argument("--until-pid", type=int, default=None, help="heartbeat: stop when this process ends")
    parser.add_argument("--wait", type=float, default=60.0, help="create: seconds to wait for the taints to go")
    args = parser.parse_args(argv)
    kubectl = Kubectl(args.kubeconfig)
    if args.command == "create":
        create(kubectl, args.file, args.wait)
        return 0
    if args.command == "delete":
        delete(kubectl, node_names(args.file))
        return 0
    return heartbeat(kubectl, node_names(args.file), args.interval, args.until_pid)


if __name__ == "__main__":
    raise SystemExit(main())
