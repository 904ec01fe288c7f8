"""Where a serve process spends its time at saturation: a py-spy sampling profile, summarised by layer.

`python -m tests.bench.run server --profile` (or `profile_server()`) starts one server pinned to a CPU, drives
it at saturation with the load generator and samples it with py-spy (`pip install py-spy`; sampling needs
ptrace rights on the process). The raw stacks go to out/bench/server-profile.txt (flamegraph.pl input) and
the summary into the JSON.

Samples are attributed to the deepest frame that belongs to a known layer (threading.py frames count for their
caller). C code (uvloop's event loop and socket calls, httptools, OpenSSL) has no Python frame of its own: its
time shows as the Python frame that called into it (the loop's run() for the loop itself, uvicorn's send() for
uvloop's TLS transport write path, ssl.py's SSLObject.write/read for OpenSSL).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from tests.bench import common, driver, server
from tests.serverproc import ServerProcess

# (layer, file-path pattern), checked from the deepest frame up.
LAYERS = (
    ("engine (policies/)", re.compile(r"^policies/")),
    ("AdmissionReview parse/response (webhook/admission.py)", re.compile(r"^webhook/admission\.py$")),
    ("audit log (webhook/audit.py)", re.compile(r"^webhook/audit\.py$")),
    ("metrics (webhook/metrics.py)", re.compile(r"^webhook/metrics\.py$")),
    ("TLS records (ssl.py SSLObject read/write, GIL waits inside)", re.compile(r"^ssl\.py$")),
    ("handler (webhook/app.py)", re.compile(r"^webhook/app\.py$")),
    ("FastAPI/Starlette", re.compile(r"^(fastapi|starlette|pydantic)/")),
    ("uvicorn protocol (httptools/h11)", re.compile(r"^(uvicorn|h11|httptools)/")),
    ("asyncio (Python part)", re.compile(r"^(asyncio/|concurrent/|selectors\.py)")),
)
LOOP = "event loop, TLS, sockets (C: uvloop/ssl)"
# Leaf frames of a thread that is blocked, not running (py-spy's idle detection misses some under --nonblocking).
WAITS = {("Condition.wait", "threading.py"), ("Event.wait", "threading.py"), ("wait", "threading.py")}
_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^():]+?)(?::\d+)?\)$")


def parse_raw(text: str) -> list[tuple[str, list[tuple[str, str]], int]]:
    """py-spy --format raw [--threads]: `thread (tid): name;frame;frame… count` per line."""
    out = []
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        parts = stack.split(";")
        thread = parts[0] if parts and parts[0].startswith("thread ") else ""
        frames = []
        for p in parts[1:] if thread else parts:
            m = _FRAME.match(p)
            frames.append((m.group("func"), m.group("file")) if m else (p, ""))
        out.append((thread.split(": ", 1)[-1] if thread else "", frames, int(count)))
    return out


def summarize(text: str, top: int = 20) -> dict[str, Any]:
    samples = parse_raw(text)
    total = sum(n for _, frames, n in samples if not (frames and frames[-1] in WAITS)) or 1
    layers: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    waiting = 0
    for thread, frames, n in samples:
        if frames and frames[-1] in WAITS:
            waiting += n
            continue
        threads[thread or "?"] += n
        layer = LOOP if thread in ("MainThread", "") else f"other thread: {thread}"
        for _func, path in reversed(frames):
            hit = next((name for name, rx in LAYERS if rx.search(path)), None)
            if hit:
                layer = hit if thread in ("MainThread", "") else f"other thread: {thread} ({hit})"
                break
        layers[layer] += n
        if frames:
            func, path = frames[-1]
            own[f"{func} ({path})"] += n
        for key in {f"{f} ({p})" for f, p in frames}:
            inclusive[key] += n

    def pct(c: Counter[str], k: int | None = None) -> list[list[Any]]:
        return [[name, round(100 * n / total, 1)] for name, n in c.most_common(k)]

    return {
        "samples": total,
        "waiting_samples_dropped": waiting,
        "layers_pct": pct(layers),
        "threads_pct": pct(threads),
        "top_own_pct": pct(own, top),
        "top_inclusive_pct": [r for r in pct(inclusive, 80) if not r[0].startswith(("_run_", "<module>", "main ("))][
            :top
        ],
    }


def pyspy() -> str | None:
    return shutil.which("py-spy")


def profile_server(seconds: float = 10.0, rate: int = 100, env: Any = None) -> dict[str, Any]:
    """Sample one pinned server at saturation (closed loop, 8 workers) with py-spy."""
    spy = pyspy()
    if not spy:
        return {"error": "py-spy is not installed (pip install py-spy)"}
    tmp = Path(tempfile.mkdtemp(prefix="gpu-admission-bench-"))
    raw = tmp / "raw.txt"
    srv = ServerProcess(env=env)
    try:
        pinned = server.pin(srv.proc.pid, 1)
        reqs = server.req_args([srv], server.write_bodies(tmp))
        driver.run(["-cacert", srv.ca, "-c", "8", "-n", "1000", *reqs], cpus="0" if pinned else None)
        proc = subprocess.Popen(
            [
                spy,
                "record",
                "--format",
                "raw",
                "--threads",
                "--nonblocking",
                "-r",
                str(rate),
                "-d",
                str(int(seconds)),
                "-o",
                str(raw),
                "-p",
                str(srv.proc.pid),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        load = driver.run(
            [
                "-cacert",
                srv.ca,
                "-c",
                "8",
                "-conns",
                str(server.CONNS),
                "-duration",
                f"{seconds + 1}s",
                "-expect",
                server.EXPECT,
                *reqs,
            ],
            cpus="0" if pinned else None,
        )
        log = proc.communicate(timeout=60)[0]
        if not raw.exists():
            return {"error": f"py-spy wrote nothing: {log.strip()[-300:]}"}
        text = raw.read_text()
        common.OUT_DIR.mkdir(parents=True, exist_ok=True)
        (common.OUT_DIR / "server-profile.txt").write_text(text)
        out = summarize(text)
        out["achieved_rate"] = load["achieved_rate"]
        out["raw"] = str(common.OUT_DIR / "server-profile.txt")
        out["py_spy_log"] = log.strip().splitlines()[-2:] if log else []
        return out
    finally:
        server.stop(srv)
        shutil.rmtree(tmp, ignore_errors=True)


def report(prof: dict[str, Any]) -> None:
    if "error" in prof:
        common.say(f"profile: {prof['error']}")
        return
    common.say(f"profile at saturation ({prof['achieved_rate']}/s, {prof['samples']} samples, py-spy):")
    common.say(common.table(["layer", "% of samples"], prof["layers_pct"]))
    common.say(common.table(["own time: function", "%"], prof["top_own_pct"][:12]))
