"""Build and run the Go load generator of tests/bench/loadgen/.

The binary is built with the machine's Go (standard library only: no module downloads) into
``${GPU_ADMISSION_CACHE:-$HOME/.cache/gpu-admission}/bench/loadgen`` and rebuilt whenever the hash of its
sources (and of `go version`) changes (tests/gobuild.py).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests import gobuild
from tests.gobuild import GoProgram


class LoadgenError(RuntimeError):
    pass


LOADGEN = GoProgram(Path(__file__).resolve().parent / "loadgen", "loadgen", "bench")
SOURCE_DIR = LOADGEN.source_dir


def cache_dir() -> Path:
    return LOADGEN.cache_dir()


def _go() -> str:
    try:
        return gobuild.go()
    except gobuild.GoBuildError as exc:
        raise LoadgenError(str(exc)) from None


def source_hash(go: str) -> str:
    return LOADGEN.source_hash(go)


def build(force: bool = False) -> Path:
    """The path of an up-to-date loadgen binary (built now if missing or stale)."""
    return LOADGEN.build(LoadgenError, force)


def run(args: Sequence[str], *, cpus: str | None = None, timeout: float = 900.0) -> dict[str, Any]:
    """Run loadgen with `args` and return its JSON summary. `cpus` pins it (taskset -c) to those CPUs."""
    cmd = [str(build()), *args]
    if cpus and shutil.which("taskset"):
        cmd = ["taskset", "-c", cpus, *cmd]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise LoadgenError(f"loadgen exited {proc.returncode}: {proc.stderr.strip()[-1000:]}")
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    if not lines:
        raise LoadgenError(f"loadgen printed nothing; stderr: {proc.stderr.strip()[-1000:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def serve_noop(port: int, cert: str, key: str) -> subprocess.Popen[bytes]:
    """Start loadgen's no-op admission webhook on 127.0.0.1:`port` (stop it with .terminate())."""
    proc = subprocess.Popen(
        [str(build()), "-serve", f"127.0.0.1:{port}", "-cert", cert, "-key", key],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return proc
