"""Scale benchmark: the same speed on a 50,000-node GPU cluster (issue #13).

Clusters come from tests/bench/clustergen.py (16 nodes per rack; H100, GB200 cliques, A100 MIG mixed, H100 MIG
single, time-sliced L4, A100 and CPU racks). Parts, each printed and written to out/bench/scale.json:

- engine: `policies.engine.review` in process at 16 / 1k / 10k / 50k nodes (the inventory build timed too);
  median and p99 per object, and the 50k/16 ratio of the 8-GPU training pod's median;
- events: one Node change applied to the 50k-node inventory (`Inventory.apply`): heartbeat-like (no label
  changes), a label change, a node added or removed; and the first review after each (its candidates are
  evaluated afresh for the new version);
- list: the first list of 50k heavy Node objects (~20 KB each, as kubelets write them) from a fake API server
  process over HTTP (tests/bench/fakeapi.py), cut down page by page, then the inventory built from them;
- node_file: `serve --nodes FILE` with a JSON NodeList of 50k heavy Nodes (700 MB): ready time, peak and
  settled RSS;
- memory: a real `serve` watching those nodes and 500k GPU pods (fakeapi's pods): RSS once both are synced;
- server: a real `gpu-admission serve` watching that fake API server: time to ready, RSS with the full
  inventory, then admission p99 at 500 reviews/s (the server benchmark's mix over TLS, Go loadgen, open loop)
  without and with a storm of 1,000 Node updates/s, and the server's CPU during a storm with no admission load.
"""

from __future__ import annotations

import gc
import math
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import yaml

from cluster.kubeclient import KubeClient, KubeConfig
from policies import inventory as inventory_mod
from policies.engine import review
from tests.bench import clustergen, common, corpus, driver, server
from tests.bench.engine import _time
from tests.serverproc import ROOT, ServerProcess, free_port
from webhook.state import State, gc_paused

SIZES = (16, 1_000, 10_000, 50_000)
EVENT_KINDS = ("heartbeat", "label change", "GPU count change", "add or remove")
TARGET_MEDIAN_US = 100.0
TARGET_RATIO = 1.2
TARGET_EVENT_MS = 1.0
TARGET_LIST_S = 5.0
TARGET_RSS_MIB = 250.0
TARGET_P99_MS = 5.0
STORM_RATE = 1000.0
PODS = 500_000
REVIEW_RATE = 500
QUICK_CLIENT_TIMEOUT = 60.0  # s; loadgen's default is 10


def _cases() -> list[tuple[str, dict[str, Any]]]:
    return [
        ("training-pod-8gpu", corpus.training_pod()),
        ("training-pod-8gpu-fresh", corpus.training_pod(from_mutated_template=False)),
        ("inference-mig-pod", corpus.mig_pod()),
        ("inference-replica-pod", corpus.inference_replica_pod()),
    ]


def run_engine(sizes: tuple[int, ...], iterations: int, rounds: int) -> dict[str, Any]:
    pol = corpus.policy()
    rows = []
    for n in sizes:
        objs = clustergen.cluster(n)
        gc.collect()
        with gc_paused():  # as the server builds it (webhook/state.py: _build)
            t0 = time.perf_counter()
            inv = inventory_mod.build(objs, pol)
            build_s = time.perf_counter() - t0
        gc.freeze()
        del objs
        row: dict[str, Any] = {"nodes": n, "gpu_nodes": inv.node_count, "build_s": common.rnd(build_s, 3)}
        for name, obj in _cases():
            row[name] = _time(lambda obj=obj, inv=inv: review(obj, policy=pol, inventory=inv), iterations, rounds)
        rows.append(row)
        head = row["training-pod-8gpu"]
        common.say(
            f"  {n:>6} nodes: build {build_s:.2f} s; 8-GPU pod p50 {head['median_us']} µs p99 {head['p99_us']} µs"
        )
        del inv
        gc.unfreeze()
        gc.collect()
    small, large = rows[0]["training-pod-8gpu"]["median_us"], rows[-1]["training-pod-8gpu"]["median_us"]
    return {"rows": rows, "ratio": common.rnd(large / small, 3), "largest": rows[-1]["nodes"]}


def run_events(n: int, per_kind: int) -> dict[str, Any]:
    pol = corpus.policy()
    inv = inventory_mod.build(clustergen.cluster(n), pol)
    gc.freeze()  # as the server does after a build
    pod = corpus.training_pod()
    rng = random.Random(3)
    out: dict[str, Any] = {"nodes": n}
    gc.collect()
    for kind in EVENT_KINDS:
        apply_ns: list[int] = []
        review_ns: list[int] = []
        added: list[str] = []
        for g in range(per_kind):
            i = rng.randrange(n)
            while clustergen.rack_kind(i // clustergen.PER_RACK) == "cpu":  # a GPU node: the inventory holds it
                i = rng.randrange(n)
            obj = clustergen.node(i, heavy=True, generation=g + 1)
            name = obj["metadata"]["name"]
            if kind == "label change":
                obj["metadata"]["labels"]["gpu-admission.example/health"] = "degraded" if g % 2 else "ok"
            if kind == "GPU count change":  # a GPU lost (an Xid error) on a node: its domains' totals move
                res = obj["status"]["allocatable"]
                if "nvidia.com/gpu" in res:
                    res["nvidia.com/gpu"] = str(max(int(res["nvidia.com/gpu"]) - 1, 1))
            if kind == "add or remove":
                change = {f"{name}-extra": inventory_mod.node_from_object(obj, pol.pools)} if g % 2 == 0 else {}
                change = change or {added.pop(): None}
                added += [k for k, v in change.items() if v is not None]
            else:
                change = {name: inventory_mod.node_from_object(obj, pol.pools)}
            t0 = time.perf_counter_ns()
            inv = inv.apply(change)
            apply_ns.append(time.perf_counter_ns() - t0)
            t0 = time.perf_counter_ns()
            review(pod, policy=pol, inventory=inv)
            review_ns.append(time.perf_counter_ns() - t0)
        out[kind] = {
            "apply_median_ms": common.rnd(common.median(apply_ns) / 1e6, 3),
            "apply_p99_ms": common.rnd(common.percentile(apply_ns, 99) / 1e6, 3),
            "first_review_median_us": common.rnd(common.median(review_ns) / 1e3, 1),
            "events": per_kind,
        }
        common.say(
            f"  {kind:>14}: apply p50 {out[kind]['apply_median_ms']} ms p99 {out[kind]['apply_p99_ms']} ms; "
            f"first review after it p50 {out[kind]['first_review_median_us']} µs"
        )
    return out


class FakeApi:
    """tests/bench/fakeapi.py in its own process."""

    def __init__(self, nodes: int, pods: int = 0) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.bench.fakeapi",
                "--nodes",
                str(nodes),
                "--pods",
                str(pods),
                "--port",
                str(self.port),
            ],
            stdout=subprocess.PIPE,
            cwd=ROOT,
        )
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != b"ready":
            raise RuntimeError("fake API server did not start")

    def storm(self, rate: float) -> None:
        httpx.get(f"{self.url}/_storm", params={"rate": str(rate)}, timeout=5)

    def sent(self) -> int:
        return int(httpx.get(f"{self.url}/_stats", timeout=5).json()["sent"])

    def kubeconfig(self, directory: Path) -> Path:
        path = directory / "kubeconfig"
        path.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "fake",
                    "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
                    "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
                    "users": [{"name": "fake", "user": {"token": "bench"}}],
                }
            )
        )
        return path

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def run_list(n: int) -> dict[str, Any]:
    """The first list of n heavy Nodes as `serve` does it (State.watch_nodes: pages cut down as they arrive,
    the next page asked for meanwhile, the inventory built at the end): from the watch's start to the built
    inventory, wall clock and this process's CPU (the fake API server is another process)."""
    api = FakeApi(n)
    try:
        with KubeClient(KubeConfig(server=api.url, token="bench"), timeout=120) as client:
            state = State(corpus.policy())
            gc.collect()
            t0, c0 = time.perf_counter(), time.process_time()
            state.watch_nodes(client)
            while not state.status.inventory_synced:
                time.sleep(0.002)
            t1, c1 = time.perf_counter(), time.process_time()
            inv = state.snapshot().inventory
            clipped = state.node_transform.snapshot()
            state.stop()
        out = {
            "nodes": n,
            "gpu_nodes": inv.node_count,
            "total_s": common.rnd(t1 - t0, 2),
            # CPU of this process (the fake API server is another): what neighbours on the machine do not inflate
            "total_cpu_s": common.rnd(c1 - c0, 2),
            "loadavg": common.loadavg(),
            "clipped": clipped,
        }
        common.say(
            f"  first list of {n} heavy nodes, cut down and built: {out['total_s']} s "
            f"(CPU {out['total_cpu_s']} s; load {out['loadavg'][0]})"
        )
        return out
    finally:
        api.stop()


def run_node_file(n: int) -> dict[str, Any]:
    """`serve --nodes FILE` with a `kubectl get nodes -o json` of n heavy Nodes: start to ready, peak and
    settled RSS (webhook/nodefile.py maps the file and decodes it cut down, like the watch)."""
    tmp = Path(tempfile.mkdtemp(prefix="gpu-admission-nodefile-"))
    try:
        path = tmp / "nodes.json"
        with path.open("wb") as f:  # page by page: the bench itself never holds 700 MB of objects
            f.write(b'{"apiVersion":"v1","kind":"NodeList","metadata":{},"items":[')
            for start in range(0, n, 1000):
                items = [clustergen.node(i, heavy=True) for i in range(start, min(n, start + 1000))]
                f.write((b"," if start else b"") + b",".join(map(orjson.dumps, items)))
            f.write(b"]}")
        size_mb = path.stat().st_size / 1e6
        t0 = time.monotonic()
        srv = ServerProcess(nodes=path, ready_timeout=600)
        try:
            ready_s = time.monotonic() - t0
            rss = _settled_rss(srv.proc.pid)
        finally:
            server.stop(srv)
        out = {"nodes": n, "file_mb": common.rnd(size_mb, 1), "ready_s": common.rnd(ready_s, 2), **rss}
        common.say(
            f"  serve --nodes FILE ({out['file_mb']} MB JSON): ready in {out['ready_s']} s, peak RSS "
            f"{out['peak_rss_mib']} MiB, then {out['rss_mib']} MiB (load {out['loadavg'][0]})"
        )
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _settled_rss(pid: int) -> dict[str, Any]:
    """RSS and peak RSS (MiB) 2 s after a process got ready, and the machine's load then."""
    time.sleep(2.0)
    status = {k: common.rnd(v / 1024, 1) for k, v in _proc_status(pid).items()}
    return {"rss_mib": status["VmRSS"], "peak_rss_mib": status["VmHWM"], "loadavg": common.loadavg()}


def _proc_status(pid: int) -> dict[str, int]:
    """VmHWM and VmRSS of a process, KiB."""
    with open(f"/proc/{pid}/status") as f:
        fields = (line.split() for line in f)
        return {row[0].rstrip(":"): int(row[1]) for row in fields if row and row[0] in ("VmHWM:", "VmRSS:")}


def _node_metrics(srv: ServerProcess) -> dict[str, float]:
    out = server.metric(srv, "gpu_admission_node_events_total")
    out["apply_seconds"] = server.metric(srv, "gpu_admission_node_batch_seconds_total").get("", 0.0)
    return out


def _wait_inventory(srv: ServerProcess, want: int, timeout: float) -> float:
    return _wait_readyz(srv, "inventory", "gpuNodes", want, timeout)


def _wait_readyz(srv: ServerProcess, section: str, count: str, want: int, timeout: float) -> float:
    """Seconds until /readyz says `section` is synced with `count` == want."""
    t0 = time.monotonic()
    while time.monotonic() < t0 + timeout:
        try:
            with srv.client(timeout=5.0) as c:
                details = c.get("/readyz").json()
            part = details.get("details", details).get(section, {})
            if part.get("synced") and part.get(count) == want:
                return time.monotonic() - t0
        except (httpx.HTTPError, ValueError, AttributeError):
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{section}: {count} {want} not synced after {timeout}s: {srv.log_tail()}")


def _storm_window(api: FakeApi, srv: ServerProcess, seconds: float) -> dict[str, Any]:
    """The server's CPU and node counters over `seconds` of a storm with no admission load."""
    m0, sent0, cpu0, t0 = _node_metrics(srv), api.sent(), server.cpu_seconds(srv.proc.pid), time.monotonic()
    time.sleep(seconds)
    m1, sent1, cpu1, t1 = _node_metrics(srv), api.sent(), server.cpu_seconds(srv.proc.pid), time.monotonic()
    wall = t1 - t0
    return {
        "events_per_s": common.rnd((sent1 - sent0) / wall, 1),
        "received_per_s": common.rnd((m1.get("received", 0) - m0.get("received", 0)) / wall, 1),
        "unchanged_per_s": common.rnd((m1.get("unchanged", 0) - m0.get("unchanged", 0)) / wall, 1),
        "applied_per_s": common.rnd((m1.get("applied", 0) - m0.get("applied", 0)) / wall, 1),
        "batches_per_s": common.rnd((m1.get("batches", 0) - m0.get("batches", 0)) / wall, 1),
        "apply_cpu_share": common.rnd((m1["apply_seconds"] - m0["apply_seconds"]) / wall, 3),
        "server_cpu_share": common.rnd((cpu1 - cpu0) / wall, 3),
    }


def run_memory(n: int, pods: int, *extra: str) -> dict[str, Any]:
    """RSS of a real `serve` watching n heavy Nodes and `pods` GPU pods (the pod view: cluster/pods.py; the
    ledger's notes in its entries unless `extra` turns it off: --ledger-window 0)."""
    tmp = Path(tempfile.mkdtemp(prefix="gpu-admission-memory-"))
    api = FakeApi(n, pods=pods)
    srv: ServerProcess | None = None
    try:
        want = inventory_mod.build(clustergen.cluster(n), corpus.policy()).node_count
        started = time.monotonic()
        srv = ServerProcess(*extra, kubeconfig=str(api.kubeconfig(tmp)), nodes=None)
        _wait_inventory(srv, want, timeout=600)
        synced_s = (time.monotonic() - started) + _wait_readyz(srv, "podView", "gpuPods", pods, timeout=900)
        rss = _settled_rss(srv.proc.pid)
        out = {"nodes": n, "gpu_nodes": want, "gpu_pods": pods, "synced_s": common.rnd(synced_s, 1), **rss}
        common.say(
            f"  serve with {want} GPU nodes and {pods} GPU pods: synced in {out['synced_s']} s, RSS "
            f"{out['rss_mib']} MiB (peak {out['peak_rss_mib']}; load {out['loadavg'][0]})"
        )
        return out
    finally:
        if srv is not None:
            server.stop(srv)
        api.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def run_server(
    n: int, duration: float, warmup: float, pin: bool = False, client_timeout: float | None = None
) -> dict[str, Any]:
    """`pin`: the server alone on a CPU (see server.pin_apart); unpinned, its p99 is the machine's scheduling too.
    `client_timeout`: loadgen's per-request deadline (default its 10 s)."""
    tmp = Path(tempfile.mkdtemp(prefix="gpu-admission-scale-"))
    api = FakeApi(n)
    srv: ServerProcess | None = None
    try:
        want = inventory_mod.build(clustergen.cluster(n), corpus.policy()).node_count
        started = time.monotonic()
        srv = ServerProcess(kubeconfig=str(api.kubeconfig(tmp)), nodes=None)
        ready_s = (time.monotonic() - started) + _wait_inventory(srv, want, timeout=300)
        time.sleep(2.0)
        rss_ready = common.rss_kib(srv.proc.pid) / 1024
        common.say(f"  serve: inventory of {want} GPU nodes ready {ready_s:.1f} s after start; RSS {rss_ready:.1f} MiB")
        clients = server.pin_apart(srv.proc.pid, [api.proc.pid]) if pin else None
        reqs = server.req_args([srv], server.write_bodies(tmp))
        driver.run(["-cacert", srv.ca, "-c", "4", "-n", "500", "-expect", server.EXPECT, *reqs])
        load = ["-rate", str(REVIEW_RATE), *_timeout_args(client_timeout)]
        quiet = server.measure([srv], reqs, load, duration=duration, warmup=warmup, loadgen_cpus=clients)
        common.say(f"  {REVIEW_RATE}/s, no node events: p50 {quiet['latency_ms'].get('p50', math.nan):.2f} ms p99 "
                   f"{quiet['latency_ms'].get('p99', math.nan):.2f} ms, {quiet['achieved_rate']:.0f}/s")  # fmt: skip
        api.storm(STORM_RATE)
        time.sleep(2.0)
        idle_storm = _storm_window(api, srv, 5.0 if duration > 5 else 2.0)
        common.say(f"  storm of {STORM_RATE:.0f} updates/s, no reviews: {idle_storm}")
        m0 = _node_metrics(srv)
        stormy = server.measure([srv], reqs, load, duration=duration, warmup=warmup, loadgen_cpus=clients)
        m1 = _node_metrics(srv)
        common.say(f"  {REVIEW_RATE}/s during the storm: p50 {stormy['latency_ms'].get('p50', math.nan):.2f} ms p99 "
                   f"{stormy['latency_ms'].get('p99', math.nan):.2f} ms, {stormy['achieved_rate']:.0f}/s")  # fmt: skip
        api.storm(0)
        rss_after = common.rss_kib(srv.proc.pid) / 1024
        reference = _reference(tmp, duration, warmup, pin, client_timeout)
        return {
            "nodes": n,
            "client_cpus": clients,
            "gpu_nodes": want,
            "ready_s": common.rnd(ready_s, 2),
            "rss_ready_mib": common.rnd(rss_ready, 1),
            "rss_after_mib": common.rnd(rss_after, 1),
            "quiet": _brief(quiet),
            "storm": _brief(stormy),
            "storm_node_counters": {k: m1.get(k, 0) - m0.get(k, 0) for k in m1},
            "idle_storm": idle_storm,
            "reference_6_nodes": reference,
            "loadavg": common.loadavg(),
        }
    finally:
        if srv is not None:
            server.stop(srv)
        api.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def _timeout_args(client_timeout: float | None) -> list[str]:
    return ["-timeout", f"{client_timeout}s"] if client_timeout else []


def _reference(
    tmp: Path, duration: float, warmup: float, pin: bool = False, client_timeout: float | None = None
) -> dict[str, Any]:
    """The same load on the example cluster's server (6 GPU nodes, no watch) in the same window: what the
    machine's neighbours do to a p99 that has nothing to do with cluster size."""
    srv = ServerProcess()
    try:
        clients = server.pin_apart(srv.proc.pid) if pin else None
        reqs = server.req_args([srv], server.write_bodies(tmp))
        driver.run(["-cacert", srv.ca, "-c", "4", "-n", "500", "-expect", server.EXPECT, *reqs])
        load = ["-rate", str(REVIEW_RATE), *_timeout_args(client_timeout)]
        res = server.measure([srv], reqs, load, duration=duration, warmup=warmup,
                             loadgen_cpus=clients)  # fmt: skip
        lat = res["latency_ms"]
        common.say(f"  reference, 6-node server, same window, {REVIEW_RATE}/s: p50 {lat.get('p50', math.nan):.2f} ms "
                   f"p99 {lat.get('p99', math.nan):.2f} ms")  # fmt: skip
        return _brief(res)
    finally:
        server.stop(srv)


def _brief(res: dict[str, Any]) -> dict[str, Any]:
    lat = res.get("latency_ms", {})
    return {
        "offered_rate": res.get("offered_rate"),
        "achieved_rate": res.get("achieved_rate"),
        "sent": res.get("sent"),
        "ok": res.get("ok"),
        "p50_ms": lat.get("p50"),
        "p99_ms": lat.get("p99"),
        "max_ms": lat.get("max"),
        "errors": res.get("errors"),
        "server_cpu_us_per_review": res.get("server_cpu_us_per_review"),
    }


def run(quick: bool = False) -> dict[str, Any]:
    sizes = (16, 1_000) if quick else SIZES
    largest = sizes[-1]
    iterations, rounds = (200, 2) if quick else (1000, 5)
    common.say(f"scale: engine at {', '.join(map(str, sizes))} nodes")
    result: dict[str, Any] = {"part": "scale", "quick": quick, "machine": common.machine()}
    result["engine"] = run_engine(sizes, iterations, rounds)
    common.say(f"scale: one Node event at {largest} nodes")
    result["events"] = run_events(largest, 50 if quick else 400)
    common.say(f"scale: first list of {largest} nodes")
    result["list"] = run_list(largest)
    common.say(f"scale: serve --nodes FILE of {largest} nodes")
    result["node_file"] = run_node_file(largest)
    pods = 5_000 if quick else PODS
    common.say(f"scale: server memory with {largest} nodes and {pods} GPU pods")
    result["memory"] = run_memory(largest, pods)
    common.say(f"scale: a server watching {largest} nodes")
    # Quick (the smoke test): a slow machine's late answers still count and are checked, rather than time out.
    timeout = QUICK_CLIENT_TIMEOUT if quick else None
    result["server"] = run_server(
        largest, 3.0 if quick else 20.0, 1.0 if quick else 3.0, pin=True, client_timeout=timeout
    )
    result["targets"] = targets(result)
    report(result)
    return result


def targets(r: dict[str, Any]) -> list[dict[str, Any]]:
    head = r["engine"]["rows"][-1]["training-pod-8gpu"]["median_us"]
    events = r["events"]
    worst_event = max(events[k]["apply_median_ms"] for k in EVENT_KINDS if k in events)
    rows = [
        ("engine median, 8-GPU pod, largest cluster (µs)", head, TARGET_MEDIAN_US),
        ("engine median ratio largest/16", r["engine"]["ratio"], TARGET_RATIO),
        ("one Node event applied, median of the worst kind (ms)", worst_event, TARGET_EVENT_MS),
        ("first list + build (s)", r["list"]["total_s"], TARGET_LIST_S),
        ("server RSS with the inventory (MiB)", r["server"]["rss_after_mib"], TARGET_RSS_MIB),
        ("serve --nodes FILE: RSS once ready (MiB)", r["node_file"]["rss_mib"], TARGET_RSS_MIB),
        (f"server RSS with {r['memory']['gpu_pods']} GPU pods too (MiB)", r["memory"]["rss_mib"], TARGET_RSS_MIB),
        (f"admission p99 at {REVIEW_RATE}/s in a {STORM_RATE:.0f}/s storm (ms)", r["server"]["storm"]["p99_ms"],
         TARGET_P99_MS),
    ]  # fmt: skip
    return [{"what": w, "measured": m, "target": t, "met": m is not None and m <= t} for w, m, t in rows]


def report(result: dict[str, Any]) -> None:
    eng = result["engine"]
    names = [name for name, _ in _cases()]
    common.say(
        common.table(
            ["nodes", "GPU nodes", "build s", *(f"{n} p50 µs" for n in names), "8-GPU p99 µs"],
            [_engine_row(r, names) for r in eng["rows"]],
        )
    )
    ev = result["events"]
    common.say(
        common.table(
            ["Node event at " + str(ev["nodes"]), "apply p50 ms", "apply p99 ms", "first review after, p50 µs"],
            [
                [k, ev[k]["apply_median_ms"], ev[k]["apply_p99_ms"], ev[k]["first_review_median_us"]]
                for k in EVENT_KINDS
                if k in ev
            ],
        )
    )
    common.say(
        common.table(
            ["target", "measured", "target", ""],
            [[t["what"], t["measured"], t["target"], "met" if t["met"] else "MISSED"] for t in result["targets"]],
        )
    )


def _engine_row(r: dict[str, Any], names: list[str]) -> list[Any]:
    return [r["nodes"], r["gpu_nodes"], r["build_s"], *(r[n]["median_us"] for n in names),
            r["training-pod-8gpu"]["p99_us"]]  # fmt: skip
