"""Build and run the Go load generator of tests/bench/loadgen/.

The binary is built with the machine's Go (standard library only: no module downloads) into
``${GPU_ADMISSION_CACHE:-$HOME/.cache/gpu-admission}/bench/loadgen`` and rebuilt whenever the hash of its
sources (and of `go version`) changes.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SOURCE_DIR = Path(__file__).resolve().parent / "loadgen"


class LoadgenError(RuntimeError):
    pass


def cache_dir() -> Path:
    root = os.environ.get("GPU_ADMISSION_CACHE") or str(Path.home() / ".cache" / "gpu-admission")
    return Path(root) / "bench"


def _go() -> str:
    go = shutil.which("go")
    if not go:
        raise LoadgenError("the Go toolchain is not on PATH (needed to build tests/bench/loadgen)")
    return go


def source_hash(go: str) -> str:
    h = hashlib.sha256()
    for path in sorted(SOURCE_DIR.iterdir()):
        if path.is_file() and (path.suffix == ".go" or path.name in ("go.mod", "go.sum")):
            h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    version = subprocess.run([go, "version"], capture_output=True, text=True, check=False).stdout.strip()
    h.update(version.encode())
    return h.hexdigest()


def build(force: bool = False) -> Path:
    """The path of an up-to-date loadgen binary (built now if missing or stale)."""
    go = _go()
    out_dir = cache_dir()
    binary = out_dir / "loadgen"
    stamp = out_dir / "loadgen.sha256"
    digest = source_hash(go)
    if not force and binary.is_file() and stamp.is_file() and stamp.read_text().strip() == digest:
        return binary
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="loadgen-", dir=out_dir)) / "loadgen"
    env = dict(os.environ, CGO_ENABLED="0", GOTOOLCHAIN="local", GOWORK="off")
    proc = subprocess.run(
        [go, "build", "-trimpath", "-o", str(tmp), "."],
        cwd=SOURCE_DIR,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise LoadgenError(f"go build of {SOURCE_DIR} failed:\n{proc.stderr.strip()[-2000:]}")
    tmp.replace(binary)  # atomic: a concurrent reader sees the old or the new binary, never half of one
    shutil.rmtree(tmp.parent, ignore_errors=True)
    stamp.write_text(digest + "\n")
    return binary


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
