"""MIG resource names and product labels (session 11's mutation survivors, issue #20): the error a bad profile
name gives, and an H100 NVL label that states its 94 GB."""

from __future__ import annotations

import pytest

from policies.mig import model_for_product, resource_name


@pytest.mark.parametrize("bad", ["1g10gb", "nvidia.com/mig-1g.10gb", "1g.10gb.me", ""])
def test_a_bad_profile_name_is_refused_naming_it_and_the_expected_form(bad: str) -> None:
    with pytest.raises(ValueError) as caught:
        resource_name(bad)
    assert str(caught.value) == f"not a MIG profile name: {bad!r} (expected e.g. 1g.10gb or 1g.10gb+me)"


@pytest.mark.parametrize("label", ["NVIDIA-H100-NVL-94GB", "NVIDIA-H100-94GB-NVL", "NVIDIA-H100-NVL-94GB-MIG-1g.12gb"])
def test_an_h100_nvl_label_that_states_its_94_gb_is_the_nvl_part(label: str) -> None:
    model = model_for_product(label)
    assert model is not None and model.name == "H100-NVL-94GB"


@pytest.mark.parametrize("label", ["NVIDIA-H100-NVL-95GB", "NVIDIA-H100-NVL-93GB"])
def test_an_h100_nvl_of_another_size_is_not_guessed(label: str) -> None:
    assert model_for_product(label) is None
