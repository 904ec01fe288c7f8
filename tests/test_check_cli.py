"""`gpu-admission check` and `gpu-admission policy`, run as a user would: `python -m webhook ...` in a subprocess.

Spec §8: `-o json` prints one JSON array (an element per input object, in input order); exit 0 when all are
allowed, 1 when any is denied, 2 on unreadable input or an invalid policy, with a one-line error on stderr and
never a traceback.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
NODES = str(ROOT / "examples" / "cluster" / "nodes.yaml")
DEFAULT_POLICY = ROOT / "policies" / "default-policy.yaml"
ELEMENT_KEYS = [
    "apiVersion",
    "kind",
    "namespace",
    "name",
    "workload",
    "allowed",
    "denials",
    "warnings",
    "mutations",
    "patch",
    "object",
]


def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "webhook", *args],
        cwd=ROOT,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=300,  # a liveness bound only: one call took ~50 s on a starved machine (#20)
        check=False,
    )


def check_json(*args: str, stdin: str | None = None, rc: int | None = None) -> list[dict[str, Any]]:
    result = cli("check", *args, "-o", "json", stdin=stdin)
    assert "Traceback" not in result.stderr, result.stderr
    if rc is not None:
        assert result.returncode == rc, result.stderr
    out: list[dict[str, Any]] = json.loads(result.stdout)
    return out


def assert_usage_error(result: subprocess.CompletedProcess[str], *needles: str) -> str:
    """Exit 2, nothing on stdout, exactly one line on stderr that names the problem, no traceback."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    line = lines[0]
    assert line.startswith("gpu-admission: error: "), line
    for needle in needles:
        assert needle in line, line
    return line


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def dump(*objects: Any) -> str:
    return yaml.safe_dump_all(list(objects), sort_keys=False)


def gpu_pod(name: str, gpus: int = 1, namespace: str = "ml", **labels: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if labels:
        meta["labels"] = dict(labels)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "main",
                    "image": "nvcr.io/nvidia/cuda:12.5.0-base-ubuntu22.04",
                    "resources": {"limits": {"nvidia.com/gpu": gpus}},
                }
            ],
        },
    }


def inference_deployment(name: str = "chat-api", namespace: str = "serving") -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "containers": [
                        {
                            "name": "vllm",
                            "image": "vllm/vllm-openai:v0.5.3",
                            "resources": {"limits": {"nvidia.com/gpu": 1}},
                        }
                    ]
                },
            },
        },
    }


def pytorchjob(name: str = "llama-sft", replicas: int = 2, gpus: int = 8) -> dict[str, Any]:
    container = {
        "name": "pytorch",
        "image": "nvcr.io/nvidia/pytorch:24.05-py3",
        "resources": {"limits": {"nvidia.com/gpu": gpus}},
    }
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": "ml", "labels": {"kueue.x-k8s.io/queue-name": "research"}},
        "spec": {
            "pytorchReplicaSpecs": {
                "Worker": {"replicas": replicas, "template": {"spec": {"containers": [container]}}},
            }
        },
    }


CONFIGMAP = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings"}, "data": {"a": "b"}}


# --- unreadable input: exit 2, one line, no traceback ------------------------------------------------------


def test_invalid_yaml_names_file_line_and_column(tmp_path: Path) -> None:
    bad = write(tmp_path, "broken.yaml", "apiVersion: v1\nkind: Pod\nmetadata:\n  name: [a, b\n  labels: {}\n")
    line = assert_usage_error(cli("check", "-f", str(bad)), "invalid YAML")
    assert re.search(re.escape(str(bad)) + r":\d+:\d+: invalid YAML", line), line


def test_invalid_yaml_in_a_later_document_names_its_line(tmp_path: Path) -> None:
    bad = write(tmp_path, "two.yaml", dump(CONFIGMAP) + "---\nkind: Pod\n  bad: indentation\n")
    line = assert_usage_error(cli("check", "-f", str(bad)))
    match = re.search(re.escape(str(bad)) + r":(\d+):(\d+): invalid YAML", line)
    assert match and int(match.group(1)) > 4, line


@pytest.mark.parametrize(
    "text",
    ["- apiVersion: v1\n  kind: Pod\n", "just a string\n", "42\n"],
    ids=["list", "string", "number"],
)
def test_document_that_is_not_an_object(tmp_path: Path, text: str) -> None:
    bad = write(tmp_path, "odd.yaml", text)
    assert_usage_error(cli("check", "-f", str(bad)), str(bad), "not a Kubernetes object")


def test_missing_kind(tmp_path: Path) -> None:
    bad = write(tmp_path, "nokind.yaml", "apiVersion: v1\nmetadata: {name: x}\n")
    assert_usage_error(cli("check", "-f", str(bad)), str(bad), "missing apiVersion or kind")


def test_missing_file() -> None:
    assert_usage_error(cli("check", "-f", "does/not/exist.yaml"), "does/not/exist.yaml", "no such file")


def test_file_that_is_not_utf8(tmp_path: Path) -> None:
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes(b"apiVersion: v1\nkind: Pod\nmetadata: {name: caf\xe9}\n")
    assert_usage_error(cli("check", "-f", str(bad)), str(bad), "not UTF-8")


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root reads any file")
def test_file_without_read_permission(tmp_path: Path) -> None:
    bad = write(tmp_path, "secret.yaml", dump(CONFIGMAP))
    bad.chmod(0)
    try:
        assert_usage_error(cli("check", "-f", str(bad)), str(bad))
    finally:
        bad.chmod(0o600)


def test_empty_directory(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    write(tmp_path, "empty/README.md", "no manifests here\n")
    assert_usage_error(cli("check", "-f", str(tmp_path / "empty")), "no .yaml")


def test_invalid_policy_names_the_field_path(tmp_path: Path) -> None:
    good = write(tmp_path, "pod.yaml", dump(gpu_pod("p")))
    policy = write(
        tmp_path,
        "policy.yaml",
        "apiVersion: gpu-admission.io/v1alpha1\nkind: Policy\nrules:\n  training-same-rack: deny\n",
    )
    assert_usage_error(
        cli("check", "-f", str(good), "--policy", str(policy)), str(policy), "rules.training-same-rack", "'deny'"
    )


def test_policy_that_is_not_yaml(tmp_path: Path) -> None:
    good = write(tmp_path, "pod.yaml", dump(gpu_pod("p")))
    policy = write(tmp_path, "policy.yaml", "rules: {a: [\n")
    assert_usage_error(cli("check", "-f", str(good), "--policy", str(policy)), str(policy), "invalid YAML", "line ")


def test_missing_policy_file(tmp_path: Path) -> None:
    good = write(tmp_path, "pod.yaml", dump(gpu_pod("p")))
    assert_usage_error(cli("check", "-f", str(good), "--policy", str(tmp_path / "nope.yaml")), "nope.yaml")


def test_nodes_file_with_other_kinds(tmp_path: Path) -> None:
    good = write(tmp_path, "pod.yaml", dump(gpu_pod("p")))
    other = write(tmp_path, "cm.yaml", dump(CONFIGMAP))
    assert_usage_error(
        cli("check", "-f", str(good), "--nodes", str(other)),
        "expected Node, ResourceSlice, DeviceClass (or Pod)",
        "'ConfigMap'",
    )
    assert_usage_error(cli("check", "-f", str(good), "--pods", str(other)), "expected Pod objects", "'ConfigMap'")


# --- the JSON output (spec §8) ---------------------------------------------------------------------------------


def test_json_is_one_array_in_input_order_with_the_spec_keys(tmp_path: Path) -> None:
    first = write(tmp_path, "a.yaml", dump(gpu_pod("first", 16), CONFIGMAP))
    second = write(tmp_path, "b.yaml", dump(inference_deployment(), pytorchjob()))
    result = cli("check", "-f", str(first), "-f", str(second), "--nodes", NODES, "-o", "json")
    assert result.returncode == 1, result.stderr
    out = json.loads(result.stdout)
    assert isinstance(out, list) and len(out) == 4
    assert [(e["kind"], e["name"]) for e in out] == [
        ("Pod", "first"),
        ("ConfigMap", "settings"),
        ("Deployment", "chat-api"),
        ("PyTorchJob", "llama-sft"),
    ]
    for e in out:
        assert list(e) == ELEMENT_KEYS
        assert isinstance(e["allowed"], bool)
        assert isinstance(e["warnings"], list) and all(isinstance(w, str) for w in e["warnings"])
        assert isinstance(e["mutations"], list) and all(isinstance(m, str) for m in e["mutations"])
        for d in e["denials"]:
            assert list(d) == ["rule", "message"] and d["message"].startswith(d["rule"] + ": ")
        for op in e["patch"]:
            assert op["op"] in ("add", "replace", "remove") and op["path"].startswith("/")
    pod, cm, deploy, job = out
    assert pod["allowed"] is False and [d["rule"] for d in pod["denials"]] == ["gpu-request-fits"]
    assert (pod["apiVersion"], pod["namespace"], pod["workload"]) == ("v1", "ml", None)
    assert cm["allowed"] is True and cm["patch"] == [] and cm["namespace"] is None
    assert deploy["workload"] == "inference" and set(deploy["mutations"]) == {"inference-spread", "online-exclusive"}
    assert job["workload"] == "training" and set(job["mutations"]) == {"training-pool", "training-rack"}
    assert job["allowed"] is True


def test_json_patch_applies_to_the_input_and_gives_the_object(tmp_path: Path) -> None:
    objects = [inference_deployment(), pytorchjob(), gpu_pod("slice", 1)]
    objects[2]["metadata"]["annotations"] = {"gpu-admission.io/gpu-memory": "10Gi"}
    path = write(tmp_path, "objs.yaml", dump(*objects))
    out = check_json("-f", str(path), "--nodes", NODES, rc=0)
    assert "gpu-slice" in out[2]["mutations"]
    for original, e in zip(objects, out, strict=True):
        assert e["patch"], e["kind"]
        patched = jsonpatch.apply_patch(copy.deepcopy(original), e["patch"])
        assert patched == e["object"]


def test_stdin(tmp_path: Path) -> None:
    out = check_json("-f", "-", "--nodes", NODES, stdin=dump(inference_deployment(), gpu_pod("big", 16)), rc=1)
    assert [e["name"] for e in out] == ["chat-api", "big"]
    assert [e["allowed"] for e in out] == [True, False]


def test_stdin_mixed_with_files(tmp_path: Path) -> None:
    path = write(tmp_path, "cm.yaml", dump(CONFIGMAP))
    out = check_json("-f", str(path), "-f", "-", stdin=dump(gpu_pod("p")), rc=0)
    assert [e["kind"] for e in out] == ["ConfigMap", "Pod"]


def test_multi_document_yaml_skips_empty_documents(tmp_path: Path) -> None:
    text = "---\n" + dump(CONFIGMAP) + "---\n---\n# only a comment\n---\n" + dump(gpu_pod("p"))
    path = write(tmp_path, "multi.yaml", text)
    out = check_json("-f", str(path), rc=0)
    assert [e["kind"] for e in out] == ["ConfigMap", "Pod"]


def test_kind_list_is_flattened(tmp_path: Path) -> None:
    lst = {"apiVersion": "v1", "kind": "List", "items": [gpu_pod("one"), gpu_pod("two", 16), CONFIGMAP]}
    path = write(tmp_path, "list.yaml", dump(lst))
    out = check_json("-f", str(path), "--nodes", NODES, rc=1)
    assert [e["name"] for e in out] == ["one", "two", "settings"]


def test_json_input_file(tmp_path: Path) -> None:
    path = write(tmp_path, "pod.json", json.dumps(gpu_pod("from-json")))
    out = check_json("-f", str(path), rc=0)
    assert [e["name"] for e in out] == ["from-json"]


def test_directory_is_read_recursively_in_name_order(tmp_path: Path) -> None:
    write(tmp_path, "manifests/b.yaml", dump(gpu_pod("b")))
    write(tmp_path, "manifests/a.yml", dump(gpu_pod("a")))
    write(tmp_path, "manifests/sub/c.json", json.dumps(gpu_pod("c")))
    write(tmp_path, "manifests/notes.txt", "not a manifest: [")
    out = check_json("-f", str(tmp_path / "manifests"), rc=0)
    assert [e["name"] for e in out] == ["a", "b", "c"]


# --- exit codes and options ------------------------------------------------------------------------------------


def test_exit_0_when_all_allowed(tmp_path: Path) -> None:
    path = write(tmp_path, "ok.yaml", dump(inference_deployment(), CONFIGMAP))
    result = cli("check", "-f", str(path), "--nodes", NODES)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines()[-1] == "2 objects: 2 allowed, 0 denied"


def test_exit_1_when_any_denied(tmp_path: Path) -> None:
    path = write(tmp_path, "mixed.yaml", dump(inference_deployment(), gpu_pod("big", 16)))
    result = cli("check", "-f", str(path), "--nodes", NODES)
    assert result.returncode == 1
    assert "DENY  Pod ml/big" in result.stdout
    assert "gpu-request-fits: one pod asks 16 nvidia.com/gpu" in result.stdout
    assert result.stdout.splitlines()[-1] == "2 objects: 1 allowed, 1 denied"


def test_no_mutate_validates_the_objects_as_given(tmp_path: Path) -> None:
    job = pytorchjob()
    path = write(tmp_path, "job.yaml", dump(job))
    mutated = check_json("-f", str(path), "--nodes", NODES, rc=0)[0]
    assert mutated["patch"] and mutated["allowed"] is True
    as_given = check_json("-f", str(path), "--nodes", NODES, "--no-mutate", rc=1)[0]
    assert as_given["patch"] == [] and as_given["mutations"] == []
    assert as_given["object"] == job
    # Without training-rack, nothing keeps the 2x8-GPU job in one rack.
    assert [d["rule"] for d in as_given["denials"]] == ["training-same-rack"]


def test_policy_file_changes_the_verdict(tmp_path: Path) -> None:
    path = write(tmp_path, "job.yaml", dump(pytorchjob()))
    policy = yaml.safe_load(DEFAULT_POLICY.read_text(encoding="utf-8"))
    policy["rules"]["training-topology-scheduler"] = "enforce"
    pol = write(tmp_path, "policy.yaml", yaml.safe_dump(policy))
    out = check_json("-f", str(path), "--nodes", NODES, "--policy", str(pol), rc=1)
    assert [d["rule"] for d in out[0]["denials"]] == ["training-topology-scheduler"]


def test_hpa_target_is_found_in_the_input_set(tmp_path: Path) -> None:
    hpa = {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "chat-api", "namespace": "serving"},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "chat-api"},
            "minReplicas": 0,
            "maxReplicas": 4,
        },
    }
    alone = write(tmp_path, "hpa.yaml", dump(hpa))
    assert check_json("-f", str(alone), rc=0)[0]["allowed"] is True  # target unknown: nothing to judge
    both = write(tmp_path, "both.yaml", dump(hpa, inference_deployment()))
    out = check_json("-f", str(both), "--nodes", NODES, rc=1)
    assert [d["rule"] for d in out[0]["denials"]] == ["inference-warm-pool"]
    assert out[0]["patch"] == [] and out[1]["allowed"] is True


def test_namespace_in_the_input_set_sets_enforcement(tmp_path: Path) -> None:
    ns = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": "sandbox", "labels": {"gpu-admission.io/enforcement": "warn"}},
    }
    path = write(tmp_path, "ns.yaml", dump(ns, gpu_pod("big", 16, namespace="sandbox"), gpu_pod("big", 16)))
    out = check_json("-f", str(path), "--nodes", NODES, rc=1)
    _, warned, denied = out
    assert warned["allowed"] is True and warned["denials"] == []
    assert any(w.startswith("gpu-request-fits: ") for w in warned["warnings"])
    assert denied["allowed"] is False


def test_yaml_output_matches_json_and_has_no_anchors(tmp_path: Path) -> None:
    path = write(tmp_path, "objs.yaml", dump(pytorchjob(), inference_deployment()))
    as_json = check_json("-f", str(path), "--nodes", NODES, rc=0)
    result = cli("check", "-f", str(path), "--nodes", NODES, "-o", "yaml")
    assert result.returncode == 0, result.stderr
    assert not re.search(r"[&*]id\d+", result.stdout), "YAML output uses anchors/aliases"
    assert yaml.safe_load(result.stdout) == as_json


# --- gpu-admission policy ------------------------------------------------------------------------------------


def test_policy_validate_ok() -> None:
    result = cli("policy", "validate", str(DEFAULT_POLICY))
    assert result.returncode == 0, result.stderr
    assert re.fullmatch(r".*default-policy\.yaml: valid policy \(sha256:[0-9a-f]{16}\)\n", result.stdout)


def test_policy_validate_lists_every_error_with_its_field_path(tmp_path: Path) -> None:
    text = "\n".join(
        [
            "apiVersion: gpu-admission.io/v1alpha1",
            "kind: Policy",
            "failureMode: sometimes",
            "rules: {training-same-rack: deny, no-such-rule: warn}",
            "mutations: {gpu-slice: yes-please}",
            "inference: {warmPool: -1}",
            "pools:",
            "  - {name: a100, nodeSelector: {}}",
            "gpuNodes: {tolerations: [{key: k, operator: Exists, value: v}]}",
            "training: {pool: missing}",
            "",
        ]
    )
    pol = write(tmp_path, "policy.yaml", text)
    result = cli("policy", "validate", str(pol))
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    paths = [line.split(": ")[1].split(" (line ")[0] for line in lines]
    assert all(" (line " in line for line in lines), lines
    for line in lines:
        assert line.startswith(f"{pol}: ")
    assert set(paths) >= {
        "failureMode",
        "rules.training-same-rack",
        "rules.no-such-rule",
        "mutations.gpu-slice",
        "inference.warmPool",
        "pools[0].nodeSelector",
        "gpuNodes.tolerations[0].value",
        "training.pool",
    }


def test_policy_validate_invalid_yaml(tmp_path: Path) -> None:
    pol = write(tmp_path, "policy.yaml", "rules: [\n")
    result = cli("policy", "validate", str(pol))
    assert result.returncode == 1
    assert "invalid YAML" in result.stderr and "line " in result.stderr
    assert "Traceback" not in result.stderr


def test_policy_validate_missing_file(tmp_path: Path) -> None:
    assert_usage_error(cli("policy", "validate", str(tmp_path / "nope.yaml")), "nope.yaml")


def test_policy_default_parses_and_validates() -> None:
    result = cli("policy", "default")
    assert result.returncode == 0, result.stderr
    assert result.stdout == DEFAULT_POLICY.read_text(encoding="utf-8")
    doc = yaml.safe_load(result.stdout)
    assert doc["apiVersion"] == "gpu-admission.io/v1alpha1" and doc["kind"] == "Policy"
    validated = cli("policy", "validate", "-", stdin=result.stdout)
    assert validated.returncode == 0, validated.stderr
    assert "valid policy" in validated.stdout


def test_policy_diff_explains_changes(tmp_path: Path) -> None:
    doc = yaml.safe_load(DEFAULT_POLICY.read_text(encoding="utf-8"))
    doc["rules"]["training-queue-priority"] = "enforce"
    doc["rules"]["training-topology-scheduler"] = "off"
    doc["mutations"]["inference-spread"] = False
    doc["inference"]["warmPool"] = 2
    doc["placement"]["whenNoDomainFits"] = "deny"
    new = write(tmp_path, "new.yaml", yaml.safe_dump(doc))
    result = cli("policy", "diff", str(DEFAULT_POLICY), str(new))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "rule training-queue-priority: changed (warn -> enforce)" in lines
    assert "rule training-topology-scheduler: switched off (warn -> off)" in lines
    assert "mutation inference-spread: switched off" in lines
    assert "inference.warmPool: 1 -> 2" in lines
    assert "placement.whenNoDomainFits: prefer -> deny" in lines
    assert len(lines) == 5


def test_policy_diff_no_change() -> None:
    result = cli("policy", "diff", str(DEFAULT_POLICY), str(DEFAULT_POLICY))
    assert result.returncode == 0
    assert result.stdout == "no change in behaviour\n"


def test_policy_diff_invalid_side(tmp_path: Path) -> None:
    bad = write(tmp_path, "bad.yaml", "apiVersion: gpu-admission.io/v1alpha1\nkind: Policy\nfailureMode: maybe\n")
    assert_usage_error(cli("policy", "diff", str(DEFAULT_POLICY), str(bad)), "failureMode")


# --- the pod view (--pods) ------------------------------------------------------------------------------------

PLACEMENT = ROOT / "examples" / "placement"


def test_pods_file_gives_capacity_aware_placement_and_garbage_pods_are_skipped_and_counted(tmp_path: Path) -> None:
    good = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "c", "namespace": "x"},
        "spec": {
            "nodeName": "h100-big-1",
            "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": 4}}}],
        },
        "status": {"phase": "Running"},
    }
    bad = [
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "a", "namespace": "x"}, "spec": [1, 2]},
        {**good, "metadata": {"name": "b", "namespace": "x"}, "spec": {**good["spec"], "nodeName": 7}},
    ]
    pods = write(tmp_path, "pods.yaml", dump({"apiVersion": "v1", "kind": "List", "items": [*bad, good]}))
    job = str(PLACEMENT / "job-4x8.yaml")
    racks = str(PLACEMENT / "racks.yaml")
    result = cli("check", "-f", job, "--nodes", racks, "--pods", str(pods), "-o", "json")
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == "gpu-admission: warning: skipped 2 pod entries that could not be read"
    # the one good pod holds 4 GPUs of rack-big: no rack holds 4x8 now, so prefer (no required rack)
    (out,) = json.loads(result.stdout)
    assert any(w.startswith("placement: no rack holds the 32-GPU job now") for w in out["warnings"])
    without = json.loads(cli("check", "-f", job, "--nodes", racks, "-o", "json").stdout)[0]
    assert not any(w.startswith("placement:") for w in without["warnings"])  # no pod view: the static rule
