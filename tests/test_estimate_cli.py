"""`gpu-admission estimate`, run as a user would: `python -m webhook estimate ...` in a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


def estimate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "webhook", "estimate", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def as_json(*args: str) -> dict[str, Any]:
    result = estimate(*args, "-o", "json")
    assert result.returncode == 0, result.stderr
    document: dict[str, Any] = json.loads(result.stdout)
    return document


def placement(document: dict[str, Any], name: str) -> dict[str, Any]:
    rows = {row["placement"]: row for row in document["placements"]}
    row: dict[str, Any] = rows[name]
    return row


def test_table_for_sixteen_gpus() -> None:
    result = estimate("--gpus", "16", "--gpus-per-node", "8")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    lines = result.stdout.splitlines()
    assert lines[0].startswith("16 GPUs, 8 per node")
    text = result.stdout
    assert "n/a (16 GPUs > 8 per node)" in text
    # 16 MiB default, 400/200 Gb/s: 0.56·(16 MiB / 16 MB) in the node stages, + 0.08·… on the network
    assert "0.671 ms" in text and "0.755 ms" in text and "1.13×" in text
    assert any(line.startswith("assumptions: ") for line in lines)
    assert "all-reduce ≈1.1× slower across racks than in one (16 MiB, ring, 400/200 Gb/s, 2:1 oversub)" in lines


def test_json_reproduces_the_worked_example() -> None:
    # comm-model.md: S = 16 MB, 8 GPUs per node, 50 GB/s NVLink, 25 GB/s network → 0.56 ms and 0.64 ms.
    one_node = as_json("--gpus", "8", "--gpus-per-node", "8", "--message-size", "16M")
    assert placement(one_node, "intra-node")["ms"] == pytest.approx(0.56, abs=1e-9)
    assert one_node["best"] == "intra-node"
    two_nodes = as_json("--gpus", "16", "--gpus-per-node", "8", "--message-size", "16MB")
    assert placement(two_nodes, "intra-node") == {
        "placement": "intra-node",
        "feasible": False,
        "nodes": None,
        "racks": None,
        "ms": None,
        "ratio": None,
    }
    rack = placement(two_nodes, "intra-rack")
    assert rack["ms"] == pytest.approx(0.64, abs=1e-9)
    assert (rack["nodes"], rack["racks"], rack["ratio"]) == (2, 1, 1.0)
    cross = placement(two_nodes, "cross-rack")
    assert cross["ms"] == pytest.approx(0.72, abs=1e-9)
    assert (cross["nodes"], cross["racks"]) == (2, 2)
    assert two_nodes["crossRackPenalty"] == pytest.approx(1.125)
    assert two_nodes["messageSizeBytes"] == 16_000_000
    assert two_nodes["bandwidths"]["nvlinkGbps"] == 400.0
    assert "\n" not in two_nodes["assumptions"]


def test_flags_change_the_model() -> None:
    document = as_json(
        "--gpus", "32", "--gpus-per-node", "8", "--message-size", "1Gi",
        "--nvlink-gbps", "3600", "--network-gbps", "400", "--oversubscription", "4",
        "--alpha-us", "5", "--hop-us", "2",
    )  # fmt: skip
    s = 2**30
    node_bw, net_bw = 450.0, 50.0
    intra = 2 * 7 * 5 / 1e3 + 2 * 7 / 8 * s / (node_bw * 1e6)
    rack = intra + 2 * 3 * 5 / 1e3 + 2 * 3 / 4 * s / 8 / (net_bw * 1e6)
    cross = intra + 2 * 3 * 7 / 1e3 + 2 * 3 / 4 * s / 8 / (net_bw / 4 * 1e6)
    assert placement(document, "intra-rack")["ms"] == pytest.approx(rack, rel=1e-12)
    assert placement(document, "cross-rack")["ms"] == pytest.approx(cross, rel=1e-12)
    assert document["bandwidths"] == {
        "nvlinkGbps": 3600.0,
        "networkGbps": 400.0,
        "crossRackOversubscription": 4.0,
        "alphaNvlinkUs": 5.0,
        "alphaNetworkUs": 5.0,
        "crossRackHopUs": 2.0,
    }


def test_one_gpu() -> None:
    result = estimate("--gpus", "1", "--gpus-per-node", "8")
    assert result.returncode == 0, result.stderr
    assert "nothing to spread" in result.stdout


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (
            ["--gpus", "16", "--gpus-per-node", "8", "--message-size", "ten"],
            "--message-size: not a size: 'ten'",
        ),
        (["--gpus", "16", "--gpus-per-node", "8", "--message-size", "0"], "at least 1 byte"),
        (["--gpus", "16", "--gpus-per-node", "8", "--message-size=-1Mi"], "--message-size: not a size"),
        (["--gpus-per-node", "8"], "--gpus is required"),
        (["--gpus", "16"], "--gpus-per-node is required"),
        (["--gpus", "0", "--gpus-per-node", "8"], "--gpus: not a whole number"),
        (["--gpus", "two", "--gpus-per-node", "8"], "--gpus: not a whole number"),
        (["--gpus", "2", "--gpus-per-node", "8", "--nvlink-gbps", "0"], "--nvlink-gbps"),
        (["--gpus", "2", "--gpus-per-node", "8", "--network-gbps", "fast"], "--network-gbps: not a number"),
        (["--gpus", "2", "--gpus-per-node", "8", "--oversubscription", "0.5"], "--oversubscription"),
        (["--gpus", "2", "--gpus-per-node", "8", "--alpha-us", "-1"], "--alpha-us"),
        (["--gpus", "2", "--gpus-per-node", "8", "--hop-us", "inf"], "--hop-us"),
        (["--gpus", "2", "--gpus-per-node", "8", "-o", "yaml"], "-o/--output"),
    ],
)
def test_bad_input_is_one_line_exit_2(args: list[str], fragment: str) -> None:
    result = estimate(*args)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("gpu-admission: error: ")
    assert fragment in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(("size", "expected"), [("16MiB", 16 * 2**20), ("16Mi", 16 * 2**20), ("100B", 100)])
def test_message_size_spellings(size: str, expected: int) -> None:
    document = as_json("--gpus", "8", "--gpus-per-node", "8", "--message-size", size)
    assert document["messageSizeBytes"] == expected


def test_nvlink_domain_adds_the_clique_penalty() -> None:
    table = estimate("--gpus", "16", "--gpus-per-node", "4", "--nvlink-gbps", "7200", "--nvlink-domain")
    assert table.returncode == 0, table.stderr
    assert "all-reduce ≈3.3× slower across NVLink cliques than in one" in table.stdout
    document = as_json("--gpus", "16", "--gpus-per-node", "4", "--nvlink-gbps", "7200", "--nvlink-domain")
    assert document["nvlinkDomainPenalty"] == pytest.approx((1.75 / 900 + 1 / 200) / (1.875 / 900))
    assert "nvlinkDomainPenalty" not in as_json("--gpus", "16", "--gpus-per-node", "4")
