"""`make soak` (`python -m tests.soak [--minutes 10]`): legitimate reviews at 500/s against a real `serve`
over TLS while every abuse of issue #14 runs beside them, for ten minutes. Not part of CI.

The legitimate load is the server benchmark's (tests/bench/server.py: the Go loadgen, open loop at a fixed
rate, latency from the scheduled send time, the realistic pod mix). The abuse, each in its own thread, on
its own schedule: reviews nested 100,000 levels deep, garbage bodies, a connection pipelining without
reading, 40 connections sending bodies just under --max-body, 64 MiB header lines, hundreds of idle and
slow-header TLS connections, the policy file rewritten with good, out-of-range, deeply nested and
half-written policies, and the audit log renamed (logrotate) or its directory removed.

Pass: the server never exits, its peak RSS (VmHWM) stays within the Deployment's 256 MiB, and the p99 of
legitimate reviews stays within 5 ms (on a shared machine the latency is the machine's too: the figures
are printed with the load average). JSON: out/bench/soak.json.

To find which abuse costs the legitimate reviews their latency: `--only bodies,header` runs those kinds alone
(`--only none`: the legitimate load alone), `--minutes 1` a short run (JSON: out/bench/soak-<kinds>.json).
`--variant stall-log` (tests/bench/variants.py) makes the server log its event-loop stalls, garbage
collections and policy reloads, summarised under "stalls"; `--server-tree DIR` runs the server from another
checkout (an A/B of a change in the same window).

`--pin` (the default on a machine with 2 CPUs or more; `--no-pin` turns it off): the server alone on the
last CPU, the load generator and the abuse on the others, the abuse at nice 10 so that it never delays the
load generator's sends and reads. A webhook Deployment has its own CPU; on a 2-core test machine the
clients of the soak would otherwise take turns with the server on both cores, and the p99 measured the
clients' scheduling as much as the server (the legitimate load alone gave a p99 of 11–28 ms unpinned at
load 1, 2 Dec 2026; docs/benchmarks.md §2).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import ssl
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import orjson

from tests.bench import common, driver, server, variants
from tests.serverproc import ServerProcess, review

RSS_LIMIT_MIB = 256
P99_LIMIT_MS = 5.0
POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "p", "namespace": "ml"},
    "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
}
HEAD = "apiVersion: gpu-admission.io/v1alpha1\nkind: Policy\n"
POLICIES = [
    HEAD + "inference: {warmPool: 1}\n",
    HEAD + "comm: {networkGbps: .nan}\n",
    HEAD + "rules: " + "[" * 1000 + "]" * 1000 + "\n",
    HEAD + "pools:\n- {name: p, nodeSelector: {a: b}, nodes: 100000000}\n",
    HEAD + "inference: {warmPool: 2}\n",
]


class Soak:
    def __init__(self, srv: ServerProcess, work: Path, stop: threading.Event) -> None:
        self.srv, self.work, self.stop = srv, work, stop
        self.outcomes: Counter[str] = Counter()
        self.lock = threading.Lock()

    def count(self, what: str) -> None:
        with self.lock:
            self.outcomes[what] += 1

    def tls(self, timeout: float = 10.0) -> ssl.SSLSocket:
        context = ssl.create_default_context(cafile=self.srv.ca)
        sock = socket.create_connection(("127.0.0.1", self.srv.port), timeout=timeout)
        return context.wrap_socket(sock, server_hostname="127.0.0.1")

    def every(self, seconds: float, fn: Any) -> None:
        lower_priority()
        while not self.stop.wait(seconds):
            try:
                fn()
            except (OSError, ssl.SSLError, httpx.HTTPError) as exc:
                self.count(f"{fn.__name__}: {type(exc).__name__}")

    # -- the abuse --------------------------------------------------------------------------------------------

    def deep(self) -> None:
        body = b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"d","object":'
        body += b'{"a":' * 100_000 + b"1" + b"}" * 100_000 + b"}}"
        with self.srv.client(timeout=10) as c:
            self.count(f"deep: {c.post('/admit', content=body).status_code}")

    def garbage(self) -> None:
        with self.srv.client(timeout=10) as c:
            self.count(f"garbage: {c.post('/validate', content=b'{' * 50 + b'x').status_code}")

    def pipeline(self) -> None:
        sock = self.tls(timeout=0.5)
        one = orjson.dumps(review(POD))
        req = b"POST /admit HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(one), one)
        end = time.monotonic() + 3
        while time.monotonic() < end:
            with contextlib.suppress(TimeoutError):  # full buffers: the server is not reading, as it should not
                sock.sendall(req * 64)
        sock.close()
        self.count("pipeline: 3 s")

    def bodies(self) -> None:
        size = 8 * 2**20 - 1
        socks = []
        for _ in range(40):
            s = self.tls()
            s.settimeout(2)
            socks.append(s)
        sent = 0
        for s in socks:
            try:
                s.sendall(b"POST /admit HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % size)
                s.sendall(b"x" * (size - 1))
                sent += 1
            except (OSError, ssl.SSLError):
                self.count("bodies: refused")
        time.sleep(2)
        for s in socks:
            s.close()
        self.count(f"bodies: {sent} sent whole")

    def header(self) -> None:
        sock = self.tls()
        try:
            sock.sendall(b"POST /admit HTTP/1.1\r\nHost: x\r\nX-Big: ")
            for _ in range(64):
                sock.sendall(b"a" * 2**20)
            self.count("header: all 64 MiB sent")
        except (OSError, ssl.SSLError):
            self.count("header: cut off")
        finally:
            sock.close()

    def idle(self) -> None:
        lower_priority()
        held: list[ssl.SSLSocket] = []
        while not self.stop.is_set():
            held = [s for s in held if s.fileno() >= 0]
            while len(held) < 300 and not self.stop.is_set():
                try:
                    s = self.tls(timeout=5)
                    if len(held) % 6 == 0:
                        s.sendall(b"POST /admit HTTP/1.1\r\nHost: x\r\n")  # slow headers
                    held.append(s)
                    self.count("idle: opened")
                except (OSError, ssl.SSLError):
                    self.count("idle: refused")
                    break
            self.stop.wait(2)
            for s in held[:50]:  # the server closes them after its timeouts; recycle some ourselves too
                s.close()
        for s in held:
            s.close()

    def policy(self) -> None:
        path = self.work / "policy.yaml"
        self.policy_round = getattr(self, "policy_round", 0) + 1
        text = POLICIES[self.policy_round % len(POLICIES)]
        if self.policy_round % 7 == 0:
            with open(path, "w") as f:  # half-written, then finished
                f.write(text[: len(text) // 2])
                f.flush()
                time.sleep(0.1)
                f.write(text[len(text) // 2 :])
        else:
            path.write_text(text)
        self.count("policy: rewritten")

    def audit(self) -> None:
        log = self.work / "audit" / "audit.log"
        self.audit_round = getattr(self, "audit_round", 0) + 1
        if self.audit_round % 3 == 0:
            shutil.rmtree(log.parent, ignore_errors=True)
            self.count("audit: directory removed")
        elif log.exists():
            log.rename(log.with_name(f"audit.log-{self.audit_round}"))
            log.touch()
            self.count("audit: rotated")


# Abuse kind -> (seconds between rounds, method name); `idle` runs continuously in a thread of its own.
KINDS = {
    "deep": (0.5, "deep"),
    "garbage": (0.2, "garbage"),
    "pipeline": (10, "pipeline"),
    "bodies": (15, "bodies"),
    "header": (10, "header"),
    "idle": (0, "idle"),
    "policy": (5, "policy"),
    "audit": (20, "audit"),
}


# What the load generator's summary says of the legitimate reviews: error_samples is the first message of each
# error class (what the client saw), connections the TCP connections it had to dial.
LOADGEN_KEYS = ("achieved_rate", "ok", "errors", "error_samples", "latency_ms", "connections", "dispatch_lag_ms")


def kinds_of(text: str) -> list[str]:
    """`--only`: a comma-separated list of KINDS, `all`, or `none` (the legitimate load alone)."""
    if text == "all":
        return list(KINDS)
    if text == "none":
        return []
    kinds = [k for k in text.split(",") if k]
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        raise argparse.ArgumentTypeError(f"unknown abuse kind {unknown[0] if unknown else text!r} "
                                         f"(known: {', '.join(KINDS)}, all, none)")  # fmt: skip
    return kinds


def stalls(log: str) -> dict[str, Any]:
    """The `--variant stall-log` probe lines of the server's log, summarised: per probe, how many events
    and their milliseconds (total, max, how many >= 10 ms); the 10 longest loop stalls (lag or busy) with the
    probe events of the second before each."""
    events = []
    for line in log.splitlines():
        if line.startswith('{"probe"'):
            with contextlib.suppress(ValueError):
                events.append(json.loads(line))
    out: dict[str, Any] = {}
    for name in sorted({e["probe"] for e in events}):
        ms = [e["ms"] for e in events if e["probe"] == name]
        out[name] = {"n": len(ms), "total_ms": round(sum(ms), 1), "max_ms": round(max(ms), 1),
                     "n_10ms": sum(m >= 10 for m in ms)}  # fmt: skip
    lags = sorted((e for e in events if e["probe"] in ("lag", "busy")), key=lambda e: -e["ms"])[:10]
    out["longest_lags"] = [
        {lag["probe"]: round(lag["ms"], 1), "before": [f"{e['probe']}{'/' + str(e['gen']) if 'gen' in e else ''} "
                                                       f"{e['ms']:.1f} ms" for e in events
                                                       if e["probe"] not in ("lag", "busy")
                                                       and 0 <= lag["t"] - e["t"] <= 1.0]}
        for lag in lags
    ]  # fmt: skip
    return out


def lower_priority() -> None:
    """This thread at nice 10 (Linux: a thread's nice value is its own): the abuse yields to the load
    generator whenever both want a CPU."""
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)


def metrics(srv: ServerProcess) -> dict[str, float]:
    with srv.client(timeout=10) as c:
        text = c.get("/metrics").text
    out = {}
    for line in text.splitlines():
        if line.startswith("gpu_admission_") and not line.startswith("gpu_admission_request_duration"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.soak", description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--rate", type=int, default=500)
    ap.add_argument("--only", type=kinds_of, default=list(KINDS), metavar="KINDS",
                    help=f"abuse kinds, comma-separated ({', '.join(KINDS)}; all, none); default all")  # fmt: skip
    ap.add_argument("--variant", default="", help="server experiments of tests/bench/variants.py, a+b")
    ap.add_argument("--server-tree", type=Path, metavar="DIR", help="run the server from this source tree")
    ap.add_argument("--pin", action=argparse.BooleanOptionalAction, default=True,
                    help="the server alone on the last CPU, the clients on the others (default: on)")  # fmt: skip
    ns = ap.parse_args()
    driver.build()
    work = Path(tempfile.mkdtemp(prefix="gpu-admission-soak-"))
    (work / "policy.yaml").write_text(POLICIES[0])
    env = variants.env_for(ns.variant, root=ns.server_tree) if ns.variant or ns.server_tree else None
    srv = ServerProcess(
        "--policy", str(work / "policy.yaml"), "--audit-file", str(work / "audit" / "audit.log"),
        env=env, cwd=ns.server_tree,
    )  # fmt: skip
    client_cpus = server.pin_apart(srv.proc.pid, this_process=True) if ns.pin else None
    stop = threading.Event()
    soak = Soak(srv, work, stop)
    threads = [
        threading.Thread(target=soak.every, args=(KINDS[k][0], getattr(soak, KINDS[k][1])), daemon=True)
        for k in ns.only
        if k != "idle"
    ]
    if "idle" in ns.only:
        threads.append(threading.Thread(target=soak.idle, daemon=True))
    rss: list[float] = []

    def sample() -> None:
        while not stop.wait(1):
            if srv.proc.poll() is not None:
                return
            rss.append(srv.memory_mib()[0])

    threads.append(threading.Thread(target=sample, daemon=True))
    bodies = server.write_bodies(work)
    common.say(
        f"soak: {ns.minutes:g} min, legitimate reviews at {ns.rate}/s beside the abuse: {','.join(ns.only) or 'none'}"
        f" (server pid {srv.proc.pid}{', variant ' + ns.variant if ns.variant else ''}"
        f"{', tree ' + str(ns.server_tree) if ns.server_tree else ''}"
        f"{', clients on CPUs ' + client_cpus + ', the server alone on the next' if client_cpus else ', unpinned'})"
    )
    cpu_before = server.cpu_seconds(srv.proc.pid)
    for t in threads:
        t.start()
    started = time.monotonic()
    try:
        res = driver.run(
            ["-cacert", srv.ca, "-rate", str(ns.rate), "-conns", "32", "-duration", f"{ns.minutes * 60:g}s",
             "-warmup", "5s", "-expect", server.EXPECT, *server.req_args([srv], bodies)],
            timeout=ns.minutes * 60 + 300,
        )  # fmt: skip
    finally:
        stop.set()
    alive = srv.proc.poll() is None
    cpu = server.cpu_seconds(srv.proc.pid) - cpu_before if alive else float("nan")
    peak = srv.memory_mib()[1] if alive else float("nan")
    counters = metrics(srv) if alive else {}
    log_tail = srv.log_tail(10**9)  # the whole log
    srv.stop()
    result = {
        "machine": common.machine(),
        "minutes": ns.minutes,
        "abuse_kinds": ns.only,
        "variant": ns.variant,
        "server_tree": str(ns.server_tree or ""),
        "client_cpus": client_cpus,
        "elapsed_s": round(time.monotonic() - started, 1),
        "alive": alive,
        "legitimate": {k: res.get(k) for k in LOADGEN_KEYS},
        "server_cpu_s": round(cpu, 2),
        "rss_mib": {"peak": peak, "median": sorted(rss)[len(rss) // 2] if rss else None, "samples": len(rss)},
        "abuse": dict(sorted(soak.outcomes.items())),
        "counters": {k: v for k, v in counters.items() if "closed" in k or "bad_requests" in k or "reload" in k
                     or "audit_records" in k or "cert" in k},
        "tracebacks": log_tail.count("Traceback"),
        "stalls": stalls(log_tail) if "stall-log" in ns.variant else None,
        "loadavg": common.loadavg(),
    }  # fmt: skip
    out = common.OUT_DIR / ("soak.json" if ns.only == list(KINDS) else f"soak-{'-'.join(ns.only) or 'none'}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    p99 = (res.get("latency_ms") or {}).get("p99", float("nan"))
    common.say(json.dumps({k: v for k, v in result.items() if k != "machine"}, indent=1))
    ok = alive and peak <= RSS_LIMIT_MIB and not res.get("errors") and p99 <= P99_LIMIT_MS
    common.say(
        f"soak: {'PASS' if ok else 'FAIL'}: alive {alive}, peak RSS {peak:.0f} MiB (<= {RSS_LIMIT_MIB}), "
        f"legitimate p99 {p99:.2f} ms (<= {P99_LIMIT_MS}), errors {res.get('errors') or 0}, load {common.loadavg()}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
