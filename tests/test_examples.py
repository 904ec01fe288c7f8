"""The manifests under examples/ are checked as a user would check them, against the example cluster:
everything under examples/training, inference and batch is allowed; everything under examples/denied is denied,
by the rules its comment names. The expectations double as documentation of what each example shows.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
NODES = EXAMPLES / "cluster" / "nodes.yaml"
ALLOWED_DIRS = ("training", "inference", "batch")


@dataclass(frozen=True)
class Expect:
    """What `check` must say about one object of an example, keyed "Kind/name"."""

    mutations: frozenset[str] = frozenset()
    warnings: frozenset[str] = frozenset()  # rule ids
    denials: frozenset[str] = frozenset()
    workload: str | None = None


def expect(
    workload: str | None = None,
    mutations: tuple[str, ...] = (),
    warnings: tuple[str, ...] = (),
    denials: tuple[str, ...] = (),
) -> Expect:
    return Expect(frozenset(mutations), frozenset(warnings), frozenset(denials), workload)


NOT_HANDLED = expect()  # e.g. a Service: allowed, untouched

ALLOWED: dict[str, dict[str, Expect]] = {
    "training/pytorchjob-2x8.yaml": {
        "PyTorchJob/llama3-8b-sft": expect(
            "training", ("training-pool", "training-rack"), warnings=("training-topology-scheduler",)
        ),
    },
    "training/indexed-job.yaml": {
        "Service/ddp-resnet50": NOT_HANDLED,
        "Job/ddp-resnet50": expect("training", ("training-pool", "training-rack", "training-node-pack", "job-size")),
    },
    "training/jobset.yaml": {
        # Kueue podset-required-topology at rack level: no second same-rack constraint is layered on top.
        "JobSet/gemma2-9b-pretrain": expect("training", ("training-pool",)),
    },
    "training/trainjob.yaml": {
        "ClusterTrainingRuntime/torch-distributed": NOT_HANDLED,  # read for the TrainJob's pods
        "TrainJob/llama3-8b-ft": expect(
            "training", ("training-pool", "training-rack"), warnings=("training-topology-scheduler",)
        ),
    },
    "inference/llminferenceservice-multi-node.yaml": {
        "LLMInferenceService/deepseek-r1": expect(
            "inference", ("inference-spread", "online-exclusive", "inference-group")
        ),
    },
    "inference/deployment-hpa.yaml": {
        "Deployment/llama3-8b-instruct": expect("inference", ("inference-spread", "online-exclusive")),
        "Service/llama3-8b-instruct": NOT_HANDLED,
        "HorizontalPodAutoscaler/llama3-8b-instruct": NOT_HANDLED,
    },
    "inference/mig-slice-pod.yaml": {
        "Pod/phi3-mini-demo": expect("inference", ("gpu-slice",)),
    },
    "batch/timesliced-job.yaml": {
        "Job/catalogue-embeddings-nightly": expect("batch", ("job-size",)),
    },
}

DENIED: dict[str, dict[str, Expect]] = {
    "denied/elastic-pytorchjob.yaml": {
        "PyTorchJob/mistral-7b-dpo": expect(
            "training",
            ("training-pool", "training-rack"),
            warnings=("training-topology-scheduler",),
            denials=("training-elastic-shrink",),
        ),
    },
    "denied/online-inference-timesliced.yaml": {
        # online-exclusive steps back: the pod is pinned to shared nodes, and the denial explains.
        "Deployment/whisper-realtime": expect("inference", ("inference-spread",), denials=("online-no-timeslice",)),
    },
    "denied/two-shared-units.yaml": {
        "Job/video-thumbnails": expect("batch", denials=("shared-gpu-single",)),
    },
    "denied/hpa-scale-to-zero.yaml": {
        "Deployment/sdxl-turbo": expect("inference", ("inference-spread", "online-exclusive")),
        "ScaledObject/sdxl-turbo": expect(denials=("inference-warm-pool",)),
    },
    "denied/typo-annotation.yaml": {
        "Deployment/reranker": expect(
            "inference", ("inference-spread", "online-exclusive"), denials=("gpu-admission-annotations",)
        ),
    },
    "denied/sixteen-gpu-pod.yaml": {
        "Pod/llama3-70b-eval": expect(denials=("gpu-request-fits",)),
    },
}


def example_files(*dirs: str) -> list[str]:
    return sorted(p.relative_to(EXAMPLES).as_posix() for d in dirs for p in (EXAMPLES / d).rglob("*.yaml"))


def check(relpath: str) -> tuple[int, list[dict[str, Any]], str]:
    result = subprocess.run(
        [sys.executable, "-m", "webhook", "check", "-f", str(EXAMPLES / relpath), "--nodes", str(NODES), "-o", "json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,  # a liveness bound only: one call took ~50 s on a starved machine (#20)
        check=False,
    )
    assert "Traceback" not in result.stderr, result.stderr
    return result.returncode, json.loads(result.stdout), result.stderr


def rule_of(warning: str) -> str:
    return warning.split(": ", 1)[0]


def assert_matches(relpath: str, out: list[dict[str, Any]], wanted: dict[str, Expect]) -> None:
    got = {f"{e['kind']}/{e['name']}": e for e in out}
    assert list(got) == list(wanted), f"{relpath}: objects {list(got)}"
    originals = [d for d in yaml.safe_load_all((EXAMPLES / relpath).read_text(encoding="utf-8")) if d]
    for original, (key, exp) in zip(originals, wanted.items(), strict=True):
        e = got[key]
        assert e["workload"] == exp.workload, f"{relpath} {key}: workload {e['workload']}"
        assert {d["rule"] for d in e["denials"]} == exp.denials, f"{relpath} {key}: {e['denials']}"
        assert e["allowed"] is (not exp.denials), f"{relpath} {key}"
        rule_warnings = {rule_of(w) for w in e["warnings"] if not w.startswith("kind ")}
        assert rule_warnings == exp.warnings, f"{relpath} {key}: {e['warnings']}"
        assert set(e["mutations"]) == exp.mutations, f"{relpath} {key}: {e['mutations']}"
        assert jsonpatch.apply_patch(copy.deepcopy(original), e["patch"]) == e["object"]


def test_every_example_has_expectations() -> None:
    assert example_files(*ALLOWED_DIRS) == sorted(ALLOWED)
    assert example_files("denied") == sorted(DENIED)


@pytest.mark.parametrize("relpath", sorted(ALLOWED))
def test_allowed_example(relpath: str) -> None:
    rc, out, stderr = check(relpath)
    assert rc == 0, f"{relpath} was denied: {[e['denials'] for e in out if not e['allowed']]}"
    assert stderr == ""
    assert all(e["allowed"] for e in out)
    assert_matches(relpath, out, ALLOWED[relpath])


@pytest.mark.parametrize("relpath", sorted(DENIED))
def test_denied_example(relpath: str) -> None:
    rc, out, stderr = check(relpath)
    assert rc == 1, f"{relpath} was allowed"
    assert stderr == ""
    assert any(not e["allowed"] for e in out)
    assert_matches(relpath, out, DENIED[relpath])


@pytest.mark.parametrize("relpath", sorted(DENIED))
def test_denied_example_comment_names_its_rule(relpath: str) -> None:
    """Each denied example starts with a comment saying which rule denies it and why."""
    head = (EXAMPLES / relpath).read_text(encoding="utf-8").splitlines()[0]
    rules = {r for exp in DENIED[relpath].values() for r in exp.denials}
    assert head.startswith("# DENIED by ") and any(r in head for r in rules), head


def test_allowed_examples_pass_together() -> None:
    """All allowed examples in one `check` run, as CI would lint a repository of manifests."""
    args = [arg for d in ALLOWED_DIRS for arg in ("-f", str(EXAMPLES / d))]
    result = subprocess.run(
        [sys.executable, "-m", "webhook", "check", *args, "--nodes", str(NODES)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,  # a liveness bound only: one call took ~50 s on a starved machine (#20)
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    total = sum(len(v) for v in ALLOWED.values())
    assert result.stdout.splitlines()[-1] == f"{total} objects: {total} allowed, 0 denied"
