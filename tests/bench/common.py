"""Shared helpers of the benchmarks: percentiles, tables, machine facts, JSON output under out/bench/."""

from __future__ import annotations

import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from tests.serverproc import ROOT

OUT_DIR = ROOT / "out" / "bench"


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100) of unsorted values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, math.ceil(p / 100 * len(ordered)) - 1))
    return float(ordered[k])


def median(values: Iterable[float]) -> float:
    vals = [v for v in values if v is not None and not math.isnan(v)]
    return float(statistics.median(vals)) if vals else math.nan


def rnd(x: float, nd: int = 2) -> float:
    return x if math.isnan(x) else round(x, nd)


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A Markdown table (also readable on a terminal)."""
    cells = [[str(h) for h in headers]] + [[_fmt(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in cells]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def _fmt(c: Any) -> str:
    if isinstance(c, float):
        if math.isnan(c):
            return "–"
        return f"{c:,.0f}" if abs(c) >= 1000 else f"{c:.3g}" if abs(c) < 10 else f"{c:.1f}"
    return str(c)


def _cmd(*args: str) -> str:
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def revision() -> str:
    """The commit measured (GPU_ADMISSION_BENCH_COMMIT when running from an export), '+dirty' when the
    product's code (policies/, webhook/, certs/) has uncommitted changes."""
    given = os.environ.get("GPU_ADMISSION_BENCH_COMMIT")
    if given:
        return given
    head = _cmd("git", "-C", str(ROOT), "rev-parse", "--short", "HEAD")
    if not head:
        return "unknown"
    dirty = _cmd("git", "-C", str(ROOT), "status", "--porcelain", "--", "policies", "webhook", "certs")
    return head + ("+dirty" if dirty else "")


def machine() -> dict[str, Any]:
    cpu = ""
    try:
        m = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.MULTILINE)
        cpu = m.group(1) if m else ""
    except OSError:
        pass
    try:
        mem_kib = int(re.search(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text()).group(1))  # type: ignore[union-attr]
    except (OSError, AttributeError):
        mem_kib = 0
    return {
        "revision": revision(),
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "memory_gib": round(mem_kib / 2**20, 1),
        "kernel": platform.release(),
        "python": sys.version.split()[0],
        "go": _cmd("go", "version"),
        "packages": {
            d: _version(d) for d in ("uvicorn", "fastapi", "starlette", "h11", "httptools", "uvloop", "orjson")
        },
        "loadavg": loadavg(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def loadavg() -> list[float]:
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return []


def rss_kib(pid: int) -> int:
    """VmRSS of a process, in KiB (from /proc/<pid>/status)."""
    m = re.search(r"^VmRSS:\s+(\d+)\s+kB", Path(f"/proc/{pid}/status").read_text(), re.MULTILINE)
    return int(m.group(1)) if m else 0


def write_json(part: str, data: dict[str, Any]) -> Path:
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    path = OUT_DIR / f"{part}.json"
    path.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")
    return path


def say(text: str = "") -> None:
    print(text, flush=True)
