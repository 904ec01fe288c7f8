"""API server benchmark: pod-create latency through a real kube-apiserver, three admission configurations.

One control plane (tests/e2e/cluster.py: etcd, kube-apiserver, scheduler, controller-manager) with the example
GPU nodes, and in turn on that same API server:

- none:    no admission webhook or policy of ours (the baseline);
- noop:    a reference floor: the same webhook configurations (rules, matchConditions) pointed at a no-op
           webhook in Go (loadgen -serve: allowed, no patch, HTTP/1.1 like ours) — what calling out costs;
- webhook: our mutating and validating webhooks, registered from deploy/ exactly as operators install them
           (tests/e2e/webhook.py), served by a real `gpu-admission serve` process on loopback;
- cel:     a subset of our validation rules as a ValidatingAdmissionPolicy + binding (tests/bench/cel.py);
- native:  deploy/overlays/native: our webhooks served by `gpu-admission serve --native`, beside the
           ValidatingAdmissionPolicies `gpu-admission policy native` generates for the run's policy (the
           rules that need no inventory judged in the API server, the rest and every mutation in the webhook);
- native-map: (--mutating-policy only) native plus the MutatingAdmissionPolicies for gpu-toleration and
           scheduler-queue, with the webhook served by `serve --native --native-mutations`.

--mutating-policy runs every configuration under the default policy plus MUTATING_POLICY (tolerations, a Kueue
queue, a schedulerName and a priorityClassName: the inventory-free mutations have something to do); without it,
the default policy leaves them empty and native-map would equal native.

The load generator creates the same GPU pods in every configuration (corpus.apiserver_pods, unique names) with
1, 20 and 100 concurrent clients (closed loop, one keep-alive connection each, HTTP/1.1), authenticated with
the admin client certificate of the kubeconfig the control plane writes. Each run gets a fresh namespace;
its pods are deleted in bulk (deletecollection, grace period 0) afterwards. Configurations are interleaved
(none, webhook, cel, none, …) so that the machine's noise falls on all three alike, and each figure is the
median over the repetitions.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import os
import re
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
import yaml

from policies import native
from policies.document import default_policy
from tests.bench import cel, common, corpus, driver, variants
from tests.e2e.cluster import DEFAULT_NODES_FILE, ControlPlane, ControlPlaneError, build_binaries

# "webhook" is deploy/ as shipped (one call per Pod: pods.admit); "webhook-2" adds deploy/overlays/validate-pods
# (a second, validating call per Pod: the design before one-call). "noop"/"noop-2": the same configurations
# pointed at the no-op Go webhook, the floor of calling out at all.
CONFIGS = ("none", "noop", "webhook", "cel", "noop-2", "webhook-2", "native", "native-map")
# The peers (tests/bench/peerinstall.py): measured only when asked (the `peers` part), beside the configurations above.
PEER_CONFIGS = ("kyverno", "gatekeeper")
ALL_CONFIGS = CONFIGS + PEER_CONFIGS
NATIVE_SERVER = "gpu-admission serve --native"
NATIVE_MAP_SERVER = "gpu-admission serve --native --native-mutations"
MUTATING_POLICY: dict[str, Any] = {
    "gpuNodes": {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]},
    "training": {"schedulerName": "volcano", "queue": {"system": "kueue", "name": "team-a"},
                 "priorityClassName": "training-normal"},
}  # fmt: skip
PLACEMENTS = ("isolated", "shared")
NOOP_SUFFIX = ".noop-bench.example.com"
# (key, concurrent clients, open-loop rate or None for closed loop). The closed loops are the spec's; the
# open loop (20 clients sharing a steady 100 pods/s) shows the overhead while the API server has headroom.
LOADS: tuple[tuple[str, int, int | None], ...] = (
    ("1", 1, None),
    ("20", 20, None),
    ("100", 100, None),
    ("20@100/s", 20, 100),
)
CONCURRENCY = tuple(key for key, _, _ in LOADS)
QUICK_LOADS = ("1", "20")  # --quick: a smoke run
TARGET_P50_DELTA_MS = 2.0
TARGET_P99_RATIO = 1.2
TARGET_CLIENTS = 20
PRIORITY_CLASSES = ("training-normal",)  # referenced by the pods (the Priority admission plugin checks)
_METRIC = re.compile(r"^(?P<name>[a-z_:]+)\{(?P<labels>[^}]*)\}\s+(?P<value>\S+)$")


def credentials(kubeconfig: Path, directory: Path) -> dict[str, str]:
    """CA, client certificate and key files from the admin kubeconfig the control plane wrote."""
    cfg = yaml.safe_load(kubeconfig.read_text())
    cluster = cfg["clusters"][0]["cluster"]
    user = cfg["users"][0]["user"]
    out = {"server": cluster["server"]}
    for key, field in (
        ("ca", cluster.get("certificate-authority-data")),
        ("cert", user.get("client-certificate-data")),
        ("key", user.get("client-key-data")),
    ):
        path = directory / f"admin-{key}.pem"
        path.write_bytes(base64.b64decode(field or ""))
        path.chmod(0o600)
        out[key] = str(path)
    return out


def admission_metrics(cp: ControlPlane) -> dict[str, tuple[float, float]]:
    """(sum seconds, count) per admission webhook and per validating admission policy, from /metrics."""
    text = cp.kubectl("get", "--raw", "/metrics").stdout
    out: dict[str, list[float]] = {}
    for line in text.splitlines():
        if not line.startswith(
            (
                "apiserver_admission_webhook_admission_duration_seconds_",
                "apiserver_validating_admission_policy_check_duration_seconds_",
                MAP_METRIC,
            )
        ):
            continue
        m = _METRIC.match(line)
        if not m or not m.group("name").endswith(("_sum", "_count")):
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group("labels")))
        who = labels.get("name") or labels.get("policy") or "?"
        acc = out.setdefault(who, [0.0, 0.0])
        acc[0 if m.group("name").endswith("_sum") else 1] += float(m.group("value"))
    return {k: (v[0], v[1]) for k, v in out.items()}


MAP_METRIC = "apiserver_mutating_admission_policy_check_duration_seconds_"


def _map_calls(cp: ControlPlane) -> float:
    return sum(c for k, (_, c) in admission_metrics(cp).items() if k.startswith(native.NAME_PREFIX + "gpu-tol"))


def _probe_map(cp: ControlPlane) -> bool:
    """Does a GPU pod's dry run reach our MutatingAdmissionPolicies now (their check counter moves)?"""
    before = _map_calls(cp)
    _probe_mutated(cp)
    return _map_calls(cp) > before


def _probe_mutated(cp: ControlPlane) -> bool:
    """Would a GPU training pod be mutated by our webhook right now (dry run)?"""
    from tests.e2e.webhook import probe_mutation

    r = probe_mutation(cp)
    return r.returncode == 0 and "podAffinity" in r.stdout


# A training pod only training-elastic-shrink denies (PET_NNODES lets it shrink): who denies it tells whether the
# native policies are in effect.
ELASTIC_POD: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "native-probe", "namespace": "default", "labels": {"gpu-admission.io/workload": "training",
                 "kueue.x-k8s.io/queue-name": "q"}},
    "spec": {"containers": [{"name": "c", "image": "busybox", "env": [{"name": "PET_NNODES", "value": "1:4"}],
                             "resources": {"limits": {"nvidia.com/gpu": "8"}}}]},
}  # fmt: skip
NATIVE_DENIAL = "ValidatingAdmissionPolicy 'gpu-admission-training-elastic-shrink'"


def _probe_native(cp: ControlPlane) -> bool:
    r = cp.kubectl("create", "--dry-run=server", "-f", "-", input=ELASTIC_POD, check=False)
    return r.returncode != 0 and NATIVE_DENIAL in r.stderr


def _probe_denied(cp: ControlPlane) -> str:
    """The denial of a pod all our rules reject (dry run), or '' when it would be created."""
    r = cp.kubectl("create", "--dry-run=server", "-f", "-", input=cel.violating_pod("default"), check=False)
    return "" if r.returncode == 0 else (r.stderr or r.stdout)


class Configs:
    """Switches the one API server between the configurations."""

    def __init__(
        self, cp: ControlPlane, variant: str, peer_names: tuple[str, ...] = (), mutating: bool = False
    ) -> None:
        from tests.bench import peerinstall as peers
        from tests.e2e.webhook import Webhook, local_configs, render
        from tests.serverproc import ROOT, free_port

        self.cp = cp
        self.peers: dict[str, peers.Peer] = {}
        for name in peer_names:  # installed and started once; registered only while measured (set)
            self.peers[name] = peers.PEERS[name](cp).start()
        self.webhook = _start_webhook(Webhook, cp, variant, ())
        self.policy = _set_policy(cp, MUTATING_POLICY) if mutating else default_policy()
        port = free_port()
        tls = self.webhook.tls
        self.noop = driver.serve_noop(port, str(tls / "tls.crt"), str(tls / "tls.key"))
        self.webhook2_configs = local_configs(
            render(cp, ROOT / "deploy" / "overlays" / "validate-pods"),
            f"https://127.0.0.1:{self.webhook.port}",
            (tls / "ca.crt").read_bytes(),
        )
        self.noop_configs = _noop_configs(self.webhook.configs, port)
        self.native_server = _native_server(cp, self.webhook, variant)
        self.native_objects = _moved(self.webhook.configs, self.webhook.port, self.native_server.port) + [
            o for o in native.generate(self.policy, mutations=False)
        ]
        self.map_server = _native_server(cp, self.webhook, variant, "--native-mutations") if mutating else None
        self.map_objects = (
            _moved(self.webhook.configs, self.webhook.port, self.map_server.port) + native.generate(self.policy)
            if self.map_server is not None
            else []
        )
        self.noop2_configs = _noop_configs(self.webhook2_configs, port)
        self.current = "webhook"
        self.set("none")

    def _pod_validate_calls(self) -> float:
        return sum(c for k, (_, c) in admission_metrics(self.cp).items() if k.startswith("pods.validate."))

    def _called(self, suffix: str) -> bool:
        """Does a GPU pod's dry run reach a webhook whose name ends with `suffix` now?"""

        def calls() -> float:
            return sum(c for k, (_, c) in admission_metrics(self.cp).items() if k.endswith(suffix))

        before = calls()
        _probe_mutated(self.cp)
        return calls() > before

    def _noop_active(self) -> bool:
        return self._called(NOOP_SUFFIX)

    def set(self, name: str, timeout: float = 60.0, settle: float = 1.0) -> None:
        cp = self.cp
        wanted = {
            "webhook": self.webhook.configs,
            "noop": self.noop_configs,
            "cel": cel.objects(),
            "noop-2": self.noop2_configs,
            "webhook-2": self.webhook2_configs,
            "native": self.native_objects,
            "native-map": self.map_objects,
        }
        for other, objs in wanted.items():
            if other != name:
                for obj in reversed(objs):
                    cp.kubectl("delete", obj["kind"].lower(), obj["metadata"]["name"], "--ignore-not-found")
        for other, peer in self.peers.items():
            if other != name and peer.active:
                peer.deactivate()
        if name in wanted:
            cp.kubectl("apply", "-f", "-", input={"apiVersion": "v1", "kind": "List", "items": wanted[name]})
        if name in self.peers:
            self.peers[name].activate()
        deadline = time.monotonic() + timeout
        while True:
            validated = self._pod_validate_calls()
            denial = _probe_denied(cp)
            mutated = _probe_mutated(cp)
            noop = self._noop_active()
            two = self._pod_validate_calls() > validated  # an allowed GPU pod reached a validating pods webhook
            vap = _probe_native(cp)
            maps = _probe_map(cp)
            peers_on = {n for n, p in self.peers.items() if p.effective()}
            if name in PEER_CONFIGS:  # its denial, and no other admission of ours or the floor's
                ours = self._called(".gpu-admission.io")
                ok = peers_on == {name} and not ours and not noop and not two and not vap and not maps
            else:
                ok = not peers_on and (maps is (name == "native-map"))
            ok = ok and {
                "none": not denial and not mutated and not noop and not two and not vap,
                "noop": noop and not denial and not mutated and not two and not vap,
                "webhook": mutated and "gpu-admission.io" in denial and not noop and not two and not vap,
                "cel": "ValidatingAdmissionPolicy" in denial and not mutated and not noop and not two and not vap,
                "noop-2": noop and not denial and not mutated and two and not vap,
                "webhook-2": mutated and "gpu-admission.io" in denial and not noop and two and not vap,
                "native": mutated and "gpu-admission.io" in denial and not noop and not two and vap,
                "native-map": mutated and "gpu-admission.io" in denial and not noop and not two and vap,
            }.get(name, True)
            if ok:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"configuration {name!r} did not take effect: {denial.strip()[:300]}")
            time.sleep(0.3)
        time.sleep(settle)  # every API server informer has seen the change, not just the one that answered
        self.current = name

    def close(self) -> None:
        for peer in self.peers.values():
            peer.stop()
        self.noop.terminate()
        self.noop.wait(10)
        for obj in self.native_objects + self.map_objects:
            if obj["kind"].endswith(("AdmissionPolicy", "AdmissionPolicyBinding")):
                self.cp.kubectl(
                    "delete", obj["kind"].lower(), obj["metadata"]["name"], "--ignore-not-found", check=False
                )
        self.native_server.stop()
        if self.map_server is not None:
            self.map_server.stop()
        for cfg in self.noop2_configs:
            self.cp.kubectl("delete", cfg["kind"].lower(), cfg["metadata"]["name"], "--ignore-not-found", check=False)
        self.webhook.close()


def _noop_configs(configs: list[dict[str, Any]], port: int) -> list[dict[str, Any]]:
    """The same webhook configurations (rules, namespaces, conditions) pointed at the no-op webhook."""
    out = []
    for cfg in configs:
        cfg = copy.deepcopy(cfg)
        cfg["metadata"]["name"] = "noop-bench"
        for wh in cfg["webhooks"]:
            wh["name"] = wh["name"].replace(".gpu-admission.io", NOOP_SUFFIX)
            url = wh["clientConfig"]["url"]
            wh["clientConfig"]["url"] = f"https://127.0.0.1:{port}/" + url.split("/", 3)[3]
        out.append(cfg)
    return out


def _moved(configs: list[dict[str, Any]], port: int, to: int) -> list[dict[str, Any]]:
    """The same webhook configurations (names included: one replaces the other) served on another port."""
    out = copy.deepcopy(configs)
    for cfg in out:
        for wh in cfg["webhooks"]:
            wh["clientConfig"]["url"] = wh["clientConfig"]["url"].replace(f":{port}/", f":{to}/")
    return out


def _set_policy(cp: ControlPlane, overrides: dict[str, Any]) -> Any:
    """The policy ConfigMap: the shipped policy plus `overrides` (every server reads it); the compiled policy."""
    import json

    from policies.document import parse_policy_text
    from tests.e2e.webhook import NAMESPACE, POLICY_CONFIGMAP
    from webhook.suite import deep_merge

    original = cp.get_json("configmap", POLICY_CONFIGMAP, "-n", NAMESPACE)["data"]["policy.yaml"]
    text = yaml.safe_dump(deep_merge(yaml.safe_load(original), copy.deepcopy(overrides)), sort_keys=False)
    cp.kubectl("patch", "configmap", POLICY_CONFIGMAP, "-n", NAMESPACE, "--type=merge", "-p",
               json.dumps({"data": {"policy.yaml": text}}))  # fmt: skip
    return parse_policy_text(text)


def _native_server(cp: ControlPlane, webhook: Any, variant: str, *extra: str) -> Any:
    """A second `gpu-admission serve`, started with --native, on the same policy ConfigMap and certificates."""
    from tests.e2e.webhook import NAMESPACE, POLICY_CONFIGMAP
    from tests.serverproc import ServerProcess

    server = ServerProcess(
        "--policy-configmap", f"{NAMESPACE}/{POLICY_CONFIGMAP}", "--native", *extra,
        tls_dir=webhook.tls, nodes=None, kubeconfig=str(cp.kubeconfig), env=variants.env_for(variant),
    )  # fmt: skip
    server.wait_ready(timeout=30, path="/readyz")
    return server


def _start_webhook(cls: Any, cp: ControlPlane, variant: str, extra: tuple[str, ...]) -> Any:
    """tests.e2e.webhook.Webhook, with the server process of a variant's environment when one is asked."""
    env = variants.env_for(variant)
    if env is None:
        return cls(cp, *extra)
    import tests.serverproc as serverproc

    original = serverproc.ServerProcess.__init__

    def init(self: Any, *a: Any, **k: Any) -> None:
        k.setdefault("env", env)
        original(self, *a, **k)

    serverproc.ServerProcess.__init__ = init  # type: ignore[method-assign]
    try:
        return cls(cp, *extra)
    finally:
        serverproc.ServerProcess.__init__ = original  # type: ignore[method-assign]


TARGET_RELOAD_S = 2.0
TYPO_POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "reload-probe", "namespace": "default", "annotations": {"gpu-admission.io/gpu-memry": "1Gi"}},
    "spec": {"containers": [{"name": "c", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
}


def measure_reload(cp: ControlPlane, toggles: int) -> dict[str, Any]:
    """Seconds from a policy ConfigMap edit (kubectl patch returned) to the first dry-run create that shows the
    new policy: gpu-admission-annotations toggled between enforce (the typo pod is denied) and warn (allowed)."""
    from tests.e2e.webhook import NAMESPACE, POLICY_CONFIGMAP

    def set_policy(text: str) -> None:
        patch = orjson.dumps({"data": {"policy.yaml": text}}).decode()
        cp.kubectl("patch", "configmap", POLICY_CONFIGMAP, "-n", NAMESPACE, "--type=merge", "-p", patch)

    original = str(cp.get_json("configmap", POLICY_CONFIGMAP, "-n", NAMESPACE)["data"]["policy.yaml"])
    warn = original.replace("gpu-admission-annotations: enforce", "gpu-admission-annotations: warn")
    if warn == original:
        return {"error": "the policy has no 'gpu-admission-annotations: enforce' line to toggle"}
    took: list[float] = []
    try:
        for k in range(toggles):
            to_warn = k % 2 == 0
            set_policy(warn if to_warn else original)
            t0 = time.monotonic()
            while True:
                r = cp.kubectl("create", "--dry-run=server", "-f", "-", input=TYPO_POD, check=False)
                if (r.returncode == 0) == to_warn:
                    break
                if time.monotonic() - t0 > 30:
                    return {"error": "a policy edit did not take effect within 30 s", "runs_s": took}
                time.sleep(0.02)
            took.append(round(time.monotonic() - t0, 3))
    finally:
        set_policy(original)
    return {
        "toggles": toggles,
        "median_s": common.rnd(common.median(took), 3),
        "max_s": max(took),
        "runs_s": took,
        "target_s": TARGET_RELOAD_S,
        "met": max(took) <= TARGET_RELOAD_S,
        "resolution": "one kubectl dry-run per poll (~0.1 s)",
    }


def _taskset(pid: int, cpus: str) -> None:
    subprocess.run(["taskset", "-a", "-pc", cpus, str(pid)], capture_output=True, check=False)


def can_isolate() -> bool:
    return (os.cpu_count() or 1) >= 2 and shutil.which("taskset") is not None


def place(cp: ControlPlane, configs: Configs, placement: str) -> str | None:
    """Pin processes for a placement; returns the CPU list for the load generator (None: float).

    isolated: the control plane (etcd, API server, scheduler, controller-manager) and the load generator on
              CPU 0, the webhook servers (ours, the no-op) on CPU 1 — as when a webhook runs on a node of its own;
    shared:   everything floats over all CPUs — the webhook competes with the API server for the same cores.
    """
    everything = f"0-{(os.cpu_count() or 1) - 1}"
    control = [c.proc.pid for c in getattr(cp, "_components", []) if c.proc is not None]
    server = configs.webhook.server
    webhooks = [configs.noop.pid, configs.native_server.proc.pid] + ([server.proc.pid] if server is not None else [])
    webhooks += [p.proc.pid for p in configs.peers.values() if p.proc is not None]
    if placement == "isolated":
        for pid in control:
            _taskset(pid, "0")
        for pid in webhooks:
            _taskset(pid, "1")
        return "0"
    for pid in control + webhooks:
        _taskset(pid, everything)
    return None


def _cleanup(cp: ControlPlane, namespace: str, timeout: float = 120.0) -> None:
    def delete_pods() -> None:
        # A webhook registered for DELETE (Kyverno's validating one is) is called once per pod: 1,500 of them
        # can outlast kubectl's 60 s; the loop below then asks again for what is left.
        with contextlib.suppress(ControlPlaneError):
            cp.kubectl("delete", "--raw", f"/api/v1/namespaces/{namespace}/pods?gracePeriodSeconds=0", check=False)

    delete_pods()
    cp.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = cp.kubectl("get", "pods", "-n", namespace, "-o", "name", check=False).stdout.split()
        if not left:
            break
        delete_pods()
        time.sleep(0.5)
    time.sleep(1.0)  # let etcd compaction, watchers and the namespace controller settle


def _audit_size(configs: Configs) -> int:
    server = configs.webhook.server
    return server.audit.stat().st_size if server is not None and server.audit.exists() else 0


def _server_side(configs: Configs, offset: int) -> dict[str, Any]:
    """p50/p99 of the webhook server's own latency (audit log latencyMs) per webhook, since byte `offset`."""
    server = configs.webhook.server
    if server is None or not server.audit.exists():
        return {}
    with server.audit.open("rb") as f:
        f.seek(offset)
        lines = f.read().splitlines()
    by: dict[str, list[float]] = {}
    for line in lines:
        try:
            rec = orjson.loads(line)
            by.setdefault(str(rec["webhook"]), []).append(float(rec["latencyMs"]))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            continue
    return {
        w: {
            "p50_ms": common.rnd(common.percentile(v, 50), 3),
            "p99_ms": common.rnd(common.percentile(v, 99), 3),
            "n": len(v),
        }
        for w, v in by.items()
    }


def _pids(cp: ControlPlane, configs: Configs) -> dict[str, int]:
    out = {c.name: c.proc.pid for c in getattr(cp, "_components", []) if c.proc is not None}
    if configs.webhook.server is not None:
        out["gpu-admission serve"] = configs.webhook.server.proc.pid
    out["no-op webhook"] = configs.noop.pid
    out[NATIVE_SERVER] = configs.native_server.proc.pid
    if configs.map_server is not None:
        out[NATIVE_MAP_SERVER] = configs.map_server.proc.pid
    for name, peer in configs.peers.items():
        if peer.proc is not None:
            out[name] = peer.proc.pid
    return out


# The process that answers a configuration's reviews, and how its webhooks are named in the API server's metrics.
HOOKS: dict[str, tuple[str, str]] = {
    "noop": ("no-op webhook", NOOP_SUFFIX),
    "noop-2": ("no-op webhook", NOOP_SUFFIX),
    "webhook": ("gpu-admission serve", ".gpu-admission.io"),
    "webhook-2": ("gpu-admission serve", ".gpu-admission.io"),
    "native": (NATIVE_SERVER, ".gpu-admission.io"),
    "native-map": (NATIVE_MAP_SERVER, ".gpu-admission.io"),
    "kyverno": ("kyverno", "kyverno.svc"),
    "gatekeeper": ("gatekeeper", "gatekeeper.sh"),
}


def hook_figures(config: str, pids: dict[str, int], calls: dict[str, Any]) -> dict[str, Any]:
    """Reviews the configuration's webhook process answered, its CPU per review and its RSS after the run."""
    if config not in HOOKS:
        return {}
    process, marker = HOOKS[config]
    reviews = sum(c["calls"] for who, c in calls.items() if marker in who)
    out: dict[str, Any] = {"process": process, "reviews": reviews}
    if process in pids:
        from tests.bench.common import rss_kib

        with contextlib.suppress(OSError):  # the process ended: no figure
            out["rss_mib"] = round(rss_kib(pids[process]) / 1024, 1)
    return out


def _cpu(pids: dict[str, int]) -> dict[str, float]:
    from tests.bench.server import cpu_seconds

    out = {}
    for name, pid in pids.items():
        try:
            out[name] = cpu_seconds(pid)
        except OSError:
            continue
    return out


def one_run(
    cp: ControlPlane,
    configs: Configs,
    creds: dict[str, str],
    bodies: list[Path],
    config: str,
    clients: int,
    rate: int | None,
    count: int,
    warmup: int,
    cpus: str | None,
) -> dict[str, Any]:
    namespace = f"bench-{config}-c{clients}{f'-r{rate}' if rate else ''}-{uuid.uuid4().hex[:6]}"
    cp.kubectl("create", "namespace", namespace)
    url = f"{creds['server']}/api/v1/namespaces/{namespace}/pods"
    reqs = [a for b in bodies for a in ("-req", f"{url}@{b}")]
    auth = ["-cacert", creds["ca"], "-cert", creds["cert"], "-key", creds["key"]]
    try:
        if warmup:
            driver.run([*auth, "-c", str(clients), "-n", str(warmup), *reqs], cpus=cpus)  # connections, caches
        before = admission_metrics(cp)
        audit_at = _audit_size(configs)
        pids = _pids(cp, configs)
        cpu0 = _cpu(pids)
        res = driver.run(
            [
                *auth,
                *(["-rate", str(rate)] if rate else ["-c", str(clients)]),
                "-n",
                str(count),
                "-conns",
                str(clients),
                "-timeout",
                "30s",
                "-offset",
                str(warmup),
                *reqs,
            ],
            cpus=cpus,
        )
        cpu1 = _cpu(pids)
        after = admission_metrics(cp)
        if config.startswith("webhook"):
            time.sleep(0.3)  # the audit writer is asynchronous
            res["webhook_server_side"] = _server_side(configs, audit_at)
    finally:
        _cleanup(cp, namespace)
    calls = {}
    for who, (s1, c1) in after.items():
        s0, c0 = before.get(who, (0.0, 0.0))
        if c1 > c0:
            calls[who] = {"calls": int(c1 - c0), "mean_ms": round((s1 - s0) / (c1 - c0) * 1000, 3)}
    res["admission"] = calls
    res["namespace"] = namespace
    created = res.get("ok", 0)
    res["hook"] = hook_figures(config, pids, calls)
    # CPU per created pod of each process (ms), over the measured run only: noise-robust, and it shows whose
    # work a configuration adds (the API server's for calling out, the webhook server's for deciding).
    res["cpu_ms_per_pod"] = {
        name: round((cpu1[name] - cpu0[name]) / created * 1000, 3)
        for name in cpu1
        if name in cpu0 and created and cpu1[name] > cpu0[name]
    }
    hook = res["hook"]
    if hook.get("reviews") and hook["process"] in cpu0:
        hook["cpu_ms_per_review"] = round((cpu1[hook["process"]] - cpu0[hook["process"]]) / hook["reviews"] * 1000, 3)
    load = common.loadavg()
    res["loadavg"] = load[0] if load else None
    return res


def start(*apiserver_args: str) -> tuple[ControlPlane, Path, list[Path]]:
    """A control plane with the example GPU nodes, and the pod bodies of the corpus in a temporary directory."""
    driver.build()
    tmp = Path(tempfile.mkdtemp(prefix="gpu-admission-bench-"))
    bodies = []
    for k, pod in enumerate(corpus.apiserver_pods()):
        path = tmp / f"pod-{k}.json"
        path.write_bytes(orjson.dumps(pod))
        bodies.append(path)
    cp = ControlPlane(build_binaries(), extra_apiserver_args=apiserver_args).start()
    try:
        cp.create_nodes(DEFAULT_NODES_FILE)
        for pc in PRIORITY_CLASSES:
            cp.kubectl("create", "priorityclass", pc, "--value=1000", check=False)
    except BaseException:
        cp.stop()
        raise
    return cp, tmp, bodies


def run(
    quick: bool = False,
    variant: str = "baseline",
    placement: str = "both",
    only: tuple[str, ...] = CONFIGS,
    only_loads: tuple[str, ...] = CONCURRENCY,
    peer_names: tuple[str, ...] = (),
    burst: Any = None,
    reps: int | None = None,
    mutating: bool = False,
) -> dict[str, Any]:
    """`only`: the configurations to measure (none and webhook always); `only_loads`: the LOADS keys;
    `peer_names`: peers to install and measure too (tests/bench/peerinstall.py); `burst(cp, configs, config, cpus)`:
    one more measurement per configuration and repetition after the loads (the peers part's Job burst)."""
    chosen = tuple(c for c in ALL_CONFIGS if c in ("none", "webhook") or c in only or c in peer_names)
    chosen = tuple(c for c in chosen if c != "native-map" or mutating)  # without MAPs it would equal native
    reps = reps or (1 if quick else 3)
    counts = (
        {"1": 20, "20": 100, "100": 200, "20@100/s": 50}
        if quick
        else {"1": 300, "20": 1500, "100": 3000, "20@100/s": 1000}
    )
    t0 = time.monotonic()
    cp, tmp, bodies = start()
    configs: Configs | None = None
    try:
        version = cp.server_version().get("gitVersion", "")
        creds = credentials(cp.kubeconfig, tmp)
        configs = Configs(cp, variant, peer_names, mutating)
        common.say(
            f"apiserver ({variant}): kube-apiserver {version}, control plane + webhook ready in "
            f"{time.monotonic() - t0:.1f}s; {reps} rep(s), pods per run {counts}"
        )
        loads = tuple(k for k in (QUICK_LOADS if quick else CONCURRENCY) if k in only_loads)
        if placement != "both":
            placements = [placement]
        else:
            placements = ["isolated"] if can_isolate() else []
            if not quick or not placements:
                placements.append("shared")
        runs: dict[str, dict[str, dict[str, list[dict[str, Any]]]]] = {
            p: {c: {k: [] for k in loads} for c in chosen} for p in placements
        }
        bursts: dict[str, list[dict[str, Any]]] = {}
        for where in placements:
            cpus = place(cp, configs, where)
            for rep in range(reps):
                order = chosen[rep % len(chosen) :] + chosen[: rep % len(chosen)]  # rotate: no order bias
                for key, clients, rate in LOADS:
                    if key not in loads:
                        continue
                    for config in order:
                        configs.set(config, settle=0.3 if quick else 1.0)
                        res = one_run(
                            cp,
                            configs,
                            creds,
                            bodies,
                            config,
                            clients,
                            rate,
                            counts[key],
                            warmup=max(clients, 10),
                            cpus=cpus,
                        )
                        runs[where][config][key].append(res)
                        lat = res.get("latency_ms", {})
                        common.say(
                            f"  {where} rep {rep + 1}/{reps} {key:>8} clients {config:>7}: "
                            f"{res['achieved_rate']:7.1f} pods/s p50 {lat.get('p50', float('nan')):7.2f} ms "
                            f"p99 {lat.get('p99', float('nan')):7.2f} ms errors {res['errors'] or 0} "
                            f"calls {res['admission']} CPU ms/pod {res['cpu_ms_per_pod']} hook {res['hook']} "
                            f"(load {res['loadavg']})"
                        )
                if burst is not None:
                    for config in order:
                        configs.set(config, settle=0.3 if quick else 1.0)
                        bursts.setdefault(config, []).append(burst(cp, configs, config, cpus))
        configs.set("webhook")
        reload = measure_reload(cp, 3 if quick else 10)
        common.say(f"  policy reload: {reload}")
        cp.check_alive()
    finally:
        if configs is not None:
            configs.close()
        cp.stop()
    result: dict[str, Any] = {"placements": {p: summarize(r) for p, r in runs.items()}}
    # The headline is "shared" (one machine, everything competing, as in a small cluster) when it ran.
    headline = "shared" if "shared" in placements else placements[0]
    result["headline_placement"] = headline
    result["targets"] = dict(result["placements"][headline]["targets"])
    result["reload"] = reload
    if bursts:
        result["bursts"] = bursts
    if peer_names:
        from tests.bench import peerinstall as peers

        result["peers"] = {n: peers.PEERS[n].version for n in peer_names}
    if "met" in reload:
        result["targets"]["policy_reload"] = {
            "target_s": TARGET_RELOAD_S,
            "max_s": reload["max_s"],
            "median_s": reload["median_s"],
            "met": reload["met"],
        }
    result.update(
        part="apiserver",
        variant=variant,
        policy=("default + MUTATING_POLICY " + str(MUTATING_POLICY)) if mutating else "default",
        quick=quick,
        kube_apiserver=version,
        repetitions=reps,
        pods_per_run=counts,
        machine=common.machine(),
        pods=[p.name for p in bodies],
        configurations={
            "none": "no admission webhook or policy of ours",
            "noop": "reference: the same webhook configurations pointed at a no-op Go webhook (HTTP/1.1)",
            "webhook": "gpu-admission webhooks from deploy/ (Pods: one call, pods.admit), serve on loopback",
            "noop-2": "reference: noop with deploy/overlays/validate-pods (two calls per Pod)",
            "webhook-2": "gpu-admission with deploy/overlays/validate-pods (two calls per Pod: admit + validate)",
            "native": "deploy/overlays/native: serve --native beside the generated ValidatingAdmissionPolicies "
            "(training-queue-priority, scheduler-topology-keys, training-elastic-shrink)",
            "native-map": "native plus the generated MutatingAdmissionPolicies (gpu-toleration, scheduler-queue), "
            "serve --native --native-mutations",
            "cel": "ValidatingAdmissionPolicy + binding: "
            + "; ".join(v["message"].split(":")[0] for v in cel.VALIDATIONS),
            "kyverno": "Kyverno's admission controller with tests/bench/peerpolicies/kyverno.yaml",
            "gatekeeper": "Gatekeeper's manager with tests/bench/peerpolicies/gatekeeper*.yaml",
        },
    )
    report(result)
    return result


def summarize(runs: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    table: dict[str, dict[str, Any]] = {}
    for config, by_clients in runs.items():
        for clients, rs in by_clients.items():

            def med(key: str, rs: list[dict[str, Any]] = rs) -> float:
                return common.rnd(common.median(r.get("latency_ms", {}).get(key, float("nan")) for r in rs), 3)

            adm: dict[str, list[float]] = {}
            side: dict[str, list[float]] = {}
            cpu: dict[str, list[float]] = {}
            per_review = [r["hook"]["cpu_ms_per_review"] for r in rs if "cpu_ms_per_review" in r.get("hook", {})]
            rss = [r["hook"]["rss_mib"] for r in rs if "rss_mib" in r.get("hook", {})]
            for r in rs:
                for who, a in r.get("admission", {}).items():
                    adm.setdefault(who, []).append(a["mean_ms"])
                for who, a in r.get("webhook_server_side", {}).items():
                    side.setdefault(who, []).append(a["p50_ms"])
                for who, ms in r.get("cpu_ms_per_pod", {}).items():
                    cpu.setdefault(who, []).append(ms)
            table.setdefault(config, {})[str(clients)] = {
                "p50_ms": med("p50"),
                "p95_ms": med("p95"),
                "p99_ms": med("p99"),
                "max_ms": med("max"),
                "rate": common.rnd(common.median(r.get("achieved_rate", float("nan")) for r in rs), 1),
                "p50_runs": [r.get("latency_ms", {}).get("p50") for r in rs],
                "p99_runs": [r.get("latency_ms", {}).get("p99") for r in rs],
                "errors": sum(sum(r.get("errors", {}).values()) for r in rs),
                "admission_mean_ms": {k: common.rnd(common.median(v), 3) for k, v in adm.items()},
                "webhook_server_side_p50_ms": {k: common.rnd(common.median(v), 3) for k, v in side.items()},
                "cpu_ms_per_pod": {k: common.rnd(common.median(v), 3) for k, v in cpu.items()},
                "hook_cpu_ms_per_review": common.rnd(common.median(per_review), 3) if per_review else None,
                "hook_rss_mib": max(rss) if rss else None,
                "runs": rs,
            }
    comparisons: dict[str, dict[str, Any]] = {}
    for config in [c for c in ALL_CONFIGS[1:] if c in table]:
        for clients in table["none"]:
            base, this = table["none"][str(clients)], table[config][str(clients)]
            comparisons.setdefault(config, {})[str(clients)] = {
                "p50_delta_ms": common.rnd(this["p50_ms"] - base["p50_ms"], 3),
                "p50_ratio": common.rnd(this["p50_ms"] / base["p50_ms"], 3),
                "p99_ratio": common.rnd(this["p99_ms"] / base["p99_ms"], 3),
                "rate_ratio": common.rnd(this["rate"] / base["rate"], 3),
            }
    at = comparisons["webhook"][str(TARGET_CLIENTS)]
    return {
        "results": table,
        "vs_baseline": comparisons,
        "targets": {
            "p50_delta": {
                "clients": TARGET_CLIENTS,
                "target_ms": TARGET_P50_DELTA_MS,
                "measured_ms": at["p50_delta_ms"],
                "met": at["p50_delta_ms"] <= TARGET_P50_DELTA_MS,
            },
            "p99_ratio": {
                "clients": TARGET_CLIENTS,
                "target": TARGET_P99_RATIO,
                "measured": at["p99_ratio"],
                "met": at["p99_ratio"] <= TARGET_P99_RATIO,
            },
        },
    }


def report(result: dict[str, Any]) -> None:
    for placement, summary in result["placements"].items():
        common.say(f"placement: {placement}")
        report_placement(summary)
    r = result.get("reload", {})
    if "median_s" in r:
        common.say(
            f"policy reload (ConfigMap edit to enforcement, {r['toggles']} edits): median {r['median_s']} s, "
            f"max {r['max_s']} s (≤ {r['target_s']} s: {'met' if r['met'] else 'MISSED'})"
        )


def _calls(d: dict[str, float], prefix: str = "") -> str:
    """'admit 1.2 + validate 0.9': one figure per webhook of the pods family (or per server path)."""
    parts = [
        f"{k.split('.')[1] if prefix else k} {v}" for k, v in sorted(d.items()) if not prefix or k.startswith(prefix)
    ]
    return " + ".join(parts) or "–"


def report_placement(result: dict[str, Any]) -> None:
    headers = [
        "clients",
        "config",
        "pods/s",
        "p50 ms",
        "p95 ms",
        "p99 ms",
        "p50 Δ ms",
        "p99 ratio",
        "p99 of runs",
        "call ms (API server)",
        "handler p50 ms",
        "CPU ms/pod apiserver",
        "CPU ms/pod webhook",
        "CPU ms/review webhook",
        "RSS MiB webhook",
        "errors",
    ]
    rows = []
    for clients in result["results"]["none"]:
        for config in [c for c in ALL_CONFIGS if c in result["results"]]:
            r = result["results"][config][str(clients)]
            cmp = result["vs_baseline"].get(config, {}).get(str(clients), {})
            cpu = r.get("cpu_ms_per_pod", {})
            ours = config.startswith("webhook")
            hook = cpu.get("gpu-admission serve") if ours else cpu.get("no-op webhook")
            if config in HOOKS:
                hook = cpu.get(HOOKS[config][0])
            rows.append(
                [
                    clients,
                    config,
                    r["rate"],
                    r["p50_ms"],
                    r["p95_ms"],
                    r["p99_ms"],
                    cmp.get("p50_delta_ms", "–"),
                    cmp.get("p99_ratio", "–"),
                    "/".join(f"{x:.0f}" for x in r["p99_runs"] if x is not None),
                    _calls(r["admission_mean_ms"], "" if config in PEER_CONFIGS else "pods."),
                    _calls(r["webhook_server_side_p50_ms"]),
                    cpu.get("kube-apiserver", "–"),
                    hook if config in HOOKS and hook is not None else "–",
                    r.get("hook_cpu_ms_per_review") or "–",
                    r.get("hook_rss_mib") or "–",
                    r["errors"],
                ]
            )
    common.say(common.table(headers, rows))
    t = result["targets"]
    common.say(
        f"targets at {t['p50_delta']['clients']} clients: webhook p50 +{t['p50_delta']['measured_ms']} ms over none "
        f"(≤ {t['p50_delta']['target_ms']}: {'met' if t['p50_delta']['met'] else 'MISSED'}); p99 ratio "
        f"{t['p99_ratio']['measured']} (≤ {t['p99_ratio']['target']}: {'met' if t['p99_ratio']['met'] else 'MISSED'})"
    )
