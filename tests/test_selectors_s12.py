"""Gt/Lt operands read as the scheduler reads them (Go's strconv.ParseInt(s, 10, 64) in apimachinery's
labels.Requirement.Matches), by both the node-by-node filter (selectors) and the node index (nodeindex): Python's
int() also took " 8", "1_0", "+ 8"-less forms and non-ASCII digits, so a pod could be placed on nodes the scheduler
never gives it."""

from __future__ import annotations

from typing import Any

import pytest

from policies import inventory as inventory_mod
from policies.document import default_policy
from policies.selectors import expression_matches, node_selection, parse_int64, selection_filter


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("8", 8),
        ("08", 8),
        ("+8", 8),
        ("-8", -8),
        ("0", 0),
        ("9223372036854775807", 2**63 - 1),  # the int64 bounds themselves
        ("-9223372036854775808", -(2**63)),
        ("9223372036854775808", None),  # one past: ParseInt's range error
        ("-9223372036854775809", None),
        ("1_0", None),  # underscores only with base 0 in Go
        (" 8", None),
        ("8 ", None),
        ("8\n", None),
        ("٨", None),  # an Arabic-Indic eight: int() takes it, Go does not
        ("", None),
        ("+", None),
        ("-", None),
        ("1.5", None),
        ("0x10", None),
        ("++8", None),
    ],
)
def test_parse_int64_is_gos_parse_int_base_10(text: str, value: int | None) -> None:
    assert parse_int64(text) == value


def _node(name: str, version: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                "nvidia.com/cuda.driver.major": version,
            },
        },
        "status": {"allocatable": {"nvidia.com/gpu": "8"}},
    }


# Label values as a node may carry them (each is a valid label value): only the plain ones are integers to Go.
VERSIONS = {"n-550": "550", "n-0560": "0560", "n-5_70": "5_70", "n-big": "99999999999999999999", "n-neg": "550-1"}


@pytest.mark.parametrize(
    ("op", "bound", "expected"),
    [
        ("Gt", "549", ["n-0560", "n-550"]),
        ("Gt", "555", ["n-0560"]),
        ("Lt", "600", ["n-0560", "n-550"]),
        ("Gt", "5_49", []),  # the operand is no integer to Go: no node
        ("Lt", "1e9", []),
        ("Gt", "9223372036854775808", []),
    ],
)
def test_the_index_and_the_filter_read_gt_and_lt_as_the_scheduler_does(
    op: str, bound: str, expected: list[str]
) -> None:
    inv = inventory_mod.build([_node(n, v) for n, v in VERSIONS.items()], default_policy())
    expr = {"key": "nvidia.com/cuda.driver.major", "operator": op, "values": [bound]}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "default"},
        "spec": {
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchExpressions": [expr]}]
                    }
                }
            }
        },
    }
    allowed = selection_filter(node_selection(pod))
    assert sorted(n.name for n in inv.nodes if allowed(n.labels, n.name)) == expected
    assert sorted(n.name for n in inv.candidates(pod)) == expected
    assert [n for n, v in VERSIONS.items() if expression_matches(expr, {"nvidia.com/cuda.driver.major": v})] == sorted(
        expected, key=list(VERSIONS).index
    )
