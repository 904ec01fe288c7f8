"""The built-in MIG catalogue, MIG resource names, and GFD product labels mapped to GPU models.

Why this exists: users ask for "a 10 GiB GPU slice" (`gpu-admission.io/gpu-memory: 10Gi`) and the webhook
must turn that into a resource the cluster really advertises, such as `nvidia.com/mig-1g.10gb` on an A100
80GB but `nvidia.com/mig-1g.18gb` on an H200. Doing that needs three facts, kept here as data:

- which MIG profiles each GPU model offers (NVIDIA's MIG user guide, as used by the GPU Operator's
  mig-parted configs; transcribed in shared/reference/gpu-resources.md §3);
- how the NVIDIA device plugin names them as extended resources (`mig-<profile>`, `+me` → `.me`, and
  `.shared` for renamed time-sliced resources; gpu-resources.md §1);
- which GPU model a node's GFD `nvidia.com/gpu.product` label denotes, including the `-MIG-<profile>`
  (single strategy) and `-SHARED` (time-slicing/MPS) suffixes GFD appends (gpu-resources.md §2).

Decision — what the `Ngb` in a profile name means for a memory ask: it is read as **N GiB** (N·2^30
bytes). NVIDIA rounds the figure in the name, and the memory the driver actually reports for a slice is
somewhat below N GiB (memory is cut in eighths of the card, minus reserved space), so neither "N GB" nor
the exact size is what users mean. A user who writes `10Gi` means "the 10 GB slice"; reading the name as
N GiB maps `10Gi` to `1g.10gb` (and `20G` = 20·10^9 bytes to a 20 GB slice), whereas reading it as
10^9-byte GB or as the exact size would push `10Gi` to the next, twice as large, slice and waste half of
it. Where a live node is known, its GFD `nvidia.com/mig-<profile>.memory` label (MiB) is the exact figure.

Decision — product labels not matched with certainty return `None` rather than a guess: a family missing
from the catalogue (H800, GH200, H20…), a memory size that does not fit the family (`H100-64GB`) or an
unknown token (`H200-NVL`, whose MIG sizes differ from the SXM part). A wrong catalogue would produce
resource names no node advertises; the caller can still use the per-profile GFD labels of the node.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import NamedTuple

__all__ = [
    "CATALOGUE",
    "MIG_RESOURCE_PREFIX",
    "GpuModel",
    "MigProfile",
    "MigResource",
    "ProductInfo",
    "memory_bytes",
    "model_for_product",
    "parse_mig_resource",
    "parse_product",
    "resource_name",
]

MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
_GIB = 2**30


@dataclass(frozen=True)
class MigProfile:
    """One GPU-instance profile, e.g. `1g.10gb` (1 of 7 compute slices, "10 GB", up to 7 per card).

    `media_extensions` marks the `+me` variant, which also takes the card's only media engines (NVDEC,
    NVJPG…) and so exists once per card.
    """

    name: str
    compute_slices: int
    memory_gb: int
    max_instances: int
    media_extensions: bool = False


@dataclass(frozen=True)
class GpuModel:
    """A MIG-capable GPU model: its memory, compute slices (7, or 4 on the A30) and profiles."""

    name: str
    memory_gib: int
    slices: int
    profiles: tuple[MigProfile, ...] = field(repr=False)

    def profile(self, name: str) -> MigProfile | None:
        """The profile called `name` (`1g.10gb`, `1g.10gb+me`), or None if this model has none."""
        for profile in self.profiles:
            if profile.name == name:
                return profile
        return None


class MigResource(NamedTuple):
    """A parsed `nvidia.com/mig-…` resource name; `profile` is the canonical name (`1g.10gb+me`)."""

    profile: str
    compute: int
    memory_gb: int
    me: bool
    shared: bool


@dataclass(frozen=True)
class ProductInfo:
    """A GFD `nvidia.com/gpu.product` label split into its base product and GFD's suffixes.

    `base` is the label without suffixes (`NVIDIA-A100-SXM4-40GB`), `mig_profile` the `-MIG-<profile>`
    of a single-strategy node (canonical, e.g. `1g.5gb`), `shared` whether `-SHARED` (time-slicing or
    MPS) is present, and `model` the catalogue entry for the base, when known with certainty.
    """

    base: str
    mig_profile: str | None
    shared: bool
    model: GpuModel | None

    @property
    def profile(self) -> MigProfile | None:
        """The catalogue entry of a single-strategy node's `-MIG-<profile>`, if both are known."""
        if self.model is None or self.mig_profile is None:
            return None
        return self.model.profile(self.mig_profile)


def _profiles(
    small: int, double: int, half: int, full: int, *, slices: int = 7, small_count: int = 7
) -> tuple[MigProfile, ...]:
    """The profile set every 7-slice part shares, from its four memory sizes (1/8, 2/8, 4/8, 8/8)."""
    return (
        MigProfile(f"1g.{small}gb", 1, small, small_count),
        MigProfile(f"1g.{small}gb+me", 1, small, 1, media_extensions=True),
        MigProfile(f"1g.{double}gb", 1, double, 4),
        MigProfile(f"2g.{double}gb", 2, double, 3),
        MigProfile(f"3g.{half}gb", 3, half, 2),
        MigProfile(f"4g.{half}gb", 4, half, 1),
        MigProfile(f"{slices}g.{full}gb", slices, full, 1),
    )


_A100_80_H100_80 = _profiles(10, 20, 40, 80)

# gpu-resources.md §3 (NVIDIA MIG user guide, "Supported MIG profiles").
CATALOGUE: tuple[GpuModel, ...] = (
    GpuModel(
        "A30-24GB",
        24,
        4,
        (
            MigProfile("1g.6gb", 1, 6, 4),
            MigProfile("1g.6gb+me", 1, 6, 1, media_extensions=True),
            MigProfile("2g.12gb", 2, 12, 2),
            MigProfile("2g.12gb+me", 2, 12, 1, media_extensions=True),
            MigProfile("4g.24gb", 4, 24, 1),
        ),
    ),
    GpuModel("A100-40GB", 40, 7, _profiles(5, 10, 20, 40)),
    GpuModel("A100-80GB", 80, 7, _A100_80_H100_80),
    GpuModel("H100-80GB", 80, 7, _A100_80_H100_80),
    GpuModel("H100-NVL-94GB", 94, 7, _profiles(12, 24, 47, 94)),
    GpuModel("H200-141GB", 141, 7, _profiles(18, 35, 71, 141)),
    GpuModel("B200-180GB", 180, 7, _profiles(23, 45, 90, 180)),
)
_BY_NAME = {model.name: model for model in CATALOGUE}


def memory_bytes(item: MigProfile | GpuModel) -> int:
    """Bytes a memory ask is compared with: the profile's `Ngb` or the model's memory, read as GiB.

    See the module docstring for why `10gb` counts as 10 GiB.
    """
    if isinstance(item, MigProfile):
        return item.memory_gb * _GIB
    return item.memory_gib * _GIB


_PROFILE = r"([1-9][0-9]?)g\.([1-9][0-9]{0,3})gb"
_RESOURCE = re.compile(re.escape(MIG_RESOURCE_PREFIX) + _PROFILE + r"(\.me)?(\.shared)?")
_PROFILE_NAME = re.compile(_PROFILE + r"(\+me)?")


def resource_name(profile: MigProfile | str, shared: bool = False) -> str:
    """The extended resource the NVIDIA device plugin advertises for a profile (mixed strategy).

    `1g.10gb` → `nvidia.com/mig-1g.10gb`, `1g.10gb+me` → `nvidia.com/mig-1g.10gb.me`; with `shared`
    (time-slicing with `renameByDefault: true`) `.shared` is appended. A string must be a profile name.
    """
    name = profile.name if isinstance(profile, MigProfile) else profile
    if _PROFILE_NAME.fullmatch(name) is None:
        raise ValueError(f"not a MIG profile name: {name!r} (expected e.g. 1g.10gb or 1g.10gb+me)")
    return MIG_RESOURCE_PREFIX + name.replace("+me", ".me") + (".shared" if shared else "")


def parse_mig_resource(name: str) -> MigResource | None:
    """Parse `nvidia.com/mig-<C>g.<M>gb[.me][.shared]`; None for any other name (incl. `nvidia.com/gpu`).

    Independent of the catalogue, so a profile of a GPU model this module does not know still parses.
    """
    match = _RESOURCE.fullmatch(name)
    if match is None:
        return None
    compute, memory, me, shared = match.groups()
    profile = f"{compute}g.{memory}gb" + ("+me" if me else "")
    return MigResource(profile, int(compute), int(memory), me is not None, shared is not None)


# GFD appends `-MIG-<profile>` (single strategy) and then `-SHARED` (time-slicing/MPS). A `+me` profile
# may appear as `.me` because `+` is not allowed in label values; both are accepted.
_PRODUCT = re.compile(
    r"(?P<base>.+?)(?:-MIG-(?P<profile>[0-9]+g\.[0-9]+gb(?:[.+]me)?))?(?P<shared>-SHARED)?",
    re.IGNORECASE | re.DOTALL,
)
_MEMORY_TOKEN = re.compile(r"([0-9]+)GB")
# Form-factor and memory-type tokens that do not change a model's MIG catalogue.
_NEUTRAL_TOKENS = frozenset({"SXM", "SXM4", "SXM5", "PCIE", "HBM2", "HBM2E", "HBM3", "HBM3E"})
# family → (memory GB when the label names none, {memory GB → catalogue name})
_FAMILIES: dict[str, tuple[int | None, dict[int, str]]] = {
    "A30": (24, {24: "A30-24GB"}),
    "A100": (None, {40: "A100-40GB", 80: "A100-80GB"}),  # every A100 product name states its memory
    "H100": (80, {80: "H100-80GB"}),  # "NVIDIA H100 PCIe" is the 80 GB part
    "H200": (141, {141: "H200-141GB"}),
    "B200": (180, {180: "B200-180GB"}),
}


def _model_for_base(base: str) -> GpuModel | None:
    """Match a suffix-free product name by its tokens, exactly (so `GH200` is never an `H200`)."""
    tokens = re.split(r"[-_ ]+", base.upper())
    if tokens and tokens[0] == "NVIDIA":
        tokens = tokens[1:]
    if not tokens or tokens[0] not in _FAMILIES:
        return None
    family, rest = tokens[0], tokens[1:]
    memory: int | None = None
    nvl = False
    for token in rest:
        if (size := _MEMORY_TOKEN.fullmatch(token)) is not None:
            if memory is not None:
                return None
            memory = int(size.group(1))
        elif token == "NVL" and family == "H100":
            nvl = True
        elif token not in _NEUTRAL_TOKENS:
            return None
    if nvl:  # H100 NVL: 94 GB
        return _BY_NAME["H100-NVL-94GB"] if memory in (None, 94) else None
    default, sizes = _FAMILIES[family]
    chosen = sizes.get(memory if memory is not None else default or 0)
    return _BY_NAME[chosen] if chosen is not None else None


@functools.lru_cache(maxsize=1024)  # a cluster has a few products; every node of it is parsed at each build
def parse_product(label: str) -> ProductInfo:
    """Split a GFD product label (`NVIDIA-A100-SXM4-40GB-MIG-1g.5gb-SHARED`) and match its GPU model.

    Never raises: an unknown product gives `model=None`. The MIG profile is returned in canonical form
    (`1g.10gb+me`) even when the label spells it `1g.10gb.me`.
    """
    match = _PRODUCT.fullmatch(label)
    if match is None:  # only the empty string
        return ProductInfo(label, None, False, None)
    raw = match.group("profile")
    profile = raw.lower().replace(".me", "+me") if raw else None
    base = match.group("base")
    return ProductInfo(base, profile, match.group("shared") is not None, _model_for_base(base))


def model_for_product(gfd_product_label: str) -> GpuModel | None:
    """The catalogue model of a GFD `nvidia.com/gpu.product` label, suffixes tolerated; None if unknown."""
    return parse_product(gfd_product_label).model
