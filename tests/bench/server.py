"""Server benchmark: real `gpu-admission serve` processes over TLS with keep-alive, driven by the Go loadgen.

Each server runs exactly as `ServerProcess` starts it for the contract tests: `--nodes
examples/cluster/nodes.yaml --no-kube`, the built-in policy, the audit log written to a file. The load is a
mix of realistic pods (corpus.server_mix): each pod is POSTed to /admit as created (what the API server sends
for a Pod: one review that mutates and judges), with a unique name and uid per request.

- one worker: one serve process. At saturation (closed loop) it is pinned to CPU 1 and the load generator to
  CPU 0, so that the throughput is that of one worker on one core; at fixed offered rates nothing is pinned
  (a pinned process waits behind any neighbour on its core, which is the machine's noise, not the server's).
- two workers: two serve processes on two ports; requests alternate between them, so the offered load is
  split evenly. At saturation they are pinned to CPU 0 and CPU 1 and the load generator floats.
- offered loads: open loop at fixed rates (latency from the scheduled send time: no coordinated omission)
  and closed loop (saturation). At most `CONNS` keep-alive connections per server, like the API server's
  webhook client pool.
- CPU per review: the servers' utime+stime over a run divided by the reviews answered: a figure that the
  neighbours' noise barely moves, from which the capacity of one fully available core follows.
- memory: VmRSS of a fresh server at start, after a warm-up, and after 100k reviews.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import orjson

from tests.bench import common, corpus, driver, variants
from tests.serverproc import ServerProcess, review

CONNS = 32  # keep-alive connections per server (client-go keeps 25 idle per host)
QUICK_SATURATION_N = 50  # answers measured by the quick (smoke) saturation run
METRICS_TIMEOUT = 120.0  # s, reading /metrics between runs
EXPECT = '"allowed":true'
TARGET_RATE = 2000.0  # reviews/s, one worker
TARGET_P99_MS = 5.0  # at 500 reviews/s, one worker
TARGET_RSS_MIB = 100.0
FLAT_MIB = 5.0  # "flat": growth over 100k reviews under this
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def pin(pid: int, cpu: int | None) -> bool:
    """Pin every thread of `pid` to one CPU (taskset -a), or unpin it (cpu None); False when not possible."""
    if (os.cpu_count() or 1) < 2 or not shutil.which("taskset"):
        return False
    cpus = str(cpu) if cpu is not None else f"0-{(os.cpu_count() or 1) - 1}"
    return subprocess.run(["taskset", "-a", "-pc", cpus, str(pid)], capture_output=True).returncode == 0


def pin_apart(server_pid: int, others: Iterable[int] = (), *, this_process: bool = False) -> str | None:
    """The server alone on the last CPU, as a webhook Deployment with its own CPU runs; `others` (every
    thread) and, with `this_process`, this process (and the threads and children it starts from now on) on
    the rest. Returns the other CPUs as a taskset list, or None when there is one CPU or no taskset."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2 or not pin(server_pid, cpus[-1]):
        return None
    rest = ",".join(map(str, cpus[:-1]))
    for pid in others:
        subprocess.run(["taskset", "-a", "-pc", rest, str(pid)], capture_output=True, check=False)
    if this_process:
        os.sched_setaffinity(0, cpus[:-1])
    return rest


def stop(srv: ServerProcess) -> None:
    """Stop a server and remove its files (certificates, audit log)."""
    srv.stop()
    shutil.rmtree(srv.tmp, ignore_errors=True)


def metric(srv: ServerProcess, name: str) -> dict[str, float]:
    """The samples of one metric from the server's /metrics, by the value of its one label ("" if none)."""
    # A liveness bound: after an open-loop run the machine did not sustain, the server still works off the
    # requests loadgen gave up on, and a TLS handshake behind them took over 5 s at load ~25.
    with srv.client(timeout=METRICS_TIMEOUT) as c:
        text = c.get("/metrics").text
    out: dict[str, float] = {}
    pattern = rf'^{re.escape(name)}(?:\{{\w+="([^"]*)"\}})?\s+(\S+)$'
    for m in re.finditer(pattern, text, re.MULTILINE):
        out[m.group(1) or ""] = float(m.group(2))
    return out


def audit_counters(srv: ServerProcess) -> dict[str, float]:
    """The audit log counters (written, dropped, …) from the server's /metrics."""
    return metric(srv, "gpu_admission_audit_records")


def audit_latencies(srv: ServerProcess, offset: int) -> list[float]:
    """Server-side latencies (latencyMs of the audit records written after byte `offset`)."""
    try:
        with srv.audit.open("rb") as f:
            f.seek(offset)
            data = f.read()
    except OSError:
        return []
    out = []
    for line in data.splitlines():
        try:
            out.append(float(orjson.loads(line)["latencyMs"]))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            continue
    return out


def write_bodies(directory: Path) -> list[tuple[str, Path]]:
    """(webhook path, body file) of the mix, each an AdmissionReview with {{i}} in the pod name and uid."""
    out = []
    for k, (webhook, obj) in enumerate(corpus.server_mix()):
        path = directory / f"{k:02d}-{webhook}.json"
        path.write_bytes(orjson.dumps(review(corpus.with_placeholder(obj), uid="bench-{{i}}")))
        out.append((webhook, path))
    return out


def req_args(servers: Sequence[ServerProcess], bodies: list[tuple[str, Path]]) -> list[str]:
    """-req arguments cycling through every body on every server in turn: an even split across servers."""
    args: list[str] = []
    for webhook, path in bodies:
        for srv in servers:
            args += ["-req", f"{srv.url}/{webhook}?timeout=5s@{path}"]
    return args


def measure(
    servers: Sequence[ServerProcess],
    reqs: list[str],
    load: list[str],
    *,
    duration: float,
    warmup: float,
    loadgen_cpus: str | None,
    server_latency: bool = False,
) -> dict[str, Any]:
    """One loadgen run against the servers; loadgen's summary plus the servers' CPU and audit figures."""
    ca = servers[0].ca
    offsets = [s.audit.stat().st_size if s.audit.exists() else 0 for s in servers]
    before = [cpu_seconds(s.proc.pid) for s in servers]
    audit0 = [audit_counters(s) for s in servers]
    res = driver.run(
        [
            "-cacert",
            ca,
            *load,
            "-conns",
            str(CONNS),
            *([] if "-n" in load else ["-duration", f"{duration}s"]),
            "-warmup",
            f"{warmup}s",
            "-expect",
            EXPECT,
            "-review",
            *reqs,
        ],
        cpus=loadgen_cpus,
    )
    cpu = sum(cpu_seconds(s.proc.pid) - b for s, b in zip(servers, before, strict=True))
    answered = res["ok"] + res.get("warmup_requests", 0)
    res["server_cpu_s"] = round(cpu, 3)
    res["server_cpu_us_per_review"] = round(cpu / answered * 1e6, 1) if answered else None
    time.sleep(0.3)  # let the audit writers catch up before reading their counters
    audit1 = [audit_counters(s) for s in servers]
    res["audit"] = {
        k: sum(a1.get(k, 0) - a0.get(k, 0) for a0, a1 in zip(audit0, audit1, strict=True))
        for k in {k for a in audit1 for k in a}
    }
    if server_latency:
        lat = [x for s, off in zip(servers, offsets, strict=True) for x in audit_latencies(s, off)]
        res["server_side_ms"] = {
            "p50": common.rnd(common.percentile(lat, 50), 3),
            "p99": common.rnd(common.percentile(lat, 99), 3),
            "n": len(lat),
        }
    if not res.get("errors"):
        res.pop("error_samples", None)
    return res


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over repeated runs of one scenario (every run is kept under `runs`)."""

    def med(path: Sequence[str]) -> float:
        vals = []
        for r in runs:
            v: Any = r
            for p in path:
                v = v.get(p) if isinstance(v, dict) else None
            if isinstance(v, int | float):
                vals.append(float(v))
        return common.rnd(common.median(vals), 3)

    errors: dict[str, int] = {}
    for r in runs:
        for k, v in r.get("errors", {}).items():
            errors[k] = errors.get(k, 0) + v
    return {
        "achieved_rate": med(["achieved_rate"]),
        "p50_ms": med(["latency_ms", "p50"]),
        "p95_ms": med(["latency_ms", "p95"]),
        "p99_ms": med(["latency_ms", "p99"]),
        "max_ms": med(["latency_ms", "max"]),
        "p99_ms_runs": [r.get("latency_ms", {}).get("p99") for r in runs],
        "rate_runs": [r.get("achieved_rate") for r in runs],
        "cpu_us_per_review": med(["server_cpu_us_per_review"]),
        "dispatch_lag_p50_ms": med(["dispatch_lag_ms", "p50"]),
        "server_side_p50_ms": med(["server_side_ms", "p50"]),
        "server_side_p99_ms": med(["server_side_ms", "p99"]),
        "sent": sum(r.get("sent", 0) for r in runs),
        "errors": errors,
        "audit_dropped": sum(r.get("audit", {}).get("dropped", 0) for r in runs),
        "loadavg": [r.get("loadavg") for r in runs],
        "runs": runs,
    }


def scenarios(workers: int, quick: bool) -> list[tuple[str, list[str]]]:
    rates = [100, 500, 1000, 2000]
    if quick:
        rates = [100, 500]
    out = [(f"{r}/s", ["-rate", str(r)]) for r in rates]
    # Quick: a number of answers, not a window. On a busy machine (~2 reviews/s) every worker's first request,
    # sent in the 0.5 s warm-up, came back after the 1.5 s window: a run with no sample at all.
    out.append(("saturation", ["-c", str(8 * workers), *(["-n", str(QUICK_SATURATION_N)] if quick else [])]))
    return out


def run_config(workers: int, quick: bool, reps: int, duration: float, warmup: float, env: Any) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="gpu-admission-bench-"))
    servers: list[ServerProcess] = []
    try:
        tls = None
        for _ in range(workers):
            srv = ServerProcess(env=env, tls_dir=tls)
            tls = srv.tls
            servers.append(srv)
        ncpu = os.cpu_count() or 1
        pinnable = ncpu >= 2 and shutil.which("taskset") is not None

        def placement(saturation: bool) -> str | None:
            """Pin (saturation) or unpin (fixed rates) the servers; the CPUs for the load generator."""
            if not pinnable:
                return None
            for k, s in enumerate(servers):
                pin(s.proc.pid, ((1 + k) % ncpu) if saturation else None)
            return "0" if saturation and workers == 1 else None

        bodies = write_bodies(tmp)
        reqs = req_args(servers, bodies)
        # a short warm-up of every server (first-request imports, TLS session set-up) before any scenario
        driver.run(["-cacert", servers[0].ca, "-c", str(4 * workers), "-n", "500", "-expect", EXPECT, *reqs])
        results: dict[str, Any] = {}
        runs: dict[str, list[dict[str, Any]]] = {}
        for rep in range(reps):
            for name, load in scenarios(workers, quick):
                loadgen_cpus = placement(name == "saturation")
                res = measure(
                    servers,
                    reqs,
                    load,
                    duration=duration,
                    warmup=warmup,
                    loadgen_cpus=loadgen_cpus,
                    server_latency=name == "500/s",
                )
                res["loadavg"] = common.loadavg()[0] if common.loadavg() else None
                runs.setdefault(name, []).append(res)
                common.say(
                    f"  {workers} worker(s) rep {rep + 1}/{reps} {name:>10}: {res['achieved_rate']:8.1f}/s "
                    f"p50 {res['latency_ms'].get('p50', float('nan')):7.2f} ms "
                    f"p99 {res['latency_ms'].get('p99', float('nan')):7.2f} ms "
                    f"errors {res['errors'] or 0} cpu/review {res['server_cpu_us_per_review']} µs "
                    f"(load {res['loadavg']})"
                )
        for name, rs in runs.items():
            results[name] = summarize(rs)
        if not pinnable:
            where = "nothing pinned (taskset or a second CPU missing)"
        elif workers == 1:
            where = "fixed rates: unpinned; saturation: server on CPU 1, loadgen on CPU 0"
        else:
            where = "fixed rates: unpinned; saturation: servers on CPUs 1 and 0, loadgen floating"
        return {
            "workers": workers,
            "placement": where,
            "split": "requests alternate between the servers (even split)" if workers > 1 else "",
            "connections_per_server": CONNS,
            "mix": [f"{w} {p.name}" for w, p in bodies],
            "scenarios": results,
        }
    finally:
        for s in servers:
            stop(s)
        shutil.rmtree(tmp, ignore_errors=True)


def run_memory(reviews: int, env: Any) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="gpu-admission-bench-"))
    srv = ServerProcess(env=env)
    try:
        pinned = pin(srv.proc.pid, 1)
        loadgen_cpus = "0" if pinned else None
        reqs = req_args([srv], write_bodies(tmp))
        time.sleep(1.0)
        rss_start = common.rss_kib(srv.proc.pid)
        driver.run(["-cacert", srv.ca, "-c", "8", "-n", "2000", "-expect", EXPECT, *reqs], cpus=loadgen_cpus)
        time.sleep(0.5)
        rss_before = common.rss_kib(srv.proc.pid)
        samples: list[tuple[float, int]] = []
        done = threading.Event()
        t0 = time.monotonic()

        def sample() -> None:
            while not done.wait(0.5):
                try:
                    samples.append((round(time.monotonic() - t0, 1), common.rss_kib(srv.proc.pid)))
                except OSError:
                    return

        thread = threading.Thread(target=sample, daemon=True)
        thread.start()
        try:
            load = ["-c", "8", "-n", str(reviews), "-conns", str(CONNS), "-expect", EXPECT, "-review"]
            res = driver.run(["-cacert", srv.ca, *load, *reqs], cpus=loadgen_cpus)
        finally:
            done.set()
            thread.join()
        time.sleep(1.0)  # audit writer drains its queue
        rss_after = common.rss_kib(srv.proc.pid)
        peak = max([rss_after, rss_before, *(s[1] for s in samples)])
        growth = (rss_after - rss_before) / 1024
        step = max(1, len(samples) // 40)
        return {
            "reviews": reviews,
            "ok": res["ok"],
            "errors": res["errors"],
            "achieved_rate": res["achieved_rate"],
            "rss_start_mib": round(rss_start / 1024, 1),
            "rss_before_mib": round(rss_before / 1024, 1),
            "rss_after_mib": round(rss_after / 1024, 1),
            "rss_peak_mib": round(peak / 1024, 1),
            "growth_mib": round(growth, 1),
            "flat": abs(growth) < FLAT_MIB,
            "within_target": peak / 1024 <= TARGET_RSS_MIB,
            "samples_s_kib": samples[::step],
            "audit": audit_counters(srv),
        }
    finally:
        stop(srv)
        shutil.rmtree(tmp, ignore_errors=True)


def run(quick: bool = False, variant: str = "baseline") -> dict[str, Any]:
    env = variants.env_for(variant)
    reps, duration, warmup = (1, 1.5, 0.5) if quick else (3, 10.0, 2.0)
    reviews = 5000 if quick else 100_000
    driver.build()
    common.say(f"server ({variant}): {reps} rep(s) of {duration:.0f}s per scenario (+{warmup}s warm-up)")
    one = run_config(1, quick, reps, duration, warmup, env)
    two = run_config(2, quick, reps, duration, warmup, env)
    common.say(f"  memory: {reviews} reviews against a fresh server")
    mem = run_memory(reviews, env)
    s1 = one["scenarios"]
    rate = s1["saturation"]["achieved_rate"]
    p99 = s1["500/s"]["p99_ms"]
    cpu = s1["saturation"]["cpu_us_per_review"]
    result: dict[str, Any] = {
        "part": "server",
        "variant": variant,
        "quick": quick,
        "machine": common.machine(),
        "repetitions": reps,
        "duration_s": duration,
        "warmup_s": warmup,
        "one_worker": one,
        "two_workers": two,
        "memory": mem,
        "targets": {
            "throughput": {
                "target": TARGET_RATE,
                "measured": rate,
                "ratio": common.rnd(rate / TARGET_RATE, 2),
                "met": rate >= TARGET_RATE,
                "capacity_one_core": round(1e6 / cpu) if cpu and cpu == cpu else None,
            },
            "p99_at_500": {
                "target_ms": TARGET_P99_MS,
                "measured_ms": p99,
                "ratio": common.rnd(p99 / TARGET_P99_MS, 2),
                "met": p99 <= TARGET_P99_MS,
            },
            "rss": {"target_mib": TARGET_RSS_MIB, "peak_mib": mem["rss_peak_mib"], "met": mem["within_target"]},
            "rss_flat": {"growth_mib": mem["growth_mib"], "limit_mib": FLAT_MIB, "met": mem["flat"]},
        },
    }
    if not quick:
        from tests.bench import profiles

        common.say("  profile: py-spy of one pinned server at saturation")
        result["profile"] = profiles.profile_server(env=env)
    report(result)
    if "profile" in result:
        from tests.bench import profiles

        profiles.report(result["profile"])
    return result


def report(result: dict[str, Any]) -> None:
    headers = [
        "workers",
        "offered",
        "achieved/s",
        "p50 ms",
        "p95 ms",
        "p99 ms",
        "max ms",
        "p99 of runs",
        "loadgen lag p50 ms",
        "handler p50/p99 ms",
        "CPU µs/review",
        "errors",
    ]
    rows = []
    for cfg in (result["one_worker"], result["two_workers"]):
        for name, s in cfg["scenarios"].items():
            rows.append(
                [
                    cfg["workers"],
                    name,
                    s["achieved_rate"],
                    s["p50_ms"],
                    s["p95_ms"],
                    s["p99_ms"],
                    s["max_ms"],
                    "/".join(f"{x:.1f}" for x in s["p99_ms_runs"] if x is not None),
                    s["dispatch_lag_p50_ms"],
                    f"{s['server_side_p50_ms']} / {s['server_side_p99_ms']}"
                    if s["server_side_p50_ms"] == s["server_side_p50_ms"]
                    else "–",
                    s["cpu_us_per_review"],
                    sum(s["errors"].values()),
                ]
            )
    common.say(common.table(headers, rows))
    m = result["memory"]
    common.say(
        f"memory: RSS {m['rss_start_mib']} MiB at start, {m['rss_before_mib']} after warm-up, "
        f"{m['rss_after_mib']} after {m['reviews']} reviews (peak {m['rss_peak_mib']}, growth {m['growth_mib']} MiB)"
    )
    t = result["targets"]
    common.say(
        f"targets: ≥{t['throughput']['target']:.0f}/s one worker: {t['throughput']['measured']}/s "
        f"({'met' if t['throughput']['met'] else 'MISSED'}; one full core ≈ {t['throughput']['capacity_one_core']}/s)"
        f"; p99 ≤ {t['p99_at_500']['target_ms']} ms at 500/s: {t['p99_at_500']['measured_ms']} ms "
        f"({'met' if t['p99_at_500']['met'] else 'MISSED'}); RSS ≤ {t['rss']['target_mib']:.0f} MiB: "
        f"{t['rss']['peak_mib']} ({'met' if t['rss']['met'] else 'MISSED'}); flat: {t['rss_flat']['growth_mib']} MiB "
        f"({'met' if t['rss_flat']['met'] else 'MISSED'})"
    )
