"""Run mutmut's mutants faster than `mutmut run` does: collect the tests once, fork one child per mutant.

`mutmut run` forks a child per mutant that starts pytest afresh (argument parsing, plugin loading, collection of
the listed tests: about a second on this project before the first test runs). This driver works in mutmut's own
`mutants/` tree, after `mutmut run` has generated it and collected its stats: it collects the test files once in
one pytest session, then for each mutant forks a child that sets `MUTANT_UNDER_TEST` (mutmut's trampoline reads
it on every call) and runs only the tests mutmut's stats say reach the mutated function, cheapest first, until
one fails. The verdicts go into mutmut's `.meta` files, so `mutmut results` and `mutmut show` work as after a
`mutmut run`, and one JSON line per mutant into a log, which also lets a stopped run resume.

On `policies/classify.py` (115 mutants) it gave the same verdict as `mutmut run` for every mutant, at 3x the
speed (docs/testing.md, session 11). `make mutmut-fast` runs it.

Exit codes follow mutmut's: 0 survived, 1 killed, 33 no test reaches the function, 36 killed at the wall-clock
bound, -24 over the CPU-time bound.
"""

from __future__ import annotations

import argparse
import fnmatch
import gc
import json
import os
import resource
import signal
import sys
import time
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

NO_TESTS, KILLED, SURVIVED, WALL_TIMEOUT, CPU_TIMEOUT = 33, 1, 0, 36, -24
# A mutant that loops must not stall the run: bounds scale with the clean duration of its tests.
CPU_FACTOR, WALL_FACTOR, SLACK_S = 20, 30, 5.0


def function_of(mutant: str) -> str:
    """`policies.rules.x_f__mutmut_3` -> `policies.rules.x_f`, the key of mutmut's stats."""
    return mutant.rsplit("__mutmut_", 1)[0]


def meta_file(mutant: str) -> Path:
    """The `.meta` file mutmut keeps a module's verdicts in (`policies/rules.py.meta`)."""
    module = function_of(mutant).rsplit(".", 1)[0]
    return Path(module.replace(".", "/") + ".py.meta")


def select_tests(
    tests: Iterable[str], duration: dict[str, float], per_test: int | None, max_secs: float | None
) -> list[str]:
    """The tests a mutant runs, cheapest first.

    `per_test` keeps at most that many parameters of one parametrized test (each golden case counts as its own
    test) and `max_secs` drops tests slower than that: both trade completeness for speed, so a survivor of a
    narrowed set is a candidate, to be re-tested or explained. None keeps every test.
    """
    ordered = sorted(set(tests), key=lambda t: (duration.get(t, 1.0), t))
    if max_secs is not None:
        ordered = [t for t in ordered if duration.get(t, 1.0) <= max_secs]
    if per_test is None:
        return ordered
    kept: list[str] = []
    seen: dict[str, int] = defaultdict(int)
    for t in ordered:
        key = t if t.startswith("tests/test_golden.py") else t.split("[", 1)[0]
        if seen[key] < per_test:
            seen[key] += 1
            kept.append(t)
    return kept


def exit_code(status: int) -> int:
    """A child's wait status as mutmut's exit code."""
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status)
    sig = os.WTERMSIG(status)
    return CPU_TIMEOUT if sig == signal.SIGXCPU else WALL_TIMEOUT if sig == signal.SIGKILL else -sig


def read_log(path: Path) -> dict[str, int]:
    """Verdicts an earlier run logged; a torn last line (the run was killed mid-write) is left out."""
    verdicts: dict[str, int] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
                verdicts[record["name"]] = int(record["code"])
            except (ValueError, KeyError, TypeError):
                continue
    return verdicts


def write_meta(verdicts: dict[str, int]) -> None:
    """Merge verdicts into mutmut's `.meta` files, each replaced whole (a reader never sees half a file)."""
    by_file: dict[Path, dict[str, int]] = defaultdict(dict)
    for name, code in verdicts.items():
        by_file[meta_file(name)][name] = code
    for path, codes in by_file.items():
        data = json.loads(path.read_text())
        data["exit_code_by_key"].update(codes)
        tmp = path.with_suffix(".meta.tmp")
        tmp.write_text(json.dumps(data, indent=4))
        os.replace(tmp, path)


class Driver:
    """A pytest plugin: collection is pytest's; the run loop is replaced by one fork per mutant."""

    def __init__(self, work: list[tuple[str, list[str], float]], jobs: int, log: Path) -> None:
        self.work = work
        self.jobs = jobs
        self.log = log.open("a", buffering=1)
        self.unflushed: dict[str, int] = {}
        self.flushed_at = time.monotonic()
        self.done = 0

    def pytest_runtestloop(self, session: Any) -> bool:
        items = {item.nodeid: item for item in session.items}
        running: dict[int, tuple[str, float, float]] = {}
        gc.collect()
        gc.freeze()  # children share the parent's heap pages instead of copying them on the first collection
        started = time.monotonic()
        print(f"mutdrive: {len(self.work)} mutants, {len(items)} tests collected", file=sys.__stderr__, flush=True)
        for name, tests, estimate in self.work:
            chosen = [items[t] for t in tests if t in items]
            if not chosen:
                self.record(name, NO_TESTS, 0.0)
                continue
            while len(running) >= self.jobs:
                self.reap(running)
            pid = os.fork()
            if pid == 0:
                self.child(name, chosen, estimate)
            running[pid] = (name, time.monotonic(), estimate)
        while running:
            self.reap(running)
        self.flush()
        elapsed = time.monotonic() - started
        print(f"mutdrive: {self.done} mutants in {elapsed:.0f} s", file=sys.__stderr__, flush=True)
        return True

    @staticmethod
    def child(name: str, items: list[Any], estimate: float) -> None:
        from _pytest.runner import runtestprotocol

        os.environ["MUTANT_UNDER_TEST"] = name
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        limit = int((estimate + SLACK_S) * CPU_FACTOR + time.process_time()) + 30
        resource.setrlimit(resource.RLIMIT_CPU, (limit, limit + 1))
        code = SURVIVED
        try:
            for i, item in enumerate(items):
                following = items[i + 1] if i + 1 < len(items) else None
                if any(report.failed for report in runtestprotocol(item, nextitem=following, log=False)):
                    code = KILLED
                    break
        except BaseException:  # an error escaping pytest's protocol is the mutant's doing: a kill
            code = KILLED
        os._exit(code)

    def reap(self, running: dict[int, tuple[str, float, float]]) -> None:
        while True:
            now = time.monotonic()
            for pid, (_, start, estimate) in running.items():
                if now - start > (estimate + SLACK_S) * WALL_FACTOR + 60:
                    os.kill(pid, signal.SIGKILL)
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid:
                name, start, _ = running.pop(pid)
                self.record(name, exit_code(status), time.monotonic() - start)
                return
            time.sleep(0.01)

    def record(self, name: str, code: int, secs: float) -> None:
        self.log.write(json.dumps({"name": name, "code": code, "secs": round(secs, 3)}) + "\n")
        self.unflushed[name] = code
        self.done += 1
        if time.monotonic() - self.flushed_at > 10:
            self.flush()

    def flush(self) -> None:
        write_meta(self.unflushed)
        self.unflushed = {}
        self.flushed_at = time.monotonic()


def all_mutants() -> list[str]:
    names: list[str] = []
    for meta in sorted(Path("policies").glob("*.py.meta")):
        names.extend(json.loads(meta.read_text())["exit_code_by_key"])
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("patterns", nargs="*", help="mutant name globs (default: every mutant not yet decided)")
    parser.add_argument("--names", type=Path, help="a file of mutant names, one per line")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--log", type=Path, default=Path("mutdrive.jsonl"))
    parser.add_argument("--per-test", type=int, help="at most this many parameters of one parametrized test")
    parser.add_argument("--max-secs", type=float, help="leave out tests slower than this (clean run)")
    args = parser.parse_args(argv)
    if not Path("mutmut-stats.json").exists():
        print("mutdrive: run it in mutmut's mutants/ tree after `mutmut run` has collected stats", file=sys.stderr)
        return 2
    stats = json.loads(Path("mutmut-stats.json").read_text())
    tests_by_function: dict[str, list[str]] = stats["tests_by_mangled_function_name"]
    duration: dict[str, float] = stats["duration_by_test"]

    names = [n.strip() for n in args.names.read_text().splitlines() if n.strip()] if args.names else all_mutants()
    if args.patterns:
        names = [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in args.patterns)]
    logged = read_log(args.log)
    write_meta(logged)  # what a stopped run logged but had not flushed
    undecided = {
        n
        for meta in Path("policies").glob("*.py.meta")
        for n, code in json.loads(meta.read_text())["exit_code_by_key"].items()
        if code is None
    }
    names = [n for n in names if n not in logged and (args.names or args.patterns or n in undecided)]

    work = []
    for name in names:
        tests = select_tests(tests_by_function.get(function_of(name), ()), duration, args.per_test, args.max_secs)
        work.append((name, tests, sum(duration.get(t, 1.0) for t in tests)))
    work.sort(key=lambda w: (w[2], w[0]))  # cheap functions first, like mutmut
    files = sorted({t.split("::", 1)[0] for _, tests, _ in work for t in tests})
    if not files:
        print("mutdrive: nothing to run", file=sys.stderr)
        return 0

    import pytest

    sys.path.insert(0, os.getcwd())
    os.environ["MUTANT_UNDER_TEST"] = ""
    os.environ.setdefault("HYPOTHESIS_PROFILE", "mutmut")
    pytest.main(
        ["--rootdir=.", "-q", "--tb=no", "-p", "no:cacheprovider", "-p", "no:randomly", *files],
        plugins=[Driver(work, args.jobs, args.log)],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
