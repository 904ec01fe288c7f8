"""The node index's one-expression mask (`nodeindex._expr_mask`) where session 11's tests did not reach (issue #20,
session 12): an In list holding a value that is itself a list, and a matchFields name list holding the empty
name beside a real one. Each selection is checked against the node-by-node filter (policies/selectors.py), the
definition the index mirrors (test_nodeindex_s11.chosen)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from policies import inventory as inventory_mod
from policies.document import default_policy
from tests.test_nodeindex_s11 import chosen, example_nodes, pod, required

PRODUCT = "nvidia.com/gpu.product"


@pytest.mark.parametrize(
    ("operator", "want"),
    [("In", ["h100-a-1", "h100-a-2", "h100-b-1", "h100-b-2"]), ("NotIn", ["a100-mig-1", "l4-ts-1"])],
)
def test_a_value_that_is_itself_a_list_matches_no_label_and_never_raises(operator: str, want: list[str]) -> None:
    """`values: [[NVIDIA-A100-SXM4-80GB], NVIDIA-H100-80GB-HBM3]` (a flow list nested by mistake, in a file `check`
    reads or a custom resource's pod template the API server does not type): no label value equals a list,
    so only the H100 string selects; looking the list up as a label value would raise (it cannot be hashed)."""
    inv = inventory_mod.build(example_nodes(), default_policy())
    expr = {"key": PRODUCT, "operator": operator, "values": [["NVIDIA-A100-SXM4-80GB"], "NVIDIA-H100-80GB-HBM3"]}
    assert chosen(inv, pod({"affinity": required({"matchExpressions": [expr]})})) == want


def test_a_match_fields_name_list_holding_the_empty_name_keeps_the_named_node() -> None:
    """A node written without metadata.name or a hostname label (a hand-made `check --nodes` file) has the name
    "" (test_nodeindex_s11): `metadata.name In [h100-a-1, ""]` admits it and h100-a-1 both, NotIn every
    other node."""
    nodes = example_nodes()
    nameless = copy.deepcopy(next(n for n in nodes if n["metadata"]["name"] == "h100-b-2"))
    del nameless["metadata"]["name"]
    del nameless["metadata"]["labels"]["kubernetes.io/hostname"]
    inv = inventory_mod.build([*[n for n in nodes if n["metadata"]["name"] != "h100-b-2"], nameless], default_policy())
    for operator, want in (("In", ["", "h100-a-1"]), ("NotIn", ["a100-mig-1", "h100-a-2", "h100-b-1", "l4-ts-1"])):
        field: dict[str, Any] = {"key": "metadata.name", "operator": operator, "values": ["h100-a-1", ""]}
        assert chosen(inv, pod({"affinity": required({"matchFields": [field]})})) == want, operator
