"""MIG catalogue (gpu-resources.md §3), resource names (§1) and GFD product labels (§2)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies import inventory
from policies.document import default_policy
from policies.mig import (
    CATALOGUE,
    GpuModel,
    MigProfile,
    memory_bytes,
    model_for_product,
    parse_mig_resource,
    parse_product,
    resource_name,
)
from policies.mutations import choose_slice
from policies.quantity import parse_bytes

GI = 2**30
MODELS = {model.name: model for model in CATALOGUE}

# gpu-resources.md §3, transcribed independently of the module: profile → max instances.
TABLE = {
    "A30-24GB": {"1g.6gb": 4, "1g.6gb+me": 1, "2g.12gb": 2, "2g.12gb+me": 1, "4g.24gb": 1},
    "A100-40GB": {
        "1g.5gb": 7, "1g.5gb+me": 1, "1g.10gb": 4, "2g.10gb": 3, "3g.20gb": 2, "4g.20gb": 1, "7g.40gb": 1,
    },
    "A100-80GB": {
        "1g.10gb": 7, "1g.10gb+me": 1, "1g.20gb": 4, "2g.20gb": 3, "3g.40gb": 2, "4g.40gb": 1, "7g.80gb": 1,
    },
    "H100-80GB": {
        "1g.10gb": 7, "1g.10gb+me": 1, "1g.20gb": 4, "2g.20gb": 3, "3g.40gb": 2, "4g.40gb": 1, "7g.80gb": 1,
    },
    "H100-NVL-94GB": {
        "1g.12gb": 7, "1g.12gb+me": 1, "1g.24gb": 4, "2g.24gb": 3, "3g.47gb": 2, "4g.47gb": 1, "7g.94gb": 1,
    },
    "H200-141GB": {
        "1g.18gb": 7, "1g.18gb+me": 1, "1g.35gb": 4, "2g.35gb": 3, "3g.71gb": 2, "4g.71gb": 1,
        "7g.141gb": 1,
    },
    "B200-180GB": {
        "1g.23gb": 7, "1g.23gb+me": 1, "1g.45gb": 4, "2g.45gb": 3, "3g.90gb": 2, "4g.90gb": 1,
        "7g.180gb": 1,
    },
}  # fmt: skip
MEMORY_GIB = {
    "A30-24GB": 24,
    "A100-40GB": 40,
    "A100-80GB": 80,
    "H100-80GB": 80,
    "H100-NVL-94GB": 94,
    "H200-141GB": 141,
    "B200-180GB": 180,
}


def test_catalogue_matches_the_reference_table() -> None:
    assert set(MODELS) == set(TABLE)
    for name, profiles in TABLE.items():
        model = MODELS[name]
        assert {p.name: p.max_instances for p in model.profiles} == profiles, name
        assert model.memory_gib == MEMORY_GIB[name]
        assert model.slices == (4 if name == "A30-24GB" else 7)


@pytest.mark.parametrize("model", CATALOGUE, ids=lambda m: m.name)
def test_profiles_are_consistent_with_their_names(model: GpuModel) -> None:
    for p in model.profiles:
        compute, memory = p.name.removesuffix("+me").split(".")
        assert p.compute_slices == int(compute.removesuffix("g"))
        assert p.memory_gb == int(memory.removesuffix("gb"))
        assert p.media_extensions == p.name.endswith("+me")
        assert p.compute_slices <= model.slices
        assert p.memory_gb <= model.memory_gib
        assert p.compute_slices * p.max_instances <= model.slices
        assert model.profile(p.name) is p
    full = max(model.profiles, key=lambda p: p.compute_slices)
    assert (full.compute_slices, full.memory_gb) == (model.slices, model.memory_gib)
    assert model.profile("9g.999gb") is None


def test_frozen() -> None:
    profile = MODELS["A100-80GB"].profiles[0]
    with pytest.raises(AttributeError):
        profile.memory_gb = 11  # type: ignore[misc]


def test_memory_is_read_as_gib() -> None:
    one_g_10 = MODELS["A100-80GB"].profile("1g.10gb")
    assert one_g_10 is not None
    assert memory_bytes(one_g_10) == 10 * GI
    assert memory_bytes(MODELS["H200-141GB"]) == 141 * GI
    # The decision the module docstring records: a user's "10Gi" is the 10 GB slice.
    assert chosen_profile([mixed_node("A100-80GB", TABLE["A100-80GB"])], "10Gi") == "1g.10gb"


# The webhook's best fit is mutations.choose_slice over the inventory (gpu-slice); these cases feed it a
# mixed-strategy node of each model that offers every profile of the catalogue, +me twins included.
PRODUCTS = {
    "A30-24GB": "NVIDIA-A30",
    "A100-40GB": "NVIDIA-A100-SXM4-40GB",
    "A100-80GB": "NVIDIA-A100-SXM4-80GB",
    "H100-80GB": "NVIDIA-H100-80GB-HBM3",
    "H100-NVL-94GB": "NVIDIA-H100-NVL",
    "H200-141GB": "NVIDIA-H200-141GB",
    "B200-180GB": "NVIDIA-B200",
}


def mixed_node(model: str, units: dict[str, int]) -> dict[str, Any]:
    resources = {resource_name(profile): str(n) for profile, n in units.items()}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": f"{model.lower()}-mixed",
            "labels": {
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.product": PRODUCTS[model],
                "nvidia.com/mig.strategy": "mixed",
            },
        },
        "status": {"allocatable": {"cpu": "32", "pods": "110", **resources}},
    }


def best_fit(nodes: list[dict[str, Any]], ask: str) -> tuple[inventory.Offer, list[str]] | None:
    """The webhook's choice over an inventory of these Node objects: the offer and the nodes that have it."""
    best = choose_slice(inventory.build(nodes, default_policy()).all, parse_bytes(ask), allow_shared=False)
    return (best[0], sorted(n.name for n in best[1])) if best else None


def chosen_profile(nodes: list[dict[str, Any]], ask: str) -> str | None:
    best = best_fit(nodes, ask)
    return best[0].profile if best else None


@pytest.mark.parametrize(
    ("model", "ask", "expected"),
    [
        ("A100-80GB", "1", "1g.10gb"),
        ("A100-80GB", "10Gi", "1g.10gb"),  # never the +me twin of the same size
        ("A100-80GB", "10.5Gi", "1g.20gb"),  # 1g.20gb before 2g.20gb: fewer compute slices
        ("A100-80GB", "20G", "1g.20gb"),
        ("A100-80GB", "20Gi", "1g.20gb"),
        ("A100-80GB", "21Gi", "3g.40gb"),  # 3g before 4g
        ("A100-80GB", "80Gi", "7g.80gb"),
        ("A100-80GB", "81Gi", None),
        ("A100-40GB", "5Gi", "1g.5gb"),  # never the +me twin
        ("A100-40GB", "6Gi", "1g.10gb"),  # 1g.10gb before 2g.10gb
        ("A30-24GB", "6Gi", "1g.6gb"),
        ("A30-24GB", "7Gi", "2g.12gb"),
        ("H200-141GB", "10Gi", "1g.18gb"),
        ("H100-NVL-94GB", "40Gi", "3g.47gb"),
        ("B200-180GB", "100Gi", "7g.180gb"),
    ],
)
def test_best_fit_over_the_catalogue(model: str, ask: str, expected: str | None) -> None:
    assert chosen_profile([mixed_node(model, TABLE[model])], ask) == expected


def test_best_fit_among_offered_profiles_only() -> None:
    offered = {name: n for name, n in TABLE["A100-80GB"].items() if name != "1g.20gb"}
    assert chosen_profile([mixed_node("A100-80GB", offered)], "15Gi") == "2g.20gb"
    assert chosen_profile([mixed_node("A100-80GB", {"1g.10gb+me": 1, "7g.80gb": 1})], "10Gi") == "7g.80gb"
    assert chosen_profile([mixed_node("A100-80GB", {"1g.10gb+me": 1})], "1") is None
    assert chosen_profile([], "1") is None


def test_best_fit_ties_go_to_the_profile_with_most_units() -> None:
    # Same memory and compute on two nodes: the node offering more units of it is where the ask will fit.
    a = mixed_node("A100-80GB", {"1g.10gb": 2})
    b = mixed_node("H100-80GB", {"1g.10gb": 7})
    best = best_fit([a, b], "10Gi")
    assert best is not None
    offer, nodes = best
    assert (offer.profile, offer.count) == ("1g.10gb", 7)
    assert nodes == ["a100-80gb-mixed", "h100-80gb-mixed"]


@pytest.mark.parametrize(
    ("profile", "shared", "name"),
    [
        ("1g.10gb", False, "nvidia.com/mig-1g.10gb"),
        ("3g.40gb", False, "nvidia.com/mig-3g.40gb"),
        ("1g.10gb+me", False, "nvidia.com/mig-1g.10gb.me"),
        ("1g.10gb", True, "nvidia.com/mig-1g.10gb.shared"),
        ("1g.10gb+me", True, "nvidia.com/mig-1g.10gb.me.shared"),
        ("7g.141gb", False, "nvidia.com/mig-7g.141gb"),
    ],
)
def test_resource_name(profile: str, shared: bool, name: str) -> None:
    assert resource_name(profile, shared=shared) == name
    parsed = parse_mig_resource(name)
    assert parsed is not None
    assert parsed.profile == profile
    assert parsed.me == profile.endswith("+me")
    assert parsed.shared is shared


def test_resource_name_of_a_profile_object_and_bad_names() -> None:
    profile = MigProfile("2g.20gb", 2, 20, 3)
    assert resource_name(profile) == "nvidia.com/mig-2g.20gb"
    for bad in ("1g10gb", "nvidia.com/mig-1g.10gb", "1g.10gb.me", ""):
        with pytest.raises(ValueError):
            resource_name(bad)


def test_parse_mig_resource_fields() -> None:
    assert parse_mig_resource("nvidia.com/mig-3g.47gb.me") == ("3g.47gb+me", 3, 47, True, False)
    assert parse_mig_resource("nvidia.com/mig-1g.5gb.shared") == ("1g.5gb", 1, 5, False, True)
    # Unknown to the catalogue but well-formed: still parsed.
    assert parse_mig_resource("nvidia.com/mig-1g.16gb") == ("1g.16gb", 1, 16, False, False)


@pytest.mark.parametrize(
    "name",
    [
        "nvidia.com/gpu",
        "nvidia.com/gpu.shared",
        "nvidia.com/mig-1g.10gb+me",  # '+' is not valid in a resource name
        "nvidia.com/mig-1g.10gb.shared.me",
        "nvidia.com/mig-",
        "nvidia.com/mig-1c.3g.20gb",
        "nvidia.com/mig-0g.10gb",
        "nvidia.com/MIG-1g.10gb",
        "example.com/mig-1g.10gb",
        "nvidia.com/mig-1g.10gb ",
        "",
    ],
)
def test_parse_mig_resource_rejects(name: str) -> None:
    assert parse_mig_resource(name) is None


@pytest.mark.parametrize(
    ("label", "model"),
    [
        ("NVIDIA-A100-SXM4-80GB", "A100-80GB"),
        ("NVIDIA-A100-PCIE-40GB", "A100-40GB"),
        ("NVIDIA-A100-SXM4-40GB", "A100-40GB"),
        ("NVIDIA-A100-80GB-PCIe", "A100-80GB"),
        ("A100-SXM4-40GB", "A100-40GB"),  # older drivers: no NVIDIA- prefix
        ("NVIDIA-H100-80GB-HBM3", "H100-80GB"),
        ("NVIDIA-H100-SXM5-80GB", "H100-80GB"),
        ("NVIDIA-H100-PCIe", "H100-80GB"),
        ("NVIDIA-H100-NVL", "H100-NVL-94GB"),
        ("NVIDIA-H200", "H200-141GB"),
        ("NVIDIA-B200", "B200-180GB"),
        ("NVIDIA-A30", "A30-24GB"),
        ("nvidia-a100-sxm4-80gb", "A100-80GB"),
    ],
)
def test_model_for_product(label: str, model: str) -> None:
    found = model_for_product(label)
    assert found is not None and found.name == model
    info = parse_product(label)
    assert (info.base, info.mig_profile, info.shared) == (label, None, False)


@pytest.mark.parametrize(
    "label",
    [
        "NVIDIA-GH200-480GB",  # not an H200
        "NVIDIA-H800",
        "NVIDIA-H20",
        "NVIDIA-H200-NVL",  # MIG sizes differ from the SXM part: not guessed
        "NVIDIA-A100",  # memory unknown
        "NVIDIA-A100-SXM4-64GB",
        "NVIDIA-H100-64GB-HBM3",
        "NVIDIA-H100-NVL-80GB",
        "NVIDIA-B200-192GB",
        "NVIDIA-A100X",
        "NVIDIA-A100-SXM4-40GB-80GB",
        "Tesla-V100-SXM2-16GB",
        "NVIDIA-L40S",
        "",
        "-SHARED",
        "NVIDIA-A100-SXM4-40GB-MIG-bogus",
    ],
)
def test_unknown_products(label: str) -> None:
    assert model_for_product(label) is None


@pytest.mark.parametrize(
    ("label", "base", "profile", "shared", "model"),
    [
        ("A100-SXM4-40GB-MIG-1g.5gb", "A100-SXM4-40GB", "1g.5gb", False, "A100-40GB"),
        ("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", "NVIDIA-A100-SXM4-40GB", "1g.5gb", False, "A100-40GB"),
        ("NVIDIA-A100-SXM4-80GB-MIG-3g.40gb-SHARED", "NVIDIA-A100-SXM4-80GB", "3g.40gb", True, "A100-80GB"),
        ("NVIDIA-H100-80GB-HBM3-SHARED", "NVIDIA-H100-80GB-HBM3", None, True, "H100-80GB"),
        ("NVIDIA-H100-80GB-HBM3-MIG-1g.10gb.me", "NVIDIA-H100-80GB-HBM3", "1g.10gb+me", False, "H100-80GB"),
        ("NVIDIA-H100-80GB-HBM3-MIG-1g.10gb+me", "NVIDIA-H100-80GB-HBM3", "1g.10gb+me", False, "H100-80GB"),
        ("NVIDIA-H200-MIG-1g.18gb", "NVIDIA-H200", "1g.18gb", False, "H200-141GB"),
        ("NVIDIA-GH200-480GB-MIG-1g.12gb", "NVIDIA-GH200-480GB", "1g.12gb", False, None),
    ],
)
def test_parse_product_suffixes(label: str, base: str, profile: str | None, shared: bool, model: str | None) -> None:
    info = parse_product(label)
    assert (info.base, info.mig_profile, info.shared) == (base, profile, shared)
    assert (info.model.name if info.model else None) == model
    if model is not None and profile is not None:
        assert info.profile is not None and info.profile.name == profile


def test_product_profile_not_in_the_catalogue() -> None:
    info = parse_product("NVIDIA-A100-SXM4-40GB-MIG-1g.20gb")  # an 80GB profile on a 40GB card
    assert info.mig_profile == "1g.20gb"
    assert info.model is not None and info.profile is None


@given(st.text(max_size=80))
def test_parse_product_never_raises(label: str) -> None:
    info = parse_product(label)
    assert isinstance(info.shared, bool)
    assert parse_mig_resource(label) is None or label.startswith("nvidia.com/mig-")
