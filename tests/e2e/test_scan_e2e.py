"""`gpu-admission scan` on the real control plane (issue #17, item 2).

Workloads are created WITHOUT the webhook (as on a cluster where it was installed later, or before a policy
change), with the real controllers running: Deployments get ReplicaSets and pods, Jobs get pods. The scan
must list exactly the violating workloads, judge each once (not its ReplicaSets and pods), apply exceptions,
skip and name what it cannot parse, stay within its page size and rate limit, and write OpenReports Reports
that the API server accepts under the Report CRD's schema (tests/e2e/openreports.py, fieldValidation=Strict).
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e import crds, openreports
from tests.e2e.cluster import ControlPlane
from tests.e2e.webhook import Webhook, render

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
Obj = dict[str, Any]
VIOLATING = {
    ("PyTorchJob", "mistral-7b-dpo"): {"training-elastic-shrink"},
    ("ScaledObject", "sdxl-turbo"): {"inference-warm-pool"},
    ("Deployment", "whisper-realtime"): {"online-no-timeslice"},
    ("Pod", "llama3-70b-eval"): {"gpu-request-fits"},
    ("Job", "video-thumbnails"): {"shared-gpu-single"},
    ("Deployment", "reranker"): {"gpu-admission-annotations"},
    # The 2026 kinds, from their golden cases; the TrainJob's GPUs are only in its runtime (resolved by the scan).
    ("TrainJob", "sft-from-runtime"): {"training-same-rack"},
    ("RayService", "llm-serve"): {"inference-warm-pool"},
    ("InferenceService", "sentiment"): {"online-no-timeslice"},
    ("LLMInferenceService", "llama3-70b-pd"): {"inference-warm-pool"},
}
# Cases of tests/cases whose input is seeded as it is (each breaks the rule VIOLATING names for it).
KIND_CASES = (
    "kinds/rayservice-autoscaling-to-zero-denied",
    "kinds/inferenceservice-timesliced-denied",
    "kinds/llminferenceservice-prefill-scale-to-zero-denied",
)
COMPLIANT = {("Deployment", "sdxl-turbo"), ("Deployment", "llama3-8b-instruct"),
             ("HorizontalPodAutoscaler", "llama3-8b-instruct"), ("Job", "catalogue-embeddings-nightly")}  # fmt: skip


@pytest.fixture(scope="module")
def installed(control_plane: ControlPlane) -> None:
    crds.install(control_plane)
    openreports.install(control_plane)
    wanted = [d for d in render(control_plane) if d["kind"] == "CustomResourceDefinition"]
    control_plane.kubectl("apply", "-f", "-", input={"apiVersion": "v1", "kind": "List", "items": wanted})
    control_plane.kubectl(
        "wait", "--for=condition=Established", "crd/gpupolicyexceptions.gpu-admission.io", "--timeout=60s"
    )


def manifests(*paths: str) -> list[Obj]:
    out: list[Obj] = []
    for p in paths:
        path = ROOT / p
        for f in sorted(path.glob("*.yaml")) if path.is_dir() else [path]:
            out += [d for d in yaml.safe_load_all(f.read_text()) if d]
    return out


def nested(depth: int) -> Obj:
    value: Obj = {"leaf": True}
    for _ in range(depth):
        value = {"x": value}
    return value


def exception(ns: str) -> Obj:
    until = (datetime.now(UTC) + timedelta(days=3)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "gpu-admission.io/v1alpha1",
        "kind": "GPUPolicyException",
        "metadata": {"name": "dpo-trial", "namespace": ns},
        "spec": {
            "rules": ["training-elastic-shrink", "training-same-rack"],
            "workloads": {"names": ["dpo-excepted"]},
            "reason": "elastic DPO trial",
            "requester": "alice",
            "approver": "bob",
            "until": until,
        },
    }


RUNTIME = "gpu-admission-e2e-torch-8gpu"


def runtime() -> Obj:
    """A ClusterTrainingRuntime whose node job asks 8 GPUs on each of 2 nodes."""
    node = {"name": "node", "image": "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime",
            "resources": {"limits": {"nvidia.com/gpu": 8}}}  # fmt: skip
    step = {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}  # marks the trainer's job, as real runtimes do
    job = {"name": "node", "template": {"metadata": {"labels": step},
                                        "spec": {"template": {"spec": {"containers": [node]}}}}}  # fmt: skip
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": RUNTIME},
        "spec": {"mlPolicy": {"numNodes": 2, "torch": {}}, "template": {"spec": {"replicatedJobs": [job]}}},
    }


def train_job(ns: str) -> Obj:
    """A TrainJob naming no GPU itself: only the runtime the scan resolves makes it a 16-GPU job."""
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "sft-from-runtime", "namespace": ns},
        "spec": {"runtimeRef": {"name": RUNTIME}},
    }


@pytest.fixture(scope="module")
def seeded(control_plane: ControlPlane, installed: None) -> Iterator[str]:
    """A namespace holding the denied examples, compliant ones, an excepted job and an unparsable one."""
    ns = f"scan-e2e-{uuid.uuid4().hex[:6]}"
    cp = control_plane
    cp.kubectl("create", "namespace", ns)
    classes = [{"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": n}, "value": v}
               for n, v in (("batch-low", 100), ("training-normal", 1000))]  # the examples' classes  # fmt: skip
    cp.kubectl("apply", "-f", "-", input={"apiVersion": "v1", "kind": "List", "items": classes})
    docs = manifests("examples/denied", "examples/inference/deployment-hpa.yaml", "examples/batch")
    (elastic,) = [d for d in docs if d["kind"] == "PyTorchJob"]
    excepted = copy.deepcopy(elastic)
    excepted["metadata"]["name"] = "dpo-excepted"
    deep = copy.deepcopy(elastic)
    deep["metadata"]["name"] = "deep-nesting"
    deep["spec"]["runPolicy"] = nested(150)  # past the parse limit (100 levels); the API server stores it
    docs += [yaml.safe_load((ROOT / "tests/cases" / f"{case}.yaml").read_text())["input"] for case in KIND_CASES]
    docs.append(train_job(ns))
    for d in [*docs, excepted, deep]:
        d["metadata"]["namespace"] = ns
    cp.kubectl("apply", "-f", "-", input=runtime())
    cp.kubectl("apply", "-f", "-", input={"apiVersion": "v1", "kind": "List", "items": [*docs, excepted, deep]})
    cp.kubectl("apply", "-f", "-", input=exception(ns))
    try:
        yield ns
    finally:
        cp.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        cp.kubectl("delete", "clustertrainingruntime", RUNTIME, "--ignore-not-found", check=False)
        cp.kubectl("delete", "pods", "--all", "-n", ns, "--grace-period=0", "--force", check=False)


def scan(cp: ControlPlane, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "webhook", "scan", "--kubeconfig", str(cp.kubeconfig), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )


def findings(doc: dict[str, Any], ns: str) -> dict[tuple[str, str], dict[str, str]]:
    """(kind, name) -> {rule: result} for the objects of `ns` in a `scan -o json` document."""
    return {
        (r["kind"], r["name"]): {f["rule"]: f["result"] for f in r["findings"]}
        for r in doc["results"]
        if r["namespace"] == ns
    }


def test_scan_lists_exactly_the_violating_workloads(control_plane: ControlPlane, seeded: str) -> None:
    r = scan(control_plane, "-o", "json")
    assert r.returncode == 1, r.stderr  # something fails
    doc = json.loads(r.stdout)
    got = findings(doc, seeded)
    failing = {k for k, rules in got.items() if "fail" in rules.values()}
    assert failing == set(VIOLATING), {f"{k}/{n}": v for (k, n), v in got.items()}
    for key, rules in VIOLATING.items():
        assert rules <= {rule for rule, result in got[key].items() if result == "fail"}, (key, got[key])
    assert not (COMPLIANT & set(got)), "compliant objects have no findings"
    # Served at v1alpha1 and v1alpha2 (crds.py), listed at both, judged once; a kind served at some version
    # is not "not served".
    mine = [(x["kind"], x["name"]) for x in doc["results"] if x["namespace"] == seeded]
    assert mine.count(("LLMInferenceService", "llama3-70b-pd")) == 1, mine
    assert "LLMInferenceService" not in doc["summary"].get("notServed", []), doc["summary"]
    # Judged once, through the workload: no ReplicaSet or controller-created pod of ours is listed.
    assert not any(kind in ("ReplicaSet",) or (kind == "Pod" and name != "llama3-70b-eval") for kind, name in got)
    assert doc["summary"]["owned"] >= 4  # whisper/reranker/sdxl/llama ReplicaSets at least
    # The exception turned the excepted job's two rules into skips naming it; its warning stays.
    assert got[("PyTorchJob", "dpo-excepted")] == {
        "training-elastic-shrink": "skip",
        "training-same-rack": "skip",
        "training-topology-scheduler": "warn",
    }
    skip = next(
        f for x in doc["results"] if x["name"] == "dpo-excepted" for f in x["findings"] if f["result"] == "skip"
    )
    assert skip["exception"] == f"{seeded}/dpo-trial"
    # The unparsable one is counted, named and skipped, on stderr too; nothing crashed.
    assert {"kind": "PyTorchJob", "namespace": seeded, "name": "deep-nesting",
            "reason": "nested deeper than 100 levels"} in doc["unreadable"]  # fmt: skip
    assert (
        f"gpu-admission: warning: skipped PyTorchJob {seeded}/deep-nesting: nested deeper than 100 levels" in r.stderr
    )
    assert "Traceback" not in r.stderr
    assert doc["summary"]["policy"] == "built-in (ConfigMap gpu-admission/gpu-admission-policy not found)" or doc[
        "summary"
    ]["policy"].startswith("configmap:")


def test_scan_table_names_each_violation(control_plane: ControlPlane, seeded: str) -> None:
    r = scan(control_plane, "-n", seeded)
    assert r.returncode == 1, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["RESULT", "KIND", "OBJECT", "RULE", "MESSAGE"]
    fails = {(ln.split()[1], ln.split()[2].split("/")[1], ln.split()[3]) for ln in lines[1:] if ln.startswith("FAIL ")}
    assert {(k, n, rule) for (k, n), rules in VIOLATING.items() for rule in rules} <= fails
    assert lines[-1].startswith("13 objects judged: ") or "objects judged" in lines[-1], lines[-1]
    assert "1 unreadable (skipped)" in lines[-1]


def test_scan_pages_and_keeps_to_its_rate_limit(control_plane: ControlPlane, seeded: str) -> None:
    one = json.loads(scan(control_plane, "-n", seeded, "-o", "json", "--page-size", "1", "--qps", "4").stdout)
    many = json.loads(scan(control_plane, "-n", seeded, "-o", "json", "--page-size", "500", "--qps", "50").stdout)
    listed = one["summary"]["objects"] + one["summary"]["owned"] + one["summary"]["unreadable"]
    assert one["summary"]["requests"] >= many["summary"]["requests"] + listed - 1  # a request per object
    # At most 4 requests per second: n requests take at least (n - 1) / 4 seconds.
    assert one["summary"]["seconds"] >= (one["summary"]["requests"] - 1) / 4 * 0.95, one["summary"]
    assert findings(one, seeded) == findings(many, seeded)


def test_scan_reports_pass_the_api_servers_schema(control_plane: ControlPlane, seeded: str) -> None:
    cp = control_plane
    r = scan(cp, "-n", seeded, "--report", "-o", "json")
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    assert doc["summary"]["reportsWritten"] == 1
    report = cp.get_json("reports.openreports.io", "gpu-admission", "-n", seeded)
    listed = {
        ((x["resources"][0]["kind"], x["resources"][0]["name"]), x["rule"], x["result"]) for x in report["results"]
    }
    expected = {(k, rule, res) for k, rules in findings(doc, seeded).items() for rule, res in rules.items()}
    assert listed == expected
    assert report["summary"]["fail"] == sum(1 for _, _, res in expected if res == "fail")
    assert report["summary"]["pass"] == doc["summary"]["pass"]
    assert all(x["resources"][0]["uid"] for x in report["results"])
    # Written again, the same report is replaced, not duplicated.
    assert scan(cp, "-n", seeded, "--report").returncode == 1
    assert len(cp.get_json("reports.openreports.io", "-n", seeded)["items"]) == 1
    # The schema is really enforced: a report with a result outside the enum is refused.
    bad = copy.deepcopy(report)
    bad["metadata"] = {"name": "bad", "namespace": seeded}
    bad["results"][0]["result"] = "failed"
    refused = cp.kubectl("create", "-f", "-", input=bad, check=False)
    assert refused.returncode != 0 and 'results[0].result: Unsupported value: "failed"' in refused.stderr


def scan_metrics(wh: Webhook) -> dict[tuple[str, str], float]:
    assert wh.server is not None
    with wh.server.client() as client:
        text = client.get("/metrics").raise_for_status().text
    out = {}
    for line in text.splitlines():
        if line.startswith("gpu_admission_scan_findings{"):
            labels, value = line.rsplit(" ", 1)
            rule = labels.split('rule="')[1].split('"')[0]
            result = labels.split('result="')[1].split('"')[0]
            out[(rule, result)] = float(value)
        if line.startswith('gpu_admission_scan_runs_total{outcome="finished"}'):
            out[("runs", "finished")] = float(line.rsplit(" ", 1)[1])
    return out


def test_the_server_scans_in_the_background_and_after_a_policy_change(control_plane: ControlPlane, seeded: str) -> None:
    """`serve --scan-interval`: a metric per rule from what runs, refreshed when the policy changes."""
    cp = control_plane
    wh = Webhook(cp, "--scan-interval", "600", "--scan-qps", "50")
    cm = cp.get_json("configmap", "gpu-admission-policy", "-n", "gpu-admission")
    original = cm["data"]["policy.yaml"]
    try:
        first = wait_until_metrics(wh, lambda m: m.get(("runs", "finished"), 0) >= 1)
        for rules in VIOLATING.values():
            for rule in rules:
                assert first.get((rule, "fail"), 0) >= 1, (rule, first)
        assert first.get(("training-elastic-shrink", "skip"), 0) >= 1  # the excepted job
        edited = yaml.safe_load(original)
        edited["rules"]["online-no-timeslice"] = "off"
        cm["data"]["policy.yaml"] = yaml.safe_dump(edited, sort_keys=False)
        cp.kubectl("apply", "-f", "-", input=cm)
        # Long before the next interval (600 s): the policy change triggered a scan.
        second = wait_until_metrics(wh, lambda m: m.get(("runs", "finished"), 0) >= 2)
        assert second.get(("online-no-timeslice", "fail"), 0) == 0, second
        assert second.get(("shared-gpu-single", "fail"), 0) >= 1
    finally:
        restored = cp.get_json("configmap", "gpu-admission-policy", "-n", "gpu-admission")
        restored["data"]["policy.yaml"] = original
        cp.kubectl("apply", "-f", "-", input=restored)
        wh.close()


def wait_until_metrics(wh: Webhook, ready: Any, timeout: float = 120.0) -> dict[tuple[str, str], float]:
    deadline = time.monotonic() + timeout
    while True:
        m = scan_metrics(wh)
        if ready(m):
            return m
        assert time.monotonic() < deadline, f"scan metrics never got there: {m}"
        time.sleep(1.0)
