"""policies/resources.py in process, for its mutants (session 11, issue #20): the resource-name tests, counts,
`ContainerAsk.total`, and `PodAsk.units` (the scheduler's count: the app containers' sum or the largest init
container, whichever is larger, per resource). `pod_ask`, `_container_ask` and `_differs` were done in session 9."""

from __future__ import annotations

from typing import Any

import pytest

from policies.resources import (
    NOTHING,
    ContainerAsk,
    PodAsk,
    _container_ask,
    _resource_map,
    is_gpu_resource,
    is_mig,
    is_shared,
    parse_count,
    pod_ask,
)


def test_resource_names() -> None:
    assert is_gpu_resource("nvidia.com/gpu") and is_gpu_resource("nvidia.com/mig-1g.10gb")
    assert not is_gpu_resource("amd.com/gpu") and not is_gpu_resource("NVIDIA.COM/gpu")
    assert not is_gpu_resource("x/nvidia.com/gpu")
    assert is_shared("nvidia.com/gpu.shared") and is_shared("nvidia.com/mig-1g.10gb.shared")
    assert not is_shared("nvidia.com/gpu") and not is_shared("example.com/gpu.shared")
    assert not is_shared("nvidia.com/gpu.SHARED") and not is_shared("nvidia.com/gpu.shared.x")
    assert is_mig("nvidia.com/mig-1g.10gb") and is_mig("nvidia.com/mig-")
    assert not is_mig("nvidia.com/gpu") and not is_mig("nvidia.com/MIG-1g.10gb") and not is_mig("x/nvidia.com/mig-1g")


@pytest.mark.parametrize(
    ("value", "count"),
    [
        (0, 0),
        (3, 3),
        (-1, None),
        ("0", 0),
        ("8", 8),
        ("08", 8),
        ("-1", None),
        ("+1", None),
        ("1.0", None),
        ("1e2", None),
        (" 1", None),
        ("", None),
        ("١", None),  # a non-ASCII digit
        ("²", None),  # isdigit() but not a decimal
        (2.0, 2),
        (0.0, 0),
        (2.5, None),
        (-2.0, None),
        (float("inf"), None),
        (float("nan"), None),
        (True, None),
        (False, None),
        (None, None),
        ([1], None),
    ],
)
def test_parse_count(value: Any, count: int | None) -> None:
    got = parse_count(value)
    assert got == count and (got is None or type(got) is int)


def test_resource_map_reads_a_mapping_or_nothing() -> None:
    limits = {"nvidia.com/gpu": 1}
    assert _resource_map({"limits": limits}, "limits") is limits
    assert _resource_map({"limits": limits}, "requests") == {}
    assert _resource_map({"limits": ["nvidia.com/gpu"]}, "limits") == {}
    assert _resource_map({"limits": None}, "limits") == {}
    assert _resource_map(["limits"], "limits") == {}
    assert _resource_map(None, "limits") == {}


def test_the_ask_of_one_container() -> None:
    c = {
        "name": "train",
        "resources": {"limits": {"nvidia.com/gpu": "2", "cpu": "4"}, "requests": {"nvidia.com/gpu": "1"}},
    }
    ask = _container_ask(c, False, 3, frozenset())[0]
    assert ask == ContainerAsk("train", False, {"nvidia.com/gpu": 2}, (), ("nvidia.com/gpu",))
    assert ask.claimed is NOTHING
    init = _container_ask(
        {"resources": {"limits": {"nvidia.com/gpu": "x", "deviceclass.resource.kubernetes.io/gpu": 1}}},
        True,
        3,
        frozenset(),
    )[0]
    assert init == ContainerAsk("#3", True, {}, ("nvidia.com/gpu",), ())


def test_total_adds_the_limits_and_the_claims_of_one_resource() -> None:
    c = ContainerAsk("c", False, {"nvidia.com/gpu": 2, "nvidia.com/gpu.shared": 1}, (), (), {"nvidia.com/gpu": 3})
    assert c.total("nvidia.com/gpu") == 5
    assert c.total("nvidia.com/gpu.shared") == 1
    assert c.total("nvidia.com/mig-1g.10gb") == 0
    assert ContainerAsk("c", False, {}, (), (), {"nvidia.com/gpu": 4}).total("nvidia.com/gpu") == 4
    assert ContainerAsk("c", False, {"nvidia.com/gpu": 4}, (), ()).total("nvidia.com/gpu") == 4


def ask(*containers: ContainerAsk) -> PodAsk:
    return PodAsk(containers=containers, whole_gpus=0, asks_gpu=True)


def test_units_are_the_app_sum_or_the_largest_init_container() -> None:
    app1 = ContainerAsk("a", False, {"nvidia.com/gpu": 2, "nvidia.com/mig-1g.10gb": 1}, (), ())
    app2 = ContainerAsk("b", False, {"nvidia.com/gpu": 3}, (), (), {"nvidia.com/gpu": 1})
    init1 = ContainerAsk("i", True, {"nvidia.com/gpu": 4, "nvidia.com/mig-1g.10gb": 5}, (), ())
    init2 = ContainerAsk("j", True, {"nvidia.com/mig-1g.10gb": 2}, (), (), {"nvidia.com/gpu.shared": 1})
    # gpu: app 2 + 3 + 1 = 6 against init 4; mig: app 1 against init max(5, 2) = 5; shared: app 0, init 1
    assert ask(app1, app2, init1, init2).units() == {
        "nvidia.com/gpu": 6,
        "nvidia.com/mig-1g.10gb": 5,
        "nvidia.com/gpu.shared": 1,
    }
    assert ask(init2, app1).units() == {"nvidia.com/gpu": 2, "nvidia.com/mig-1g.10gb": 2, "nvidia.com/gpu.shared": 1}
    assert ask(app1).units() == {"nvidia.com/gpu": 2, "nvidia.com/mig-1g.10gb": 1}
    assert ask(init1).units() == {"nvidia.com/gpu": 4, "nvidia.com/mig-1g.10gb": 5}
    assert ask().units() == {}


def test_resource_names_and_claim_asks_of_a_pod() -> None:
    a = ContainerAsk("a", False, {"nvidia.com/gpu": 1}, (), (), {"nvidia.com/mig-1g.10gb": 1})
    b = ContainerAsk("b", True, {"nvidia.com/gpu.shared": 1}, (), ())
    assert ask(a, b).resource_names() == {"nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "nvidia.com/gpu.shared"}
    assert ask(a, b).claim_asks() == ()
    pod = {"spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}
    assert pod_ask(pod).claims is None and pod_ask(pod).claim_asks() == ()


def test_claim_asks_are_the_claims_read() -> None:
    class Claims:
        asks = ("first", "second")

    with_claims = PodAsk(containers=(), whole_gpus=0, asks_gpu=True, claims=Claims())  # type: ignore[arg-type]
    assert with_claims.claim_asks() == ("first", "second")
