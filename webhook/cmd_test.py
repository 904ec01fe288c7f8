"""`gpu-admission test DIR`: run a policy repository's own cases (webhook/suite.py) and say what differs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import orjson

from webhook.cli import UsageError
from webhook.cmd_check import _size
from webhook.manifests import DEFAULT_LIMITS, Limits
from webhook.suite import FAIL, INVALID, PASS, XFAIL, XPASS, Outcome, SuiteError, exit_code, run_suite

_LABELS = {PASS: "PASS ", FAIL: "FAIL ", XFAIL: "XFAIL", XPASS: "XPASS", INVALID: "BAD  "}


def register(sub: Any) -> None:
    p = sub.add_parser(
        "test",
        help="run a test suite: manifests, nodes and policy in, expected verdicts and patches out",
        description="Run every case under DIR (docs/testing-policies.md) through the webhook's engine. "
        "Exit 0 when every case passes, 1 when any fails, 2 when the suite or a case cannot be read.",
    )
    p.add_argument("dir", metavar="DIR", help="the suite's directory")
    p.add_argument("-q", "--quiet", action="store_true", help="print only cases that did not pass, and the summary")
    p.add_argument("-o", "--output", choices=("text", "json"), default="text")
    p.add_argument("--max-input", type=_size, default=DEFAULT_LIMITS.max_bytes, metavar="SIZE",
                   help="bytes read over all case files, and per nodes or pods file (default 32Mi)")  # fmt: skip
    p.add_argument("--max-objects", type=int, default=DEFAULT_LIMITS.max_objects, metavar="N",
                   help="cases in the suite, and objects per nodes or pods file (default 20000)")  # fmt: skip
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        outcomes = run_suite(Path(args.dir), Limits(max_bytes=args.max_input, max_objects=args.max_objects))
    except SuiteError as exc:
        raise UsageError(str(exc)) from None
    if not outcomes:
        raise UsageError(f"{args.dir}: no cases (.yaml, .yml or .json files)")
    if args.output == "json":
        out = [{"id": o.id, "status": o.status, "description": o.description, "problems": list(o.problems)}
               for o in outcomes]  # fmt: skip
        sys.stdout.buffer.write(orjson.dumps(out, option=orjson.OPT_INDENT_2) + b"\n")
    else:
        _print_text(outcomes, args.quiet)
    return exit_code(outcomes)


def _print_text(outcomes: list[Outcome], quiet: bool) -> None:
    for o in outcomes:
        if quiet and o.status in (PASS, XFAIL):
            continue
        print(f"{_LABELS[o.status]} {o.id}")
        if o.status in (FAIL, XPASS, INVALID):
            for problem in o.problems:
                print("\n".join(f"      {line}" for line in problem.splitlines()))
    counts = {s: sum(1 for o in outcomes if o.status == s) for s in _LABELS}
    extra = f", {counts[XFAIL]} expected to fail" if counts[XFAIL] else ""
    extra += f", {counts[XPASS]} passed unexpectedly" if counts[XPASS] else ""
    print(f"{len(outcomes)} cases: {counts[PASS]} passed, {counts[FAIL]} failed, {counts[INVALID]} invalid{extra}")
