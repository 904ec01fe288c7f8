"""`python -m tests.bench.run [PART|all] [--quick]`: the benchmarks of docs/benchmarks.md (parts: PARTS below).

Each part prints a table and writes JSON to out/bench/<part>.json. `--quick` is a smoke run of a few seconds
per part (the numbers are not meant to be quoted). `--variant` runs an experiment from tests/bench/variants.py
(engine: patched in process; server and apiserver: the webhook server's sitecustomize) and writes
<part>-<variant>.json instead.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from tests.bench import common

PARTS = ("engine", "server", "apiserver", "apiprofile", "scale", "placement", "placement-cost", "peers")
ALL = PARTS[:-1]  # `all`: peers only when named (it needs scripts/peers/build.sh and runs ~40 min)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.bench.run", description=__doc__.splitlines()[0])
    ap.add_argument("part", nargs="?", default="all", choices=(*PARTS, "all"))
    ap.add_argument("--quick", action="store_true", help="a short smoke run (a few seconds per part)")
    ap.add_argument(
        "--report", action="store_true", help="print the tables of out/bench/<part>.json again, run nothing"
    )
    ap.add_argument(
        "--variant", default="baseline", help="server experiment(s) from tests/bench/variants.py, joined with '+'"
    )
    ap.add_argument(
        "--placement",
        default="both",
        choices=("both", "shared", "isolated"),
        help="apiserver: where the webhook runs (shared cores, its own core, or both; default both)",
    )
    ap.add_argument("--configs", default="", help="apiserver: configurations to measure, comma-separated "
                    "(none and webhook always run; default all)")  # fmt: skip
    ap.add_argument("--loads", default="", help="apiserver, peers: loads to measure, comma-separated LOADS keys "
                    "(e.g. 20,20@100/s; default all)")  # fmt: skip
    ap.add_argument("--reps", type=int, default=None, help="apiserver, peers: repetitions (default 3; --quick 1)")
    ap.add_argument("--mutating-policy", action="store_true",
                    help="apiserver: every configuration under the default policy plus apiserver.MUTATING_POLICY, "
                    "and the native-map configuration (MutatingAdmissionPolicies) measured too")  # fmt: skip
    ns = ap.parse_args(argv)
    if ns.reps is not None and ns.reps < 1:
        ap.error(f"--reps must be 1 or more, not {ns.reps}")
    parts = ALL if ns.part == "all" else (ns.part,)
    from tests.bench import variants

    try:
        variants.names(ns.variant)
    except ValueError as exc:
        ap.error(str(exc))
    suffix = "" if ns.variant == "baseline" else f"-{ns.variant}"
    if ns.report:
        import importlib
        import json

        for part in parts:
            path = common.OUT_DIR / f"{part}{suffix}.json"
            if not path.is_file():
                common.say(f"== {part}: no {path}")
                continue
            data = json.loads(path.read_text())
            common.say(f"== {part} ({data['machine'].get('revision', '?')}, {data['machine'].get('time', '?')})")
            module = importlib.import_module(f"tests.bench.{part.replace('-', '')}")
            module.report(data)
            if part == "server" and "profile" in data:
                from tests.bench import profiles

                profiles.report(data["profile"])
        return 0
    for part in parts:
        common.say(f"== {part}{' (quick)' if ns.quick else ''}")
        if part == "engine":
            from tests.bench import engine

            undo = variants.engine_patch(ns.variant)
            try:
                result = engine.run(quick=ns.quick, tag=suffix)
            finally:
                undo()
            result["variant"] = ns.variant
            path = common.write_json("engine" + suffix, result)
        elif part == "server":
            from tests.bench import server

            result = server.run(quick=ns.quick, variant=ns.variant)
            path = common.write_json("server" + suffix, result)
        elif part == "scale":
            from tests.bench import scale

            result = scale.run(quick=ns.quick)
            path = common.write_json("scale", result)
        elif part == "apiserver":
            from tests.bench import apiserver

            result = apiserver.run(
                quick=ns.quick,
                variant=ns.variant,
                placement=ns.placement,
                only=tuple(ns.configs.split(",")) if ns.configs else apiserver.CONFIGS,
                only_loads=tuple(ns.loads.split(",")) if ns.loads else apiserver.CONCURRENCY,
                reps=ns.reps,
                mutating=ns.mutating_policy,
            )
            path = common.write_json("apiserver" + ("-mutating" if ns.mutating_policy else "") + suffix, result)
        elif part == "peers":
            from tests.bench import peers

            result = peers.run(
                quick=ns.quick, reps=ns.reps, loads=tuple(ns.loads.split(",")) if ns.loads else peers.LOADS
            )
            path = common.write_json("peers", result)
        elif part == "placement":
            from tests.bench import placement

            result = placement.run(quick=ns.quick)
            path = common.write_json("placement", result)
        elif part == "placement-cost":
            from tests.bench import placementcost

            result = placementcost.run(quick=ns.quick)
            path = common.write_json("placement-cost", result)
        else:
            from tests.bench import apiprofile

            result = apiprofile.run(quick=ns.quick, variant=ns.variant)
            path = common.write_json("apiprofile" + suffix, result)
        common.say(f"wrote {path}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
