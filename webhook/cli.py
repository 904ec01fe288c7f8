"""The `gpu-admission` command line: one sub-command module per idea, registered here.

Each sub-command module exposes `register(subparsers) -> None`, which adds its parser and sets
`func=handler` with `handler(args) -> int` (the exit code). Errors are one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import sys
from collections.abc import Sequence

# Modules that register sub-commands; each is imported lazily so `check` never pays for FastAPI.
COMMAND_MODULES: tuple[str, ...] = (
    "webhook.cmd_check",
    "webhook.cmd_scan",
    "webhook.cmd_policy",
    "webhook.cmd_estimate",
    "webhook.cmd_serve",
    "certs.cli",
    "webhook.cmd_audit",
    "webhook.cmd_test",
    "webhook.cmd_placement",
)


class UsageError(Exception):
    """A one-line error for the user; exit code 2."""


def installed_version() -> str:
    """The version of the installed distribution (pyproject.toml's, as pip recorded it)."""
    try:
        return importlib.metadata.version("gpu-admission")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpu-admission",
        description="Admission webhook and policy enforcer for GPU/AI workloads on Kubernetes.",
    )
    parser.add_argument("--version", action="version", version=f"gpu-admission {installed_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # not written yet: leave it out rather than crash
                continue
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.func(args))
    except UsageError as exc:
        print(f"gpu-admission: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
