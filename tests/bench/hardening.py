"""What issue #14's hardening costs on the hot path: the server as shipped against the same server with the
connection guard and the request depth check off (variants `unguarded+no-depth-check`), run in alternation
so that both see the same machine noise: `python -m tests.bench.hardening [--rounds 5] [--duration 5]`.

Each round runs, against each server in turn, a closed-loop saturation run (8 connections) and an open-loop
run at 500 reviews/s (the spec §10 rows), with the server part's loadgen and request mix (tests/bench/server.py).
Printed: per variant the medians of reviews/s, server CPU per review and p99 at 500/s, and their ratios.
CPU per review is the figure the neighbours' noise moves least. JSON: out/bench/hardening.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.bench import common, driver, server, variants
from tests.serverproc import ServerProcess

BEFORE = "unguarded+no-depth-check"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.bench.hardening", description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--before", default=BEFORE, help=f"the variant to compare with (default {BEFORE})")
    ns = ap.parse_args(argv)
    driver.build()
    tmp = Path(tempfile.mkdtemp(prefix="gpu-admission-bench-"))
    bodies = server.write_bodies(tmp)
    names = ("after", "before")
    servers = {"after": ServerProcess(env=variants.env_for("baseline"))}
    servers["before"] = ServerProcess(env=variants.env_for(ns.before), tls_dir=servers["after"].tls)
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {n: {"saturation": [], "500/s": []} for n in names}
    try:
        for name in names:  # warm-up
            reqs = server.req_args([servers[name]], bodies)
            driver.run(["-cacert", servers[name].ca, "-c", "4", "-n", "500", "-expect", server.EXPECT, *reqs])
        for r in range(ns.rounds):
            for name in names if r % 2 == 0 else reversed(names):
                srv = servers[name]
                reqs = server.req_args([srv], bodies)
                for scenario, load in (("saturation", ["-c", "8"]), ("500/s", ["-rate", "500"])):
                    res = server.measure([srv], reqs, load, duration=ns.duration, warmup=1.0, loadgen_cpus=None)
                    res["loadavg"] = common.loadavg()[0] if common.loadavg() else None
                    runs[name][scenario].append(res)
                    common.say(
                        f"round {r + 1}/{ns.rounds} {name:>6} {scenario:>10}: {res['achieved_rate']:8.1f}/s "
                        f"p99 {res['latency_ms'].get('p99', float('nan')):7.2f} ms errors {res['errors'] or 0} "
                        f"cpu/review {res['server_cpu_us_per_review']} µs (load {res['loadavg']})"
                    )
    finally:
        for srv in servers.values():
            server.stop(srv)
    summary = {
        name: {
            "reviews_per_s": statistics.median(x["achieved_rate"] for x in runs[name]["saturation"]),
            "cpu_us_per_review": statistics.median(
                x["server_cpu_us_per_review"] for x in runs[name]["saturation"] if x["server_cpu_us_per_review"]
            ),
            "p99_ms_at_500": statistics.median(x["latency_ms"]["p99"] for x in runs[name]["500/s"]),
        }
        for name in names
    }
    common.say(f"medians over {ns.rounds} alternating rounds (before = variant {ns.before}):")
    for key in ("reviews_per_s", "cpu_us_per_review", "p99_ms_at_500"):
        a, b = summary["after"][key], summary["before"][key]
        common.say(f"  {key:>18}: after {a:9.2f}  before {b:9.2f}  after/before {a / b:5.3f}")
    out = common.OUT_DIR / "hardening.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    data = {"machine": common.machine(), "before": ns.before, "summary": summary, "runs": runs}
    out.write_text(json.dumps(data, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
