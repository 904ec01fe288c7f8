"""Placement benchmark (issue #11): a seeded stream of mixed training jobs with departures, on the real
control plane (etcd, kube-apiserver, kube-scheduler, the Job controller; fake 8x H100 nodes), per rack
layout, with the webhook off and on in the same run, against an offline best-fit reference.

Time advances in steps. Each step: jobs whose run is over leave (deleted), jobs that waited more than
PATIENCE steps without all their pods bound are given up (deleted, as a user would), the step's arrivals
are submitted as Indexed Jobs, the scheduler settles (no binding change for SETTLE seconds), and the pods
are read back. A job "runs" from the step all its pods are bound, for its duration.

Reported per layout and mode:
- multi-pod jobs wholly in one rack, of those that ever ran;
- jobs ever partly placed (some pods bound, some not, after settling), and how many of them had a rack
  with room for the whole gang when submitted (the webhook's fault when it is on);
- GPU-steps held by partial gangs (GPUs bound to jobs that are not running), and the peak;
- mean GPU allocation (bound GPUs / all GPUs, mean over the steps of the stream);
- pending time (steps from submission to running: median and p90) and jobs that never ran.

The offline reference replays the same stream in Python with what a gang scheduler that sees the future
state exactly could do without preemption: each step, queued jobs in order take the best-fit rack that
holds the whole gang, else spread over the cluster when it holds the gang, else wait.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field
from typing import Any

from policies.placement import place
from tests.bench import common
from tests.e2e import placement as pl
from tests.e2e.cluster import ControlPlane
from tests.e2e.webhook import Webhook

GPUS_PER_NODE = 8
PATIENCE = 4  # steps a job waits for all its pods before it is given up
SETTLE = 1.0  # seconds without a binding change that end a step
# (pods, GPUs per pod), weight: mostly multi-node gangs, some node-sized and single-pod jobs
SHAPES = (((2, 8), 3), ((4, 8), 2), ((3, 8), 2), ((6, 4), 2), ((4, 4), 2), ((2, 4), 2), ((8, 2), 1), ((1, 8), 1))
LAYOUTS: dict[str, dict[str, Any]] = {
    # three racks, one of them small: a rack that can never hold 4x8 but still attracts first pods
    "4+4+2": {"racks": {"rack-a": 4, "rack-b": 4, "rack-c": 2}, "busy": {}},
    # a busy, fragmented rack: half of rack-a's nodes hold 4 GPUs of long-running work
    "4+2 fragmented": {"racks": {"rack-a": 4, "rack-b": 2}, "busy": {"rack-a-1": 4, "rack-a-2": 4}},
    # one rack too small for any multi-node gang
    "4+3+1": {"racks": {"rack-a": 4, "rack-b": 3, "rack-c": 1}, "busy": {}},
}


@dataclass(frozen=True)
class JobSpec:
    name: str
    arrive: int
    pods: int
    gpus: int
    duration: int

    @property
    def sizes(self) -> tuple[int, ...]:
        return (self.gpus,) * self.pods


@dataclass
class JobState:
    spec: JobSpec
    submitted: int = -1
    ran: int = -1  # the step it started running (all pods bound)
    racks: frozenset[str] = frozenset()
    partial: bool = False
    partial_with_room: bool = False
    partial_detail: str = ""
    room_at_submit: bool = False
    gone: bool = False


@dataclass
class Run:
    jobs: dict[str, JobState] = field(default_factory=dict)
    allocation: list[float] = field(default_factory=list)  # per step, bound GPUs / all GPUs
    partial_gpus: list[int] = field(default_factory=list)  # per step, GPUs bound to jobs not running
    seconds: float = 0.0
    namespace: str = ""


def stream(seed: int, jobs: int, arrivals_per_step: float = 0.8) -> list[JobSpec]:
    rnd = random.Random(seed)
    out = []
    step = 0
    shapes, weights = zip(*SHAPES, strict=True)
    while len(out) < jobs:
        for _ in range(_poisson(rnd, arrivals_per_step)):
            if len(out) < jobs:
                pods, gpus = rnd.choices(shapes, weights)[0]
                out.append(JobSpec(f"job-{len(out):02d}", step, pods, gpus, rnd.randint(2, 6)))
        step += 1
    return out


def _poisson(rnd: random.Random, lam: float) -> int:
    k, p, limit = 0, 1.0, math.exp(-lam)
    while True:
        p *= rnd.random()
        if p <= limit:
            return k
        k += 1


def room_somewhere(free: dict[str, list[int]], sizes: tuple[int, ...]) -> bool:
    return any(place(f, sizes) is not None for f in free.values())


# --- the real control plane ------------------------------------------------------------------------------


def run_real(cp: ControlPlane, wh: Webhook, specs: list[JobSpec], webhook_on: bool, racks: dict[str, str]) -> Run:
    labels = {} if webhook_on else {"gpu-admission.io/enforcement": "off"}
    ns = pl.new_namespace(cp, "bench-on" if webhook_on else "bench-off", labels)
    run = Run({s.name: JobState(s) for s in specs}, namespace=ns)
    total = len(racks) * GPUS_PER_NODE
    busy = _busy_gpus(cp)
    t0 = time.monotonic()
    step = 0
    while True:
        live = [j for j in run.jobs.values() if j.submitted >= 0 and not j.gone]
        for j in live:
            over = j.ran >= 0 and step >= j.ran + j.spec.duration
            given_up = j.ran < 0 and step - j.submitted > PATIENCE
            if over or given_up:
                pl.delete_job(cp, ns, j.spec.name)
                j.gone = True
        arrivals = [run.jobs[s.name] for s in specs if s.arrive == step]
        if not arrivals and all(j.gone or j.submitted < 0 for j in run.jobs.values()) and step > specs[-1].arrive:
            break
        if arrivals:
            wh_ready(wh, cp, webhook_on)
            free = _free(cp, ns, racks, busy, {s.name: s.gpus for s in specs})
            for j in arrivals:
                j.submitted = step
                j.room_at_submit = room_somewhere(free, j.spec.sizes)
                _take(free, j.spec.sizes)
            items = [pl.indexed_job(j.spec.name, j.spec.pods, j.spec.gpus) for j in arrivals]
            cp.kubectl("apply", "-n", ns, "-f", "-", input={"apiVersion": "v1", "kind": "List", "items": items})
        bound = _settle(cp, ns)
        _observe(run, step, bound, racks, total, busy)
        step += 1
    run.seconds = time.monotonic() - t0
    cp.kubectl("delete", "jobs", "--all", "-n", ns, "--cascade=orphan", "--wait=false", check=False)
    cp.kubectl("delete", "pods", "--all", "-n", ns, "--grace-period=0", "--force", check=False)
    return run


def admissions_of_split(wh: Webhook, run: Run) -> dict[str, Any]:
    """For each job of an "on" play that ran across racks although a rack had room at submission (the bench's
    reckoning): what the webhook decided at its admission, from its audit log (pinned or not, and the warning
    that says why not) — whether the webhook saw the room the bench reckoned."""
    split = {n for n, j in run.jobs.items() if len(j.racks) > 1 and j.room_at_submit and j.spec.pods > 1}
    if not split:
        return {}
    out: dict[str, Any] = {}
    for rec in wh.audit_records():
        if rec.get("namespace") == run.namespace and rec.get("name") in split and rec.get("kind") == "Job":
            patch = [op.get("value") for op in rec.get("patch") or [] if "affinity" in str(op.get("path", ""))]
            out[rec["name"]] = {"webhook": rec.get("webhook"), "mutations": rec.get("mutations"),
                                "warnings": rec.get("warnings"), "affinity": str(patch)[:400]}  # fmt: skip
    return out


def wh_ready(wh: Webhook, cp: ControlPlane, webhook_on: bool) -> None:
    if webhook_on:
        pl.wait_pod_view(wh, cp)  # what was deleted is gone from the webhook's view before new admissions
        # ... and the reservations of the previous play's jobs have ended (deleted pods end theirs after
        # noPodsGraceSeconds): otherwise a play right after another "on" play starts with racks held for jobs
        # that no longer exist, and only "on" plays pay that (an "off" namespace is never judged).
        deadline = time.monotonic() + 120
        while pl.live_reservations(wh) > 0 and time.monotonic() < deadline:
            time.sleep(1.0)


def _busy_gpus(cp: ControlPlane) -> dict[str, int]:
    out: dict[str, int] = {}
    for p in cp.get_json("pods", "-A", "-l", "app=busy")["items"]:
        node = p["spec"].get("nodeName")
        out[node] = out.get(node, 0) + int(p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"])
    return out


def _pods(cp: ControlPlane, ns: str) -> dict[str, dict[str, str]]:
    """job -> pod -> node ('' when unbound)."""
    out: dict[str, dict[str, str]] = {}
    for p in cp.get_json("pods", "-n", ns)["items"]:
        job = p["metadata"]["labels"].get("batch.kubernetes.io/job-name", "")
        out.setdefault(job, {})[p["metadata"]["name"]] = p["spec"].get("nodeName") or ""
    return out


def _free(
    cp: ControlPlane, ns: str, racks: dict[str, str], busy: dict[str, int], gpus: dict[str, int]
) -> dict[str, list[int]]:
    """Free GPUs per node, by rack, from the pods bound now (`gpus`: job -> GPUs per pod)."""
    used = dict(busy)
    for job, pods in _pods(cp, ns).items():
        for node in pods.values():
            if node:
                used[node] = used.get(node, 0) + gpus.get(job, 0)
    return _by_rack({n: GPUS_PER_NODE - used.get(n, 0) for n in racks}, racks)


def _take(free: dict[str, list[int]], sizes: tuple[int, ...]) -> None:
    """Assume a submitted gang takes the best-fit rack that holds it (for the next arrival's room check)."""
    fits = [(sum(f), r) for r, f in free.items() if place(f, sizes) is not None]
    if fits:
        rack = min(fits)[1]
        free[rack] = list(place(free[rack], sizes) or free[rack])


def _settle(cp: ControlPlane, ns: str, timeout: float = 30.0) -> dict[str, dict[str, str]]:
    last: dict[str, dict[str, str]] | None = None
    since = time.monotonic()
    deadline = since + timeout
    while True:
        now_pods = _pods(cp, ns)
        if now_pods != last:
            last, since = now_pods, time.monotonic()
        elif time.monotonic() - since >= SETTLE or time.monotonic() > deadline:
            return now_pods
        time.sleep(0.25)


def _observe(
    run: Run, step: int, bound: dict[str, dict[str, str]], racks: dict[str, str], total: int, busy: dict[str, int]
) -> None:
    used = sum(busy.values())
    partial_gpus = 0
    for j in run.jobs.values():
        if j.submitted < 0 or j.gone:
            continue
        created = bound.get(j.spec.name, {})
        nodes = [n for n in created.values() if n]
        used += len(nodes) * j.spec.gpus
        if len(nodes) >= j.spec.pods and j.ran < 0:
            j.ran, j.racks = step, frozenset(racks[n] for n in nodes)
        elif 0 < len(nodes) < j.spec.pods and j.ran < 0:
            partial_gpus += len(nodes) * j.spec.gpus
            if len(created) >= j.spec.pods:  # all pods exist, some cannot bind: not the controller being slow
                j.partial = True
                j.partial_with_room = j.partial_with_room or j.room_at_submit
                j.partial_detail = (
                    f"step {step}: {len(nodes)}/{j.spec.pods} x {j.spec.gpus} GPUs bound in "
                    f"{sorted({racks[n] for n in nodes})}, submitted step {j.submitted}"
                )
    run.allocation.append(used / total)
    run.partial_gpus.append(partial_gpus)


# --- the offline reference ---------------------------------------------------------------------------------


def run_offline(specs: list[JobSpec], racks: dict[str, str], busy: dict[str, int]) -> Run:
    run = Run({s.name: JobState(s) for s in specs})
    nodes = {n: GPUS_PER_NODE - busy.get(n, 0) for n in racks}
    held: dict[str, dict[str, int]] = {}  # job -> node -> GPUs
    total = len(racks) * GPUS_PER_NODE
    queue: list[JobState] = []
    step = 0
    while True:
        for j in list(queue) + [j for j in run.jobs.values() if j.ran >= 0 and not j.gone]:
            over = j.ran >= 0 and step >= j.ran + j.spec.duration
            given_up = j.ran < 0 and step - j.submitted > PATIENCE
            if over or given_up:
                for n, g in held.pop(j.spec.name, {}).items():
                    nodes[n] += g
                j.gone = True
                if j in queue:
                    queue.remove(j)
        arrivals = [run.jobs[s.name] for s in specs if s.arrive == step]
        if not arrivals and not queue and not held and step > specs[-1].arrive:
            break
        for j in arrivals:
            j.submitted = step
            j.room_at_submit = room_somewhere(_by_rack(nodes, racks), j.spec.sizes)
            queue.append(j)
        for j in list(queue):
            where = _best_fit(nodes, racks, j.spec.sizes)
            if where is not None:
                held[j.spec.name] = where
                for n, g in where.items():
                    nodes[n] -= g
                j.ran, j.racks = step, frozenset(racks[n] for n in where)
                queue.remove(j)
        used = total - sum(nodes.values())
        run.allocation.append(used / total)
        run.partial_gpus.append(0)
        step += 1
    return run


def _by_rack(nodes: dict[str, int], racks: dict[str, str]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for n, f in nodes.items():
        out.setdefault(racks[n], []).append(f)
    return out


def _best_fit(nodes: dict[str, int], racks: dict[str, str], sizes: tuple[int, ...]) -> dict[str, int] | None:
    """Pods onto nodes: the best-fit rack holding the gang, else best fit across the cluster, else None."""
    per_rack = _by_rack(nodes, racks)
    fits = sorted((sum(f), r) for r, f in per_rack.items() if place(f, sizes) is not None)
    pool = [n for n in nodes if racks[n] == fits[0][1]] if fits else list(nodes)
    left = {n: nodes[n] for n in pool}
    where: dict[str, int] = {}
    for size in sorted(sizes, reverse=True):
        cands = [n for n, f in left.items() if f >= size]
        if not cands:
            return None
        n = min(cands, key=lambda c: (left[c], c))
        left[n] -= size
        where[n] = where.get(n, 0) + size
    return where


# --- figures ---------------------------------------------------------------------------------------------------


def summary(run: Run, stream_steps: int) -> dict[str, Any]:
    jobs = list(run.jobs.values())
    ran = [j for j in jobs if j.ran >= 0]
    multi = [j for j in ran if j.spec.pods > 1]
    partial = [j for j in jobs if j.partial]
    waits = [j.ran - j.submitted for j in ran]
    steps = run.allocation[: stream_steps + 1] or run.allocation
    return {
        "jobs": len(jobs),
        "ran": len(ran),
        "never_ran": len(jobs) - len(ran),
        "multi_pod_ran": len(multi),
        "multi_pod_one_rack": sum(1 for j in multi if len(j.racks) == 1),
        # ran across racks although one rack had room for the whole gang when it was submitted
        "split_with_room": sum(1 for j in multi if len(j.racks) > 1 and j.room_at_submit),
        "multi_pod_room_at_submit": sum(1 for j in jobs if j.spec.pods > 1 and j.room_at_submit),
        "partly_placed": len(partial),
        "partly_placed_with_room": sum(1 for j in partial if j.partial_with_room),
        "partly_placed_detail": {j.spec.name: j.partial_detail for j in partial},
        "partial_gpu_steps": sum(run.partial_gpus),
        "partial_gpus_peak": max(run.partial_gpus, default=0),
        "mean_allocation_pct": common.rnd(100 * sum(steps) / len(steps), 1) if steps else math.nan,
        "pending_steps_median": common.median(waits),
        "pending_steps_p90": common.percentile(waits, 90),
        "seconds": common.rnd(run.seconds, 1),
        # the trace behind the figures: allocation per step, and per job when it came, ran and where
        "allocation_per_step_pct": [common.rnd(100 * a, 1) for a in run.allocation],
        "trace": {
            j.spec.name: f"{j.spec.pods}x{j.spec.gpus} arrive {j.submitted} ran {j.ran} racks {sorted(j.racks)} "
            f"room {j.room_at_submit} partial {j.partial_with_room if j.partial else '-'}"
            for j in jobs
        },
    }


def run(
    quick: bool = False, seed: int = 11, only: tuple[str, ...] = (), modes: tuple[str, ...] = ("off", "on")
) -> dict[str, Any]:
    """`modes`: the real runs per layout, in order ("off", "on"); a mode given again is a repeat of the same
    stream on the same cluster, kept as "off#2", "on#2", ... (the bench's own noise)."""
    n_jobs = 10 if quick else 30
    layouts = dict(list(LAYOUTS.items())[:1]) if quick else LAYOUTS
    layouts = {k: v for k, v in layouts.items() if not only or k in only}
    out: dict[str, Any] = {"machine": common.machine(), "seed": seed, "jobs": n_jobs, "layouts": {}}
    burst = stream(seed, n_jobs, arrivals_per_step=3.0)  # bursts: several admissions before any pod binds
    for name, lay in layouts.items():
        specs = stream(seed, n_jobs)
        nodes = pl.layout(lay["racks"])
        racks = {n["metadata"]["name"]: n["metadata"]["labels"][pl.RACK] for n in nodes}
        common.say(f"-- layout {name}: racks {lay['racks']}, busy {lay['busy']}, {len(specs)} jobs")
        cp = pl.start_cluster(nodes)
        try:
            wh = Webhook(cp)
            try:
                busy_ns = pl.new_namespace(cp, "busy", {"gpu-admission.io/enforcement": "off"})
                busy = [pl.busy_pod(f"busy-{i}", n, g) for i, (n, g) in enumerate(lay["busy"].items())]
                if busy:
                    cp.kubectl(
                        "apply", "-n", busy_ns, "-f", "-", input={"apiVersion": "v1", "kind": "List", "items": busy}
                    )
                result: dict[str, Any] = {}
                for mode in modes:
                    key = mode if mode not in result else f"{mode}#{sum(k.startswith(mode) for k in result) + 1}"
                    played = run_real(cp, wh, specs, mode == "on", racks)
                    result[key] = summary(played, specs[-1].arrive)
                    if mode == "on":
                        result[key]["split_with_room_admission"] = admissions_of_split(wh, played)
                    checks = pl.bind_checks(wh)  # reserved-bind, since the server started (one per layout)
                    result[key]["bind_checks"] = checks
                    result[key]["binds_refused"] = sum(n for k, n in checks.items() if k.startswith("deny/"))
                    result[key]["reservations_ended"] = pl.reservations_ended(wh)
                    result[key]["loadavg"] = common.loadavg()
                    common.say(f"   {key}: {result[key]}")
                result["offline"] = summary(run_offline(specs, racks, lay["busy"]), specs[-1].arrive)
                result["replicas"] = [replica_double_booking(burst, racks, n) for n in (1, 2, 3)]
                common.say(f"   replicas: {result['replicas']}")
                out["layouts"][name] = {"racks": lay["racks"], "busy": lay["busy"], **result}
            finally:
                wh.close()
        finally:
            cp.stop()
    report(out)
    return out


ROWS = (
    ("multi-pod jobs wholly in one rack", lambda s: f"{s['multi_pod_one_rack']}/{s['multi_pod_ran']}"),
    ("  across racks although a rack had room at submission", lambda s: str(s.get("split_with_room", "-"))),
    ("jobs ever partly placed", lambda s: str(s["partly_placed"])),
    ("  of which a rack had room at submission", lambda s: str(s["partly_placed_with_room"])),
    ("GPU-steps held by partial gangs (peak GPUs)", lambda s: f"{s['partial_gpu_steps']} ({s['partial_gpus_peak']})"),
    ("mean GPU allocation", lambda s: f"{s['mean_allocation_pct']}%"),
    ("pending steps, median / p90", lambda s: f"{s['pending_steps_median']:g} / {s['pending_steps_p90']:g}"),
    ("jobs that never ran (given up)", lambda s: f"{s['never_ran']}/{s['jobs']}"),
)


def report(result: dict[str, Any]) -> None:
    for name, lay in result["layouts"].items():
        busy = lay["busy"] or "none"
        common.say(f"layout {name} (racks {lay['racks']}, busy {busy}), {result['jobs']} jobs, seed {result['seed']}")
        rows = [(label, fn(lay["off"]), fn(lay["on"]), fn(lay["offline"])) for label, fn in ROWS]
        common.say(common.table(("", "webhook off", "webhook on", "offline best fit"), rows))
        for r in lay.get("replicas", []):
            over, pins = r["over_committed_pins"], r["pins"]
            common.say(f"  {r['replicas']} replica(s), bursts of ~3 jobs: {over} of {pins} pins over-commit their rack")
        refused = lay["on"].get("binds_refused")
        common.say(f"  binds refused by reserved-bind (webhook on): {'-' if refused is None else f'{refused:g}'}")
        common.say(f"  binds judged, by outcome/reason: {lay['on'].get('bind_checks', {})}")
        for mode in ("off", "on"):
            for job, what in lay[mode].get("partly_placed_detail", {}).items():
                common.say(f"  partly placed ({mode}) {job}: {what}")
        common.say()


# --- replicas do not share reservations: what it costs ---------------------------------------------------------


def replica_double_booking(specs: list[JobSpec], racks: dict[str, str], replicas: int) -> dict[str, Any]:
    """Each step's arrivals admitted round-robin by `replicas` webhook servers, each with its own reservations,
    before any of their pods bind (a burst: the worst case), on the offline best-fit state of the cluster.
    Counts the pins whose rack is over-committed by the pins of all replicas together (those jobs' pods
    would wait, or strand behind a same-rack podAffinity, until the other job leaves)."""
    from cluster.pods import PodView
    from policies import inventory as inventory_mod
    from policies.document import default_policy
    from policies.engine import ReviewContext, review
    from policies.subject import pod_facts
    from webhook.reservations import Reservations
    from webhook.state import capacity_of

    pol = default_policy()
    inv = inventory_mod.build(pl.layout(_rack_sizes(racks)), pol)
    nodes = {n: GPUS_PER_NODE for n in racks}
    held: dict[str, dict[str, int]] = {}
    ends: dict[str, int] = {}
    pins = over = 0
    for step in range(max(s.arrive for s in specs) + 1):
        for name in [n for n, e in ends.items() if e <= step]:
            for n, g in held.pop(name).items():
                nodes[n] += g
            del ends[name]
        view = PodView(pod_facts)
        view.load(
            {
                f"{job}-{n}-{i}": {
                    "metadata": {"name": f"{job}-{n}-{i}", "namespace": "bench"},
                    "spec": {"nodeName": n, "containers": [{"resources": {"limits": {"nvidia.com/gpu": 1}}}]},
                    "status": {"phase": "Running"},
                }
                for job, where in held.items()
                for n, g in where.items()
                for i in range(g)
            }
        )
        cap = capacity_of(view.snapshot())
        stores = [Reservations(clock=lambda: 0.0) for _ in range(replicas)]
        promised: dict[str, int] = {}
        arrivals = [s for s in specs if s.arrive == step]
        for i, s in enumerate(arrivals):
            store = stores[i % replicas]
            ctx = ReviewContext(namespace="bench", capacity=cap, reservations=store.active())
            r = review(pl.indexed_job(s.name, s.pods, s.gpus), policy=pol, inventory=inv, ctx=ctx)
            if r.placement is not None:
                store.record(r.placement, 60)
                pins += 1
                promised[r.placement.domain] = promised.get(r.placement.domain, 0) + sum(s.sizes)
                free = sum(nodes[n] for n in racks if racks[n] == r.placement.domain)
                over += promised[r.placement.domain] > free
        for s in arrivals:  # then the cluster moves on as the offline best fit would place them
            where = _best_fit(nodes, racks, s.sizes)
            if where is not None:
                held[s.name] = where
                ends[s.name] = step + s.duration
                for n, g in where.items():
                    nodes[n] -= g
    return {"replicas": replicas, "pins": pins, "over_committed_pins": over}


def _rack_sizes(racks: dict[str, str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for rack in racks.values():
        out[rack] = out.get(rack, 0) + 1
    return out
