"""Where the API server's CPU goes when it calls webhooks: Go CPU profiles of the real kube-apiserver.

One control plane (profiling on), the configurations of `tests.bench.apiserver` in turn, each under the
same closed-loop load (20 clients creating the corpus pods); a CPU profile of the API server is taken from
`/debug/pprof/profile` in the middle of each run and summarised with `go tool pprof`: total API-server CPU
per created pod, and the cumulative CPU per pod of the code paths a webhook adds (the webhook dispatchers,
building the AdmissionReview, the HTTP/TLS call, match conditions, applying a patch). The profiles
themselves are kept in out/bench/ (`go tool pprof -http=: out/bench/apiserver-<config>.pprof`).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
import time
import uuid
from typing import Any

from tests.bench import apiserver, common, driver

CLIENTS = 20
# (label, regular expression on function names): the cumulative CPU of each path per created pod, summed
# over the matching functions. Indented rows are parts of the row above; the validating dispatcher runs
# each hook in a goroutine of its own (Dispatch.func1), hence its two names.
_A = r"^k8s\.io/apiserver/pkg/admission/plugin/"  # most paths live under the API server's admission plugins
PATHS: tuple[tuple[str, str], ...] = (
    ("mutating webhooks (whole plugin)", _A + r"webhook/mutating\.\(\*Plugin\)\.Admit$"),
    (
        "validating webhooks (whole plugin)",
        _A + r"webhook/validating\.\(\*validatingDispatcher\)\.Dispatch(\.func\d+)?$",
    ),
    ("  should the hook be called (rules + matchConditions)", _A + r"webhook/generic\.\(\*Webhook\)\.ShouldCallHook$"),
    ("    of which: object converted for CEL", _A + r"cel\.convertObjectToUnstructured$"),
    (
        "  the calls (encode, HTTP/TLS, decode, patch)",
        _A + r"webhook/(mutating\.\(\*mutatingDispatcher\)\.callAttrMutatingHook"
        r"|validating\.\(\*validatingDispatcher\)\.callHook)$",
    ),
    ("    of which: AdmissionReview encoded", r"^k8s\.io/client-go/rest\.\(\*Request\)\.Body$"),
    ("    of which: HTTP round trip", r"^k8s\.io/client-go/rest\.\(\*Request\)\.Do$"),
    ("    of which: JSON patch applied", r"^gopkg\.in/evanphx/json-patch%2ev4\.Patch\.ApplyIndent$"),
    ("validating admission policies (CEL)", _A + r"policy/validating\.\(\*dispatcher\)\.Dispatch$"),
    ("TLS writes and reads (every connection)", r"^crypto/tls\.\(\*Conn\)\.(Read|Write)$"),
    ("etcd (storage create)", r"^k8s\.io/apiserver/pkg/storage/etcd3\.\(\*store\)\.Create$"),
    ("garbage collection (background mark)", r"^runtime\.gcBgMarkWorker$"),
)
_LINE = re.compile(r"^\s*([\d.]+)([a-zµ]*)\s+[\d.]+%\s+[\d.]+%\s+([\d.]+)([a-zµ]*)\s+[\d.]+%\s+(.+)$")
_TOTAL = re.compile(r"Total samples = ([\d.]+)(\w+)")
_UNIT_MS = {"": 0.0, "ns": 1e-6, "us": 1e-3, "µs": 1e-3, "ms": 1.0, "s": 1000.0, "min": 60000.0, "hrs": 3600000.0}


def _ms(value: str, unit: str) -> float:
    return float(value) * _UNIT_MS.get(unit, float("nan"))


def analyse(path: str) -> dict[str, Any]:
    """Total CPU and the cumulative CPU of each function in a Go CPU profile (`go tool pprof -top -cum`)."""
    go = shutil.which("go")
    if go is None:
        return {"error": "go is not on PATH"}
    proc = subprocess.run(
        [go, "tool", "pprof", "-top", "-cum", "-nodecount=100000", path],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if proc.returncode != 0:
        return {"error": proc.stderr.strip()[-500:]}
    total = _TOTAL.search(proc.stdout)
    cum: dict[str, float] = {}
    for line in proc.stdout.splitlines():
        m = _LINE.match(line)
        if m:
            name = m.group(5).strip()
            cum[name] = max(cum.get(name, 0.0), _ms(m.group(3), m.group(4)))
    return {"total_ms": _ms(total.group(1), total.group(2)) if total else None, "cum_ms": cum}


def _paths(cum: dict[str, float]) -> dict[str, float]:
    out: dict[str, float] = {}
    for label, pattern in PATHS:
        rx = re.compile(pattern)
        out[label] = sum(ms for name, ms in cum.items() if rx.match(name))
    return out


def _profile(cp: Any, seconds: int) -> bytes:
    cmd = [cp.kubectl_path, f"--kubeconfig={cp.kubeconfig}", "get", "--raw", f"/debug/pprof/profile?seconds={seconds}"]
    proc = subprocess.run(cmd, capture_output=True, timeout=seconds + 60, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"pprof: {proc.stderr.decode(errors='replace').strip()[-300:]}")
    return proc.stdout


def run(quick: bool = False, variant: str = "baseline") -> dict[str, Any]:
    seconds = 4 if quick else 10
    t0 = time.monotonic()
    cp, tmp, bodies = apiserver.start("--profiling=true")
    configs: apiserver.Configs | None = None
    results: dict[str, Any] = {}
    try:
        creds = apiserver.credentials(cp.kubeconfig, tmp)
        configs = apiserver.Configs(cp, variant)
        common.say(f"apiserver profile ({variant}): ready in {time.monotonic() - t0:.1f}s; {seconds}s per profile")
        auth = ["-cacert", creds["ca"], "-cert", creds["cert"], "-key", creds["key"]]
        # native-map only under --mutating-policy (apiserver.run's rule): the default policy makes no MAP, so it
        # would equal native, and an empty List is refused by kubectl apply.
        for config in (c for c in apiserver.CONFIGS if c != "native-map" or configs.map_objects):
            configs.set(config, settle=0.3 if quick else 1.0)
            namespace = f"prof-{config}-{uuid.uuid4().hex[:6]}"
            cp.kubectl("create", "namespace", namespace)
            url = f"{creds['server']}/api/v1/namespaces/{namespace}/pods"
            reqs = [a for b in bodies for a in ("-req", f"{url}@{b}")]
            load: dict[str, Any] = {}

            def drive(reqs: list[str] = reqs, load: dict[str, Any] = load) -> None:
                try:
                    load.update(
                        driver.run(
                            [*auth, "-c", str(CLIENTS), "-conns", str(CLIENTS), "-warmup", "2s", "-duration",
                             f"{seconds + 4}s", "-timeout", "30s", *reqs]
                        )
                    )  # fmt: skip
                except driver.LoadgenError as exc:
                    load["error"] = str(exc)

            thread = threading.Thread(target=drive)
            thread.start()
            time.sleep(3.0)  # past the warm-up: connections open, caches warm
            profile = _profile(cp, seconds)
            thread.join()
            apiserver._cleanup(cp, namespace)
            path = common.OUT_DIR / f"apiserver-{config}{'' if variant == 'baseline' else '-' + variant}.pprof"
            common.OUT_DIR.mkdir(parents=True, exist_ok=True)
            path.write_bytes(profile)
            summary = analyse(str(path))
            rate = float(load.get("achieved_rate") or 0.0)
            pods = rate * seconds  # pods created while the profile ran (a steady closed loop)
            entry: dict[str, Any] = {"pods_per_s": round(rate, 1), "profile": str(path), "errors": load.get("errors")}
            if "error" in summary or not pods:
                entry["error"] = summary.get("error") or load.get("error") or "no pods created"
            else:
                entry["cpu_ms_per_pod"] = round((summary["total_ms"] or 0.0) / pods, 3)
                entry["paths_ms_per_pod"] = {k: round(v / pods, 3) for k, v in _paths(summary["cum_ms"]).items()}
            results[config] = entry
            common.say(f"  {config:>9}: {rate:7.1f} pods/s, API server CPU {entry.get('cpu_ms_per_pod', '–')} ms/pod")
    finally:
        if configs is not None:
            configs.close()
        cp.stop()
    result = {
        "part": "apiprofile",
        "variant": variant,
        "quick": quick,
        "clients": CLIENTS,
        "seconds": seconds,
        "configs": results,
        "machine": common.machine(),
    }
    report(result)
    return result


def report(result: dict[str, Any]) -> None:
    configs = [c for c in apiserver.CONFIGS if c in result["configs"]]
    headers = ["API server CPU ms per created pod", *configs]
    rows: list[list[Any]] = [
        ["pods/s (20 clients)", *(result["configs"][c].get("pods_per_s", "–") for c in configs)],
        ["total (profile samples)", *(result["configs"][c].get("cpu_ms_per_pod", "–") for c in configs)],
    ]
    for label, _ in PATHS:
        rows.append([label, *(result["configs"][c].get("paths_ms_per_pod", {}).get(label, "–") for c in configs)])
    common.say(common.table(headers, rows))
