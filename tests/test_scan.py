"""`gpu-admission scan` below the control plane: what counts as unreadable or owned, the findings of one
object, the rate limiter's spacing, the Report built from results, and one-line errors of the CLI.
tests/e2e/test_scan_e2e.py runs the whole scan against the real API server."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from cluster.lister import RateLimiter
from policies import exceptions as ex
from policies import inventory as inventory_mod
from policies import scan
from policies.document import default_policy
from policies.engine import ReviewContext
from webhook import reports
from webhook.manifests import load_objects

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def judge() -> Any:
    policy = default_policy()
    inv = inventory_mod.build(load_objects([str(ROOT / "examples/cluster/nodes.yaml")]), policy)

    def run(obj: dict[str, Any], **ctx: Any) -> scan.ObjectResult:
        return scan.judge(obj, policy=policy, inventory=inv, ctx=ReviewContext(**ctx))

    return run


def objects(path: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"] + "/" + o["kind"]: o for o in load_objects([str(ROOT / path)])}


def test_a_violating_workload_fails_with_the_rules_message(judge: Any) -> None:
    obj = objects("examples/denied/online-inference-timesliced.yaml")["whisper-realtime/Deployment"]
    r = judge(obj)
    assert r.verdict == "fail" and (r.kind, r.namespace, r.name) == ("Deployment", "speech", "whisper-realtime")
    (f,) = r.findings
    assert (f.rule, f.result) == ("online-no-timeslice", "fail")
    assert f.message.startswith("online-no-timeslice: online inference asks nvidia.com/gpu on time-sliced")


def test_objects_are_judged_as_stored_without_mutation(judge: Any) -> None:
    """A multi-pod training job stored without a same-rack constraint runs unpinned: training-same-rack."""
    job = objects("examples/training/indexed-job.yaml")
    (obj,) = [o for k, o in job.items() if k.endswith("/Job")]
    assert "training-same-rack" in {f.rule for f in judge(obj).findings if f.result == "fail"}


def test_an_exception_turns_a_failure_into_a_skip_naming_it(judge: Any) -> None:
    obj = objects("examples/denied/online-inference-timesliced.yaml")["whisper-realtime/Deployment"]
    e = ex.parse(
        {
            "metadata": {"name": "asr-trial", "namespace": "speech"},
            "spec": {"rules": ["online-no-timeslice"], "workloads": {"names": ["whisper-realtime"]},
                     "reason": "r", "requester": "a", "approver": "b", "until": "2099-01-01T00:00:00Z"},
        }
    )  # fmt: skip
    r = judge(obj, exceptions=(e,), now=0.0, namespace="speech")
    assert r.verdict == "skip" and r.findings[0].exception == "speech/asr-trial"


@pytest.mark.parametrize(
    ("obj", "reason"),
    [
        ("garbage", "not an object"),
        ({"kind": "Pod"}, "no metadata.name"),
        ({"metadata": {"name": ""}}, "no metadata.name"),
        ({"metadata": {"name": "x", "namespace": "ml"}, "spec": {"a": [[[[]]]] * 1} | {"deep": None}}, None),
    ],
)
def test_unreadable_objects_are_named(obj: Any, reason: str | None) -> None:
    got = scan.unreadable(obj, "Pod", "item 3")
    assert (got.reason if got else None) == reason
    if got is not None:
        assert got.describe().startswith("Pod ")


def test_too_deep_is_unreadable() -> None:
    value: Any = {}
    for _ in range(150):
        value = {"x": value}
    got = scan.unreadable({"metadata": {"name": "deep", "namespace": "ml"}, "spec": value}, "PyTorchJob", "item 0")
    assert got is not None and got.describe() == "PyTorchJob ml/deep: nested deeper than 100 levels"


def test_owned_objects_are_judged_through_their_controller() -> None:
    pod = {"metadata": {"ownerReferences": [{"kind": "ReplicaSet", "name": "web-1", "controller": True}]}}
    assert scan.owned_by_scanned(pod, {"ReplicaSet", "Deployment"})
    assert not scan.owned_by_scanned(pod, {"Deployment"})  # the owner is not scanned: judge the pod
    not_controller = {"metadata": {"ownerReferences": [{"kind": "ReplicaSet", "name": "web-1"}]}}
    assert not scan.owned_by_scanned(not_controller, {"ReplicaSet"})
    assert not scan.owned_by_scanned({"metadata": {"ownerReferences": "junk"}}, {"ReplicaSet"})


def test_the_rate_limiter_spaces_requests() -> None:
    t = [0.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        t[0] += s

    limiter = RateLimiter(4.0, clock=lambda: t[0], sleep=sleep)
    for _ in range(5):
        limiter.acquire()
    assert slept == [0.25, 0.25, 0.25, 0.25] and t[0] == 1.0 and limiter.acquired == 5
    t[0] += 10.0  # idle time is not saved up: no burst afterwards
    limiter.acquire()
    limiter.acquire()
    assert slept[-1] == 0.25
    with pytest.raises(ValueError):
        RateLimiter(0)


def test_a_report_lists_what_needs_attention_and_counts_the_rest(judge: Any) -> None:
    denied = objects("examples/denied/online-inference-timesliced.yaml")["whisper-realtime/Deployment"]
    fine = objects("examples/inference/deployment-hpa.yaml")["llama3-8b-instruct/Deployment"]
    results = [judge(denied), judge(fine)]
    report = reports.build("speech", results, "sha256:x", 1_700_000_000.5)
    assert report["apiVersion"] == "openreports.io/v1alpha1" and report["kind"] == "Report"
    assert report["summary"] == {"pass": 1, "fail": 1, "warn": 0, "error": 0, "skip": 0}
    (entry,) = report["results"]
    assert entry["rule"] == "online-no-timeslice" and entry["result"] == "fail" and entry["policy"] == "gpu-admission"
    assert entry["timestamp"] == {"seconds": 1_700_000_000, "nanos": 500_000_000}
    assert entry["resources"] == [{"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "speech",
                                   "name": "whisper-realtime"}]  # fmt: skip


def test_a_report_holds_at_most_max_results(judge: Any) -> None:
    denied = judge(objects("examples/denied/online-inference-timesliced.yaml")["whisper-realtime/Deployment"])
    report = reports.build("speech", [denied] * (reports.MAX_RESULTS + 5), "h", 0.0)
    assert len(report["results"]) == reports.MAX_RESULTS
    assert report["summary"]["fail"] == reports.MAX_RESULTS + 5
    assert report["configuration"]["limits"]["maxResults"] == reports.MAX_RESULTS


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--kubeconfig", "/nonexistent/kubeconfig"], "/nonexistent/kubeconfig"),
        (["--page-size", "0"], "must be 1-10000"),
        (["--qps", "fast"], "not a number"),
        (["--policy-configmap", "nonamespace"], "--policy-configmap must be NAMESPACE/NAME"),
    ],
)
def test_scan_usage_errors_are_one_line(args: list[str], message: str) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "webhook", "scan", *args], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr
    assert r.stdout == ""


def test_the_scan_overlay_turns_the_scan_on_and_only_reads() -> None:
    out = subprocess.run(
        ["kubectl", "kustomize", str(ROOT / "deploy/overlays/scan")], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[-2:] == ["--scan-interval", "3600"]
    from webhook.cli import build_parser

    parsed = build_parser().parse_args(args)
    assert parsed.scan_interval == 3600.0
    (role,) = [d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "gpu-admission-scan"]
    granted = set()
    for rule in role["rules"]:
        assert set(rule["verbs"]) <= {"get", "list"}, rule
        granted |= {(g, r) for g in rule["apiGroups"] for r in rule["resources"]}
    # Every kind the scan lists is readable by the server: the base's grants plus this role.
    base_rules = next(d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "gpu-admission")
    for rule in base_rules["rules"]:
        granted |= {(g, r) for g in rule["apiGroups"] for r in rule["resources"]}
    from webhook.scan import KINDS

    for prefix, plural, _kind in KINDS:
        group = "" if prefix == "/api/v1" else prefix.removeprefix("/apis/").rsplit("/", 1)[0]
        assert (group, plural) in granted, (group, plural)


def test_every_outcome_maps_to_its_report_result() -> None:
    from policies.engine import Review, RuleResult

    r = Review(
        kind="Deployment",
        workload="inference",
        allowed=False,
        denials=(),
        warnings=(),
        mutations=(),
        patch=(),
        object={},
        results=(
            RuleResult("a", "enforce", "deny", "a: bad\n  thing"),
            RuleResult("b", "warn", "warn", "b: meh"),
            RuleResult("c", "enforce", "excepted", "c: ok (excepted by ns/e until x)"),
            RuleResult("d", "enforce", "error", "d: internal error"),
            RuleResult("e", "enforce", "pass"),
            RuleResult("f", "audit", "audit", "f: noted"),
            RuleResult("g", "off", "skip"),
        ),
        policy_hash="h",
        excepted=(("c", "ns/e"),),
    )
    obj = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "w", "namespace": "ns", "uid": "u-1"}}
    got = scan.result_of(obj, r)
    assert (got.api_version, got.kind, got.namespace, got.name, got.uid, got.workload) == (
        "apps/v1", "Deployment", "ns", "w", "u-1", "inference",
    )  # fmt: skip
    assert got.findings == (
        scan.Finding("a", "fail", "a: bad thing"),
        scan.Finding("b", "warn", "b: meh"),
        scan.Finding("c", "skip", "c: ok (excepted by ns/e until x)", "ns/e"),
        scan.Finding("d", "error", "d: internal error"),
    )
    assert [f.result for f in got.findings] == ["fail", "warn", "skip", "error"]
    assert got.findings[2].exception == "ns/e" and got.findings[0].exception == ""
    assert got.verdict == "fail"
    bare = scan.result_of({"metadata": {"name": "p"}}, r)
    assert (bare.api_version, bare.kind, bare.namespace, bare.uid) == ("", "", "", "")


@pytest.mark.parametrize(
    ("results", "verdict"),
    [((), "pass"), (("warn", "skip"), "warn"), (("skip",), "skip"), (("error", "warn"), "error"),
     (("warn", "error", "fail"), "fail")],
)  # fmt: skip
def test_the_worst_finding_is_the_verdict(results: tuple[str, ...], verdict: str) -> None:
    found = tuple(scan.Finding("r", x, "m") for x in results)
    assert scan.ObjectResult("v1", "Pod", "ns", "p", "", None, found).verdict == verdict


def test_unreadable_names_and_places() -> None:
    got = scan.unreadable([1], "Pod", "item 7")
    assert got == scan.Unreadable("Pod", "", "item 7", "not an object")
    assert got.describe() == "Pod item 7: not an object"
    no_name = scan.unreadable({"metadata": {"namespace": "ml"}}, "Job", "item 2")
    assert no_name == scan.Unreadable("Job", "", "item 2", "no metadata.name")
    assert scan.unreadable({"metadata": {"name": 5}}, "Job", "item 2") == scan.Unreadable(
        "Job", "", "item 2", "no metadata.name"
    )
    value: Any = {}
    for _ in range(101):
        value = {"x": value}
    deep = scan.unreadable({"metadata": {"name": "d", "namespace": 3}, "spec": value}, "Job", "item 0")
    assert deep == scan.Unreadable("Job", "", "d", "nested deeper than 100 levels")
    assert deep.describe() == "Job d: nested deeper than 100 levels"
    assert scan.unreadable({"metadata": {"name": "ok"}, "spec": {"a": 1}}, "Job", "item 0") is None


def test_only_handled_kinds_are_judged() -> None:
    assert scan.judged({"kind": "Deployment", "apiVersion": "apps/v1"})
    assert scan.judged({"kind": "HorizontalPodAutoscaler", "apiVersion": "autoscaling/v2"})
    assert not scan.judged({"kind": "Service", "apiVersion": "v1"})


def test_owner_must_be_the_controller_of_a_scanned_kind() -> None:
    owners = [{"kind": "Deployment", "controller": False}, {"kind": "ReplicaSet", "controller": True}]
    assert scan.owned_by_scanned({"metadata": {"ownerReferences": owners}}, ["ReplicaSet"])
    assert not scan.owned_by_scanned({"metadata": {"ownerReferences": owners}}, ["Deployment"])
    assert not scan.owned_by_scanned({"metadata": {"ownerReferences": ["junk"]}}, ["ReplicaSet"])
    assert not scan.owned_by_scanned({"metadata": None}, ["ReplicaSet"])
