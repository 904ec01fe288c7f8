"""`gpu-admission test DIR`, run as a user would (`python -m webhook test ...` in a subprocess): the golden cases
and the example suite pass through it, a wrong expectation fails with a diff, and a hostile or broken suite
file is one line and exit 2 while the other cases still run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from webhook.suite import SUITE_FILE

ROOT = Path(__file__).resolve().parent.parent
CASES = ROOT / "tests" / "cases"
EXAMPLE = ROOT / "examples" / "policy-tests"
NODES = ROOT / "examples" / "cluster" / "nodes.yaml"


def gpu_admission(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "webhook", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def no_traceback(p: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in p.stderr and "Traceback" not in p.stdout, p.stderr


JOB = {
    "apiVersion": "batch/v1",
    "kind": "Job",
    "metadata": {"name": "finetune", "namespace": "ml"},
    "spec": {
        "completionMode": "Indexed",
        "completions": 2,
        "parallelism": 2,
        "template": {
            "spec": {
                "restartPolicy": "Never",
                "priorityClassName": "training",
                "containers": [{"name": "t", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 4}}}],
            }
        },
    },
}


def write(path: Path, value: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(value if isinstance(value, str) else yaml.safe_dump(value, sort_keys=False), encoding="utf-8")
    return path


def case(**expect: Any) -> dict[str, Any]:
    return {"description": "a 2x4 Indexed Job", "input": JOB, "expect": {"allowed": True, **expect}}


@pytest.fixture
def suite(tmp_path: Path) -> Path:
    """A suite with settings (the example nodes), deciding with the default policy."""
    write(tmp_path / SUITE_FILE, {"nodes": str(NODES)})
    return tmp_path


# --- the project's own cases and the example suite --------------------------------------------------------


def test_every_golden_case_passes_through_gpu_admission_test() -> None:
    files = sorted(p for p in CASES.rglob("*.yaml") if p.name != SUITE_FILE)
    p = gpu_admission("test", str(CASES), "-o", "json")
    no_traceback(p)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr
    outcomes = json.loads(p.stdout)
    ids = {o["id"] for o in outcomes}
    assert ids == {f.relative_to(CASES).with_suffix("").as_posix() for f in files}  # every file, once
    assert {o["status"] for o in outcomes} == {"pass"}


def test_the_example_suite_passes_and_says_so() -> None:
    p = gpu_admission("test", str(EXAMPLE))
    no_traceback(p)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.splitlines()[-1] == "4 cases: 4 passed, 0 failed, 0 invalid"
    assert "PASS  training/queued-job-pinned-to-one-rack" in p.stdout


def test_the_suite_policy_file_decides(tmp_path: Path) -> None:
    """The example's policy enforces training-queue-priority: with the built-in policy its denial case fails."""
    shutil.copytree(EXAMPLE, tmp_path / "s")
    shutil.copytree(NODES.parent, tmp_path / "cluster")  # the suite names ../cluster/nodes.yaml
    (tmp_path / "s" / "policy.yaml").write_text("apiVersion: gpu-admission.io/v1alpha1\nkind: Policy\n")
    p = gpu_admission("test", str(tmp_path / "s"), "-q")
    assert p.returncode == 1, p.stdout
    assert "FAIL  training/unqueued-job-denied" in p.stdout
    assert "allowed: expected False, got True (allowed)" in p.stdout
    assert "denials: expected ['training-queue-priority'], got [] (missing ['training-queue-priority'])" in p.stdout


# --- failures: what differs, shown --------------------------------------------------------------------------


def test_a_wrong_patch_and_verdict_fail_with_a_diff(suite: Path) -> None:
    write(suite / "job.yaml", case(mutations=["training-pool", "training-rack", "training-node-pack", "job-size"]))
    write(suite / "wrong.yaml", case(allowed=False, denials=["training-same-rack"], patch=[], workload="batch"))
    p = gpu_admission("test", str(suite))
    no_traceback(p)
    assert p.returncode == 1, p.stdout + p.stderr
    lines = p.stdout.splitlines()
    assert "PASS  job" in lines and "FAIL  wrong" in lines
    out = p.stdout
    assert "allowed: expected False, got True (allowed)" in out
    assert "workload: expected batch, got training" in out
    assert "denials: expected ['training-same-rack'], got [] (missing ['training-same-rack'])" in out
    assert "mutations: expected [], got ['job-size', 'training-node-pack', 'training-pool', 'training-rack']" in out
    assert "patch differs:" in out and "--- expected" in out and "+++ got" in out
    assert "        -[]" in out and "        +- op: add" in out
    assert "        +  path: /spec/template/spec/affinity" in out
    assert lines[-1] == "2 cases: 1 passed, 1 failed, 0 invalid"


def test_object_diff_names_the_changed_line(suite: Path) -> None:
    expected = json.loads(json.dumps(JOB))
    expected["spec"]["parallelism"] = 3
    write(suite / "c.yaml", case(object=expected))
    p = gpu_admission("test", str(suite), "-q")
    assert p.returncode == 1
    assert "object differs:" in p.stdout
    assert "        -  parallelism: 3" in p.stdout and "        +  parallelism: 2" in p.stdout


def test_xfail_is_strict(suite: Path) -> None:
    write(suite / "known-gap.yaml", {**case(allowed=False), "xfail": "not decided yet"})
    p = gpu_admission("test", str(suite))
    assert p.returncode == 0 and "XFAIL known-gap" in p.stdout, p.stdout
    write(suite / "known-gap.yaml", {**case(mutations=["training-pool", "training-rack", "training-node-pack",
                                                       "job-size"]), "xfail": "fixed since"})  # fmt: skip
    p = gpu_admission("test", str(suite))
    assert p.returncode == 1 and "XPASS known-gap" in p.stdout and "xfail: fixed since" in p.stdout, p.stdout


def test_json_output(suite: Path) -> None:
    write(suite / "c.yaml", case())
    p = gpu_admission("test", str(suite), "-o", "json")
    [o] = json.loads(p.stdout)
    assert o["id"] == "c" and o["status"] == "fail" and o["description"] == "a 2x4 Indexed Job"
    assert o["problems"][0].startswith("mutations: expected [], got [")


# --- bad input: one line, exit 2, the other cases still run ---------------------------------------------------

ALIAS_BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [{', '.join(['*' + p] * 10)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True)
)

HOSTILE: list[tuple[str, str | bytes, str]] = [
    ("alias-bomb.yaml", ALIAS_BOMB, "aliases expand to more than"),
    (
        "deep.yaml",
        "description: x\ninput: " + "[" * 200 + "]" * 200 + "\nexpect: {allowed: true}\n",
        "nested deeper than 100 levels",
    ),
    ("binary.yaml", b"\xff\xfe\x00garbage", "not UTF-8 text"),
    ("broken.yaml", "description: x\ninput: {a: [1, 2\n", "invalid YAML"),
    ("list.yaml", "- 1\n- 2\n", "a case is a mapping"),
    (
        "typo.yaml",
        "description: x\ninput: {}\nexpect: {allowed: true}\nnamespaceLabel: {}\n",
        "namespaceLabel: unknown key (did you mean 'namespaceLabels'?)",
    ),
    ("no-expect.yaml", "description: x\ninput: {}\n", "expect: required"),
    ("no-allowed.yaml", "description: x\ninput: {}\nexpect: {denials: [a]}\n", "expect.allowed: required"),
    (
        "expect-typo.yaml",
        "description: x\ninput: {}\nexpect: {allowed: true, mutation: [a]}\n",
        "expect.mutation: unknown key (did you mean 'mutations'?)",
    ),
    (
        "denials-string.yaml",
        "description: x\ninput: {}\nexpect: {allowed: true, denials: a}\n",
        "expect.denials: must be a list of strings",
    ),
    (
        "bad-exception.yaml",
        "description: x\nexceptions: [{apiVersion: gpu-admission.io/v1alpha1, kind: GPUPolicyException, metadata: "
        "{name: e}, spec: {rules: [nope]}}]\ninput: {}\nexpect: {allowed: true}\n",
        "exceptions: spec.rules[0]: Unsupported value: 'nope'",
    ),
    ("bad-now.yaml", "description: x\nnow: yesterday\ninput: {}\nexpect: {allowed: true}\n", "now: must be a time"),
    (
        "bad-reservation.yaml",
        "description: x\nreservations: [{job: a/b=c, key: rack, domain: r, sizes: [8, 0]}]\ninput: {}\n"
        "expect: {allowed: true}\n",
        "reservations[0]: must be {job, key, domain, sizes: [GPUs per pod, ...]}",
    ),
    (
        "reservations-mapping.yaml",
        "description: x\nreservations: {job: a}\ninput: {}\nexpect: {allowed: true}\n",
        "reservations[0]: must be",
    ),
    (
        "bad-reserves.yaml",
        "description: x\ninput: {}\nexpect: {allowed: true, reserves: {rack: r}}\n",
        "expect.reserves: must be null or a mapping of domain and sizes",
    ),
    ("no-description.yaml", "input: {}\nexpect: {allowed: true}\n", "description: required"),
    (
        "missing-nodes.yaml",
        "description: x\nnodes: nowhere.yaml\ninput: {}\nexpect: {allowed: true}\n",
        "nowhere.yaml: no such file",
    ),
    (
        "bad-policy.yaml",
        "description: x\npolicy: {rules: {training-same-rack: deny}}\ninput: {}\nexpect: {allowed: true}\n",
        "policy.rules.training-same-rack: must be one of",
    ),
]


@pytest.mark.parametrize(("name", "content", "says"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_a_hostile_case_file_is_one_line_and_exit_2(suite: Path, name: str, content: str | bytes, says: str) -> None:
    write(suite / "good.yaml", case(mutations=["training-pool", "training-rack", "training-node-pack", "job-size"]))
    target = suite / name
    target.write_bytes(content if isinstance(content, bytes) else content.encode())
    p = gpu_admission("test", str(suite))
    no_traceback(p)
    stem = name.removesuffix(".yaml")
    lines = p.stdout.splitlines()
    assert p.returncode == 2, p.stdout + p.stderr
    assert "PASS  good" in lines, p.stdout  # the other cases still ran
    i = lines.index(f"BAD   {stem}")
    assert lines[i + 1].strip() and says in lines[i + 1], p.stdout
    assert lines[i + 2].startswith(("PASS", "FAIL", "BAD", "XFAIL", "XPASS")) or lines[i + 2][0].isdigit(), p.stdout
    assert lines[-1].endswith("1 invalid")


@pytest.mark.parametrize(
    ("settings", "says"),
    [
        ("policy: nowhere.yaml\n", "no such file"),
        ("policy: bad-policy.yaml\n", "rules.training-same-rack: must be one of"),
        ("nodez: x\n", "nodez: unknown key (did you mean 'nodes'?)"),
        ("base: nowhere\n", "base: 'nowhere' is not a directory"),
        ("- a list\n", "must be one mapping"),
        ("nodes: 7\n", "nodes: must be a file path or a list of objects"),
    ],
)
def test_broken_settings_are_one_line_on_stderr(tmp_path: Path, settings: str, says: str) -> None:
    write(tmp_path / "bad-policy.yaml", "apiVersion: gpu-admission.io/v1alpha1\nkind: Policy\nrules:\n"
          "  training-same-rack: deny\n")  # fmt: skip
    write(tmp_path / SUITE_FILE, settings)
    write(tmp_path / "c.yaml", case())
    p = gpu_admission("test", str(tmp_path))
    no_traceback(p)
    assert p.returncode == 2 and p.stdout == ""
    [line] = p.stderr.splitlines()
    assert line.startswith("gpu-admission: error: ") and says in line, line


def test_no_suite_is_exit_2(tmp_path: Path) -> None:
    for target, says in ((tmp_path / "nowhere", "not a directory"), (tmp_path, "no cases")):
        p = gpu_admission("test", str(target))
        assert p.returncode == 2 and says in p.stderr and len(p.stderr.splitlines()) == 1, p.stderr


def test_too_many_bytes_over_the_suite_is_exit_2(suite: Path) -> None:
    for i in range(3):
        write(suite / f"c{i}.yaml", case())
    p = gpu_admission("test", str(suite), "--max-input", "600")
    assert p.returncode == 2 and "raise it with --max-input" in p.stderr + p.stdout, p.stdout + p.stderr
