"""`gpu-admission placement` (the post-launch ledger) and the ledger's follow-up records in `gpu-admission audit`,
run as a user would, on the example dumps of examples/placement/ (docs/policy.md "After launch: the ledger")."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from policies import comm

ROOT = Path(__file__).resolve().parent.parent
EX = "examples/placement"
DUMPS = ("--nodes", f"{EX}/racks.yaml", "--pods", f"{EX}/ledger-pods.yaml", "--audit", f"{EX}/ledger-audit.log")
AT = ("--at", "2026-12-01T10:05:00Z")


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "webhook", *args], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )


def as_json(*args: str) -> dict[str, Any]:
    result = cli(*args, "-o", "json")
    assert result.returncode == 0, result.stderr
    document: dict[str, Any] = json.loads(result.stdout)
    return document


def test_json_per_job_outcome_pending_and_comm_ratio() -> None:
    doc = as_json("placement", *DUMPS, *AT)
    jobs = {j["job"].rsplit("=", 1)[-1]: j for j in doc["jobs"]}
    a, b, c, d = (jobs[f"train-{x}"] for x in "abcd")
    assert (a["outcome"], a["pendingSeconds"], a["spans"], a["placement"], a["commRatio"]) == (
        "one-domain",
        3.0,
        {"topology.kubernetes.io/rack": 1, "topology.kubernetes.io/zone": 1},
        "intra-rack",
        1.0,
    )
    estimate = comm.placement_estimate(comm.DEFAULT_MESSAGE_BYTES, 16, 8)
    assert (b["outcome"], b["placement"], b["best"], b["uid"]) == (
        "spanning",
        "cross-rack",
        "intra-rack",
        "5f0c1d2e-0002",
    )
    assert b["commRatio"] == pytest.approx(estimate.cross_rack_ratio, rel=1e-12)
    assert (c["outcome"], c["bound"], c["pods"], c["pendingSeconds"], c["best"]) == (
        "partly-bound",
        1,
        2,
        180.0,
        "cross-rack",  # at its first pod only h100-big-4 and h100-small-2 were free
    )
    assert (d["outcome"], d["rules"], d["pendingSeconds"]) == ("denied", ["training-same-rack"], None)
    assert jobs["notebook"]["unowned"] is True
    # the uid of each job's object in the API: its pods' controller's (a Job's), a bare pod's own
    assert (b["jobUid"], jobs["notebook"]["jobUid"], d["jobUid"]) == (
        "7a1e0c55-0000-4000-8000-000000000002",
        "7a1e0c55-0000-4000-8000-000000000004",
        None,  # denied: no pod ever existed
    )
    [chat] = doc["inference"]
    assert (chat["workload"], chat["perNode"], chat["perZone"], chat["onSharedGpus"]) == (
        "serving/Deployment/chat",
        {"h100-big-4": 2},
        {"zone-1": 2},
        0,
    )
    s = doc["summary"]
    assert (s["jobs"], s["admitted"], s["succeeded"], s["successRate"]) == (5, 4, 3, 0.75)
    assert (s["partialGangs"], s["partialGangGpus"], s["unowned"]) == (1, 8, 1)


def test_table_rows_and_summary() -> None:
    result = cli("placement", *DUMPS, *AT)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "Jobs (5; levels: rack, zone)"
    row = next(line for line in lines if "train-b" in line).split()
    assert row[1:] == ["training", "2/2", "spanning", "4s", "rack:2", "zone:1", "cross-rack", "intra-rack", "1.13"]
    assert "  jobs 5, admitted 4; fully bound within 10.0m: 3 (75%)" in lines
    assert "  partly bound: 1 job(s) holding 8 GPU(s)" in lines


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--pods", "/no/such/file"), "gpu-admission: error: --pods: /no/such/file: no such file"),
        (("--pods", "README.md"), "gpu-admission: error: --pods: README.md:"),
        (("--pods", f"{EX}/racks.yaml", "-o", "xml"), "gpu-admission: error: -o/--output: must be table or json"),
        (("--pods", f"{EX}/ledger-pods.yaml", "--at", "soon"), "gpu-admission: error: --at: not an RFC 3339 time"),
        (("--pods", f"{EX}/job-4x8.yaml"), "expected Node or Pod objects, found kind 'Job'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: tuple[str, ...], message: str) -> None:
    result = cli("placement", *args)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and message in result.stderr


def test_audit_summary_success_and_comm_ratio_per_rule_and_namespace() -> None:
    doc = as_json("audit", "--summary", f"{EX}/ledger-audit.log")
    outcomes = doc["outcomes"]
    assert outcomes["jobs"] == 5 and doc["verdicts"] == {"allow": 2, "warn": 1, "deny": 1}
    assert outcomes["byRule"]["training-rack"] == {
        "jobs": 2,
        "denied": 0,
        "bound": 1,
        "successRate": 0.5,
        "commRatioMean": 1.0,
    }
    assert outcomes["byRule"]["training-node-pack"]["commRatioMean"] == pytest.approx(1.125)
    assert outcomes["byRule"]["training-same-rack"] == {
        "jobs": 1,
        "denied": 1,
        "bound": 0,
        "successRate": None,
        "commRatioMean": None,
    }
    assert outcomes["byNamespace"]["research"]["successRate"] == pytest.approx(2 / 3)


def test_audit_filters_treat_outcome_records_as_records_of_their_rules() -> None:
    only_rack = as_json("audit", "--rule", "training-rack", f"{EX}/ledger-audit.log")
    assert sorted(r.get("outcome", r.get("verdict")) for r in only_rack) == ["one-domain", "partly-bound"]
    denied = as_json("audit", "--verdict", "deny", f"{EX}/ledger-audit.log")
    assert [r["name"] for r in denied] == ["train-d"]  # outcome records have no verdict
