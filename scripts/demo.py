"""`make demo`: gpu-admission on its embedded default.

Starts a real control plane on loopback (etcd, kube-apiserver, kube-scheduler, kube-controller-manager built
from Go modules), creates the fake GPU cluster of examples/cluster/nodes.yaml, runs `gpu-admission serve` as
a real process registered through the webhook configurations of deploy/, then `kubectl apply`s every example
and shows what the API server stored, where the scheduler put the pods, and what was denied. Tears it all
down at the end (or keeps it with --keep, printing the KUBECONFIG to use).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import yaml

from tests.e2e import crds
from tests.e2e.cluster import DEFAULT_NODES_FILE, ControlPlane, ControlPlaneError, build_binaries
from tests.e2e.webhook import Webhook

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
GROUPS = ("training", "inference", "batch", "denied")


def say(text: str = "") -> None:
    print(text, flush=True)


def run(cp: ControlPlane, *args: str) -> int:
    say("$ kubectl " + " ".join(args))
    r = cp.kubectl(*args, check=False)
    for line in (r.stdout + r.stderr).splitlines():
        say("  " + line)
    return r.returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make demo", description=__doc__)
    parser.add_argument("--keep", action="store_true", help="leave the cluster running; Ctrl-C to stop")
    args = parser.parse_args(argv)

    say("== control plane (built from Go modules, cached) ==")
    t0 = time.monotonic()
    try:
        cp = ControlPlane(build_binaries())
        cp.start()
    except ControlPlaneError as exc:
        say(f"error: {exc}")
        return 1
    wh: Webhook | None = None
    try:
        say(f"kube-apiserver {cp.server_version()['gitVersion']} at {cp.server} in {time.monotonic() - t0:.1f}s")
        cp.create_nodes(DEFAULT_NODES_FILE)
        crds.install(cp)
        run(
            cp,
            "get",
            "nodes",
            "-L",
            "topology.kubernetes.io/rack",
            "-L",
            "nvidia.com/gpu.product",
            "-L",
            "nvidia.com/gpu.sharing-strategy",
        )

        say("\n== gpu-admission serve, registered from deploy/ (failurePolicy Fail, TLS, matchConditions) ==")
        wh = Webhook(cp)
        say(f"webhook at {wh.server.url if wh.server else '?'}; policy: ConfigMap gpu-admission/gpu-admission-policy")

        namespaces = sorted(
            {
                str(d["metadata"]["namespace"])
                for f in EXAMPLES.glob("*/*.yaml")
                for d in yaml.safe_load_all(f.read_text())
                if isinstance(d, dict) and d.get("kind") != "List" and d.get("metadata", {}).get("namespace")
            }
        )
        for ns in namespaces:
            cp.kubectl("create", "namespace", ns)
        # the PriorityClasses a platform team would have (the examples name them)
        classes = {"training-high": 100000, "training-normal": 50000, "batch-low": 1000}
        cp.kubectl(
            "apply",
            "-f",
            "-",
            input={
                "apiVersion": "v1",
                "kind": "List",
                "items": [
                    {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": n}, "value": v}
                    for n, v in classes.items()
                ],
            },
        )
        for group in GROUPS:
            files = sorted((EXAMPLES / group).glob("*.yaml"))
            if not files:
                continue
            say(f"\n== examples/{group} ==")
            for f in files:
                run(cp, "apply", "-f", str(f.relative_to(ROOT)))

        say("\n== where the scheduler put the pods ==")
        time.sleep(3)  # let the controllers create and the scheduler bind the Job and Deployment pods
        nodes = {n["metadata"]["name"]: n["metadata"]["labels"] for n in cp.get_json("nodes")["items"]}
        pods = [p for p in cp.get_json("pods", "-A")["items"] if p["metadata"]["namespace"] in namespaces]
        say(f"{'POD':44} {'NODE':12} {'RACK':8} GPU RESOURCES")
        for p in sorted(pods, key=lambda p: (p["metadata"]["namespace"], p["metadata"]["name"])):
            node = p["spec"].get("nodeName") or "(pending)"
            rack = nodes.get(node, {}).get("topology.kubernetes.io/rack", "-")
            res = sorted(
                f"{k}={v}"
                for c in p["spec"]["containers"]
                for k, v in (c.get("resources", {}).get("limits") or {}).items()
                if k.startswith("nvidia.com/")
            )
            name = f"{p['metadata']['namespace']}/{p['metadata']['name']}"
            say(f"{name[:44]:44} {node:12} {rack:8} {', '.join(res)}")

        say("\n== the audit log (gpu-admission audit --summary) ==")
        import subprocess

        assert wh.server is not None
        subprocess.run([sys.executable, "-m", "webhook", "audit", str(wh.server.audit), "--summary"], check=False)

        if args.keep:
            say(f"\ncluster kept: export KUBECONFIG={cp.kubeconfig}   (Ctrl-C to stop)")
            while True:
                time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        if wh is not None:
            wh.close()
        cp.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
