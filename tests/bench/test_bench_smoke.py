"""Smoke tests of the benchmarks: the quick mode of each part runs and writes JSON of the expected shape.

They check structure and sanity (counts, orderings, no errors), never timings: the machine is shared and
noisy, and docs/benchmarks.md is where figures are reported.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from tests.bench import common, driver, run, server


@pytest.fixture
def out_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(common, "OUT_DIR", tmp_path)  # never overwrite the real results in out/bench
    return tmp_path


def _load(out_dir: Path, part: str) -> dict[str, Any]:
    path = out_dir / f"{part}.json"
    assert path.is_file(), f"{part} wrote no JSON"
    data: dict[str, Any] = json.loads(path.read_text())
    assert data["part"] == part and data["quick"] is True
    assert data["machine"]["cpus"] >= 1
    return data


def _finite_positive(x: Any) -> bool:
    return isinstance(x, int | float) and math.isfinite(x) and x > 0


# loadgen's own per-request deadline (its -timeout default): the client gave up waiting, nothing was answered.
CLIENT_TIMEOUT = "timeout"


def _answered_right(what: Any, run_: dict[str, Any], *, open_loop: bool) -> None:
    """A load run's errors. Any server-side one fails: a non-2xx status, an answer that is not the
    AdmissionReview response to its request (`bad-review`: another uid, no verdict, not JSON) or not the verdict
    expected (`unexpected-body`), a refused or reset connection (`transport`). One thing is tolerated: on a busy
    machine an open-loop load (a fixed rate, whatever the answers) can outrun the server, and its requests then
    wait in the client until loadgen's deadline. So `timeout` passes only for an open loop the machine did not
    sustain: fewer answered a second than offered, the answered ones slow too (queued, not one request lost by
    a fast server), and every answered one right (loadgen counts as ok only a 2xx that is the response to its
    request, with the verdict expected). A closed loop waits for each answer: a timeout there fails."""
    errors = dict(run_["errors"] or {})
    timeouts = errors.pop(CLIENT_TIMEOUT, 0) if open_loop else 0
    assert errors == {}, (what, run_["errors"], run_.get("error_samples"))
    assert run_["ok"] + timeouts == run_["sent"] and run_["ok"] > 0, (what, run_["ok"], run_["sent"], timeouts)
    if timeouts:
        assert run_["achieved_rate"] < run_["offered_rate"], (what, "timeouts at a sustained rate", run_)
        assert run_["latency_ms"]["max"] >= 1000.0, (what, "timeouts while the answered ones were quick", run_)


def test_loadgen_is_built_once_and_cached() -> None:
    first = driver.build()
    stamp = first.stat().st_mtime_ns
    assert driver.build() == first and first.stat().st_mtime_ns == stamp  # same source hash: no rebuild
    assert (driver.cache_dir() / "loadgen.sha256").read_text().strip() == driver.source_hash(driver._go())


def test_engine_quick(out_dir: Path) -> None:
    assert run.main(["engine", "--quick"]) == 0
    data = _load(out_dir, "engine")
    names = {c["case"] for c in data["cases"]}
    assert {"training-pod-8gpu", "pytorchjob-2x8", "jobset-2x8", "inference-mig-pod", "inference-deployment",
            "cpu-pod"} <= names  # fmt: skip
    for case in data["cases"]:
        assert case["allowed"] is True, case["case"]
        for variant in ("mutate+validate", "mutate-only", "validate-only"):
            t = case[variant]
            assert _finite_positive(t["median_us"]) and t["p99_us"] >= t["median_us"] >= t["min_us"] > 0
            assert t["calls"] == data["iterations"] * data["rounds"]
    cpu_pod = next(c for c in data["cases"] if c["case"] == "cpu-pod")
    assert cpu_pod["mutations"] == [] and cpu_pod["patch_ops"] == 0  # the fast path is what it claims
    target = data["target"]
    assert target["case"] == "training-pod-8gpu" and target["target_us"] == 100
    assert isinstance(target["met"], bool) and _finite_positive(target["ratio"])


def test_server_quick(out_dir: Path) -> None:
    assert run.main(["server", "--quick"]) == 0
    data = _load(out_dir, "server")
    for cfg, workers in (("one_worker", 1), ("two_workers", 2)):
        section = data[cfg]
        assert section["workers"] == workers
        assert set(section["scenarios"]) == {"100/s", "500/s", "saturation"}
        for name, s in section["scenarios"].items():
            for run_ in s["runs"]:
                _answered_right((cfg, name), run_, open_loop=name != "saturation")
            run0 = s["runs"][0]
            assert _finite_positive(s["achieved_rate"]), (cfg, name)
            assert 0 < s["p50_ms"] <= s["p95_ms"] <= s["p99_ms"] <= s["max_ms"], (cfg, name)
            assert _finite_positive(s["cpu_us_per_review"]), (cfg, name)
            if name == "100/s":  # an open loop sends exactly rate x duration requests
                assert run0["sent"] == round(100 * data["duration_s"])
            if name == "saturation":  # quick: a closed loop of a fixed number of answers, however slow
                assert run0["sent"] == server.QUICK_SATURATION_N
            if workers == 2:  # the load is split evenly: every server got its share of every body
                per_url: dict[str, int] = {}
                for t in run0["targets"]:
                    port = t["url"].split(":")[2].split("/")[0]
                    per_url[port] = per_url.get(port, 0) + t["sent"]
                assert len(per_url) == 2 and abs(min(per_url.values()) - max(per_url.values())) <= 8
    mem = data["memory"]
    assert mem["ok"] == mem["reviews"] and mem["errors"] == {}
    assert 10 < mem["rss_start_mib"] <= mem["rss_peak_mib"] < 4096
    assert isinstance(mem["flat"], bool) and isinstance(mem["within_target"], bool)
    for key in ("throughput", "p99_at_500", "rss", "rss_flat"):
        assert isinstance(data["targets"][key]["met"], bool)


@pytest.mark.e2e
def test_apiserver_quick(out_dir: Path) -> None:
    assert run.main(["apiserver", "--quick"]) == 0
    data = _load(out_dir, "apiserver")
    assert data["kube_apiserver"].startswith("v1.")
    placement = data["placements"][data["headline_placement"]]
    for config in ("none", "noop", "webhook", "cel", "noop-2", "webhook-2"):
        for clients in ("1", "20"):
            r = placement["results"][config][clients]
            assert r["errors"] == 0, (config, clients, r["runs"][0].get("error_samples"))
            assert 0 < r["p50_ms"] <= r["p99_ms"], (config, clients)
            calls = r["runs"][0]["admission"]
            pod_calls = {k: v["calls"] for k, v in calls.items() if k.startswith("pods.")}
            ok = r["runs"][0]["ok"]
            if config == "webhook":  # every create took exactly one call: pods.admit
                assert pod_calls == {"pods.admit.gpu-admission.io": ok}, pod_calls
            elif config == "webhook-2":  # ... and two with the validate-pods overlay
                assert pod_calls == {"pods.admit.gpu-admission.io": ok, "pods.validate.gpu-admission.io": ok}
            elif config.startswith("noop"):  # the reference webhook got the same calls, ours none
                assert calls["pods.admit.noop-bench.example.com"]["calls"] == ok
                assert ("pods.validate.noop-bench.example.com" in calls) == (config == "noop-2"), calls
                assert not any("gpu-admission.io" in k for k in calls), (config, calls)
            else:
                assert not any("gpu-admission.io" in k or "noop" in k for k in calls), (config, calls)
    for config in ("noop", "webhook", "cel", "noop-2", "webhook-2"):
        assert set(placement["vs_baseline"][config]) == {"1", "20"}
    assert isinstance(data["targets"]["p50_delta"]["met"], bool)
    assert data["reload"]["toggles"] == 3 and len(data["reload"]["runs_s"]) == 3


@pytest.mark.e2e
def test_peers_quick(out_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The peers part: each built peer measured beside ours (its own webhooks called, nobody else's); a peer
    that is not built is left out with the reason printed (scripts/peers/build.sh), never silently."""
    from tests.bench import peers

    built, missing = peers.available()
    assert run.main(["peers", "--quick"]) == 0
    data = _load(out_dir, "peers")
    assert set(data["left_out"]) == set(missing)
    out = capsys.readouterr().out
    for why in missing.values():
        assert f"left out: {why}" in out
    results = data["placements"]["shared"]["results"]
    assert set(results) == {"none", "noop", "webhook", "native", *built}
    for config, by_load in results.items():
        for clients, r in by_load.items():
            assert r["errors"] == 0, (config, clients)
            calls = r["runs"][0]["admission"]
            for peer in built:
                marker = "gatekeeper.sh" if peer == "gatekeeper" else "kyverno"
                assert any(marker in k for k in calls) == (config == peer), (config, calls)
            if config in built:
                assert not any("gpu-admission.io" in k for k in calls), calls
                assert r["hook_rss_mib"] > 0 and r["runs"][0]["hook"]["reviews"] >= r["runs"][0]["ok"]
    bursts = data["burst_summary"]
    assert set(bursts) == set(results)
    for config, b in bursts.items():
        assert b["all_created"] and b["pods"] == b["jobs"] * peers.QUICK_BURST[1], (config, b)


@pytest.mark.e2e
def test_apiprofile_quick(out_dir: Path) -> None:
    assert run.main(["apiprofile", "--quick"]) == 0
    data = _load(out_dir, "apiprofile")
    from tests.bench import apiprofile

    calls = "  the calls (encode, HTTP/TLS, decode, patch)"
    for config, r in data["configs"].items():
        assert "error" not in r, (config, r)
        assert _finite_positive(r["pods_per_s"]) and _finite_positive(r["cpu_ms_per_pod"]), (config, r)
        assert Path(r["profile"]).is_file() and Path(r["profile"]).parent == out_dir
        assert set(r["paths_ms_per_pod"]) == {label for label, _ in apiprofile.PATHS}
        if config in ("none", "cel"):  # no webhook registered: the API server made no webhook call
            assert r["paths_ms_per_pod"][calls] == 0, (config, r["paths_ms_per_pod"])
    assert set(data["configs"]) == {"none", "noop", "webhook", "cel", "noop-2", "webhook-2", "native"}


def test_scale_quick(out_dir: Path) -> None:
    assert run.main(["scale", "--quick"]) == 0
    data = _load(out_dir, "scale")
    rows = data["engine"]["rows"]
    assert [r["nodes"] for r in rows] == [16, 1000] and rows[1]["gpu_nodes"] == 952
    for r in rows:
        t = r["training-pod-8gpu"]
        assert _finite_positive(t["median_us"]) and t["p99_us"] >= t["median_us"]
    for kind in ("heartbeat", "label change", "add or remove"):
        assert _finite_positive(data["events"][kind]["apply_median_ms"])
    assert data["list"]["gpu_nodes"] == 952 and data["list"]["clipped"] == {}
    srv = data["server"]
    assert srv["gpu_nodes"] == 952 and _finite_positive(srv["rss_after_mib"])
    for what in ("quiet", "storm", "reference_6_nodes"):
        run_ = srv[what]
        brief = {**run_, "latency_ms": {"max": run_["max_ms"]}}
        _answered_right(what, brief, open_loop=True)  # 500 reviews/s on a fixed schedule
        assert _finite_positive(run_["p99_ms"])
    assert srv["storm_node_counters"]["received"] > 0 and srv["storm_node_counters"]["batches"] > 0
    assert {t["what"] for t in data["targets"]} and all(isinstance(t["met"], bool) for t in data["targets"])


def test_placement_cost_quick(out_dir: Path) -> None:
    assert run.main(["placement-cost", "--quick"]) == 0
    data = _load(out_dir, "placement-cost")
    assert (data["nodes"], data["pods"]) == (1000, 10000)
    room, full = data["some_racks_hold_it"], data["no_rack_holds_it"]
    assert room["decision"]["pinned"] and full["decision"]["pinned"] is None  # best fit / the prefer fallback
    assert full["keep_off_mutations"] == ["reserved-keep-off"]  # no rack free: the pod is kept off the reserved
    assert full["gpu_pods_in_view"] > room["gpu_pods_in_view"] > 0
    for sc in (room, full):
        assert sc["bind_check"] in ("harms-reservation", "harmless")  # judged: a view, a reservation, a GPU pod
        names = ("change_and_snapshot", "job_4x8_fresh_snapshot", "job_4x8_memoized", "pod_keep_off_memoized")
        for name in (*names, "bind_check_fresh_snapshot", "bind_check_memoized"):
            assert _finite_positive(sc[name]["median_us"]) and sc[name]["p99_us"] >= sc[name]["median_us"]
